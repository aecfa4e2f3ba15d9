"""Inputs that are not regular files, numbers out of range, paths that cannot be, and
mistakes that deserve a message naming them (issue #28). Every case: exit 2 (or a skipped
entry with a warning), one stderr line naming the input, nothing hung, nothing written."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from securesystemslib.dsse import Envelope
from securesystemslib.signer import CryptoSigner

from tests.attacks.harness import assert_contained, assert_outcome, line_naming

pytestmark = pytest.mark.attack


def _key(sandbox) -> tuple[CryptoSigner, str]:
    private = ec.generate_private_key(ec.SECP256R1())
    public = sandbox.inputs / "cosign.pub"
    public.write_bytes(
        private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return CryptoSigner(private), str(public)


@pytest.mark.parametrize("which", ["--attestation", "--key"])
def test_an_attestation_or_key_that_is_a_fifo_is_refused_not_read(sandbox, forged, which):
    """Reading a FIFO with no writer hung verify until it was killed."""
    signer, public = _key(sandbox)
    envelope = Envelope(b"{}", "application/vnd.in-toto+json", {})
    envelope.sign(signer)
    attestation = sandbox.inputs / "att.json"
    attestation.write_text(__import__("json").dumps(envelope.to_dict()))
    fifo = sandbox.inputs / "fifo"
    os.mkfifo(fifo)
    paths = {"--attestation": str(attestation), "--key": public, which: str(fifo)}
    result = sandbox.run("verify", forged, "--attestation", paths["--attestation"], "--key", paths["--key"], timeout=20)
    assert_outcome(sandbox, result, 2, str(fifo), "not a regular file")


def test_a_signed_payload_nested_deeply_is_bad_input(sandbox, forged):
    """A validly signed payload of 100,000 nested arrays was a RecursionError (exit 4)."""
    signer, public = _key(sandbox)
    envelope = Envelope(b"[" * 100_000 + b"]" * 100_000, "application/vnd.in-toto+json", {})
    envelope.sign(signer)
    attestation = sandbox.inputs / "deep.json"
    attestation.write_text(__import__("json").dumps(envelope.to_dict()))
    result = sandbox.run("verify", forged, "--attestation", attestation, "--key", public)
    assert_outcome(sandbox, result, 2, "signed payload", "nested deeper")


@pytest.mark.parametrize("command", ["report", "pack"])
@pytest.mark.parametrize("target", ["fifo", "device", "symlink"])
def test_an_output_that_is_not_a_regular_file_is_never_replaced(sandbox, forged, command, target):
    """`report -o DEVICE --force` replaced a character device with a file (as root, /dev/full
    went); `bundle pack -o` refused it. One rule for every -o: --force replaces a regular file."""
    path = sandbox.inputs / target
    if target == "fifo":
        os.mkfifo(path)
    elif target == "device":
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 7))  # what /dev/full is
        except PermissionError:
            pytest.skip("mknod needs CAP_MKNOD")
    else:
        (sandbox.inputs / "elsewhere").write_text("kept\n")
        path.symlink_to(sandbox.inputs / "elsewhere")
    before = os.lstat(path)
    argv = ["report", forged, "--format", "markdown"] if command == "report" else ["bundle", "pack", forged]
    result = sandbox.run(*argv, "-o", path, "--force", timeout=30)
    assert_outcome(sandbox, result, 2, str(path), "refusing to replace")
    after = os.lstat(path)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)


@pytest.mark.parametrize("epoch", ["99999999999999999999", "253402300800", "9" * 5000])
def test_a_source_date_epoch_out_of_range_is_bad_input(sandbox, forged, epoch):
    """Past 9999-12-31 datetime overflows; past 4,300 digits Python refuses the int itself."""
    result = sandbox.run("report", forged, "--format", "markdown", env={"SOURCE_DATE_EPOCH": epoch})
    assert_outcome(sandbox, result, 2, "SOURCE_DATE_EPOCH", "out of range")


def test_an_unreadable_probes_path_entry_is_skipped_with_a_warning(sandbox):
    """A symlink loop, a name too long or a FIFO on KVPROBE_PROBES_PATH was exit 4 for `list`
    and `show`; each is skipped and named, and the built-in experiments are still found."""
    loop_a, loop_b, fifo = (sandbox.inputs / n for n in ("loop-a", "loop-b", "fifo"))
    loop_a.symlink_to(loop_b)
    loop_b.symlink_to(loop_a)
    os.mkfifo(fifo)
    long_name = str(sandbox.inputs / ("x" * 300))
    entries = [str(loop_a), long_name, str(fifo)]
    env = {"KVPROBE_PROBES_PATH": os.pathsep.join(entries)}
    for argv in (("list",), ("show", "model")):
        result = sandbox.run(*argv, env=env)
        assert_outcome(sandbox, result, 0)
        assert "model" in result.out
        for entry in entries:
            assert line_naming(result.err, "warning", "KVPROBE_PROBES_PATH", entry[:60], "skipped"), result.describe()


def _git(repo, *args: str) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(repo), "GIT_CONFIG_NOSYSTEM": "1"}
    ident = ["-c", "user.name=up", "-c", "user.email=up@example.invalid"]
    subprocess.run(["git", *ident, "-C", str(repo), *args], env=env, check=True, capture_output=True, timeout=30)


def _two_commits(sandbox) -> tuple[str, str, str]:
    repo = sandbox.inputs / "upstream"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    shas = []
    for value in ("1", "2"):
        (repo / "m.py").write_text(f"X = {value}\n")
        _git(repo, "add", "m.py")
        _git(repo, "commit", "-qm", f"commit {value}")
        shas.append(
            subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        )
    return str(repo), shas[0].strip(), shas[1].strip()


def test_new_into_a_directory_that_cannot_be_made_names_it(sandbox):
    """`new --dir /proc/nope` was exit 4 "a bug in kvprobe"."""
    repo, base, head = _two_commits(sandbox)
    result = sandbox.run(
        "new", "exp-x", "--base", base, "--head", head, "--repo", repo, "--profile", "pytest-minimal",
        "--package", "m", "--dir", "/proc/nope", allow=(sandbox.cache,),
    )  # fmt: skip
    assert_outcome(sandbox, result, 2, "--dir /proc/nope")


def test_new_from_a_directory_that_is_no_repository_leaves_no_git_store(sandbox):
    """`new --repo file:///etc` was exit 3 and left a git store in the cache."""
    base, head = "a" * 40, "b" * 40
    result = sandbox.run("new", "exp-y", "--base", base, "--head", head, "--repo", "file:///etc", "--dir", sandbox.out)
    assert_outcome(sandbox, result, 2, "file:///etc", "not a git repository")
    assert list(sandbox.cache.iterdir()) == []


def test_a_mistyped_experiment_is_met_with_a_guess(sandbox):
    result = sandbox.run("show", "experiment-aa")
    assert_outcome(sandbox, result, 2, "unknown experiment", "did you mean experiment-a?")


def test_a_bundle_path_that_does_not_exist_says_so(sandbox):
    result = sandbox.run("verify", sandbox.inputs / "no-such-bundle")
    assert_outcome(sandbox, result, 2, "no-such-bundle", "no such file")


def test_an_experiment_kvprobe_does_not_ship_has_its_profile_checked_when_loaded(sandbox):
    """`show` of an experiment from KVPROBE_PROBES_PATH whose profile does not exist said
    nothing; the run found out only as it was about to build the env."""
    from tests.attacks.harness import REPO

    folder = sandbox.inputs / "experiments" / "my-exp"
    folder.mkdir(parents=True)
    source = (REPO / "probes" / "experiment-a" / "experiment.toml").read_text()
    source = source.replace('id = "experiment-a"', 'id = "my-exp"').replace('"sglang-cpu"', '"no-such-profile"')
    assert "no-such-profile" in source
    (folder / "experiment.toml").write_text(source)
    for probe in (REPO / "probes" / "experiment-a").glob("*.py"):
        (folder / probe.name).write_bytes(probe.read_bytes())
    result = sandbox.run("show", "my-exp", env={"KVPROBE_PROBES_PATH": str(folder.parent)})
    assert_outcome(sandbox, result, 2, "no-such-profile")
    assert_contained(sandbox, result)

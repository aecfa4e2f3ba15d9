"""Bad input is exit 2, in one line, before anything runs (issue #11): profiles and their
locks, --torch-index, and one overwrite policy for files kvprobe writes (issue #16)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from kvprobe.env.venv import check_index_url, check_lock, load_profile
from kvprobe.errors import ExperimentError, UsageError
from kvprobe.resources import builtin_probes_dir

HASHED = "pytest==9.2.0 \\\n    --hash=sha256:07acdcf88ec174f907dc01af70bf52d49b014bbab03faeeade31c96b18c2e588\n"
MODEL_BUNDLE = next((builtin_probes_dir().parent / "bundles").glob("model-model-*"))


@pytest.fixture
def profiles(tmp_path, monkeypatch) -> Path:
    """An empty ``profiles/`` first on the experiment search path."""
    folder = tmp_path / "search" / "profiles"
    folder.mkdir(parents=True)
    monkeypatch.setenv("KVPROBE_PROBES_PATH", str(folder.parent))
    return folder


def write_profile(folder: Path, toml: str, lock: str | None = HASHED) -> None:
    (folder / "p.toml").write_text(toml)
    if lock is not None:
        (folder / "p.txt").write_text(lock)


# --- profiles -------------------------------------------------------------------------------


def test_a_valid_profile_loads(profiles):
    write_profile(profiles, 'name = "p"\nlock = "p.txt"\n[env]\nA = 1\n')
    profile = load_profile("p")
    assert profile.lock_name == "p.txt" and profile.lock_bytes == HASHED.encode() and profile.env == (("A", "1"),)


def test_a_profile_names_what_its_fork_server_preloads(profiles):
    write_profile(profiles, 'name = "p"\nlock = "p.txt"\npreload = ["torch", "transformers.models.llama"]\n')
    assert load_profile("p").preload == ("torch", "transformers.models.llama")
    write_profile(profiles, 'name = "p"\nlock = "p.txt"\n')
    assert load_profile("p").preload is None  # the fork server's default


def test_a_profile_that_preloads_the_package_under_test_is_refused_before_anything_runs(
    profiles, tmp_path, monkeypatch
):
    """Each side's SGLang must come from its own tree: a server that imported one would hand
    both sides the same code."""
    shipped = builtin_probes_dir() / "profiles"
    (profiles / "sglang-cpu.txt").write_bytes((shipped / "sglang-cpu.txt").read_bytes())
    toml = (
        (shipped / "sglang-cpu.toml").read_text().replace("preload = [", 'preload = [\n    "sglang.srt.managers",', 1)
    )
    (profiles / "sglang-cpu.toml").write_text(toml)
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path))
    result = CliRunner(env={"KVPROBE_CACHE_DIR": str(tmp_path / "cache")}).invoke(main, ["run", "experiment-a"])
    assert result.exit_code == 2
    assert "preload names 'sglang.srt.managers', part of the package under test" in result.stderr
    assert sorted(os.listdir(tmp_path)) == before  # no cache, no bundles/: nothing ran


def test_the_shipped_profiles_pass_the_checks():
    for name in ("sglang-cpu", "pytest-minimal"):
        assert load_profile(name).lock_bytes


@pytest.mark.parametrize(
    ("toml", "words"),
    [
        ('name = "p"\nlock = "p.txt\n', "not valid TOML"),
        ('name = "p"\n', "no `lock` key"),
        ('name = "p"\nlock = 3\n', "no `lock` key"),
        ('name = "p"\nlock = "../p.txt"\n', "outside the profile folder"),
        ('name = "p"\nlock = "/etc/passwd"\n', "outside the profile folder"),
        ('name = "p"\nlock = "sub/p.txt"\n', "outside the profile folder"),
        ('name = "p"\nlock = "missing.txt"\n', "no such file"),
        ('name = "p"\nlock = "p.txt"\npreload = "torch"\n', "`preload` must be a list of module names"),
        ('name = "p"\nlock = "p.txt"\npreload = [1]\n', "`preload` must be a list of module names"),
        ('name = "p"\nlock = "p.txt"\npreload = ["torch; import os"]\n', "`preload` must be a list of module names"),
        ('name = "p"\nlock = "p.txt"\npreload = ["torch."]\n', "`preload` must be a list of module names"),
    ],
)
def test_a_bad_profile_is_refused_naming_it(profiles, toml, words):
    write_profile(profiles, toml)
    with pytest.raises(ExperimentError, match=words) as caught:
        load_profile("p")
    assert caught.value.exit_code == 2 and "p.toml" in caught.value.message


def test_a_lock_symlinked_out_of_the_folder_is_never_read(profiles, tmp_path):
    (tmp_path / "secret.txt").write_text("SECRET-LINE\n")
    (profiles / "p.txt").symlink_to(tmp_path / "secret.txt")
    write_profile(profiles, 'name = "p"\nlock = "p.txt"\n', lock=None)
    with pytest.raises(ExperimentError, match="outside the profile folder") as caught:
        load_profile("p")
    assert "SECRET-LINE" not in caught.value.message


@pytest.mark.parametrize(
    ("lock", "words"),
    [
        (HASHED + "iniconfig==2.3.1\n", r"p\.txt:3: iniconfig==2\.3\.1 has no --hash"),
        (HASHED + "-r ../../other.txt\n", "not a name==version requirement"),
        (HASHED + "--index-url http://evil.example/simple\n", "not a name==version requirement"),
        (HASHED + "iniconfig>=2 --hash=sha256:" + "0" * 64 + "\n", "not a name==version requirement"),
        (HASHED + "iniconfig==2.3.1 --hash=sha256:" + "0" * 64 + " --index-url=x\n", "unexpected"),
    ],
)
def test_every_lock_line_is_a_hash_pinned_requirement(lock, words):
    with pytest.raises(ExperimentError, match=words):
        check_lock(lock.encode(), Path("p.txt"))


def test_comments_markers_and_continuations_are_fine():
    lock = (
        "# header\n\n" + HASHED + 'tomli==2.0 ; python_version < "3.11" \\\n  --hash=sha256:' + "a" * 64 + "  # why\n"
    )
    check_lock(lock.encode(), Path("p.txt"))


# --- --torch-index ----------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["https://download.pytorch.org/whl/cpu", "file:///srv/mirror/simple"])
def test_https_and_file_indexes_are_accepted(url):
    assert check_index_url(url) == url


@pytest.mark.parametrize(
    "url", ["http://download.pytorch.org/whl/cpu", "ftp://x/y", "/srv/mirror", "https://user:pw@mirror.example/simple"]
)
def test_other_indexes_are_refused(url):
    with pytest.raises(UsageError) as caught:
        check_index_url(url)
    assert "pw" not in caught.value.message


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "model"],
        ["gates", "--log", "x.log"],
        ["verify", "--rerun", "b"],
    ],
)
def test_plain_http_index_is_refused_before_anything_runs(tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.log").write_text("[2026-08-27 10:00:00] hello\n")
    result = CliRunner().invoke(main, [*argv, "--torch-index", "http://evil.example/simple"])
    assert result.exit_code == 2 and "only https://" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["x.log"]
    via_env = CliRunner(env={"KVPROBE_TORCH_INDEX": "http://evil.example/simple"}).invoke(main, argv)
    assert via_env.exit_code == 2 and "only https://" in via_env.stderr


def test_a_plain_verify_does_not_use_the_index_and_does_not_refuse_over_it(tmp_path):
    result = CliRunner(env={"KVPROBE_TORCH_INDEX": "http://evil.example/simple"}).invoke(
        main, ["verify", str(MODEL_BUNDLE)]
    )
    assert result.exit_code == 0, result.stderr


# --- one overwrite policy: refuse unless --force ---------------------------------------------


def test_report_output_is_not_overwritten_without_force(tmp_path):
    out = tmp_path / "report.md"
    out.write_text("mine\n")
    argv = ["report", str(MODEL_BUNDLE), "--format", "markdown", "-o", str(out)]
    refused = CliRunner().invoke(main, argv)
    assert refused.exit_code == 2 and "--force" in refused.stderr and out.read_text() == "mine\n"
    forced = CliRunner().invoke(main, [*argv, "--force"])
    assert forced.exit_code == 0, forced.stderr
    assert out.read_text().startswith("#") and list(tmp_path.iterdir()) == [out]


def test_pack_output_is_not_overwritten_without_force(tmp_path):
    out = tmp_path / "b.tar.gz"
    out.write_bytes(b"mine")
    argv = ["bundle", "pack", str(MODEL_BUNDLE), "-o", str(out)]
    refused = CliRunner().invoke(main, argv)
    assert refused.exit_code == 2 and "--force" in refused.stderr and out.read_bytes() == b"mine"
    forced = CliRunner().invoke(main, [*argv, "--force"])
    assert forced.exit_code == 0, forced.stderr
    assert out.read_bytes()[:2] == b"\x1f\x8b" and list(tmp_path.iterdir()) == [out]

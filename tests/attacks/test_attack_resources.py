"""Resource bounds hold for every path (issue #11).

The README promises flat, tens-of-MiB memory for verification. The harness measures the
child's peak RSS and kills it once it passes 300 MiB (a correctness bound, not a timing),
so these attacks fail fast today instead of taking gigabytes from the machine.
"""

from __future__ import annotations

import tarfile
import zlib

import pytest

from tests import forge
from tests.attacks.gatelogs import CONTEXT, RAISED, startup_log
from tests.attacks.harness import assert_outcome

pytestmark = pytest.mark.attack

GIB = 1 << 30


def huge_header_archive(path, kind: bytes, declared: int) -> None:
    """A few-MB .tar.gz whose first member is a PAX ('x') or GNU long-name ('L') header
    of ``declared`` bytes (all present, highly compressible), then a tiny receipt member."""
    info = tarfile.TarInfo("././@PaxHeader" if kind == tarfile.XHDTYPE else "././@LongLink")
    info.type, info.size = kind, declared
    prefix = f"{declared} path=".encode() if kind == tarfile.XHDTYPE else b""
    gz = zlib.compressobj(1, zlib.DEFLATED, 31)
    chunk = b"a" * (1 << 20)
    with open(path, "wb") as out:
        out.write(gz.compress(info.tobuf(tarfile.USTAR_FORMAT) + prefix))
        left = declared - len(prefix)
        while left > 0:
            out.write(gz.compress(chunk[: min(left, len(chunk))]))
            left -= len(chunk)
        receipt = tarfile.TarInfo("b/receipt.json")
        receipt.size = 3
        tail = b"\0" * ((-declared) % 512) + receipt.tobuf(tarfile.USTAR_FORMAT) + b"{}\n" + b"\0" * (509 + 1024)
        out.write(gz.compress(tail) + gz.flush())


@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME], ids=["pax", "gnu-longname"])
def test_huge_archive_header(sandbox, kind):
    """Attack: a 1 GiB PAX / GNU long-name header in a ~5 MB .tar.gz; it must be refused by its
    declared size, before it is read."""
    archive = sandbox.inputs / "header.tar.gz"
    huge_header_archive(archive, kind, GIB)
    result = sandbox.run("verify", archive, timeout=30)
    assert_outcome(sandbox, result, (1, 2), "header.tar.gz", ("header", "pax", "long"))


def pad_receipt(bundle, mib: int) -> None:
    """Grow receipt.json to ``mib`` MiB (under the 64 MiB JSON cap) with empty lists, the densest
    shape in Python objects; the bundle stays self-consistent."""
    path = bundle / "receipt.json"
    count = (mib << 20) // 3
    pad = b"[" + b",".join([b"[]"] * count) + b"]"
    path.write_bytes(path.read_bytes().replace(b'"cpus": 2', b'"cpus": 2, "pad": ' + pad, 1))
    forge.rehash(bundle)


@pytest.mark.parametrize(
    "command", [("verify",), ("report", "--format", "openvex", "--author", "x")], ids=["verify", "report"]
)
def test_receipt_just_under_the_json_cap(sandbox, forged, command):
    """Attack: a 57 MiB receipt of empty lists; uncapped, verify peaks at 2.9 GB (25 s) and
    report at 1.5 GB."""
    pad_receipt(forged, 57)
    result = sandbox.run(command[0], forged, *command[1:], timeout=60)
    assert_outcome(sandbox, result, (0, 1))


def test_sha256sums_just_under_the_cap(sandbox, forged):
    """Attack (own): 60 MiB of SHA256SUMS lines naming a file that does not exist; uncapped,
    verify peaks at 779 MiB (10 s)."""
    line = "0" * 64 + "  raw/x\n"
    with open(forged / "SHA256SUMS", "a") as sums:
        sums.write(line * ((60 << 20) // len(line)))
    result = sandbox.run("verify", forged, timeout=30)
    assert_outcome(sandbox, result, 1, "SHA256SUMS")


def test_manifest_just_under_the_cap(sandbox, forged):
    """Attack (own): a 56 MiB manifest.json listing 420,000 files that are not there; uncapped,
    verify peaks at 819 MiB (36 s)."""
    path = forged / "manifest.json"
    entries = ",".join(f'{{"path": "raw/x{i}", "sha256": "{"0" * 64}", "size": 1}}' for i in range(420_000))
    path.write_bytes(path.read_bytes().replace(b'"files": [', b'"files": [' + entries.encode() + b",", 1))
    result = sandbox.run("verify", forged, timeout=60)
    assert_outcome(sandbox, result, 1, ("manifest.json", "missing-file"))


def test_infinite_number_in_a_receipt(sandbox, forged):
    """Attack: `1e999` is not NaN/Infinity to a strict parser but overflows to inf; today verified."""
    path = forged / "receipt.json"
    path.write_bytes(path.read_bytes().replace(b'"checks_s": 0.1', b'"checks_s": 1e999', 1))
    forge.rehash(forged)
    result = sandbox.run("verify", forged)
    assert_outcome(sandbox, result, 1, "receipt.json", ("1e999", "non-finite", "infinity", "overflow"))


def test_deeply_nested_experiment_toml(sandbox, forged):
    """Attack (own): 50,000 nested arrays in the bundled experiment.toml (re-cited): the TOML
    parser recurses; verify must name the file, not crash."""
    rel = f"probes/{forge.EXP_ID}/experiment.toml"
    path = forged / rel
    path.write_bytes(path.read_bytes() + b"\n[deep]\nx = " + b"[" * 50_000 + b"]" * 50_000 + b"\n")
    forge.edit_receipt(forged, lambda r: r["experiment"].update(sha256=forge.sha(path.read_bytes())))
    forge.recite(forged, rel)
    result = sandbox.run("verify", forged)
    assert_outcome(sandbox, result, 1, rel)


def test_experiment_toml_just_under_the_cap(sandbox, forged):
    """Attack (own): the bundled experiment.toml (read under the same 64 MiB cap as JSON) grown
    to 16 MiB of empty arrays, re-cited: uncapped, verify peaks at 446 MiB (13 s)."""
    rel = f"probes/{forge.EXP_ID}/experiment.toml"
    path = forged / rel
    path.write_bytes(path.read_bytes() + b"\n[pad]\nx = [" + b",".join([b"[]"] * ((16 << 20) // 3)) + b"]\n")
    forge.edit_receipt(forged, lambda r: r["experiment"].update(sha256=forge.sha(path.read_bytes())))
    forge.recite(forged, rel)
    result = sandbox.run("verify", forged, timeout=60)
    assert_outcome(sandbox, result, 1, rel)


def test_large_worker_log(sandbox):
    """Attack (own): a 200 MiB startup log (a long-running server's log); gates reads it whole
    (uncapped: 592 MiB)."""
    paths = []
    for role in ("prefill", "decode"):
        path = sandbox.inputs / f"{role}.log"
        path.write_text(startup_log(role, RAISED, CONTEXT, canary=True))
        paths += ["--log", str(path)]
    serving = b"[2026-08-27 10:00:00] Decode batch. #running-req: 1, #token: 100, token usage: 0.00\n"
    with open(sandbox.inputs / "prefill.log", "ab") as log:
        log.write(serving * ((200 << 20) // len(serving)))
    result = sandbox.run("gates", *paths, "--out", sandbox.out, allow=(sandbox.out,), timeout=30)
    assert_outcome(sandbox, result, 3)


def test_gzip_bomb_member_is_refused_by_its_declared_size(sandbox, forged):
    """Regression guard: a member of 520 MiB (over the 512 MiB file cap) is refused
    from its header, without reading its data."""
    info, _ = forge.member("b/logs/bomb", tarfile.REGTYPE, b"")
    info.size = 520 << 20
    archive = sandbox.inputs / "bomb.tar.gz"
    gz = zlib.compressobj(1, zlib.DEFLATED, 31)
    with open(archive, "wb") as out:
        out.write(gz.compress(info.tobuf(tarfile.PAX_FORMAT)))
        for _ in range(520):
            out.write(gz.compress(b"\0" * (1 << 20)))
        out.write(gz.compress(b"\0" * 1024) + gz.flush())
    result = sandbox.run("verify", archive, timeout=30)
    assert_outcome(sandbox, result, 1, "file-too-large", "b/logs/bomb")

"""`report` (and `bundle pack`) say nothing `verify` would not (issue #11).

Every bundle here fails `kvprobe verify` (exit 1); `report` must refuse it the same way,
with one line naming the defect, whatever the format, and never render an export.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tarfile
import tempfile
from pathlib import Path

import pytest

from tests import forge
from tests.attacks.harness import assert_outcome, line_naming

pytestmark = pytest.mark.attack

FORMATS = ("markdown", "openvex", "intoto")
HEAD_RAW = "raw/head/probes/doors.json"


def forge_verdict(bundle) -> None:
    """The head's raw output now shows the bug persisting (re-cited, re-hashed); the receipt
    still says reproduced: `verify` recomputes 'not-reproduced' and calls the verdict forged."""
    raw = forge.load(bundle, HEAD_RAW)
    raw["cases"][0]["observations"]["enqueued"] = True
    (bundle / HEAD_RAW).write_bytes(forge.dumps(raw))
    forge.recite(bundle, HEAD_RAW)


@pytest.mark.parametrize("fmt", FORMATS)
def test_forged_verdict_gets_no_export(sandbox, forged, fmt):
    """Attack: a forged verdict, re-hashed. Today openvex says base affected / head fixed."""
    forge_verdict(forged)
    assert sandbox.run("verify", forged).code == 1
    result = sandbox.run("report", forged, "--format", fmt)
    assert_outcome(sandbox, result, 1, "forged-verdict")
    assert result.out == "", "an export was rendered for a bundle verify rejects"


def test_pack_refuses_a_forged_verdict(sandbox, forged):
    """Regression guard: `bundle pack` already verifies first and refuses."""
    forge_verdict(forged)
    result = sandbox.run("bundle", "pack", forged, "-o", sandbox.out)
    assert_outcome(sandbox, result, 2, "forged-verdict")
    assert not sandbox.out.exists()


def test_symlinked_receipt_outside_the_bundle(sandbox, forged):
    """Attack: receipt.json is a symlink to an identical copy outside the bundle."""
    outside = sandbox.inputs / "elsewhere.json"
    outside.write_bytes((forged / "receipt.json").read_bytes())
    (forged / "receipt.json").unlink()
    (forged / "receipt.json").symlink_to(outside)
    result = sandbox.run("report", forged, "--format", "openvex")
    assert_outcome(sandbox, result, 1, "symlink", "receipt.json")


def test_fifo_in_the_bundle_is_never_opened(sandbox, forged):
    """Attack: a FIFO where a log should be; opening it for reading blocks forever."""
    fifo = forged / "logs/base/probes/doors.stdout"
    fifo.unlink()
    os.mkfifo(fifo)
    result = sandbox.run("report", forged, "--format", "markdown", timeout=3)
    assert_outcome(sandbox, result, 1, "logs/base/probes/doors.stdout")


def test_socket_in_the_bundle_is_unreadable(sandbox, forged):
    """Attack: an entry no one can open (a UNIX socket; chmod 000 would not stop root)."""
    path = forged / "logs/base/probes/doors.stdout"
    path.unlink()
    short = Path(tempfile.mkdtemp(dir="/tmp", prefix="kv-sock-"))  # AF_UNIX paths are short
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(short / "s"))
        os.rename(short / "s", path)
    finally:
        os.rmdir(short)
    result = sandbox.run("report", forged, "--format", "markdown")
    assert_outcome(sandbox, result, 1, "logs/base/probes/doors.stdout")


@pytest.mark.parametrize("depth", [100, 100_000])
def test_deeply_nested_receipt(sandbox, forged, depth):
    """Attack: receipt nesting past verify's depth cap (100), or past Python's recursion limit."""
    path = forged / "receipt.json"
    nested = b"[" * depth + b"]" * depth
    path.write_bytes(path.read_bytes().replace(b'"cpus": 2', b'"cpus": 2, "deep": ' + nested, 1))
    forge.rehash(forged)
    result = sandbox.run("report", forged, "--format", "markdown")
    assert_outcome(sandbox, result, 1, "receipt.json", ("deep", "nest", "depth"))


def test_more_entries_than_verify_accepts(sandbox, forged):
    """Attack (own): 10,050 empty directories, past verify's 10,000-entry cap; report walks them all."""
    extra = forged / "logs" / "many"
    for i in range(10_050):
        (extra / str(i)).mkdir(parents=True)
    assert sandbox.run("verify", forged).code == 1
    result = sandbox.run("report", forged, "--format", "markdown")
    assert_outcome(sandbox, result, 1, "too-many-files")


def test_report_reads_a_tar_gz_as_verify_does(sandbox, forged):
    """`verify` accepts a .tar.gz; `report` must too (through the same reader)."""
    archive = forge.tar_of(forged, sandbox.inputs / "bundle.tar.gz")
    assert sandbox.run("verify", archive).code == 0
    result = sandbox.run("report", archive, "--format", "markdown")
    assert_outcome(sandbox, result, 0)
    assert "## kvprobe evidence: forge-exp" in result.out


def test_report_refuses_a_hostile_archive_as_verify_does(sandbox, forged):
    """A .tar.gz with a symlink member: report names the same defect verify does."""
    archive = forge.tar_of(
        forged, sandbox.inputs / "bundle.tar.gz", [forge.member("b/logs/evil", tarfile.SYMTYPE, None, "/etc/passwd")]
    )
    result = sandbox.run("report", archive, "--format", "markdown")
    assert_outcome(sandbox, result, 1, "archive-link-member", "b/logs/evil")


def test_infinite_number_does_not_crash_intoto(sandbox, forged):
    """Attack: `1e999` in the receipt parses as inf; the in-toto renderer then crashes."""
    path = forged / "receipt.json"
    path.write_bytes(path.read_bytes().replace(b'"checks_s": 0.1', b'"checks_s": 1e999', 1))
    forge.rehash(forged)
    result = sandbox.run("report", forged, "--format", "intoto")
    assert_outcome(sandbox, result, 1, "receipt.json", ("1e999", "non-finite", "infinity", "overflow"))


# --- issue #22: exports that say more than the bundle shows -----------------------------------


def test_relabelled_sweep_exports_say_they_are_unanchored_and_unshipped(sandbox):
    """Attack (#22 "Relabelled"): a copy of experiment A's sweep renamed, [vulnerability] set to a
    CVE and fix_kind "security". verify calls it self-consistent; today `report --format osv`
    writes a CVE record with exit 0 and no caveat. An advisory record (OSV, OpenVEX) of it is
    refused unless anchored or asked for with --allow-unanchored; every export says, inside
    itself and on stderr, that the bundle only agrees with itself and that kvprobe does not ship
    its experiment."""
    from tests.relabel import CVE, NEW_ID, relabelled_sweep

    bundle = relabelled_sweep(sandbox.inputs / "relabelled")
    assert sandbox.run("verify", bundle).code == 0
    for fmt in ("osv", "openvex"):
        refused = sandbox.run("report", bundle, "--format", fmt, "--author", "a <a@b>")
        assert_outcome(sandbox, refused, 1, "is not an experiment kvprobe ships")
        assert refused.out == ""
    osv = sandbox.run("report", bundle, "--format", "osv", "--allow-unanchored")
    assert_outcome(sandbox, osv, 0, "SELF-CONSISTENT ONLY")
    assert line_naming(osv.err, "UNSHIPPED EXPERIMENT", NEW_ID), osv.describe()
    record = json.loads(osv.out)
    assert record["id"] == CVE
    provenance = record["database_specific"]["kvprobe"]["provenance"]
    assert provenance["experiment_shipped_by_kvprobe"] is False
    assert provenance["anchor"].startswith("none")
    assert record["details"].startswith("SELF-CONSISTENT ONLY") and "UNSHIPPED EXPERIMENT" in record["details"]
    vex = json.loads(
        sandbox.run("report", bundle, "--format", "openvex", "--author", "a <a@b>", "--allow-unanchored").out
    )
    assert all("UNSHIPPED EXPERIMENT" in s["status_notes"] for s in vex["statements"])
    md = sandbox.run("report", bundle, "--format", "markdown").out
    assert "**Caveat:** SELF-CONSISTENT ONLY" in md and "**Caveat:** UNSHIPPED EXPERIMENT" in md
    # a published digest anchors the bundle; the experiment is still not one kvprobe ships
    digest = hashlib.sha256((bundle / "manifest.json").read_bytes()).hexdigest()
    anchored = sandbox.run("report", bundle, "--format", "osv", "--expect-manifest-sha256", digest)
    assert_outcome(sandbox, anchored, 0, "UNSHIPPED EXPERIMENT")
    assert "SELF-CONSISTENT" not in anchored.err
    wrong = sandbox.run("report", bundle, "--format", "osv", "--expect-manifest-sha256", "0" * 64)
    assert_outcome(sandbox, wrong, 1, "manifest")
    assert wrong.out == ""

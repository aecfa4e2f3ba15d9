"""`verify` through the CLI: what it already refuses (regression guards), and what it lets by.

tests/unit/verify/test_verify.py has the full forge suite in process; these few cases run as a
user runs them (subprocess, private HOME and temp dir) so the tier's harness checks them
for writes, code, memory and hangs too.
"""

from __future__ import annotations

import os
import tarfile

import pytest

from tests import forge
from tests.attacks.harness import MODEL_BUNDLE, assert_outcome, copy_committed

pytestmark = pytest.mark.attack


def test_forged_verdict_is_refused(sandbox, forged):
    """Regression guard: the raw outputs say not reproduced, the re-hashed receipt says reproduced."""
    raw = forge.load(forged, "raw/head/probes/doors.json")
    raw["cases"][0]["observations"]["enqueued"] = True
    (forged / "raw/head/probes/doors.json").write_bytes(forge.dumps(raw))
    forge.recite(forged, "raw/head/probes/doors.json")
    result = sandbox.run("verify", forged)
    assert_outcome(sandbox, result, 1, "forged-verdict", "receipt.json")


def _unstable(bundle):
    """``bundle`` as run --repeat 3 writes it, head's run 3 seeing the bug: could-not-observe."""
    again = {side: [forge.probe_doc(side), forge.probe_doc(side)] for side in ("base", "head")}
    again["head"][1]["cases"][0]["observations"]["enqueued"] = True
    forge.add_repeats(bundle, again)


def test_a_receipt_claiming_its_repeats_agreed_is_refused(sandbox, forged):
    """The repeats differ; the re-hashed receipt drops that and claims the verdict of one run."""
    _unstable(forged)

    def claim_stable(receipt):
        receipt["comparison"]["unstable"]["head"] = {}
        receipt["verdict"] = receipt["comparison"]["verdict"] = "reproduced"

    forge.edit_receipt(forged, claim_stable)
    result = sandbox.run("verify", forged)
    assert_outcome(sandbox, result, 1, "forged-verdict", "receipt.json")


def test_a_receipt_that_drops_the_repeat_that_differed_is_refused(sandbox, forged):
    _unstable(forged)
    forge.edit_receipt(forged, lambda r: r["sides"]["head"]["probes"][0]["repeats"].pop())
    result = sandbox.run("verify", forged)
    assert_outcome(sandbox, result, 1, "record-mismatch", "receipt.json")


def test_fifo_is_never_opened(sandbox, forged):
    """Regression guard: a FIFO in the bundle is reported, never opened (no hang)."""
    fifo = forged / "logs/base/probes/doors.stdout"
    fifo.unlink()
    os.mkfifo(fifo)
    result = sandbox.run("verify", forged, timeout=10)
    assert_outcome(sandbox, result, 1, "special-file", "logs/base/probes/doors.stdout")


@pytest.mark.parametrize("name", ["b/../../pwned", "/tmp/kvprobe-attack-absolute-pwned"])
def test_archive_member_escaping_the_extraction_dir(sandbox, forged, name):
    """Regression guard: '..' and absolute member names are refused before anything is written."""
    archive = forge.tar_of(forged, sandbox.inputs / "t.tar.gz", [forge.member(name, tarfile.REGTYPE, b"pwned\n")])
    result = sandbox.run("verify", archive)
    assert_outcome(sandbox, result, 1, "archive-traversal", name)
    assert not os.path.exists("/tmp/kvprobe-attack-absolute-pwned")


def test_homoglyph_experiment_id_is_refused(sandbox, forged):
    """Regression guard: an experiment id with a Cyrillic a (U+0430, looks like experiment-a) fails the schema."""
    forge.edit_receipt(forged, lambda r: r["experiment"].update(id="experiment-\u0430"))
    result = sandbox.run("verify", forged)
    assert_outcome(sandbox, result, 1, "schema-violation", "receipt.json")


def test_readme_that_contradicts_the_receipt(sandbox):
    """Attack (own): the model bundle's README.md (what a reviewer reads first) is rewritten to
    claim an SGLang leak was reproduced on GPUs, then re-hashed; nothing ties it to the receipt."""
    bundle = copy_committed(MODEL_BUNDLE, sandbox)
    (bundle / "README.md").write_text(
        "# experiment-a: SGLang 0.5.21 leaks KV cache across tenants\n\n"
        "Verdict: **reproduced** on 8x H100 with real model weights.\n"
    )
    forge.rehash(bundle)
    result = sandbox.run("verify", bundle)
    assert_outcome(sandbox, result, 1, "README.md")

"""A receipt's probe records (what each probe set away from its default, what its mocks absorbed)
are derived from the raw outputs, so `verify` recomputes them (issue #12 §2): a publisher who
hides a setting that made the probe reach its door, or claims mocks stood in for less than they
did, and re-hashes everything consistently, is refused in step 4 with one line, exit 1.

Run receipts state them in ``evidence``; gates receipts per gate-2 probe in ``probes[]``.
"""

from __future__ import annotations

import json

import pytest

from tests import forge, forge_gate2
from tests.attacks.harness import assert_outcome

pytestmark = pytest.mark.attack

HICACHE = {"name": "enable_hicache_storage", "value": True, "default": False, "why": "reach the door", "case": None}
ABSORBED = {"case": "reject", "mock": "sender", "call": "sender.send", "count": 1}


@pytest.mark.parametrize("key", ["configuration", "absorbed"])
def test_run_receipt_stating_records_its_raw_output_lacks(sandbox, forged, key):
    """Attack: the raw output is rewritten without the setting (or the absorbed call) and
    re-cited; the receipt still states it."""
    rel = f"raw/head/probes/{forge.PROBE}.json"
    raw = forge.load(forged, rel)
    raw[key] = []
    (forged / rel).write_bytes(forge.dumps(raw))
    forge.recite(forged, rel)
    result = sandbox.run("verify", forged)
    assert_outcome(sandbox, result, 1, "record-mismatch", f"evidence.{key}")


@pytest.fixture
def grafted(gates_bundle):
    """The real gates bundle with gate 2 grafted as `kvprobe gates --sglang` leaves it
    (tests/forge_gate2.py): its first probe's output states one setting and one absorbed call."""
    outputs = forge_gate2.as_fixed()
    outputs["experiment-a"]["admission_doors"].update(configuration=[HICACHE], absorbed=[ABSORBED])
    forge_gate2.graft(gates_bundle, written=outputs)
    return gates_bundle


def test_a_gates_receipt_whose_probe_records_match_verifies(sandbox, grafted):
    """The control: the same bundle, its records those of the raw output, verifies."""
    result = sandbox.run("verify", grafted)
    assert result.code == 0, result.describe()


@pytest.mark.parametrize(
    ("key", "stated"),
    [
        ("configuration", []),  # the setting that reached the door, hidden
        ("configuration", [{**HICACHE, "value": False}]),  # stated as its default
        ("absorbed", []),  # the mock's stand-in hidden
        ("absorbed", [ABSORBED, {**ABSORBED, "call": "sender.poll"}]),  # more than the output shows
    ],
)
def test_a_gates_receipt_stating_records_its_raw_output_does_not_support(sandbox, grafted, key, stated):
    """Attack: gate 2's probe record states other settings or absorbed calls than its raw
    output; the receipt and manifest are re-hashed consistently."""
    receipt = json.loads((grafted / "receipt.json").read_bytes())
    receipt["probes"][0][key] = stated
    (grafted / "receipt.json").write_bytes(forge.dumps(receipt))
    forge.rehash(grafted)
    result = sandbox.run("verify", grafted)
    assert_outcome(sandbox, result, 1, "record-mismatch", f"{key} differs from the raw output")


def test_a_gates_receipt_dropping_its_probe_records_is_refused(sandbox, grafted):
    """Attack: the keys removed outright, as if written before probes recorded them, while
    the raw output records a setting."""
    receipt = json.loads((grafted / "receipt.json").read_bytes())
    del receipt["probes"][0]["configuration"]
    (grafted / "receipt.json").write_bytes(forge.dumps(receipt))
    forge.rehash(grafted)
    result = sandbox.run("verify", grafted)
    assert_outcome(sandbox, result, 1, "record-mismatch", "configuration is missing")

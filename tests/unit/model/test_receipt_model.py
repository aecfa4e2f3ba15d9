"""The typed receipt (model/receipt) reads and writes every receipt kvprobe wrote, byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvprobe.files import json_bytes
from kvprobe.model.receipt import FileRef, Receipt
from kvprobe.model.records import Verdict

ROOT = Path(__file__).resolve().parents[3]
RUN_RECEIPTS = sorted(
    p for p in (ROOT / "bundles").glob("*/receipt.json") if json.loads(p.read_bytes())["schema"] == "kvprobe.receipt/1"
)


def test_there_are_committed_run_receipts_to_read():
    assert len(RUN_RECEIPTS) >= 3


@pytest.mark.parametrize("path", RUN_RECEIPTS, ids=[p.parent.name for p in RUN_RECEIPTS])
def test_a_committed_receipt_round_trips_to_the_same_bytes(path):
    data = path.read_bytes()
    receipt = Receipt.from_json(json.loads(data))
    assert json_bytes(receipt.to_json()) == data
    assert receipt.verdict is Verdict.REPRODUCED
    assert all(isinstance(p.source, FileRef) for side in receipt.sides.values() for p in side.probes)


def test_optional_keys_stay_absent_and_unknown_comparison_keys_are_kept():
    doc = json.loads(RUN_RECEIPTS[0].read_bytes())
    doc["experiment"].pop("vulnerability", None)
    doc["evidence"].pop("configuration", None)
    doc["comparison"]["added_by_a_later_algorithm"] = {"x": 1}
    out = Receipt.from_json(doc).to_json()
    assert "vulnerability" not in out["experiment"] and "configuration" not in out["evidence"]
    assert out == doc

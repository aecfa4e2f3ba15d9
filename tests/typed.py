"""Typed receipts for unit tests of readers: a committed run receipt with the parts a test
sets replaced (readers take :class:`~kvprobe.model.receipt.Receipt`, never a dict)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from kvprobe.model.receipt import Comparison, EvidenceScope, Receipt
from kvprobe.model.records import Verdict

ROOT = Path(__file__).resolve().parents[1]


def model_receipt() -> Receipt:
    """The committed model bundle's receipt."""
    return Receipt.from_json(json.loads(next((ROOT / "bundles").glob("model-model-*/receipt.json")).read_text()))


def run_receipt(comparison: dict[str, Any], **changes: Any) -> Receipt:
    """The model bundle's receipt with ``comparison`` (compare's output) and its verdict, and
    ``changes`` (``mocks``: the evidence's; any other: a field of the receipt)."""
    base = model_receipt()
    if "mocks" in changes:
        changes["evidence"] = dataclasses.replace(base.evidence, mocks=changes.pop("mocks"))
    assert isinstance(changes.get("evidence", base.evidence), EvidenceScope)
    return dataclasses.replace(
        base, comparison=Comparison.from_json(comparison), verdict=Verdict(comparison["verdict"]), **changes
    )

"""The one typed entry for a receipt read back: :func:`load` dispatches on its schema id.

Every reader past verification (the exports, the console, the rerun, the expectations
recorder, the sweep driver) takes the receipt as :data:`AnyReceipt` from here and reads
attributes; only the model turns a receipt into a dict and back. ``load(doc).to_json() == doc``
for every version verify accepts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvprobe.errors import SchemaError
from kvprobe.model.gates_receipt import GatesReceipt
from kvprobe.model.receipt import Receipt
from kvprobe.model.sweep_receipt import SweepReceipt
from kvprobe.names import (
    GATES_RECEIPT_SCHEMA,
    GATES_RECEIPT_SCHEMA_1,
    GATES_RECEIPT_SCHEMA_2,
    GATES_RECEIPT_SCHEMA_3,
    RECEIPT_SCHEMA,
    SWEEP_RECEIPT_SCHEMA,
)

AnyReceipt = Receipt | SweepReceipt | GatesReceipt

# Each receipt version verify accepts, and the model that reads it.
READS: dict[str, type[AnyReceipt]] = {
    RECEIPT_SCHEMA: Receipt,
    SWEEP_RECEIPT_SCHEMA: SweepReceipt,
    GATES_RECEIPT_SCHEMA: GatesReceipt,
    GATES_RECEIPT_SCHEMA_3: GatesReceipt,
    GATES_RECEIPT_SCHEMA_2: GatesReceipt,
    GATES_RECEIPT_SCHEMA_1: GatesReceipt,
}


def load(doc: Mapping[str, Any]) -> AnyReceipt:
    """The typed receipt of ``doc``, a receipt that passed its schema (verify's step 2, or the
    schema check before a write): this reads, it does not check. Raises SchemaError for a
    schema id no model reads."""
    version = doc.get("schema")
    model = READS.get(version) if isinstance(version, str) else None
    if model is None:
        raise SchemaError(f"receipt schema {version!r} is not one this kvprobe reads ({', '.join(sorted(READS))})")
    return model.from_json(doc)

"""rules/gate_scope: kvprobe's statement of what a gates receipt's evidence shows, per version."""

from __future__ import annotations

from kvprobe.model.load import READS
from kvprobe.names import GATES_RECEIPT_SCHEMA
from kvprobe.rules.gate_scope import STATEMENTS, scope


def test_every_gates_receipt_version_verify_reads_has_its_statement():
    gates_versions = {v for v in READS if v.startswith("kvprobe.gates-receipt/")}
    assert set(STATEMENTS) == gates_versions


def test_the_statement_says_what_no_gates_bundle_shows_and_names_the_host():
    stated = scope(GATES_RECEIPT_SCHEMA, {"system": "Linux", "machine": "x86_64"})
    assert stated["layer"] == "deployment"
    assert stated["does_not_show"][0].startswith("that no cross-request KV exposure happened or can happen")
    assert stated["limits"][0] == "host: Linux x86_64, CPU only"

"""OpenVEX naming, authorship and timestamps; in-toto checked with the official bindings;
formats are assertions in kvprobe's schema checks (jsonschema's format checker)."""

from __future__ import annotations

from kvprobe import schema
from kvprobe.exports import openvex
from tests.unit.test_report import make_receipt, view_of


def test_openvex_timestamp_that_is_no_date_time_fails_validation():
    doc = openvex.openvex(view_of(make_receipt()))
    assert schema.errors(doc, "openvex/0.2.0") == []
    doc["timestamp"] = "yesterday at noon"
    assert schema.errors(doc, "openvex/0.2.0") == ["timestamp: 'yesterday at noon' is not a 'date-time'"]
    doc["timestamp"], doc["@id"] = "2026-01-01T00:00:00Z", "not an iri"
    assert schema.errors(doc, "openvex/0.2.0") == ["@id: 'not an iri' is not a 'iri'"]

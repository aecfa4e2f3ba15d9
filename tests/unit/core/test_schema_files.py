"""Every schema kvprobe ships is a valid Draft 2020-12 schema (checked here, not at runtime)."""

import json

import pytest
from jsonschema import Draft202012Validator

from kvprobe import schema
from kvprobe.resources import schemas_dir


@pytest.mark.parametrize("version", sorted(v for v, f in schema.KNOWN.items() if (schemas_dir() / f).is_file()))
def test_shipped_schema_is_valid(version):
    doc = json.loads((schemas_dir() / schema.KNOWN[version]).read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(doc)

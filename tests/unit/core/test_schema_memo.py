"""schema.errors keeps outcomes by canonical JSON text: the same answer as a fresh walk, never
one earned by a different document."""

from __future__ import annotations

import copy
import json
from enum import StrEnum

import pytest

from kvprobe import schema
from kvprobe.names import FORKSERVER_REPLY_SCHEMA, MANIFEST_SCHEMA, RECEIPT_SCHEMA

GOOD = {"schema": MANIFEST_SCHEMA, "files": [{"path": "receipt.json", "size": 1, "sha256": "0" * 64}]}


@pytest.fixture(autouse=True)
def _empty_memo(monkeypatch):
    monkeypatch.setattr(schema, "_checked", type(schema._checked)())


def _fresh(document, version, definition=None):
    """What the validator says with nothing kept."""
    schema._checked.clear()
    return schema.errors(document, version, definition)


def test_a_kept_outcome_is_the_fresh_one_for_valid_and_invalid_documents():
    bad = {**GOOD, "files": [{"path": "../x", "size": -1, "sha256": "not hex"}], "extra": 1}
    for doc in (GOOD, bad):
        want = _fresh(copy.deepcopy(doc), MANIFEST_SCHEMA)
        assert schema.errors(doc, MANIFEST_SCHEMA) == want  # first check: kept
        assert schema.errors(json.loads(json.dumps(doc)), MANIFEST_SCHEMA) == want  # an equal twin
    assert _fresh(bad, MANIFEST_SCHEMA) != []


def test_a_document_changed_in_place_is_checked_again():
    doc = copy.deepcopy(GOOD)
    assert schema.errors(doc, MANIFEST_SCHEMA) == []
    doc["files"][0]["sha256"] = "not hex"
    assert schema.errors(doc, MANIFEST_SCHEMA) != []


def test_the_version_and_definition_are_part_of_what_is_kept():
    assert schema.errors(GOOD, MANIFEST_SCHEMA) == []
    assert schema.errors(GOOD, RECEIPT_SCHEMA) != []
    pid = {"pid": 12}
    assert schema.errors(pid, FORKSERVER_REPLY_SCHEMA, "pid") == _fresh(pid, FORKSERVER_REPLY_SCHEMA, "pid")
    assert schema.errors(pid, FORKSERVER_REPLY_SCHEMA, "hello") == _fresh(pid, FORKSERVER_REPLY_SCHEMA, "hello")
    assert _fresh(pid, FORKSERVER_REPLY_SCHEMA, "pid") != _fresh(pid, FORKSERVER_REPLY_SCHEMA, "hello")


class Kind(StrEnum):
    SCHEMA = MANIFEST_SCHEMA


@pytest.mark.parametrize(
    "twin",
    [
        {**GOOD, "files": ({"path": "receipt.json", "size": 1, "sha256": "0" * 64},)},  # dumps like a list
        {**GOOD, "schema": Kind.SCHEMA},  # a str enum dumps like its value
        {**GOOD, "files": [{1: "x", "path": "r", "size": 1, "sha256": "0" * 64}]},  # an int key: a str
    ],
)
def test_a_document_of_other_than_jsons_types_never_borrows_an_outcome(twin):
    plain = json.loads(json.dumps(twin))
    schema.errors(plain, MANIFEST_SCHEMA)  # kept under the text both dump to
    assert schema.errors(twin, MANIFEST_SCHEMA) == _fresh(twin, MANIFEST_SCHEMA)
    assert schema._memo_key(twin, MANIFEST_SCHEMA, None) is None


def test_what_is_kept_is_bounded_and_the_oldest_goes_first(monkeypatch):
    monkeypatch.setattr(schema, "_CHECKED_MAX", 3)
    docs = [{**GOOD, "files": [{"path": f"f{i}", "size": i, "sha256": "0" * 64}]} for i in range(5)]
    for doc in docs:
        schema.errors(doc, MANIFEST_SCHEMA)
    kept = [schema._memo_key(d, MANIFEST_SCHEMA, None) in schema._checked for d in docs]
    assert kept == [False, False, True, True, True]


def test_a_caller_changing_the_list_it_got_changes_nothing_kept():
    bad = {**GOOD, "extra": 1}
    first = schema.errors(bad, MANIFEST_SCHEMA)
    first.append("mine")
    assert schema.errors(bad, MANIFEST_SCHEMA) == first[:-1]

"""The only jsonschema user: load kvprobe's own schemas and validate documents."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from functools import cache
from typing import TYPE_CHECKING, Any

from kvprobe.errors import SchemaError
from kvprobe.names import (
    EXPERIMENT_SCHEMA,
    FIX_MARKERS_SCHEMA,
    FORKSERVER_REPLY_SCHEMA,
    GATES_RECEIPT_SCHEMA,
    GATES_RECEIPT_SCHEMA_1,
    GATES_RECEIPT_SCHEMA_2,
    GATES_RECEIPT_SCHEMA_3,
    MANIFEST_SCHEMA,
    PROBE_OUTPUT_SCHEMA,
    RECEIPT_SCHEMA,
    SWEEP_RECEIPT_SCHEMA,
)
from kvprobe.resources import schemas_dir

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator, FormatChecker

# Schema documents kvprobe knows, by the version string documents carry.
KNOWN = {
    EXPERIMENT_SCHEMA: "experiment.schema.json",
    RECEIPT_SCHEMA: "receipt.schema.json",
    MANIFEST_SCHEMA: "manifest.schema.json",
    PROBE_OUTPUT_SCHEMA: "probe-output.schema.json",
    GATES_RECEIPT_SCHEMA: "gates-receipt.schema.json",
    GATES_RECEIPT_SCHEMA_1: "gates-receipt-1.schema.json",
    GATES_RECEIPT_SCHEMA_2: "gates-receipt-2.schema.json",
    GATES_RECEIPT_SCHEMA_3: "gates-receipt-3.schema.json",
    SWEEP_RECEIPT_SCHEMA: "sweep-receipt.schema.json",
    FIX_MARKERS_SCHEMA: "fix-markers.schema.json",
    FORKSERVER_REPLY_SCHEMA: "forkserver-reply.schema.json",
    # Third-party formats `kvprobe report` writes (schemas/vendor/README.md says where from).
    "openvex/0.2.0": "vendor/openvex-0.2.0.schema.json",
    "in-toto/statement-v1": "vendor/in-toto-statement-v1.schema.json",
    "osv": "vendor/osv-schema.json",
}

# Versions this kvprobe no longer reads, and why: an honest refusal, not "upgrade kvprobe".
RETIRED = {
    "kvprobe.sweep-receipt/1": "kvprobe.sweep-receipt/1 is no longer read: it records no release listing, so "
    "whether its releases are complete, in order and the index's own cannot be checked; sweep again with "
    "this kvprobe (it writes kvprobe.sweep-receipt/2)",
}


@cache
def _validator(version: str, definition: str | None = None) -> Draft202012Validator:
    from jsonschema import Draft202012Validator

    if version in RETIRED:
        raise SchemaError(RETIRED[version])
    try:
        filename = KNOWN[version]
    except KeyError:
        raise SchemaError(
            f"unknown schema version {version!r}: this kvprobe knows {', '.join(sorted(KNOWN))}; upgrade kvprobe"
        ) from None
    with open(schemas_dir() / filename, encoding="utf-8") as handle:
        schema = json.load(handle)
    if definition is not None:  # one of the file's $defs (a protocol's messages), checked as a whole
        if definition not in schema.get("$defs", {}):
            raise SchemaError(f"{filename} defines no {definition!r}")
        schema = {**schema, "$ref": f"#/$defs/{definition}"}
    # No check_schema() here: checking against the meta-schema costs ~100 ms per process
    # (half of `kvprobe list`); the shipped schemas are checked once, by a unit test.
    return Draft202012Validator(schema, format_checker=_format_checker())


@cache
def _format_checker() -> FormatChecker:
    """Formats are assertions, not annotations: an OpenVEX timestamp "yesterday at noon" or an
    @id that is no IRI fails. date-time is jsonschema's own check (rfc3339-validator); iri and
    uri are checked here, because the format-nongpl extra's IRI parser compiles a grammar at
    import (~1.5 s of CPU on every `verify` and `report`)."""
    from jsonschema import FormatChecker

    # RFC 3987/3986 absolute references: a scheme, then no whitespace, controls or characters
    # the grammar never allows (<>"{}|\^`); uri is the same in ASCII. Compiled here, not at
    # import: the uri class costs ~5 ms, and `kvprobe list` loads experiments unvalidated.
    iri = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:[^\s\x00-\x1f\x7f<>\"{}|\\^`]+")
    uri = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:[^\s\x00-\x1f\x7f-\U0010ffff<>\"{}|\\^`]+")
    checker = FormatChecker(formats=("date-time",))
    checker.checks("iri")(lambda value: not isinstance(value, str) or iri.fullmatch(value) is not None)
    checker.checks("uri")(lambda value: not isinstance(value, str) or uri.fullmatch(value) is not None)
    return checker


def errors(document: Any, version: str, definition: str | None = None) -> list[str]:
    """Every violation as 'field.path: message', sorted by path; empty when valid. With
    ``definition``, ``document`` is checked against that entry of the schema's ``$defs``."""
    key = _memo_key(document, version, definition)
    if key is not None:
        with _checked_lock:
            kept = _checked.get(key)
            if kept is not None:
                _checked.move_to_end(key)
                return list(kept)
    found = []
    for err in _validator(version, definition).iter_errors(document):
        where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        found.append(f"{where}: {err.message}")
    found.sort()
    if key is not None:
        with _checked_lock:
            _checked[key] = tuple(found)
            while len(_checked) > _CHECKED_MAX:
                _checked.popitem(last=False)
    return found


def validate(document: Any, version: str, *, source: str) -> None:
    """Raise SchemaError naming ``source`` and the first offending field."""
    problems = errors(document, version)
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise SchemaError(f"{source}: {problems[0]}{more}", hints=problems[1:20])


# Validation is a pure function of the schema and the JSON text, and the same document is
# checked again and again in one process: a bundle verified on write, then by verify, then by
# each export; one probe output per check in a sweep's units and its verify. jsonschema walks
# ~50x slower than the C json codec, so the outcome is kept per canonical text (by digest, to
# bound memory), for the last _CHECKED_MAX documents.
_CHECKED_MAX = 512
_checked: OrderedDict[tuple[str, str | None, bytes], tuple[str, ...]] = OrderedDict()
_checked_lock = threading.Lock()  # a sweep's units and the env build check from threads


def _memo_key(document: Any, version: str, definition: str | None) -> tuple[str, str | None, bytes] | None:
    """The document's canonical JSON digest, or None unless it is made of JSON's own types
    only: a tuple, a str enum or an int key dumps like a list, a str or a str key, but a
    validator sees (and its messages name) the original."""
    if not _plain(document):
        return None
    try:
        text = json.dumps(document, sort_keys=True, ensure_ascii=False)
    except (ValueError, RecursionError):
        return None
    return version, definition, hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _plain(document: Any) -> bool:
    """Whether every node's type is exactly one of JSON's (dict with str keys, list, scalars)."""
    stack = [document]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is dict:
            if any(type(k) is not str for k in node):
                return False
            stack.extend(node.values())
        elif kind is list:
            stack.extend(node)
        elif kind not in _SCALARS:
            return False
    return True

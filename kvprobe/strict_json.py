"""Strict JSON for untrusted documents: UTF-8 only, no duplicate keys, no NaN/Infinity, caps.

Caps bound memory before parsing: bytes (a size cap per document) and values (commas,
colons and brackets counted in the raw bytes: a parsed value costs ~60 bytes of Python
objects, so a few MiB of ``[],[],…`` would otherwise become hundreds of MiB). Numbers that
overflow to infinity (``1e999``) are refused like ``Infinity`` itself.

``loads`` raises a JSON defect (kvprobe.defects) naming the document's path; ``load_document``
is the same parse for documents read outside verification, raising SchemaError (exit 2).
"""

from __future__ import annotations

import json
import math
from typing import Any

from kvprobe.defects import (
    BundleDefect,
    JsonDuplicateKey,
    JsonMalformed,
    JsonNonFinite,
    JsonNotUtf8,
    JsonTooDeep,
    JsonTooLarge,
)
from kvprobe.errors import SchemaError

# The caps a bundle reader starts from (kvprobe.evidence.safetree.Limits can raise them).
MAX_BYTES = 64 << 20
MAX_DEPTH = 64
MAX_VALUES = 250_000


class _Duplicate(ValueError):
    pass


class _NonFinite(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for key, value in pairs:
        if key in doc:
            raise _Duplicate(key)
        doc[key] = value
    return doc


def _constant(name: str) -> Any:
    raise _NonFinite(name)


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NonFinite(f"{text[:40]} overflows to infinity and")
    return value


def value_bound(data: bytes) -> int:
    """An upper bound on the values in a JSON text (separators and openers, strings included)."""
    return data.count(b",") + data.count(b":") + data.count(b"[") + data.count(b"{") + 1


def depth(doc: Any) -> int:
    """Nesting depth without recursion (a hostile document must not blow the stack)."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            node = list(node.values())
        if isinstance(node, list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in node)
    return deepest


def loads(
    data: bytes, path: str, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH, max_values: int = MAX_VALUES
) -> Any:
    """Parse ``data`` strictly; raises a BundleDefect subclass naming ``path``."""
    if len(data) > max_bytes:
        raise JsonTooLarge(path, f"{len(data)} bytes > cap {max_bytes}")
    if value_bound(data) > max_values:
        raise JsonTooLarge(path, f"more than {max_values} values (separators counted before parsing)")
    if data.startswith(b"\xef\xbb\xbf"):
        raise JsonNotUtf8(path, "starts with a byte-order mark")
    try:
        text = data.decode("utf-8", "strict")
    except UnicodeDecodeError as exc:
        raise JsonNotUtf8(path, f"invalid UTF-8 at byte {exc.start}") from None
    try:
        doc = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant, parse_float=_float)
    except _Duplicate as exc:
        raise JsonDuplicateKey(path, f"duplicate key {exc.args[0]!r}") from None
    except _NonFinite as exc:
        raise JsonNonFinite(path, f"non-finite number: {exc.args[0]} is not valid JSON") from None
    except RecursionError:
        raise JsonTooDeep(path, f"nested deeper than {max_depth}") from None
    except ValueError as exc:  # JSONDecodeError, over-long integers
        raise JsonMalformed(path, str(exc)) from None
    if depth(doc) > max_depth:
        raise JsonTooDeep(path, f"nested deeper than {max_depth}")
    return doc


def load_document(data: bytes, source: str) -> Any:
    """``loads`` with the default caps; raises SchemaError naming ``source`` instead of a defect."""
    try:
        return loads(data, source)
    except BundleDefect as defect:
        raise SchemaError(f"{source}: not strict JSON: {defect.detail}") from None

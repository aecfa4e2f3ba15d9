"""Write TOML text by hand (tomllib only reads): keys and values that read back exactly.

Only what experiment files need: strings, booleans, 64-bit integers, finite floats, and
arrays / inline tables of those. Anything else raises ValueError, so a caller can skip
the value and say so instead of writing something that reads back different.
"""

from __future__ import annotations

import math
import re
from typing import Any

_BARE_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")
_INT64 = (-(1 << 63), (1 << 63) - 1)
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        elif 0xD800 <= ord(ch) <= 0xDFFF:
            raise ValueError(f"string {text!r} holds a lone surrogate, which TOML cannot carry")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def key(name: str) -> str:
    """A key as written in a table: bare when it can be, quoted otherwise ('a.b' is quoted)."""
    return name if _BARE_KEY_RE.fullmatch(name) else string(name)


def value(item: Any) -> str:
    """One value; ValueError for None, NaN/Infinity, ints beyond 64 bits and other types."""
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, int):
        if not _INT64[0] <= item <= _INT64[1]:
            raise ValueError(f"integer {item} does not fit TOML's 64 bits")
        return str(item)
    if isinstance(item, float):
        if math.isnan(item) or math.isinf(item):
            raise ValueError(f"{item} has no exact TOML spelling here")
        return repr(item)
    if isinstance(item, str):
        return string(item)
    if isinstance(item, (list, tuple)):
        return "[" + ", ".join(value(x) for x in item) + "]"
    if isinstance(item, dict):
        return "{" + ", ".join(f"{string(str(k))} = {value(v)}" for k, v in item.items()) + "}"
    if item is None:
        raise ValueError("TOML has no null")
    raise ValueError(f"{type(item).__name__} is not a TOML value")

"""Untrusted text made safe for where it goes: a terminal, Markdown, a shell, JSON.

Every string kvprobe did not write itself (a bundle's receipt, a tar member name, a log line,
an experiment file from ./probes) passes one of these before it is shown. The terminal and
JSON forms are idempotent: escaping twice gives the same text as escaping once.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

# C0 and C1 controls, DEL, and the format characters that reorder or hide text (bidi
# embeddings, overrides and isolates, marks, zero-width characters, the BOM): a terminal
# acts on the first group, and the second makes what a reader sees differ from the bytes.
_FORMAT = "\u061c\u115f\u1160\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2069\u3164\ufeff\ufff9-\ufffb"
_INVISIBLE = "\x00-\x1f\x7f-\x9f" + _FORMAT
_UNSAFE = re.compile(f"[{_INVISIBLE}]")
_UNSAFE_OR_SPACE = re.compile(f"[{_INVISIBLE}]|\\s")
_JSON_UNSAFE = re.compile(f"[\x7f-\x9f{_FORMAT}]")  # what json.dumps(ensure_ascii=False) leaves raw
# An entity already present (kept: it renders as text), or a character that could start
# HTML, a link or image, code, emphasis, a table cell; `#` only where it could make a
# heading, `_` only where it could open or close emphasis (not inside a_name).
_MD_ENTITY_OR_SPECIAL = re.compile(
    r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});"
    r"|[&<>\[\]\\`*~|]|^#|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])"
)


def _visible(char: str) -> str:
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def for_terminal(text: Any) -> str:
    """``text`` on one line with every control and invisible format character shown as an
    escape (``\\x1b``, ``\\u202e``): no escape sequence reaches the terminal and no bidi
    control reorders what is printed. Tabs and line breaks are escaped too, so one record
    stays one line."""
    return _UNSAFE.sub(lambda m: _visible(m.group()), str(text))


def for_markdown(text: Any) -> str:
    """``text`` as inert Markdown prose on one line: controls shown as escapes, whitespace
    collapsed, and every character that could start HTML, a link, an image, emphasis, code,
    a heading or a table cell written as a numeric entity. Entities already present are kept
    as they are (they render as text), which makes this idempotent."""
    flat = " ".join(_UNSAFE_OR_SPACE.sub(_markdown_space, str(text)).split())
    return _MD_ENTITY_OR_SPECIAL.sub(_entity, flat)


def _markdown_space(match: re.Match[str]) -> str:
    char = match.group()
    return " " if char in " \t\n\r\f\v" else _visible(char)


def _entity(match: re.Match[str]) -> str:
    found = match.group()
    return found if len(found) > 1 else f"&#{ord(found)};"


def for_shell(argument: Any) -> str:
    """One shell word that ``sh`` reads back as exactly ``argument`` (shlex.quote)."""
    return shlex.quote(str(argument))


def for_json(document_text: str) -> str:
    """JSON text with every invisible format character written as a ``\\uXXXX`` escape: the
    same document for a parser, no Trojan Source reordering for a reader. ``json.dumps``
    already escapes C0 controls; this covers what ``ensure_ascii=False`` leaves raw."""
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", document_text)

"""`kvprobe report`: render a bundle in one format; JSON formats pass their vendored schema first."""

from __future__ import annotations

import json
from pathlib import Path

from kvprobe import files, schema
from kvprobe.errors import UsageError
from kvprobe.exports.bundle_view import BundleView
from kvprobe.exports.intoto import INTOTO_SCHEMA, intoto
from kvprobe.exports.markdown import markdown
from kvprobe.exports.openvex import OPENVEX_SCHEMA, openvex

FORMATS = ("markdown", "openvex", "intoto")


def render(view: BundleView, fmt: str, *, author: str = "kvprobe") -> str:
    """The text to write for ``fmt``; JSON formats pass their schema first (SchemaError if not)."""
    if fmt == "markdown":
        return markdown(view)
    if fmt == "openvex":
        doc, version = openvex(view, author=author), OPENVEX_SCHEMA
    elif fmt == "intoto":
        doc, version = intoto(view), INTOTO_SCHEMA
    else:
        raise UsageError(f"unknown report format {fmt!r}; choose one of {', '.join(FORMATS)}")
    schema.validate(doc, version, source=f"{fmt} document")
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically; UsageError when its directory does not exist."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise UsageError(f"{path}: directory {directory} does not exist")
    files.write_atomic(path, text.encode("utf-8"))

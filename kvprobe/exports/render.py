"""`kvprobe report`: render a bundle in one format; JSON formats pass their vendored schema first."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from kvprobe import files, schema
from kvprobe.errors import BundleExistsError, UsageError
from kvprobe.exports import sweep
from kvprobe.exports.bundle_view import BundleView
from kvprobe.exports.intoto import INTOTO_SCHEMA, intoto
from kvprobe.exports.markdown import markdown
from kvprobe.exports.openvex import OPENVEX_SCHEMA, openvex
from kvprobe.names import SWEEP_RECEIPT_SCHEMA
from kvprobe.text import for_json

FORMATS = ("markdown", "openvex", "intoto", "osv")


@dataclass(frozen=True)
class ExportOptions:
    """What an export needs beyond the bundle: OpenVEX's author, role and issue time (UTC,
    RFC 3339; default now); in-toto's packed archive as an extra subject."""

    author: str | None = None
    role: str | None = None
    issued: str | None = None
    archive: Path | None = None


def render(view: BundleView, fmt: str, opts: ExportOptions = ExportOptions()) -> str:
    """The text to write for ``fmt``; JSON formats pass their schema first (SchemaError if not).
    UsageError for an option the format does not take, or OpenVEX without an author."""
    if opts.archive is not None and fmt != "intoto":
        raise UsageError("--subject-archive goes with --format intoto (a subject of the in-toto statement)")
    if (opts.author or opts.role) and fmt != "openvex":
        raise UsageError("--author and --author-role go with --format openvex (the VEX document's author)")
    if view.receipt["schema"] == SWEEP_RECEIPT_SCHEMA:
        return _render_sweep(view, fmt, opts)
    if fmt == "osv":
        raise UsageError("--format osv takes a sweep bundle (`kvprobe sweep`): OSV ranges need releases observed")
    if fmt == "markdown":
        return markdown(view)
    if fmt == "openvex":
        if not opts.author:
            raise UsageError(
                "--format openvex needs --author (who states it, as vexctl asks), "
                'e.g. --author "Security Team <sec@example.com>"'
            )
        issued = opts.issued or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        doc, version = openvex(view, author=opts.author, role=opts.role, issued=issued), OPENVEX_SCHEMA
    elif fmt == "intoto":
        doc, version = intoto(view, archive=opts.archive), INTOTO_SCHEMA
    else:
        raise UsageError(f"unknown report format {fmt!r}; choose one of {', '.join(FORMATS)}")
    schema.validate(doc, version, source=f"{fmt} document")
    return for_json(json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)) + "\n"


def _render_sweep(view: BundleView, fmt: str, opts: ExportOptions) -> str:
    """A sweep bundle: markdown, OSV (modified = issued) or OpenVEX per observed release."""
    issued = opts.issued or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if fmt == "markdown":
        return sweep.markdown(view)
    if fmt == "osv":
        doc, version = sweep.osv(view, modified=issued), sweep.OSV_SCHEMA
    elif fmt == "openvex":
        if not opts.author:
            raise UsageError("--format openvex needs --author (who states it)")
        doc, version = sweep.openvex(view, author=opts.author, role=opts.role, issued=issued), OPENVEX_SCHEMA
    else:
        raise UsageError(f"--format {fmt} does not take a sweep bundle (use markdown, openvex or osv)")
    schema.validate(doc, version, source=f"{fmt} document")
    return for_json(json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)) + "\n"


def write_atomic(path: Path, text: str, *, force: bool = False) -> None:
    """Write ``text`` to ``path`` atomically; an existing file is replaced only with ``force``
    (the same policy as `bundle pack -o`). UsageError when the directory does not exist."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise UsageError(f"{path}: directory {directory} does not exist")
    refusal = files.output_refusal(path, force)
    if refusal is not None:
        raise BundleExistsError(refusal)
    files.write_atomic(path, text.encode("utf-8"))

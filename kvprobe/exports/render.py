"""`kvprobe report`: render a bundle in one format; JSON formats pass their vendored schema first."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from kvprobe import files, schema
from kvprobe.errors import BundleExistsError, UsageError, VerificationFailed
from kvprobe.exports import gates_markdown as gates
from kvprobe.exports import sweep_exports as sweep
from kvprobe.exports.bundle_view import BundleView
from kvprobe.exports.intoto import INTOTO_SCHEMA, intoto
from kvprobe.exports.markdown import markdown
from kvprobe.exports.openvex import OPENVEX_SCHEMA, openvex
from kvprobe.text import for_json

FORMATS = ("markdown", "openvex", "intoto", "osv")
DEFAULT_FORMAT = "markdown"
# What each bundle kind can state: a gates bundle names no vulnerability, and OSV ranges
# need releases observed (a sweep).
KINDS = {
    "run": ("markdown", "openvex", "intoto"),
    "sweep": ("markdown", "openvex", "intoto", "osv"),
    "gates": ("markdown", "intoto"),
}


@dataclass(frozen=True)
class ExportOptions:
    """What an export needs beyond the bundle: the author (OpenVEX's author, named in
    Markdown; OSV and in-toto have no field for it) and role, the issue time (UTC, RFC 3339;
    default now), in-toto's packed archive as an extra subject, the OSV id to publish under."""

    author: str | None = None
    role: str | None = None
    issued: str | None = None
    archive: Path | None = None
    osv_id: str | None = None
    allow_unanchored_advisory: bool = False  # an OSV/OpenVEX record of an unshipped, unanchored experiment


# The formats scanners act on without a reader: pip-audit, osv-scanner and vexctl take their
# affected/fixed statements as given.
ADVISORIES = ("osv", "openvex")


def _check_advisory_provenance(view: BundleView, fmt: str, opts: ExportOptions) -> None:
    """Fail closed: an advisory record of an experiment kvprobe does not ship, from a bundle
    nothing anchors, would publish the bundle author's own claims (its vulnerability id, fix
    kind, probe code) as a scanner's fact. VerificationFailed (exit 1) unless anchored, or the
    caller asked for it with its caveats inside (``allow_unanchored_advisory``)."""
    prov = view.provenance
    if prov.shipped or prov.anchor is not None or opts.allow_unanchored_advisory:
        return
    raise VerificationFailed(
        f"refusing --format {fmt}: {prov.experiment} is not an experiment kvprobe ships and nothing anchors "
        "the bundle (give --expect-manifest-sha256 HEX or --attestation FILE --key PUB), so the record would "
        "state the bundle author's own claims as fact; --allow-unanchored writes it with those caveats inside"
    )


def render(view: BundleView, fmt: str, opts: ExportOptions = ExportOptions()) -> str:
    """The text to write for ``fmt``; JSON formats pass their schema first (SchemaError if not).
    UsageError for a format the bundle's kind cannot state, an option that belongs to another
    format, or OpenVEX without an author."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown report format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if opts.archive is not None and fmt != "intoto":
        raise UsageError("--subject-archive goes with --format intoto (a subject of the in-toto statement)")
    if opts.osv_id is not None and fmt != "osv":
        raise UsageError("--osv-id goes with --format osv (the id the OSV record is published under)")
    if opts.role and not opts.author:
        raise UsageError("--author-role goes with --author")
    kind = view.kind
    if fmt not in KINDS[kind]:
        raise UsageError(_refusal(kind, fmt))
    issued = opts.issued or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if fmt == "markdown":
        if kind == "sweep":
            return sweep.markdown(view, opts.author)
        return gates.markdown(view, opts.author) if kind == "gates" else markdown(view, opts.author)
    if fmt == "openvex":
        if not opts.author:
            raise UsageError(
                "--format openvex needs --author (who states it, as vexctl asks), "
                'e.g. --author "Security Team <sec@example.com>"'
            )
        maker = sweep.openvex if kind == "sweep" else openvex
        doc, version = maker(view, author=opts.author, role=opts.role, issued=issued), OPENVEX_SCHEMA
    elif fmt == "intoto":
        doc, version = intoto(view, archive=opts.archive), INTOTO_SCHEMA
    else:
        doc, version = sweep.osv(view, modified=issued, osv_id_given=opts.osv_id), sweep.OSV_SCHEMA
    if fmt in ADVISORIES:  # after the format's own refusals (author, fix kind), which name the input
        _check_advisory_provenance(view, fmt, opts)
    schema.validate(doc, version, source=f"{fmt} document")
    return for_json(json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)) + "\n"


def _refusal(kind: str, fmt: str) -> str:
    takes = ", ".join(KINDS[kind])
    if fmt == "osv":
        return (
            f"--format osv takes a sweep bundle (`kvprobe sweep`): OSV ranges need releases observed; "
            f"a {kind} bundle takes {takes}"
        )
    return (
        f"--format {fmt} states a vulnerability's status and a {kind} bundle names none "
        f"(it checks a deployment's gates); it takes {takes}"
    )


def write_atomic(path: Path, text: str, *, force: bool = False, source: Path | None = None) -> None:
    """Write ``text`` to ``path`` atomically; an existing file is replaced only with ``force``
    (the same policy as `bundle pack -o`). UsageError when the directory does not exist, or
    ``path`` is the bundle ``source`` the text was drawn from or lies inside it."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise UsageError(f"{path}: directory {directory} does not exist")
    inside = files.input_refusal(path, source) if source is not None else None
    if inside is not None:
        raise UsageError(inside)
    refusal = files.output_refusal(path, force)
    if refusal is not None:
        raise BundleExistsError(refusal)
    files.write_atomic(path, text.encode("utf-8"))

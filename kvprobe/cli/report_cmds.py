"""`kvprobe report`: a bundle that verifies, rendered for a security review."""

from __future__ import annotations

from pathlib import Path

import click

from kvprobe.cli.base import EXIT_OK, bundle_limits, guarded, limit_options, main, streams_for
from kvprobe.cli.verify_cmds import checked_attestation
from kvprobe.text import for_terminal


@main.command("report")
@click.argument("bundle", type=click.Path(path_type=Path))
@limit_options
@click.option(
    "--format",
    "fmt",
    default="markdown",
    show_default=True,
    type=click.Choice(["markdown", "openvex", "intoto", "osv"]),
    help="markdown: a block for a security review or change ticket (every bundle kind); openvex: OpenVEX "
    "v0.2.0 (run and sweep bundles); intoto: in-toto Statement v1 with the receipt as predicate (every "
    "bundle kind); osv: an OSV 1.7.5 record (sweep bundles).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write here (atomically) instead of stdout; an existing file is kept unless --force.",
)
@click.option("--force", is_flag=True, help="With -o: replace an existing file.")
@click.option(
    "--expect-manifest-sha256",
    "expect_digest",
    metavar="HEX",
    help="The bundle digest published elsewhere: the export is then anchored to it (as verify checks it). "
    "Without it or --attestation, the export says it is drawn from a bundle that only agrees with itself.",
)
@click.option(
    "--attestation",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A DSSE-signed in-toto statement of the bundle, checked with --key: anchors the export to the "
    "digest it signs.",
)
@click.option(
    "--key", type=click.Path(dir_okay=False, path_type=Path), help="With --attestation: the signer's PEM public key."
)
@click.option(
    "--author",
    help="Who states it, e.g. 'Security Team <sec@example.com>': required by openvex (the document's "
    "author), named by markdown, ignored by intoto and osv (they have no author field; a signature says who).",
)
@click.option("--author-role", help="With --author, for openvex: the author's role, e.g. 'Document Creator'.")
@click.option(
    "--subject-archive",
    type=click.Path(dir_okay=False, path_type=Path),
    help="intoto: the bundle's packed .tar.gz (`kvprobe bundle pack`), added as a subject by sha256.",
)
@click.option(
    "--osv-id",
    metavar="ID",
    help="osv: the id the record is published under (CVE-, GHSA-, PYSEC-, ...) when the experiment "
    "declares none with a prefix OSV lists; its declared ids become aliases.",
)
@click.option(
    "--allow-unanchored",
    is_flag=True,
    help="osv/openvex: write the record even for an experiment kvprobe does not ship from a bundle nothing "
    "anchors (refused otherwise, exit 1); its caveats are stated inside it.",
)
@guarded
def report_cmd(
    bundle: Path,
    max_files: int,
    max_file_bytes: int,
    max_bytes: int,
    fmt: str,
    output: Path | None,
    force: bool,
    expect_digest: str | None,
    attestation: Path | None,
    key: Path | None,
    author: str | None,
    author_role: str | None,
    subject_archive: Path | None,
    osv_id: str | None,
    allow_unanchored: bool,
) -> int:
    """Render a bundle (directory or .tar.gz) that verifies for a security review (exit 1: it
    does not verify, as `kvprobe verify` says; 2: not a bundle, or nothing to state).

    An export drawn from a bundle that is not anchored (no --expect-manifest-sha256 or
    --attestation), or from an experiment kvprobe does not ship, says so inside itself
    (Markdown text, OpenVEX status notes, OSV details and database_specific) and on stderr.
    An OSV or OpenVEX record of an unshipped experiment from an unanchored bundle is refused
    (exit 1) unless --allow-unanchored.

    OpenVEX's document timestamp is when it is issued (now, or SOURCE_DATE_EPOCH); each
    statement's is the run's (the receipt's created_utc)."""
    import os
    from datetime import UTC, datetime

    from kvprobe.cli.console import data
    from kvprobe.errors import UsageError
    from kvprobe.exports.bundle_view import load
    from kvprobe.exports.render import ExportOptions, render, write_atomic
    from kvprobe.verify.steps import parse_digest

    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch is not None and not _epoch_seconds(epoch):
        raise UsageError(f"SOURCE_DATE_EPOCH={epoch!r} is not a number of seconds")
    issued = datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if epoch else None
    opts = ExportOptions(
        author=author,
        role=author_role,
        issued=issued,
        archive=subject_archive,
        osv_id=osv_id,
        allow_unanchored_advisory=allow_unanchored,
    )
    expected = parse_digest(expect_digest)
    signed = checked_attestation(attestation, key, expected)
    anchor = (
        f"a DSSE attestation signed with key {signed.keyid} signs this manifest sha256" if signed is not None else None
    )
    view = load(
        bundle,
        bundle_limits(max_files, max_file_bytes, max_bytes),
        expect_manifest_sha256=signed.manifest_sha256 if signed else expected,
        anchor=anchor,
    )
    text = render(view, fmt, opts)
    streams = streams_for()
    for caveat in view.provenance.caveats():
        streams.warn(data(caveat))
    if output is None:
        streams.document(text)
    else:
        write_atomic(output, text, force=force, source=bundle)
        streams.result(f"wrote {for_terminal(output)} ({fmt})")
    return EXIT_OK


_MAX_EPOCH = 253402300799  # 9999-12-31T23:59:59Z: the last second a timestamp can name


def _epoch_seconds(epoch: str) -> bool:
    """Whether SOURCE_DATE_EPOCH is ASCII digits; UsageError for a number of seconds no date
    has (past the year 9999: ``datetime`` overflows, and Python refuses very long numbers)."""
    from kvprobe.errors import UsageError

    if not (epoch.isascii() and epoch.isdigit()):
        return False
    if len(epoch) > len(str(_MAX_EPOCH)) or int(epoch) > _MAX_EPOCH:
        raise UsageError(f"SOURCE_DATE_EPOCH={epoch[:40]!r} is out of range (a date before the year 10000)")
    return True

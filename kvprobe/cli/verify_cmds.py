"""`kvprobe verify`, `attest` and `bundle pack`: a bundle checked, signed, archived."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kvprobe.cli.base import (
    EXIT_FAIL,
    EXIT_OK,
    bundle_limits,
    emit_json,
    guarded,
    json_document,
    limit_options,
    main,
    streams_for,
    torch_index_option,
    verify_exit,
)
from kvprobe.text import for_terminal

if TYPE_CHECKING:
    from rich.console import Console

    from kvprobe.verify.attestation import SignedStatement


@main.command("verify")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option(
    "--expect-manifest-sha256",
    "expect_digest",
    metavar="HEX",
    help="The bundle digest (manifest.json's sha256) published elsewhere: checks authenticity.",
)
@click.option(
    "--rerun",
    is_flag=True,
    help="Run the experiment again and compare check by check: kvprobe's installed copy when it "
    "ships the experiment, else the bundle's own code (needs --trust-bundle-code or a yes at a terminal).",
)
@click.option(
    "--trust-bundle-code",
    is_flag=True,
    help="With --rerun: allow running the bundle's own probe code (its sha256 digests are printed first).",
)
@click.option(
    "--attestation",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A DSSE-signed in-toto statement of the bundle (a DSSE envelope or cosign's --bundle output); "
    "checked offline with --key, then the bundle is held to the manifest digest it signs.",
)
@click.option(
    "--key", type=click.Path(dir_okay=False, path_type=Path), help="With --attestation: the signer's PEM public key."
)
@click.option(
    "--require-anchor",
    is_flag=True,
    help="Exit 1 unless the outcome is verified: a bundle that only agrees with itself "
    "(self-consistent; exit 0 without this flag) fails, as a CI gate on a published bundle wants.",
)
@click.option("--repo", help="With --rerun: git URL or local path to fetch pins from.")
@click.option(
    "--release",
    "rerun_releases",
    multiple=True,
    metavar="SPEC",
    help="With --rerun of a sweep bundle: re-run only these of its releases (repeatable; a version, "
    "A..B or a specifier, as sweep's --releases). Default: all.",
)
@torch_index_option("With --rerun: index for torch, https:// or file://.", checked=False)
@click.option(
    "--timeout", default=1800, show_default=True, type=click.IntRange(1), help="With --rerun: seconds per check."
)
@limit_options
@json_document
@guarded
def verify_cmd(
    bundle: Path,
    expect_digest: str | None,
    rerun: bool,
    trust_bundle_code: bool,
    attestation: Path | None,
    key: Path | None,
    require_anchor: bool,
    repo: str | None,
    rerun_releases: tuple[str, ...],
    torch_index: str | None,
    timeout: int,
    max_files: int,
    max_file_bytes: int,
    max_bytes: int,
    as_json: bool,
) -> int:
    """Check a bundle directory or .tar.gz as untrusted input.

    \b
    Outcomes: verified (no defect, and anchored: the --expect-manifest-sha256 digest matched,
    a checked --attestation signs it, or a --rerun reproduced it), self-consistent (no defect,
    but nothing outside the bundle vouches for it), failed, could-not-rerun.
    Exit 0 verified or self-consistent (1 with --require-anchor), 1 failed, 2 not a bundle,
    3 could not re-run."""
    from kvprobe.cli.console import data, print_verify_diagnostics, print_verify_report
    from kvprobe.env.venv import check_index_url
    from kvprobe.errors import UsageError
    from kvprobe.run.rerun import RerunOptions, rerun_step
    from kvprobe.verify.result import VerifyOutcome
    from kvprobe.verify.steps import Anchoring, VerifyOptions, parse_digest, verify

    if rerun:  # only a rerun uses the index: a plain verify never refuses over it
        check_index_url(torch_index)
    streams = streams_for(as_json)
    expected = parse_digest(expect_digest)
    signed = checked_attestation(attestation, key, expected)
    if signed is not None:
        streams.diagnostic(
            f"attestation: signature verified with key {data(signed.keyid)}; "
            f"it signs manifest sha256 {signed.manifest_sha256}"
        )
    consent = _bundle_code_consent(streams.err, trust_bundle_code)
    if rerun_releases and not rerun:
        raise UsageError("--release goes with --rerun: it names the sweep releases to re-run")
    spec = ",".join(rerun_releases) if rerun_releases else None
    rerun_opts = RerunOptions(repo, torch_index, float(timeout), consent=consent, releases=spec)
    step6 = rerun_step(rerun_opts, streams.reporter()) if rerun else None
    digest_from = (
        *(
            [Anchoring("attestation", f"a DSSE attestation signed with key {signed.keyid} signs the manifest sha256")]
            if signed
            else []
        ),
        *(
            [Anchoring("expect-manifest-sha256", "manifest sha256 matches --expect-manifest-sha256")]
            if expected
            else []
        ),
    )
    opts = VerifyOptions(
        limits=bundle_limits(max_files, max_file_bytes, max_bytes),
        expect_manifest_sha256=signed.manifest_sha256 if signed else expected,
        rerun=step6,
        digest_from=digest_from,
    )
    report = verify(Path(bundle), opts)
    if streams.verbosity > -2:
        print_verify_diagnostics(streams.err, report, None if streams.verbosity > 0 else 200)
    if streams.results:
        print_verify_report(streams.out, report)
    if as_json:
        emit_json({**report.to_json(), **({"attestation": signed.to_json()} if signed else {})})
    if require_anchor and report.outcome is VerifyOutcome.SELF_CONSISTENT:
        streams.diagnostic("--require-anchor: the bundle is only self-consistent; nothing anchors it (exit 1)")
        return EXIT_FAIL
    return verify_exit(report.outcome)


def checked_attestation(attestation: Path | None, key: Path | None, expected: str | None) -> SignedStatement | None:
    """The checked attestation (None without one); UsageError when --attestation and --key
    are not given together, or the signed digest is not --expect-manifest-sha256's."""
    from kvprobe.errors import UsageError
    from kvprobe.verify import attestation as signed_statement

    if attestation is None and key is None:
        return None
    if attestation is None or key is None:
        raise UsageError("--attestation and --key go together (the signed statement and the signer's public key)")
    signed = signed_statement.check(attestation, key)
    if expected is not None and expected != signed.manifest_sha256:
        raise UsageError(
            f"--attestation signs manifest sha256 {signed.manifest_sha256}, "
            f"but --expect-manifest-sha256 is {expected}: they cannot both hold"
        )
    return signed


def _bundle_code_consent(console: Console, trusted: bool) -> Callable[[list[tuple[str, str]]], bool]:
    """Consent to run a bundle's own code: the flag, or a yes typed at a terminal; never a pipe."""

    def consent(files: list[tuple[str, str]]) -> bool:
        if not trusted and not (sys.stdin.isatty() and sys.stderr.isatty()):
            return False
        console.print("the rerun will execute the bundle's own code, and what it names:", markup=False, highlight=False)
        for what, identity in files:
            console.print(f"  {identity}  {for_terminal(what)}", markup=False, highlight=False)
        return trusted or click.confirm("Run this code as you, on this machine?", default=False, err=True)

    return consent


@main.group("bundle")
def bundle_group() -> None:
    """Bundle archives."""


@bundle_group.command("pack")
@click.argument("bundle_dir", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Archive to write (default: BUNDLE_DIR.tar.gz next to it); an existing file is kept unless --force.",
)
@click.option("--force", is_flag=True, help="Replace an existing archive.")
@limit_options
@json_document
@guarded
def bundle_pack_cmd(
    bundle_dir: Path,
    output: Path | None,
    force: bool,
    max_files: int,
    max_file_bytes: int,
    max_bytes: int,
    as_json: bool,
) -> int:
    """Verify BUNDLE_DIR, then write a deterministic .tar.gz of it (same bundle, same bytes)."""
    from kvprobe.verify.pack import pack

    result = pack(bundle_dir, output, bundle_limits(max_files, max_file_bytes, max_bytes), force=force)
    streams_for(as_json).result(
        f"wrote {for_terminal(result.archive)} (sha256 {result.sha256}; manifest sha256 {result.manifest_sha256})"
    )
    if as_json:
        emit_json(
            {
                "archive": str(result.archive),
                "sha256": result.sha256,
                "manifest_sha256": result.manifest_sha256,
                "top": result.top,
            }
        )
    return EXIT_OK


@main.command("attest")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option(
    "--key",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The signer's PEM private key (ECDSA, RSA or Ed25519; an encrypted one's password in "
    "$KVPROBE_KEY_PASSWORD). Its public half checks the envelope: `verify --attestation FILE --key PUB`.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the envelope here (atomically) instead of stdout; an existing file is kept unless --force.",
)
@click.option("--force", is_flag=True, help="With -o: replace an existing file.")
@click.option(
    "--subject-archive",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The bundle's packed .tar.gz (`kvprobe bundle pack`), added as a subject by sha256.",
)
@limit_options
@guarded
def attest_cmd(
    bundle: Path,
    key: Path,
    output: Path | None,
    force: bool,
    subject_archive: Path | None,
    max_files: int,
    max_file_bytes: int,
    max_bytes: int,
) -> int:
    """Sign a bundle's in-toto statement (run, sweep or gates bundle) into a DSSE envelope.

    The bundle must verify first (steps 1-5, as `kvprobe verify`; exit 1 when it does not).
    The statement is `report --format intoto`'s; anyone with the public key checks the
    envelope offline with `kvprobe verify BUNDLE --attestation FILE --key PUB`, which then
    says `verified` (anchored by the attestation)."""
    from kvprobe.exports.attest import attest, load_signer
    from kvprobe.exports.bundle_view import load
    from kvprobe.exports.render import write_atomic

    if output is not None and output.exists() and not force:
        from kvprobe.errors import BundleExistsError

        raise BundleExistsError(f"{output} exists; refusing to overwrite it (--force replaces it)")
    signer = load_signer(key)  # a bad key is refused before the bundle is read
    view = load(bundle, bundle_limits(max_files, max_file_bytes, max_bytes))
    signed = attest(view, signer, archive=subject_archive)
    streams = streams_for()
    said = f"signed the in-toto statement of manifest sha256 {signed.manifest_sha256} with key {signed.keyid}"
    if output is None:  # the envelope is the result; what it is, a diagnostic beside it
        streams.document(signed.text)
        streams.diagnostic(f"{said} -> stdout")
    else:
        write_atomic(output, signed.text, force=force, source=bundle)
        streams.result(f"{said} -> {for_terminal(str(output))}")
    return EXIT_OK

"""An OpenVEX v0.2.0 document from a bundle: ``affected``/``fixed`` only for a reproduced verdict
of a security fix, named exactly as the experiment declares its vulnerability.

Every statement cites the receipt's and the bundle's digests, the evidence layer and its limits.
Times: the document's ``timestamp`` is when it was issued (the export); each statement's is
when its evidence was observed (the receipt's ``created_utc``, the run).
"""

from __future__ import annotations

from typing import Any

from kvprobe import __version__
from kvprobe.errors import UsageError
from kvprobe.exports.bundle_view import BundleView, counts_text, oneline, pin_text, prs_text, purl
from kvprobe.model.receipt import Receipt
from kvprobe.model.records import FixKind, Verdict
from kvprobe.model.sweep_receipt import SweepReceipt
from kvprobe.names import SIDES

OPENVEX_CONTEXT = "https://openvex.dev/ns/v0.2.0"
OPENVEX_SCHEMA = "openvex/0.2.0"  # a key of kvprobe.schema.KNOWN


def _product(r: Receipt, side: str) -> dict[str, Any]:
    pin = r.sides[side].pin
    ident = purl(r, side)
    product: dict[str, Any] = {"@id": ident, "identifiers": {"purl": ident}}
    if pin["kind"] == "wheel":
        product["hashes"] = {"sha-256": pin["sha256"]}
    # A git pin's identity is the commit in its purl: OpenVEX's hash names are for artifact
    # bytes and its identifier keys are closed (purl, cpe22, cpe23), so no "gitCommit" field.
    return product


def _evidence_note(view: BundleView, side: str) -> str:
    r = view.run
    ev = r.evidence
    parts = [
        *view.provenance.caveats(),
        f"Determined by kvprobe from receipt sha256 {view.receipt_sha256} (receipt.json of the bundle "
        f"whose manifest.json sha256 is {view.manifest_sha256}; check it with `kvprobe verify BUNDLE "
        f"--expect-manifest-sha256 {view.manifest_sha256}`), experiment {r.experiment.id}, "
        f"run {r.run_id}.",
        f"Verdict {r.verdict}: {counts_text(r)}.",
        f"Tested {side}: {pin_text(r, side)}.",
        f"Evidence layer {ev.layer}: {oneline(ev.shows)}",
        "It does not show: " + "; ".join(oneline(x) for x in ev.does_not_show) + ".",
    ]
    if ev.limits:
        parts.append("Limits: " + "; ".join(oneline(x) for x in ev.limits) + ".")
    return " ".join(parts)


def _action(r: Receipt) -> str:
    fix = r.experiment.fix
    head = r.sides["head"].pin
    prs = prs_text(r, links=False)
    if head["kind"] == "wheel":
        tested = "the release kvprobe tested as fixed"
        if fix.release and fix.release != head["version"]:
            tested += f"; {fix.release} is the first release with the fix"
        return f"Upgrade {head['package']} to {head['version']} or later ({tested}), or backport {prs}."
    release = f" (first released in {fix.release})" if fix.release else ""
    return (
        f"Backport {prs} or move to a version that contains it{release}; kvprobe tested "
        f"commit {head['commit']} as fixed."
    )


def vulnerability(r: Receipt | SweepReceipt, fmt: str = "OpenVEX") -> dict[str, Any]:
    """The vulnerability the receipt records, exactly as its experiment declares it, in
    OpenVEX's shape (``fmt`` names the export asked for, OpenVEX or OSV, in the message).
    UsageError when it records none, or the fix tested is not a security fix: affected/fixed
    (an OSV range) would then claim that this fix closes the vulnerability."""
    exp = r.experiment
    declared = exp.vulnerability
    what = "an OSV record" if fmt == "OSV" else "an OpenVEX statement"
    if declared is None:
        raise UsageError(
            f"the receipt of {exp.id} records no vulnerability id (its experiment declares no "
            f"[vulnerability] table, or kvprobe predates it): nothing to name in {what}"
        )
    if declared.fix_kind is not FixKind.SECURITY:
        raise UsageError(
            f"{exp.id} tests a {declared.fix_kind} fix, not the security fix of {declared.id}: "
            f"no {fmt} {'record' if fmt == 'OSV' else 'statement'} is exported for it "
            "(docs/vulnerability-ids.md; --format markdown and intoto state only what the receipt says)"
        )
    release = f", first released in {exp.fix.release}" if exp.fix.release else ""
    named: dict[str, Any] = {
        "name": declared.id,
        "description": (
            f"{oneline(exp.title)}. Fixed upstream by {prs_text(r, links=False)}{release}. {oneline(exp.fix.summary)}"
        ),
    }
    if declared.aliases:
        named["aliases"] = list(declared.aliases)
    return named


def openvex(view: BundleView, *, author: str, issued: str, role: str | None = None) -> dict[str, Any]:
    """An OpenVEX v0.2.0 document by ``author`` (``role``), issued at ``issued`` (UTC,
    RFC 3339). ``affected`` (base) and ``fixed`` (head) only when the receipt's verdict is
    ``reproduced``; otherwise both sides are ``under_investigation``.
    Raises UsageError for a synthetic-model receipt (it names no product), a receipt with no
    vulnerability, or a fix that is not a security fix (see :func:`vulnerability`)."""
    r = view.run
    exp = r.experiment
    products = {side: _product(r, side) for side in SIDES}
    vuln = vulnerability(r)
    stamp = r.created_utc
    if r.verdict is Verdict.REPRODUCED:
        statements = [
            {
                "vulnerability": vuln,
                "products": [products["base"]],
                "status": "affected",
                "action_statement": _action(r),
                "timestamp": stamp,
                "status_notes": _evidence_note(view, "base"),
            },
            {
                "vulnerability": vuln,
                "products": [products["head"]],
                "status": "fixed",
                "timestamp": stamp,
                "status_notes": _evidence_note(view, "head"),
            },
        ]
    else:
        reasons = r.comparison.reasons
        why = (
            f"The receipt's verdict is {r.verdict.value!r}, not 'reproduced', so kvprobe claims neither "
            f"affected nor fixed for this product."
        )
        if reasons:
            why += f" Reasons ({len(reasons)}): " + "; ".join(oneline(x) for x in reasons[:5])
            why += "; ..." if len(reasons) > 5 else "."
        statements = [
            {
                "vulnerability": vuln,
                "products": [products[side]],
                "status": "under_investigation",
                "timestamp": stamp,
                "status_notes": f"{why} {_evidence_note(view, side)}",
            }
            for side in SIDES
        ]
    return document(
        f"{exp.id}:{view.manifest_sha256}",
        f"a kvprobe {r.tool.version} receipt",
        statements,
        author,
        issued,
        role,
    )


def document(
    name: str, made_from: str, statements: list[dict[str, Any]], author: str, issued: str, role: str | None
) -> dict[str, Any]:
    """The OpenVEX document around ``statements``: ``urn:kvprobe:openvex:<name>``, by
    ``author`` (``role``), issued at ``issued``, and the kvprobe receipt it was ``made_from``."""
    found: dict[str, Any] = {
        "@context": OPENVEX_CONTEXT,
        "@id": f"urn:kvprobe:openvex:{name}",
        "author": author,
        "timestamp": issued,
        "version": 1,
        "tooling": f"kvprobe {__version__} (report --format openvex) from {made_from}",
        "statements": statements,
    }
    if role:
        found["role"] = role
    return found

"""The bundle the renderers read, and the facts every format states the same way.

:func:`load` reads a bundle directory or .tar.gz through verification (the one reader, steps
1-5) into a :class:`BundleView`: the receipt, the manifest and manifest.json's sha256. The
renderers (:mod:`~kvprobe.exports.markdown`,
:mod:`~kvprobe.exports.openvex`, :mod:`~kvprobe.exports.intoto`) are pure functions of it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from kvprobe.errors import SchemaError, UsageError
from kvprobe.evidence.safetree import Limits
from kvprobe.names import RECEIPT, RECEIPT_SCHEMA, SIDES, SWEEP_RECEIPT_SCHEMA
from kvprobe.text import for_shell
from kvprobe.verify.steps import VerifyOptions, verified

_GITHUB = re.compile(r"^https://github\.com/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)(?:\.git)?/?$")


@dataclass(frozen=True)
class BundleView:
    """What the renderers read: the receipt, the manifest and manifest.json's sha256.

    ``name`` is how the verify command in the Markdown names the bundle directory.
    """

    receipt: Mapping[str, Any]
    manifest: Mapping[str, Any]
    manifest_sha256: str
    name: str = "BUNDLE"

    @property
    def receipt_sha256(self) -> str:
        """receipt.json's sha256 as the manifest records it; SchemaError if it is not listed."""
        for entry in self.manifest.get("files", []):
            if entry.get("path") == RECEIPT:
                return entry["sha256"]
        raise SchemaError("manifest.json does not list receipt.json")


# --- reading a bundle ----------------------------------------------------------------------


def load(bundle: Path, limits: Limits | None = None) -> BundleView:
    """A bundle directory or .tar.gz, read as `kvprobe verify` reads it: the one bundle reader
    and the same steps (layout, strict documents, integrity, the verdict recomputed from the raw
    outputs, the installed copy of a known experiment).

    Raises NotABundle (exit 2), VerificationFailed naming the first defect (exit 1), and
    SchemaError for a bundle that verifies but holds no run receipt (a gates bundle, exit 2).
    """
    report = verified(Path(bundle), VerifyOptions(limits=limits or Limits()))
    assert report.receipt is not None and report.manifest is not None, "a verified bundle's step 2 accepted both"
    sweep = report.receipt.get("schema") == SWEEP_RECEIPT_SCHEMA
    _check_version(report.receipt, SWEEP_RECEIPT_SCHEMA if sweep else RECEIPT_SCHEMA, f"{bundle}/{RECEIPT}")
    name = Path(report.archive).name if report.archive else Path(report.bundle).resolve().name
    return BundleView(report.receipt, report.manifest, report.manifest_sha256 or "", name)


def _check_version(doc: Any, version: str, source: str) -> None:
    found = doc.get("schema") if isinstance(doc, dict) else None
    if found != version:
        raise SchemaError(
            f"{source}: schema {found!r} is not {version!r}, the version this kvprobe reads",
            hints=["upgrade kvprobe if the bundle is newer"],
        )


def project(receipt: Mapping[str, Any]) -> str | None:
    for side in SIDES:
        pin = receipt["sides"][side]["pin"]
        if pin.get("kind") == "wheel":
            return pin["package"]
    upstream = receipt["experiment"].get("upstream")
    if upstream:
        return urlsplit(upstream).path.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git") or None
    return None


def pr_url(receipt: Mapping[str, Any], number: int) -> str | None:
    upstream = receipt["experiment"].get("upstream") or ""
    return f"{upstream.rstrip('/').removesuffix('.git')}/pull/{number}" if _GITHUB.match(upstream) else None


def prs_text(receipt: Mapping[str, Any], *, links: bool) -> str:
    parts = []
    for n in receipt["experiment"]["fix"]["prs"]:
        url = pr_url(receipt, n)
        parts.append(f"[#{n}]({url})" if links and url else f"#{n}" + (f" ({url})" if url else ""))
    return ", ".join(parts) or "no PR recorded"


def purl(receipt: Mapping[str, Any], side: str) -> str:
    """The package URL of one side's pin; UsageError for a synthetic pin or an unnamed repo."""
    pin = receipt["sides"][side]["pin"]
    if pin["kind"] == "wheel":
        name = re.sub(r"[-_.]+", "-", pin["package"]).lower()
        return f"pkg:pypi/{name}@{quote(pin['version'], safe='.-_~')}"
    if pin["kind"] == "git":
        upstream = receipt["experiment"].get("upstream") or ""
        match = _GITHUB.match(upstream)
        if match:
            return f"pkg:github/{match.group(1).lower()}/{match.group(2).lower()}@{pin['commit']}"
        if upstream:
            name = project(receipt) or "upstream"
            vcs = quote(f"git+{upstream}@{pin['commit']}", safe="")
            return f"pkg:generic/{quote(name.lower(), safe='.-_~')}@{pin['commit']}?vcs_url={vcs}"
        raise UsageError(
            f"{side} pin is commit {pin['commit']} but the receipt names no upstream "
            "repository, so there is no product to name"
        )
    raise UsageError(
        f"the {side} side is a synthetic model (switches {pin.get('switches')!r}), "
        "not an SGLang release or commit: there is no product to make a VEX statement about"
    )


def pin_text(receipt: Mapping[str, Any], side: str) -> str:
    pin = receipt["sides"][side]["pin"]
    if pin["kind"] == "wheel":
        return f"{pin['filename']} (sha256 {pin['sha256']})"
    if pin["kind"] == "git":
        return f"commit {pin['commit']}"
    return f"synthetic model switches {json.dumps(pin.get('switches'), sort_keys=True)}"


def counts_text(receipt: Mapping[str, Any]) -> str:
    c = receipt["comparison"]["counts"]
    return (
        f"{c['observations_matched']}/{c['observations_expected']} expected observations matched, "
        f"{c['observations_changed']} observations changed from base to head, "
        f"{c['tests']} upstream test results ({c['fail_to_pass']} fail-to-pass)"
    )


def verify_command(view: BundleView) -> str:
    """The command a reviewer pastes: the bundle path is one quoted shell word."""
    return f"kvprobe verify {for_shell(view.name)} --expect-manifest-sha256 {for_shell(view.manifest_sha256)}"


def failure_kinds_text(kinds: Mapping[str, int]) -> str:
    """``{"assertion": 0, "AttributeError": 6, "ValueError": 1}`` ->
    ``6 AttributeError + 1 ValueError, 0 assertion failures``."""
    assertion = kinds.get("assertion", 0)
    others = sorted(((n, k) for k, n in kinds.items() if k != "assertion" and n), key=lambda t: (-t[0], t[1]))
    words = {
        "collection": "collection error",
        "infrastructure": "infrastructure error",
        "timeout": "timeout",
        "exception": "exception",
    }
    parts = []
    for n, kind in others:
        label = words.get(kind, kind)
        parts.append(f"{n} {label}{'s' if n != 1 and kind in words else ''}")
    tail = f"{assertion} assertion failure{'' if assertion == 1 else 's'}"
    return f"{' + '.join(parts)}, {tail}" if parts else tail


def oneline(text: Any) -> str:
    """Prose outside tables: whitespace (newlines included) collapsed to single spaces."""
    return " ".join(str(text).split())

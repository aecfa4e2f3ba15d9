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

from kvprobe import __version__
from kvprobe.errors import SchemaError, UsageError
from kvprobe.evidence.safetree import Limits
from kvprobe.model import load as model
from kvprobe.model.gates_receipt import GatesReceipt
from kvprobe.model.receipt import Receipt
from kvprobe.model.sweep_receipt import SweepReceipt
from kvprobe.names import RECEIPT, SIDES
from kvprobe.text import for_shell
from kvprobe.verify.anchor import installed_experiment
from kvprobe.verify.steps import VerifyOptions, verified
from kvprobe.verify.sweep_set import ships_profile

_GITHUB = re.compile(r"^https://github\.com/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)(?:\.git)?/?$")


@dataclass(frozen=True)
class Provenance:
    """What ties a bundle to more than itself, as verify's step 5 decided it.

    ``anchor`` says what the manifest digest was checked against (a digest published
    elsewhere, a signed attestation), None when nothing was: the bundle is then only
    self-consistent. ``experiment`` is the experiment whose claims an export repeats, and
    ``shipped`` whether kvprobe ships it (step 5 then held the bundle's experiment file and
    probes to the installed copy, byte for byte); an experiment kvprobe does not ship (a
    renamed copy, a third party's) says what it likes about its vulnerability and fix kind.
    """

    anchor: str | None = None
    experiment: str | None = None
    shipped: bool = True
    unshipped_profile: str | None = None  # a sweep's profile kvprobe does not ship

    def caveats(self) -> list[str]:
        """One sentence per missing anchor; empty when the bundle is anchored both ways."""
        found = []
        if self.anchor is None:
            found.append(
                "SELF-CONSISTENT ONLY: no published manifest digest or signed attestation was given "
                "(kvprobe report --expect-manifest-sha256 HEX, or --attestation FILE --key PUB), so this "
                "export shows only that the bundle agrees with itself: its raw outputs could have been "
                "written by hand."
            )
        if not self.shipped:
            found.append(
                f"UNSHIPPED EXPERIMENT: {self.experiment} is not an experiment kvprobe {__version__} ships, "
                "so nothing held its probes to a known copy: the vulnerability it names, its fix kind "
                "and its probe code are the bundle publisher's own claims."
            )
        if self.unshipped_profile is not None:
            found.append(
                f"UNSHIPPED PROFILE: {self.unshipped_profile} is not a dependency profile kvprobe {__version__} "
                "ships: which releases it serves, and why it does not serve the others, are the bundle "
                "publisher's own claims."
            )
        return found

    def to_json(self) -> dict[str, Any]:
        return {
            "anchor": self.anchor or "none (self-consistent only)",
            "experiment": self.experiment,
            "experiment_shipped_by_kvprobe": self.shipped,
            "caveats": self.caveats(),
        }


@dataclass(frozen=True)
class BundleView:
    """What the renderers read: the receipt, the manifest and manifest.json's sha256.

    ``name`` is how the verify command in the Markdown names the bundle directory;
    ``provenance`` what anchored it (the default, for renderer tests, claims both anchors).
    """

    receipt: model.AnyReceipt
    manifest: Mapping[str, Any]
    manifest_sha256: str
    name: str = "BUNDLE"
    provenance: Provenance = Provenance(anchor="test", shipped=True)

    @property
    def kind(self) -> str:
        """run, sweep or gates: which receipt the bundle holds."""
        if isinstance(self.receipt, SweepReceipt):
            return "sweep"
        return "gates" if isinstance(self.receipt, GatesReceipt) else "run"

    # The receipt as the renderer of its kind reads it (render dispatches on ``kind``).

    @property
    def run(self) -> Receipt:
        assert isinstance(self.receipt, Receipt), f"a {self.kind} bundle, not a run bundle"
        return self.receipt

    @property
    def sweep(self) -> SweepReceipt:
        assert isinstance(self.receipt, SweepReceipt), f"a {self.kind} bundle, not a sweep bundle"
        return self.receipt

    @property
    def gates(self) -> GatesReceipt:
        assert isinstance(self.receipt, GatesReceipt), f"a {self.kind} bundle, not a gates bundle"
        return self.receipt

    @property
    def receipt_sha256(self) -> str:
        """receipt.json's sha256 as the manifest records it; SchemaError if it is not listed."""
        for entry in self.manifest.get("files", []):
            if entry.get("path") == RECEIPT:
                return entry["sha256"]
        raise SchemaError("manifest.json does not list receipt.json")


# --- reading a bundle ----------------------------------------------------------------------


def load(
    bundle: Path, limits: Limits | None = None, *, expect_manifest_sha256: str | None = None, anchor: str | None = None
) -> BundleView:
    """A bundle directory or .tar.gz, read as `kvprobe verify` reads it: the one bundle reader
    and the same steps (layout, strict documents, integrity, the verdict recomputed from the raw
    outputs, the published digest when given, the installed copy of a known experiment).

    ``expect_manifest_sha256`` is the digest published elsewhere (or signed: ``anchor`` then
    says by what); without it the view's provenance says the bundle is only self-consistent.
    Raises NotABundle (exit 2), VerificationFailed naming the first defect (exit 1; a digest
    that does not match is one), and SchemaError for a receipt of a version this kvprobe
    does not read (exit 2).
    """
    opts = VerifyOptions(limits=limits or Limits(), expect_manifest_sha256=expect_manifest_sha256)
    report = verified(Path(bundle), opts)
    assert report.receipt is not None and report.manifest is not None, "a verified bundle's step 2 accepted both"
    try:
        receipt = model.load(report.receipt)
    except SchemaError as exc:
        raise SchemaError(
            f"{bundle}/{RECEIPT}: {exc.message}", hints=["upgrade kvprobe if the bundle is newer"]
        ) from None
    name = Path(report.archive).name if report.archive else Path(report.bundle).resolve().name
    step5 = next(s for s in report.steps if s.number == 5)
    anchored = step5.status == "pass" and expect_manifest_sha256 is not None
    label = (anchor or "manifest sha256 matches the digest given (--expect-manifest-sha256)") if anchored else None
    provenance = _provenance(receipt, label)
    return BundleView(receipt, report.manifest, report.manifest_sha256 or "", name, provenance)


def _provenance(receipt: model.AnyReceipt, anchor: str | None) -> Provenance:
    """Step 5 passed (the bundle verified), so an experiment kvprobe ships is its installed copy;
    a gates receipt repeats no experiment's vulnerability claim (its behavioural gates' experiments were
    held to the installed copies by step 5)."""
    if isinstance(receipt, GatesReceipt):
        return Provenance(anchor, None, True)
    exp_id = receipt.experiment.id
    profile = None
    if isinstance(receipt, SweepReceipt) and not ships_profile(receipt.profile.name):
        profile = receipt.profile.name
    return Provenance(anchor, exp_id, installed_experiment(exp_id) is not None, profile)


def project(receipt: Receipt) -> str | None:
    for side in SIDES:
        pin = receipt.sides[side].pin
        if pin.get("kind") == "wheel":
            return pin["package"]
    upstream = receipt.experiment.upstream
    if upstream:
        return urlsplit(upstream).path.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git") or None
    return None


def pr_url(receipt: Receipt | SweepReceipt, number: int) -> str | None:
    upstream = receipt.experiment.upstream or ""
    return f"{upstream.rstrip('/').removesuffix('.git')}/pull/{number}" if _GITHUB.match(upstream) else None


def prs_text(receipt: Receipt | SweepReceipt, *, links: bool) -> str:
    parts = []
    for n in receipt.experiment.fix.prs:
        url = pr_url(receipt, n)
        parts.append(f"[#{n}]({url})" if links and url else f"#{n}" + (f" ({url})" if url else ""))
    return ", ".join(parts) or "no PR recorded"


def wheel_purl(package: str, version: str | None = None) -> str:
    """``pkg:pypi/<normalized name>[@version]``."""
    name = re.sub(r"[-_.]+", "-", package).lower()
    return f"pkg:pypi/{name}" + (f"@{quote(version, safe='.-_~')}" if version else "")


def purl(receipt: Receipt, side: str) -> str:
    """The package URL of one side's pin; UsageError for a synthetic pin or an unnamed repo."""
    pin = receipt.sides[side].pin
    if pin["kind"] == "wheel":
        name = re.sub(r"[-_.]+", "-", pin["package"]).lower()
        return f"pkg:pypi/{name}@{quote(pin['version'], safe='.-_~')}"
    if pin["kind"] == "git":
        upstream = receipt.experiment.upstream or ""
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


def pin_text(receipt: Receipt, side: str) -> str:
    pin = receipt.sides[side].pin
    if pin["kind"] == "wheel":
        return f"{pin['filename']} (sha256 {pin['sha256']})"
    if pin["kind"] == "git":
        return f"commit {pin['commit']}"
    return f"synthetic model switches {json.dumps(pin.get('switches'), sort_keys=True)}"


def counts_text(receipt: Receipt) -> str:
    c = receipt.comparison.counts
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

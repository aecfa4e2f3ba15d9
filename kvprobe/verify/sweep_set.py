"""Step 4 of a sweep bundle, its release set and its rendered files.

An export draws boundaries from a sweep's releases (OSV ``introduced`` and ``fixed``), so
which releases a sweep holds is evidence too: each check here is recomputed from what the
receipt records and what kvprobe itself knows (the profile's ``serves``, PEP 440 order,
the wheel file-name rules), never taken from the receipt's own say-so.

- the listing, the releases and ``unserved`` are each unique by PEP 440 equality
  (``0.5.20 == 0.5.20.0 == 0.5.020``) and in version order;
- the spec selects exactly the listing's ``selected`` versions from its ``versions``;
- each selected version is a release entry, or was not run with the reason the profile
  gives for it (recomputed), and the profile is the installed one's when kvprobe ships it;
- each wheel file name names its own release, a release's wheel is the one the listing
  recorded, and no sha256 stands under two versions;
- ``observed`` (oldest, introduced, first fixed, not observed) is what the releases give;
- README.md and timeline.svg are byte for byte what this kvprobe renders from the receipt.
"""

from __future__ import annotations

from collections.abc import Callable

from packaging.version import Version

from kvprobe import __version__
from kvprobe.defects import (
    BundleDefect,
    ListingMismatch,
    PinMismatch,
    RangeMismatch,
    ReadmeMismatch,
    ReleaseSetDefect,
    RenderedMismatch,
)
from kvprobe.env.venv import load_profile
from kvprobe.errors import ExperimentError, UsageError
from kvprobe.evidence.reader import Bundle, read_bytes
from kvprobe.evidence.sweep_view import TIMELINE, render_readme, timeline_svg
from kvprobe.model.sweep_receipt import SweepReceipt
from kvprobe.names import README, RECEIPT
from kvprobe.resources import builtin_search_path
from kvprobe.rules.sweep_listing import observed_range, unserved_reason, version_key
from kvprobe.sources import releases as index
from kvprobe.sources.wheel import names_release

_MAX_RENDERED_BYTES = 1 << 20

Defect = Callable[[str, str], BundleDefect]


def release_set_defects(receipt: SweepReceipt, notes: list[str]) -> list[BundleDefect]:
    """Every defect of the release set (see the module docstring); ``notes`` gets what could
    not be checked (a profile kvprobe does not ship)."""
    listing = receipt.listing
    found = _sequence(list(listing.versions), "listing.versions", ListingMismatch)
    found += _sequence([e.version for e in listing.selected], "listing.selected", ListingMismatch)
    found += _sequence([r.version for r in receipt.releases], "releases", ReleaseSetDefect)
    found += _sequence(list(receipt.unserved), "unserved", ReleaseSetDefect)
    if found:
        return found  # the checks below compare sequences that must first be well formed
    found += _spec_defects(receipt)
    found += _profile_defects(receipt, notes)
    found += _completeness_defects(receipt)
    found += _wheel_defects(receipt)
    return found


def _sequence(versions: list[str], where: str, defect: Defect) -> list[BundleDefect]:
    """PEP 440 versions, unique by version equality, ascending."""
    found: list[BundleDefect] = []
    parsed: list[Version] = []
    for text in versions:
        version = version_key(text)
        if version is None:
            found.append(defect(RECEIPT, f"{where}: {text!r} is not a PEP 440 version"))
        else:
            parsed.append(version)
    if found:
        return found
    seen: dict[Version, str] = {}
    for text, version in zip(versions, parsed, strict=True):
        if version in seen:
            found.append(
                defect(RECEIPT, f"{where}: {text} and {seen[version]} are one version (PEP 440 equality): a twin")
            )
        seen.setdefault(version, text)
    for i in range(1, len(parsed)):
        if parsed[i] < parsed[i - 1]:
            found.append(defect(RECEIPT, f"{where}: {versions[i]} is stored after {versions[i - 1]}: out of order"))
    return found


def _spec_defects(receipt: SweepReceipt) -> list[BundleDefect]:
    """The spec selects from the listing exactly the versions the listing says it selected."""
    listing, spec = receipt.listing, receipt.spec
    selected = [e.version for e in listing.selected]
    try:
        expected = index.select(spec, list(listing.versions), option="spec") if spec else list(listing.versions)
    except UsageError as exc:
        return [ListingMismatch(RECEIPT, f"spec {spec!r} cannot select from the listing: {exc.message}")]
    if expected != selected:
        return [
            ListingMismatch(
                RECEIPT,
                f"spec {spec!r} selects {_span(expected)} from the listing's versions; the listing's selection "
                f"is {_span(selected)}",
            )
        ]
    return []


def _span(versions: list[str]) -> str:
    if not versions:
        return "nothing"
    if len(versions) <= 4:
        return ", ".join(versions)
    return f"{len(versions)} versions, {versions[0]} .. {versions[-1]}"


def ships_profile(name: str) -> bool:
    """Whether ``name`` is a dependency profile kvprobe ships: only then did verify hold a sweep
    receipt's ``serves`` and ``serves_why`` to kvprobe's own words."""
    try:
        with builtin_search_path():
            load_profile(name)
    except ExperimentError:
        return False
    return True


def _profile_defects(receipt: SweepReceipt, notes: list[str]) -> list[BundleDefect]:
    """The profile's ``serves`` decides what is not run: it must be the installed profile's, and
    so must its ``serves_why`` where the receipt states one (receipts before it state none)."""
    name, serves, why = receipt.profile.name, receipt.profile.serves, receipt.profile.serves_why
    try:
        with builtin_search_path():
            profile = load_profile(name)
    except ExperimentError:
        notes.append(f"profile {name!r} is not one kvprobe ships: which releases it serves is the bundle's own claim")
        return []
    if profile.serves != serves:
        return [
            ReleaseSetDefect(
                RECEIPT,
                f"profile {name} serves {profile.serves!r} in this kvprobe; the receipt says it serves {serves!r}",
            )
        ]
    if why is not None and profile.serves_why != why:
        return [
            ReleaseSetDefect(
                RECEIPT,
                f"profile {name} says why it serves only {serves}: {profile.serves_why!r} in this kvprobe, "
                f"{why!r} in the receipt",
            )
        ]
    return []


def _completeness_defects(receipt: SweepReceipt) -> list[BundleDefect]:
    """Each selected version is a release entry, or was not run for the reason the profile gives."""
    profile, selected = receipt.profile, receipt.listing.selected
    found: list[BundleDefect] = []
    for entry in selected:
        version, stated = entry.version, entry.not_run
        reason = unserved_reason(profile.name, profile.serves, version, profile.serves_why)
        if stated != reason:
            given = f"not run: {stated!r}" if stated else "to be run"
            why = f"not run: {reason!r}" if reason else "served by the profile, so it must be a release entry"
            found.append(ReleaseSetDefect(RECEIPT, f"release {version}: the listing says {given}; it is {why}"))
    ran = [e.version for e in selected if e.not_run is None]
    releases = [r.version for r in receipt.releases]
    missing = [v for v in ran if v not in releases]
    extra = [v for v in releases if v not in ran]
    if missing:
        found.append(
            ReleaseSetDefect(
                RECEIPT,
                f"the listing's range holds {', '.join(missing)}, served by the profile, but no release entry does: "
                "the release set is incomplete",
            )
        )
    if extra:
        found.append(ReleaseSetDefect(RECEIPT, f"release entries {', '.join(extra)} are not in the listing's range"))
    not_run = [e.version for e in selected if e.not_run is not None]
    if list(receipt.unserved) != not_run:
        found.append(
            ReleaseSetDefect(
                RECEIPT, f"unserved is {_span(list(receipt.unserved))}; the listing did not run {_span(not_run)}"
            )
        )
    return found


def _wheel_defects(receipt: SweepReceipt) -> list[BundleDefect]:
    """Each file name names its release; a release's wheel is its listed one; one digest, one version."""
    listing = receipt.listing
    package = listing.package
    found: list[BundleDefect] = []
    owners: dict[str, str] = {}
    for entry in listing.selected:
        version, file, digest = entry.version, entry.file, entry.sha256
        if (file is None) != (digest is None) or (file is None) == (entry.problem is None):
            found.append(
                ListingMismatch(RECEIPT, f"listing {version}: a wheel file and its sha256, or a problem, not both")
            )
            continue
        if file is None or digest is None:
            continue
        if not names_release(file, package, version):
            found.append(PinMismatch(RECEIPT, f"listing {version}: {file!r} is not a wheel of {package} {version}"))
        if digest in owners and owners[digest] != version:
            found.append(PinMismatch(RECEIPT, f"sha256 {digest} is under {owners[digest]} and {version}: two releases"))
        owners.setdefault(digest, version)
    listed = {e.version: e for e in listing.selected}
    for release in receipt.releases:
        wheel, recorded = release.wheel, listed.get(release.version)
        if wheel is None or recorded is None:
            continue
        if (wheel.package, wheel.file, wheel.sha256) != (package, recorded.file, recorded.sha256):
            found.append(
                PinMismatch(
                    RECEIPT,
                    f"release {release.version}: wheel {wheel.file} sha256 {wheel.sha256} is not the one the "
                    f"listing recorded ({recorded.file} sha256 {recorded.sha256})",
                )
            )
    return found


def range_defects(receipt: SweepReceipt) -> list[BundleDefect]:
    """``observed`` is what the releases, the listing and the profile give."""
    got = observed_range(receipt.releases, receipt.listing, receipt.profile, receipt.spec).to_json()
    stated = receipt.observed.to_json()
    diffs = [f"observed.{k}: stated {stated.get(k)!r}, recomputed {got[k]!r}" for k in got if stated.get(k) != got[k]]
    if diffs:
        return [RangeMismatch(RECEIPT, f"the observed range does not follow from the releases: {'; '.join(diffs[:6])}")]
    return []


def rendered_defects(bundle: Bundle, receipt: SweepReceipt) -> list[BundleDefect]:
    """README.md and timeline.svg are byte for byte what this kvprobe renders from the receipt:
    reviewers read the one and embed the other, and nothing else ties them to the evidence."""
    made_by = receipt.tool.version
    found: list[BundleDefect] = []
    for name, render, defect in (
        (README, render_readme, ReadmeMismatch),
        (TIMELINE, timeline_svg, RenderedMismatch),
    ):
        if name not in bundle.listed():
            found.append(defect(name, "missing: a sweep bundle carries the summary kvprobe renders from receipt.json"))
            continue
        problems: list[BundleDefect] = []
        data = read_bytes(bundle, name, _MAX_RENDERED_BYTES, problems)
        if data is None:
            found += [defect(name, d.detail) for d in problems]
        elif data != render(receipt).encode("utf-8"):
            other = f", or rendered by kvprobe {made_by}: sweep again with this one" if made_by != __version__ else ""
            found.append(defect(name, f"not what kvprobe renders from receipt.json (edited after the run{other})"))
    return found

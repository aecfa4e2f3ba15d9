"""The release set of a sweep as evidence: which releases the index listed, why one in the
range did not run, and what the sweep observed of the range (its oldest observed release,
an observed ``introduced`` boundary, the first fixed release, the releases it did not see).

Pure rules over what a sweep receipt records (its listing, its releases' classes, its
profile's ``serves``), so that `verify` recomputes each of them and an export draws its
boundaries only from what verify recomputed.
"""

from __future__ import annotations

from collections.abc import Sequence

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from kvprobe.model.sweep_receipt import Listing, ObservedRange, ProfileRef, ReleaseRecord
from kvprobe.rules.sweep_classification import AFFECTED, FIXED, MIXED, NOT_PRESENT

# Names what observed_range() computes; change it whenever its output for the same inputs changes.
RANGE_ALGORITHM = "kvprobe.sweep-range/1"

# Classes that say something of a release's code: it was observed (could-not-observe is not).
SEEN = (AFFECTED, FIXED, MIXED, NOT_PRESENT)


def version_key(text: str) -> Version | None:
    """The PEP 440 version of ``text``, None when it is none."""
    try:
        return Version(text)
    except InvalidVersion:
        return None


def unserved_reason(profile: str, serves: str | None, version: str, why: str | None = None) -> str | None:
    """Why profile ``profile`` (its ``serves`` specifier set) does not run ``version``; None
    when it does. A release below a lower bound (``>=``/``>``) is older than the profile's
    floor; any other refusal is outside what it serves. ``why``: what the profile says of the
    releases it does not serve (its ``serves_why``), appended."""
    if serves is None:
        return None
    try:
        specifiers = SpecifierSet(serves)
    except InvalidSpecifier:
        return f"profile {profile} serves {serves!r}, which is no version specifier"
    if specifiers.contains(version, prereleases=True):
        return None
    below = [s for s in specifiers if s.operator in (">=", ">") and not s.contains(version, prereleases=True)]
    because = f": {why}" if why else ""
    if below:
        return f"older than the profile's floor: profile {profile} serves {serves}{because}"
    return f"outside what profile {profile} serves ({serves}){because}"


def observed_range(
    releases: Sequence[ReleaseRecord], listing: Listing, profile: ProfileRef, spec: str | None
) -> ObservedRange:
    """What the sweep observed of the range, from its releases (whatever order they are stored
    in), its listing, its profile and its --releases ``spec``:

    - ``oldest``: the oldest release observed (affected, fixed, mixed or not-present), or None;
    - ``introduced``: the oldest affected release when the release before it was observed
      not-present (the probed code appeared there), else None: where the sweep did not see the
      code path arrive, the start of the affected range is unknown;
    - ``first_fixed``: the oldest fixed release newer than every affected one, or None;
    - ``not_observed``: every version the index listed that is older than ``oldest`` (all of
      them when nothing was observed), ascending;
    - ``not_observed_reason``: why the newest of those was not observed (None: there is none)."""
    rows = sorted(((r.version, r.classification.overall) for r in releases), key=lambda row: _order(row[0]))
    seen = [(v, cls) for v, cls in rows if cls in SEEN]
    oldest = seen[0][0] if seen else None
    introduced = None
    first_affected = next((i for i, (_, cls) in enumerate(rows) if cls == AFFECTED), None)
    if first_affected is not None and first_affected > 0 and rows[first_affected - 1][1] == NOT_PRESENT:
        introduced = rows[first_affected][0]
    last_affected = max((i for i, (_, cls) in enumerate(rows) if cls == AFFECTED), default=-1)
    first_fixed = next((v for v, cls in rows[last_affected + 1 :] if cls == FIXED), None)
    floor = _order(oldest) if oldest is not None else None
    not_observed = [v for v in sorted(listing.versions, key=_order) if floor is None or _order(v) < floor]
    reason = _why_not(listing, profile, spec, not_observed[-1]) if not_observed else None
    return ObservedRange(RANGE_ALGORITHM, oldest, introduced, first_fixed, tuple(not_observed), reason)


def _why_not(listing: Listing, profile: ProfileRef, spec: str | None, version: str) -> str:
    """Why ``version`` (a listed one older than anything observed) was not observed."""
    selected = {e.version: e for e in listing.selected}
    if version not in selected:
        floor = unserved_reason(profile.name, profile.serves, version, profile.serves_why)
        return f"outside --releases {spec}" + (f"; {floor}" if floor else "")
    if selected[version].not_run is not None:
        return str(selected[version].not_run)
    return f"{version} ran but could not be observed (see its release entry)"


def _order(text: str) -> tuple[int, Version | str]:
    """Sort key: PEP 440 order; a string that is no version sorts last (step 4 refuses it)."""
    parsed = version_key(text)
    return (0, parsed) if parsed is not None else (1, text)


def ascending(versions: Sequence[str]) -> list[str]:
    """``versions`` in PEP 440 order (the order the timeline and the README show)."""
    return sorted(versions, key=_order)

"""Step 6 of a sweep bundle, its parts: which releases to re-run, whether the index still
serves the bytes the bundle recorded, and what differs between the published sweep and the
fresh one (run/rerun.py runs it, with the same trust rule as a run bundle's rerun).

A release whose version now resolves to other bytes on the index is not re-run: the same
version number with a different sha256 is itself the finding, and observations of other code
would say nothing about the published ones.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from pathlib import Path
from typing import Any

from packaging.version import Version

from kvprobe.defects import IndexServesOtherBytes, ListingChanged, RerunDiffers
from kvprobe.errors import UsageError
from kvprobe.model.sweep_receipt import Classification, ReleaseRecord, SweepReceipt
from kvprobe.names import RECEIPT
from kvprobe.rules.compare import case_table
from kvprobe.sources import releases
from kvprobe.sources.wheel import platform_args

FAMILY = "kvprobe.sweep-receipt"

# version -> {probe name: raw document}
Docs = dict[str, dict[str, dict[str, Any]]]


def chosen_releases(receipt: SweepReceipt, spec: str | None) -> list[str]:
    """The releases a rerun runs: every release the sweep ran, or those ``spec`` names (a
    --releases SPEC over the sweep's releases); UsageError for one the sweep did not run."""
    ran = [r.version for r in receipt.releases]
    if spec is None:
        return ran
    chosen = releases.select(spec, ran, option="--release", among=f"a release this sweep ran ({', '.join(ran)})")
    if not chosen:
        raise UsageError(f"--release {spec!r} names none of the releases this sweep ran ({', '.join(ran)})")
    return chosen


def listing_findings(receipt: SweepReceipt, scratch: Path) -> tuple[list[RerunDiffers], list[str]]:
    """The index's release listing read again and compared with the one the bundle recorded:
    (findings, notes). A version the index lists now that the bundle's listing lacks, older
    than the newest it recorded, is a finding (the range the bundle drew is not the index's:
    a release was left out); a newer one is a note (published since). A version the bundle
    listed that the index no longer lists (yanked and removed, or deleted) is a finding in
    the sweep's range, a note outside it. FetchError when the index cannot be asked."""
    listing = receipt.listing
    files = [e.file for e in listing.selected if e.file] + [r.wheel.file for r in receipt.releases if r.wheel]
    now = releases.index_versions(listing.package, platform_args(files[0]) if files else [], scratch / "index")
    recorded = {Version(v): v for v in listing.versions}
    current = {Version(v): v for v in now}
    newest = max(recorded, default=None)
    in_range = {Version(e.version) for e in listing.selected}
    spec = receipt.spec
    union = sorted({*recorded.values(), *current.values()}, key=Version)
    range_now = {Version(v) for v in (releases.select(spec, union, option="spec") if spec else union)}
    findings: list[RerunDiffers] = []
    notes: list[str] = []
    for version in sorted(set(current) - set(recorded)):
        text = current[version]
        if newest is not None and version < newest:
            selects = f", and the sweep's range {spec or '(every release)'} selects it" if version in range_now else ""
            findings.append(
                ListingChanged(
                    RECEIPT,
                    f"the index lists {text}, older than {recorded[newest]}{selects}; the bundle's listing, read "
                    f"{listing.read_utc}, does not hold it: the range was drawn from a release set not the index's",
                )
            )
        else:
            notes.append(f"the index lists {text}, published since the sweep read its listing ({listing.read_utc})")
    for version in sorted(set(recorded) - set(current)):
        text = recorded[version]
        if version in in_range:
            findings.append(
                ListingChanged(
                    RECEIPT,
                    f"the index no longer lists {text}, which the sweep's range held (yanked and removed, or "
                    "deleted): it cannot be re-run",
                )
            )
        else:
            notes.append(f"the index no longer lists {text} (outside the sweep's range)")
    return findings, notes


def index_findings(receipt: SweepReceipt, versions: list[str], scratch: Path) -> dict[str, RerunDiffers]:
    """Each release's wheel resolved on the index again: {version: finding} for a version that
    now names other bytes (another sha256 or file) than the bundle recorded. FetchError or
    UsageError when the index cannot be asked or no longer has the release."""
    found: dict[str, RerunDiffers] = {}
    for release in receipt.releases:
        wheel, version = release.wheel, release.version
        if version not in versions or wheel is None:
            continue
        pin = releases.resolve(wheel.package, version, platform_args(wheel.file), scratch / version)
        if (pin.filename, pin.sha256) != (wheel.file, wheel.sha256):
            found[version] = IndexServesOtherBytes(
                RECEIPT,
                f"release {version}: the index now serves {pin.filename} sha256 {pin.sha256}; "
                f"the bundle recorded {wheel.file} sha256 {wheel.sha256}: the same version is other "
                "bytes now, so it was not re-run",
            )
    return found


def raw_docs(receipt: SweepReceipt, read: Callable[[str], dict[str, Any] | None]) -> Docs:
    """{version: {probe: document}} of every probe output the receipt cites; ``read(path)``
    gives a document (None when unusable)."""
    docs: Docs = {}
    for release in receipt.releases:
        for probe in release.probes:
            doc = read(probe.raw.path) if probe.raw else None
            if doc is not None:
                docs.setdefault(release.version, {})[probe.name] = doc
    return docs


def diff_sweeps(
    published: SweepReceipt, fresh: SweepReceipt, versions: list[str], was: Docs, now: Docs
) -> list[RerunDiffers]:
    """Per re-run release: a wheel with other bytes, a probe that could not run now, every
    observation and case outcome, each case's class and the release's classification."""
    found: list[RerunDiffers] = []
    old = {r.version: r for r in published.releases}
    new = {r.version: r for r in fresh.releases}
    for version in versions:
        if version not in new:
            found.append(RerunDiffers(RECEIPT, f"release {version}: the rerun did not run it (now unserved)"))
            continue
        a, b = old[version], new[version]
        if a.wheel and b.wheel and a.wheel.sha256 != b.wheel.sha256:
            found.append(
                IndexServesOtherBytes(
                    RECEIPT,
                    f"release {version}: re-ran {b.wheel.file} sha256 {b.wheel.sha256}, "
                    f"published {a.wheel.sha256}: the index changed during the rerun",
                )
            )
            continue
        raw = {p.name: p.raw.path for p in a.probes if p.raw}
        found += _problem_diffs(version, a, b, raw)
        # a case unstable in either sweep (--repeat N) has no one value: its class is compared below
        shaky = set(a.classification.unstable or {}) | set(b.classification.unstable or {})
        found += _case_diffs(version, was.get(version, {}), now.get(version, {}), raw, shaky)
        found += _class_diffs(version, a.classification, b.classification)
    return found


def _problem_diffs(version: str, a: ReleaseRecord, b: ReleaseRecord, raw: dict[str, str]) -> list[RerunDiffers]:
    found = []
    if b.problem and b.problem != a.problem:
        found.append(RerunDiffers(RECEIPT, f"release {version}: rerun could not run it: {b.problem}"))
    before = {p.name: p.problem for p in a.probes}
    for probe in b.probes:
        if probe.problem and probe.problem != before.get(probe.name):
            found.append(
                RerunDiffers(
                    raw.get(probe.name, RECEIPT),
                    f"release {version} probe {probe.name}: rerun could not run it: {probe.problem}",
                )
            )
    return found


def _case_diffs(
    version: str,
    was: dict[str, dict[str, Any]],
    now: dict[str, dict[str, Any]],
    raw: dict[str, str],
    shaky: Set[str] = frozenset(),
) -> list[RerunDiffers]:
    """Observations value by value (the type too: True is not 1), then how far each case got;
    cases in ``shaky`` (unstable across repeats) are skipped."""
    before, after = case_table(was), case_table(now)
    found = []
    for key in sorted((set(before) | set(after)) - shaky):
        where = raw.get(key.split("/", 1)[0], RECEIPT)
        a, b = before.get(key), after.get(key)
        names = set((a or {}).get("observations", {})) | set((b or {}).get("observations", {}))
        for name in sorted(names):
            old, new = _value(a, name), _value(b, name)
            if old != new:
                found.append(RerunDiffers(where, f"release {version} {key} {name}: published {old}, rerun {new}"))
        old_outcome, new_outcome = _outcome(a), _outcome(b)
        if old_outcome != new_outcome:
            found.append(
                RerunDiffers(where, f"release {version} case {key}: published {old_outcome}, rerun {new_outcome}")
            )
    return found


def _value(case: dict[str, Any] | None, name: str) -> str:
    if case is None or name not in case["observations"]:
        return "not recorded"
    value = case["observations"][name]
    return f"{type(value).__name__}:{value!r}"


def _outcome(case: dict[str, Any] | None) -> tuple[Any, ...]:
    if case is None:
        return (None, None, None)
    return case["status"], case["error_type"], case["observation"]


def _class_diffs(version: str, a: Classification, b: Classification) -> list[RerunDiffers]:
    found = []
    for key in sorted(set(a.cases) | set(b.cases)):
        old, new = a.cases.get(key, {}).get("class"), b.cases.get(key, {}).get("class")
        if old != new:
            found.append(RerunDiffers(RECEIPT, f"release {version} case {key}: published {old!r}, rerun {new!r}"))
    if a.overall != b.overall:
        was, now = a.overall.value, b.overall.value
        found.append(RerunDiffers(RECEIPT, f"release {version}: published {was!r}, rerun {now!r}"))
    return found

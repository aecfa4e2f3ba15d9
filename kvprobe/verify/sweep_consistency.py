"""Step 4 of a sweep receipt (one experiment on many releases): each release's classification and
the summary are recomputed from the raw outputs; the release set, the observed range and the
rendered files are :mod:`~kvprobe.verify.sweep_set`'s.
"""

from __future__ import annotations

from typing import Any

from kvprobe.defects import (
    BundleDefect,
    CitationMisplaced,
    ComparisonAlgorithmUnknown,
    ComparisonMismatch,
    ExpectationsMismatch,
    ExperimentMismatch,
    ForgedVerdict,
    PinMismatch,
    RecomputeFailed,
)
from kvprobe.evidence.reader import Bundle
from kvprobe.evidence.sweep_view import TIMELINE
from kvprobe.model.receipt import FileRef
from kvprobe.model.sweep_receipt import SweepReceipt
from kvprobe.names import PROBES_DIR, RECEIPT, SIDES
from kvprobe.rules import sweep_classification as sweep
from kvprobe.rules.sweep_listing import version_key
from kvprobe.sources.wheel import names_release
from kvprobe.verify.consistency import (
    citation_defects,
    cited_files,
    duplicates,
    experiment_digest_defects,
    experiment_view,
    json_diff,
    summary,
)
from kvprobe.verify.result import StepResult, step_result
from kvprobe.verify.run_consistency import repeat_placement
from kvprobe.verify.sweep_reused import reused_defects
from kvprobe.verify.sweep_set import range_defects, release_set_defects, rendered_defects


def step_sweep_consistency(bundle: Bundle, receipt: SweepReceipt) -> StepResult:
    """Cited files are the manifest's and where they belong; each release's classification and
    the summary are recomputed from the raw outputs and the bundled experiment's [expect]; the
    release set is the listing's range (verify/sweep_set), the observed range follows from the
    releases, and README.md and timeline.svg are what kvprobe renders from the receipt."""
    exp = receipt.experiment
    notes: list[str] = []
    releases = [r.to_json() for r in receipt.releases]
    cited = [("experiment.file", FileRef(exp.file, exp.sha256)), *cited_files(releases)]
    defects = citation_defects(cited, bundle.listed()) + sweep_placement_defects(receipt)
    defects += release_set_defects(receipt, notes)
    if receipt.algorithm != sweep.ALGORITHM:
        defects.append(
            ComparisonAlgorithmUnknown(
                RECEIPT, f"classified by {receipt.algorithm!r}; this kvprobe computes {sweep.ALGORITHM!r}"
            )
        )
    else:
        defects += sweep_recompute_defects(bundle, receipt)
    defects += range_defects(receipt) + rendered_defects(bundle, receipt) + reused_defects(receipt)
    if bundle.experiment is not None:
        defects += sweep_experiment_defects(bundle, receipt)
    return step_result(
        4,
        defects,
        f"{len(receipt.releases)} release classifications recomputed from raw outputs; the release set checked "
        f"against the listing ({len(receipt.listing.selected)} in the range); README.md and {TIMELINE} re-rendered",
        notes,
    )


def sweep_placement_defects(receipt: SweepReceipt) -> list[BundleDefect]:
    """Raw outputs sit under raw/<their release>/probes/, sources under probes/<experiment id>/."""
    exp_id, exp_file = receipt.experiment.id, receipt.experiment.file
    found = duplicates([r.version for r in receipt.releases], "releases")
    if exp_file != f"{PROBES_DIR}/{exp_id}/experiment.toml":
        found.append(CitationMisplaced(exp_file, f"expected probes/{exp_id}/experiment.toml"))
    for release in receipt.releases:
        for probe in release.probes:
            if not probe.source.path.startswith(f"{PROBES_DIR}/{exp_id}/"):
                found.append(CitationMisplaced(probe.source.path, f"expected under probes/{exp_id}/"))
            expected = f"raw/{release.version}/probes/{probe.name}.json"
            if probe.raw is not None and probe.raw.path != expected:
                found.append(CitationMisplaced(probe.raw.path, f"release {release.version}: expected {expected}"))
            found += repeat_placement(
                f"raw/{release.version}", f"release {release.version}", probe, receipt.repeats or 1
            )
    return found


def sweep_recompute_defects(bundle: Bundle, receipt: SweepReceipt) -> list[BundleDefect]:
    found: list[BundleDefect] = []
    for release in receipt.releases:
        docs = {}
        for probe in release.probes:
            if probe.raw is not None and probe.raw.path not in bundle.raw_docs:
                return [RecomputeFailed(RECEIPT, f"{probe.raw.path} is unusable (step 2): not recomputed")]
            if probe.raw is not None:
                docs[probe.name] = bundle.raw_docs[probe.raw.path]
        repeats = None
        if receipt.repeats:  # sweep --repeat N: runs 2..N, read as step 2 accepted them
            usable = [r.raw.path for p in release.probes for r in p.repeats or () if r.raw]
            if any(rel not in bundle.raw_docs for rel in usable):
                return [RecomputeFailed(RECEIPT, f"a repeat of release {release.version} is unusable (step 2)")]
            repeats = sweep.release_repeats(release.probes, bundle.raw_docs.__getitem__)
        try:
            problems = sweep.release_problems(release.problem, release.probes)
            got = sweep.classify_release(dict(receipt.expectations), docs, problems, repeats)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            return [RecomputeFailed(RECEIPT, f"raw outputs cannot be classified: {type(exc).__name__}: {exc}")]
        stated = release.classification
        if stated.overall != got["overall"]:
            found.append(
                ForgedVerdict(
                    RECEIPT,
                    f"release {release.version} is stated {stated.overall.value!r}; its raw outputs give "
                    f"{got['overall']!r}",
                )
            )
        diffs = json_diff(stated.to_json(), got, f"releases[{release.version}].classification")
        if diffs:
            found.append(ComparisonMismatch(RECEIPT, f"{len(diffs)} differences recomputed: {summary(diffs)}"))
    diffs = json_diff(dict(receipt.summary), sweep.summary(receipt.releases), "summary")
    if diffs:
        found.append(ForgedVerdict(RECEIPT, f"the summary does not follow from the releases: {summary(diffs)}"))
    return found


def sweep_experiment_defects(bundle: Bundle, receipt: SweepReceipt) -> list[BundleDefect]:
    """The bundled experiment.toml is the one the receipt names, with the same [expect]."""
    data, rel = bundle.experiment, receipt.experiment.file
    assert data is not None, "called only when step 2 read the experiment"
    found = experiment_digest_defects(bundle, FileRef(rel, receipt.experiment.sha256))
    expect = {side: data.get("expect", {}).get(side, {}) for side in SIDES}
    diffs = json_diff(receipt.expectations, expect, "expectations")
    if diffs:
        found.append(ExpectationsMismatch(rel, f"[expect] differs from receipt.expectations: {summary(diffs)}"))
    # the facts an export quotes (title, fix, vulnerability) are the bundled file's, as for a run
    stated = {k: v for k, v in receipt.experiment.to_json().items() if k != "sha256"}
    declared = {k: v for k, v in experiment_view(data, "")["experiment"].items() if k not in ("layer", "profile")}
    diffs = json_diff(stated, declared, "experiment")
    if diffs:
        found.append(ExperimentMismatch(rel, f"the receipt disagrees with the bundled experiment: {summary(diffs)}"))
    if data["profile"] != receipt.profile.name:
        found.append(
            ExperimentMismatch(
                rel, f"profile {receipt.profile.name!r} is not the bundled experiment's ({data['profile']!r})"
            )
        )
    return found + sweep_wheel_defects(receipt, data)


def sweep_wheel_defects(receipt: SweepReceipt, data: dict[str, Any]) -> list[BundleDefect]:
    """Each release's wheel is a wheel of the package the experiment's wheel pins name, at that
    release: `verify --rerun` asks the index for exactly it, so a bundle must not choose what pip
    resolves (a path, another package, an sdist)."""
    pins = [p for p in (data.get("pins") or {}).values() if isinstance(p, dict) and p.get("kind") == "wheel"]
    packages = {side["package"] for p in pins for side in (p.get("base"), p.get("head")) if isinstance(side, dict)}
    found: list[BundleDefect] = []
    for release in receipt.releases:
        wheel, version = release.wheel, release.version
        if wheel is None:
            continue
        if (
            wheel.package not in packages
            or wheel.version != version
            or not names_release(wheel.file, wheel.package, version)
        ):
            found.append(
                PinMismatch(
                    RECEIPT,
                    f"release {version}: wheel {wheel.package!r} {wheel.version!r} file {wheel.file!r} is "
                    f"not a wheel of {' or '.join(sorted(map(repr, packages))) or 'a package the experiment pins'} "
                    f"at {version}",
                )
            )
    return found + _pinned_release_defects(receipt, pins)


def _pinned_release_defects(receipt: SweepReceipt, pins: list[dict[str, Any]]) -> list[BundleDefect]:
    """A release the bundled experiment pins by sha256 is that wheel in the listing and the
    release alike: two releases' digests swapped shows here without asking the index."""
    pinned = {}
    for pin in pins:
        for side in (pin.get("base"), pin.get("head")):
            if isinstance(side, dict) and isinstance(side.get("version"), str):
                pinned[version_key(side["version"])] = (side.get("file"), side.get("sha256"))
    recorded = [(e.version, e.file, e.sha256) for e in receipt.listing.selected if e.file is not None]
    recorded += [(r.version, r.wheel.file, r.wheel.sha256) for r in receipt.releases if r.wheel is not None]
    found: list[BundleDefect] = []
    for version, file, digest in recorded:
        want = pinned.get(version_key(version))
        if want is not None and want != (file, digest):
            found.append(
                PinMismatch(
                    RECEIPT,
                    f"release {version}: {file} sha256 {digest} is not the wheel the bundled experiment pins for "
                    f"{version} ({want[0]} sha256 {want[1]})",
                )
            )
    return found

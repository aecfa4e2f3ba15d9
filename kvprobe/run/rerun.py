"""Step 6: run a verified bundle's experiment again and compare check by check.

The trust rule (README, "verify --rerun"): code from a bundle never runs without consent.

- When the bundle names an experiment the installed kvprobe ships, the rerun uses kvprobe's
  own installed copy; step 5 has already compared the bundle's experiment file and probes
  with it digest by digest, and a difference stops verification before step 6.
- Otherwise the rerun would execute the bundle's own probe code. It needs consent: the caller's
  ``consent`` callback is shown the sha256 of every file that will run and says yes or no
  (the CLI: ``--trust-bundle-code``, or a prompt on a terminal; never an implicit yes).
  Those files are copied out of the verified tree into a private temp dir.

Experiments and dependency profiles are looked up in kvprobe's own ``probes/`` only while a
rerun lasts (:func:`kvprobe.resources.builtin_search_path`): never the bundle directory or the
current directory's ``./probes``. The fresh bundle goes to a temp dir removed afterwards.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvprobe import __version__
from kvprobe.defects import RerunDiffers
from kvprobe.errors import ExperimentError, ObserveError, UsageError
from kvprobe.evidence.reader import Bundle
from kvprobe.model.gates_receipt import GatesReceipt
from kvprobe.model.load import load
from kvprobe.model.receipt import EnvRecord, Receipt
from kvprobe.model.records import Experiment, GitPin, Side, WheelPin
from kvprobe.model.sweep_receipt import SweepReceipt
from kvprobe.names import PROBES_DIR, RECEIPT, SIDES
from kvprobe.progress import Reporter
from kvprobe.resources import builtin_search_path
from kvprobe.run import rerun_sweep
from kvprobe.verify.anchor import installed_experiment
from kvprobe.verify.result import StepResult, step_result

# Asked before a bundle's own code runs: [(what runs, its identity: "sha256 HEX" or "commit
# SHA")] -> yes or no. The bundle's probe files first, then what its experiment file makes
# the rerun fetch and run: release wheels by version, upstream commits whose tests run.
Consent = Callable[[list[tuple[str, str]]], bool]
TRUST_FLAG = "--trust-bundle-code"


@dataclass(frozen=True)
class RerunOptions:
    repo: str | None = None
    torch_index: str | None = None
    timeout_s: float = 1800.0
    cache_root: Path | None = None
    consent: Consent | None = None  # None: the bundle's own code never runs
    releases: str | None = None  # a sweep bundle's releases to re-run (--release; a SPEC); None: all


_RawPaths = dict[tuple[str, str], str]


def rerun_step(opts: RerunOptions, reporter: Reporter | None = None) -> Callable[[Bundle], StepResult]:
    """Step 6 for :class:`kvprobe.verify.steps.VerifyOptions`: re-run with ``opts``."""
    return functools.partial(rerun, opts=opts, reporter=reporter)


def rerunnable(bundle: Bundle) -> Receipt | SweepReceipt:
    """The typed receipt of a run or sweep bundle, which step 2 accepted (verify re-runs no
    gates bundle: its step 6 says so before calling here)."""
    accepted = load(bundle.accepted_receipt)
    assert not isinstance(accepted, GatesReceipt), "verify's step 6 re-runs no gates bundle"
    return accepted


def bundle_code(bundle: Bundle) -> list[tuple[str, str]]:
    """(path, sha256) of every file under probes/<id>/: what a rerun of the bundle's copy runs."""
    prefix = f"{PROBES_DIR}/{rerunnable(bundle).experiment.id}/"
    return [(rel, e["sha256"]) for rel, e in sorted(bundle.listed().items()) if rel.startswith(prefix)]


def rerun(bundle: Bundle, opts: RerunOptions, reporter: Reporter | None = None) -> StepResult:
    """Step 6 of a run bundle or of a sweep bundle (its releases, or those --release names)."""
    sweep = bundle.receipt_family == rerun_sweep.FAMILY
    if opts.releases is not None and not sweep:
        raise UsageError("--release applies to sweep bundles: a run bundle is re-run whole")
    accepted = rerunnable(bundle)
    chosen = rerun_sweep.chosen_releases(accepted, opts.releases) if isinstance(accepted, SweepReceipt) else []
    exp_id = accepted.experiment.id
    installed = installed_experiment(exp_id)
    notes: list[str] = []
    refused = StepResult(
        6,
        "could-not-run",
        "not re-run: the bundle's own code needs consent",
        notes=[
            f"{exp_id} is not an experiment kvprobe {__version__} ships: re-running it executes the "
            f"bundle's own probe code as you; pass {TRUST_FLAG} to allow that (its digests are printed first)"
        ],
    )
    if installed is not None:
        notes.append(f"re-ran kvprobe {__version__}'s installed {exp_id}, not the bundle's copy")
    elif opts.consent is None:
        return refused
    work = Path(tempfile.mkdtemp(prefix="kvprobe-rerun-"))
    try:
        with builtin_search_path():
            try:
                exp = _load(installed, bundle, work)  # a bundle's copy: its verified bytes, copied
            except ExperimentError as exc:
                return StepResult(
                    6,
                    "fail",
                    "the experiment cannot be loaded",
                    [RerunDiffers(accepted.experiment.file, exc.message)],
                )
            if installed is None:
                assert opts.consent is not None, "returned above"
                if not opts.consent(what_runs(bundle, exp, chosen, opts)):
                    return refused
                notes.append(f"re-ran the bundle's own code for {exp_id} ({TRUST_FLAG})")
            if isinstance(accepted, SweepReceipt):
                return _rerun_releases(bundle, exp, chosen, opts, work, notes, reporter)
            published = accepted
            try:
                fresh = _run(exp, published.pin_set.name, opts, work, reporter, published.repeats or 1)
            except (ObserveError, UsageError) as exc:
                return StepResult(6, "could-not-run", f"could not re-run: {exc.message}", notes=exc.hints)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    defects = diff_runs(published, fresh)
    notes += env_notes(published, fresh)
    return step_result(
        6, defects, f"re-ran {exp.id} ({published.pin_set.name}): verdict {fresh.verdict.value!r}", notes
    )


def _load(installed: Path | None, bundle: Bundle, work: Path) -> Experiment:
    """The installed experiment, or the bundle's copy taken out of the verified tree into
    ``work`` (loaded, not run: consent comes after). Each file's bytes are hashed as they are
    copied and must be those verified and shown for consent: the rerun runs the private copy,
    never a second read of the bundle. Raises ExperimentError for a file that changed."""
    from kvprobe.experiments.experiment import load_file

    if installed is not None:
        return load_file(installed / "experiment.toml")
    exp_id = rerunnable(bundle).experiment.id
    for rel, digest in bundle_code(bundle):
        data = bundle.tree.read_bytes(rel, bundle.limits.max_file_bytes)
        if hashlib.sha256(data).hexdigest() != digest:
            raise ExperimentError(f"{rel} changed after it was verified (its sha256 is no longer {digest}): not run")
        target = work / PROBES_DIR / rel[len(PROBES_DIR) + 1 :]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return load_file(work / PROBES_DIR / exp_id / "experiment.toml")


def what_runs(bundle: Bundle, exp: Experiment, releases: list[str], opts: RerunOptions) -> list[tuple[str, str]]:
    """Everything a consented rerun of the bundle's own experiment runs, as (what, identity):
    its probe files (sha256), then what its experiment file decides besides them: for a
    sweep, each release's wheel fetched by version (the sha256 the sweep recorded; step 6
    refuses other bytes); for a run, the pin set's wheels (sha256) and the upstream commits
    whose test files and conftest.py pytest imports (by commit, from --repo or the upstream
    the experiment names)."""
    shown = [(rel, f"sha256 {digest}") for rel, digest in bundle_code(bundle)]
    published = rerunnable(bundle)
    if isinstance(published, SweepReceipt):
        for release in published.releases:
            if release.version in releases and release.wheel is not None:
                wheel = release.wheel
                what = f"{wheel.package} {wheel.version} from the package index, by version ({wheel.file})"
                shown.append((what, f"sha256 {wheel.sha256}"))
        return shown
    pin_set = exp.pin_sets.get(published.pin_set.name)
    if pin_set is None:  # the rerun will say the pin set is gone
        return shown
    url = opts.repo or exp.upstream or "(no upstream named)"
    commits = [(side, pin_set.pin(Side(side))) for side in SIDES]
    if pin_set.tests_commit is not None:
        commits.append(("tests", pin_set.tests_commit))
    for side, pin in commits:
        if isinstance(pin, WheelPin):
            shown.append((f"{pin.package} {pin.version} wheel ({side}, {pin.filename})", f"sha256 {pin.sha256}"))
        elif isinstance(pin, GitPin) and (pin_set.runs_tests or side == "tests"):
            tests = ", ".join(t.path for t in exp.tests_for(pin_set.name)) or "none"
            shown.append(
                (f"{url} ({side}): its conftest.py files and the tests pytest runs ({tests})", f"commit {pin.commit}")
            )
        elif isinstance(pin, GitPin):
            shown.append((f"{url} ({side}): the tree the probes import", f"commit {pin.commit}"))
    return shown


def _rerun_releases(
    bundle: Bundle,
    exp: Experiment,
    versions: list[str],
    opts: RerunOptions,
    work: Path,
    notes: list[str],
    reporter: Reporter | None,
) -> StepResult:
    """A sweep's releases again: a release whose version the index now serves as other bytes
    is a finding and is not run; the others are swept and compared with the published ones."""
    from kvprobe.run.sweep_runner import SweepOptions, sweep_experiment

    published = rerunnable(bundle)
    assert isinstance(published, SweepReceipt), "rerun() sends only sweep bundles here"
    try:
        moved, listing_notes = rerun_sweep.listing_findings(published, work / "listing")
        notes += listing_notes
        if moved:  # the range itself is not the index's: re-running its releases would not mend it
            return step_result(6, moved, "not re-run: the index's listing differs from the bundle's", notes)
        notes.append(f"the index's listing of {published.listing.package} in the range is the bundle's")
        changed = rerun_sweep.index_findings(published, versions, work / "resolve")
        same = [v for v in versions if v not in changed]
        if not same:
            return step_result(
                6, list(changed.values()), "not re-run: the index serves other bytes for every chosen release", notes
            )
        sweep_opts = SweepOptions(
            releases=",".join(same),
            out=work / "bundle",
            torch_index=opts.torch_index,
            timeout_s=opts.timeout_s,
            reuse=False,  # a rerun observes again: a unit from the cache would only repeat the published one
            repeat=published.repeats or 1,  # as often as the published sweep: stability is compared too
        )
        if opts.cache_root is not None:
            sweep_opts.cache_root = opts.cache_root
        result = sweep_experiment(exp, sweep_opts, reporter)
    except (ObserveError, UsageError) as exc:
        return StepResult(6, "could-not-run", f"could not re-run: {exc.message}", notes=exc.hints)
    fresh = result.receipt
    was = rerun_sweep.raw_docs(published, lambda rel: bundle.raw_docs.get(rel))
    now = rerun_sweep.raw_docs(fresh, lambda rel: json.loads((result.bundle / rel).read_text(encoding="utf-8")))
    defects = [*changed.values(), *rerun_sweep.diff_sweeps(published, fresh, same, was, now)]
    classes = ", ".join(f"{r.version} {r.classification.overall}" for r in fresh.releases)
    return step_result(
        6,
        defects,
        f"re-ran {exp.id} on {len(same)} of {len(versions)} releases: {classes}",
        notes + env_notes(published, fresh),
    )


def _run(
    exp: Experiment, pin_set: str, opts: RerunOptions, work: Path, reporter: Reporter | None, repeat: int = 1
) -> Receipt:
    """A fresh run as the published one ran: its pin set, and as many runs of each probe."""
    from kvprobe.run.runner import RunOptions, run_experiment

    run_opts = RunOptions(
        pin_set=pin_set,
        out=work / "bundle",
        repo=opts.repo,
        torch_index=opts.torch_index,
        timeout_s=opts.timeout_s,
        repeat=repeat,
    )
    if opts.cache_root is not None:
        run_opts.cache_root = opts.cache_root
    return run_experiment(exp, run_opts, reporter).receipt


def diff_runs(published: Receipt, fresh: Receipt) -> list[RerunDiffers]:
    """Every observation, case outcome, test outcome and the verdict that differ."""
    raw = _raw_paths(published)
    found = _problem_diffs(published, fresh, raw)  # the cause first: a probe that did not run
    found += _observation_diffs(published, fresh, raw) + _case_diffs(published, fresh, raw)
    found += _test_diffs(published, fresh, raw)
    if published.verdict != fresh.verdict:
        was, now = published.verdict.value, fresh.verdict.value
        found.append(RerunDiffers(RECEIPT, f"verdict: published {was!r}, rerun {now!r}"))
    return found


def _checks(receipt: Receipt, side: str) -> dict[str, str | None]:
    """A side's probes (by name) and test files (by path), and each one's problem."""
    record = receipt.sides[side]
    return {**{p.name: p.problem for p in record.probes}, **{t.path: t.problem for t in record.tests}}


def _problem_diffs(published: Receipt, fresh: Receipt, raw: _RawPaths) -> list[RerunDiffers]:
    """A probe or test file that ran when published but could not run now, with why."""
    found = []
    for side in SIDES:
        was = _checks(published, side)
        for key, problem in _checks(fresh, side).items():
            if problem and problem != was.get(key):
                found.append(RerunDiffers(_where(raw, side, key), f"{side} {key}: rerun could not run it: {problem}"))
    return found


def _raw_paths(receipt: Receipt) -> _RawPaths:
    """(side, probe name or test path) -> the published raw output's path."""
    paths = {}
    for side in SIDES:
        for p in receipt.sides[side].probes:
            paths[(side, p.name)] = p.raw.path if p.raw else RECEIPT
        for t in receipt.sides[side].tests:
            paths[(side, t.path)] = t.raw.path
    return paths


def _where(raw: _RawPaths, side: str, key: str) -> str:
    return raw.get((side, key), RECEIPT)


def _observation_diffs(published: Receipt, fresh: Receipt, raw: _RawPaths) -> list[RerunDiffers]:
    index = {(r["case"], r["observation"]): r for r in fresh.comparison.observations}
    seen, found = set(), []
    for row in published.comparison.observations:
        key = (row["case"], row["observation"])
        seen.add(key)
        other = index.get(key)
        for side in SIDES:
            was = _value(row, side)
            now = _value(other, side) if other else "not recorded"
            if was != now:
                found.append(
                    RerunDiffers(
                        _where(raw, side, row["case"].split("/")[0]),
                        f"{side} {row['case']} {row['observation']}: published {was}, rerun {now}",
                    )
                )
    for key in sorted(set(index) - seen):
        found.append(RerunDiffers(RECEIPT, f"{key[0]} {key[1]}: only in the rerun"))
    return found


def _value(row: dict[str, Any] | None, side: str) -> str:
    if row is None or not row[f"{side}_recorded"]:
        return "not recorded"
    return f"{type(row[side]).__name__}:{row[side]!r}"


def _case_diffs(published: Receipt, fresh: Receipt, raw: _RawPaths) -> list[RerunDiffers]:
    found = []
    for side in SIDES:
        was, now = published.comparison.cases[side], fresh.comparison.cases[side]
        for case in sorted(set(was) | set(now)):
            a, b = _case_outcome(was.get(case)), _case_outcome(now.get(case))
            if a != b:
                found.append(
                    RerunDiffers(_where(raw, side, case.split("/")[0]), f"{side} case {case}: published {a}, rerun {b}")
                )
    return found


def _case_outcome(case: dict[str, Any] | None) -> tuple[Any, ...]:
    """Status, exception type and how far the case got (receipts before compare/4: observed)."""
    if case is None:
        return (None, None, None)
    return case["status"], case["error_type"], case.get("observation", "observed")


def _test_diffs(published: Receipt, fresh: Receipt, raw: _RawPaths) -> list[RerunDiffers]:
    index = {(r["file"], r["test"]): r for r in fresh.comparison.tests}
    found, seen = [], set()
    for row in published.comparison.tests:
        key = (row["file"], row["test"])
        seen.add(key)
        other = index.get(key) or {}
        for side in SIDES:
            if row[side] != other.get(side) or row[f"{side}_exc_type"] != other.get(f"{side}_exc_type"):
                found.append(
                    RerunDiffers(
                        _where(raw, side, row["file"]),
                        f"{side} {row['test']}: published {row[side]} "
                        f"({row[f'{side}_exc_type']}), rerun {other.get(side)} "
                        f"({other.get(f'{side}_exc_type')})",
                    )
                )
    for key in sorted(set(index) - seen):
        found.append(RerunDiffers(RECEIPT, f"test {key[1]} in {key[0]}: only in the rerun"))
    return found


def _env_facts(env: EnvRecord | None) -> dict[str, Any]:
    """What of an env a rerun's notes compare (all None: the sweep's units named no env)."""
    if env is None:
        return dict.fromkeys(("profile", "lock_sha256", "python", "torch"))
    return {"profile": env.profile, "lock_sha256": env.lock_sha256, "python": env.python, "torch": env.torch}


def env_notes(published: Receipt | SweepReceipt, fresh: Receipt | SweepReceipt) -> list[str]:
    """A different dependency lock is worth knowing; it does not fail the step by itself."""
    notes = []
    was, now = _env_facts(published.env), _env_facts(fresh.env)
    notes += [f"env.{key}: published {was[key]!r}, rerun {now[key]!r}" for key in was if was[key] != now[key]]
    notes.append(
        f"host: {fresh.host.get('system')} {fresh.host.get('machine')} "
        f"(published on {published.host.get('system')} {published.host.get('machine')})"
    )
    if _check_modes(published) != _check_modes(fresh):
        # how a check's interpreter started is not a result: the observations are compared as usual
        notes.append(f"checks ran {_check_modes(fresh)} in the rerun, {_check_modes(published)} when published")
    return notes


def _check_modes(receipt: Receipt | SweepReceipt) -> str:
    """Forked, fresh or both; a receipt without ``execution`` predates the fork server: fresh
    (a sweep's records how each release ran, not the run: fresh here too)."""
    execution = receipt.execution if isinstance(receipt, Receipt) else None
    modes = {c.mode for c in execution.checks} if execution is not None else set()
    return " and ".join(sorted(modes)) or "fresh"

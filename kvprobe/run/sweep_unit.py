"""One (experiment, release) unit of a sweep, and the packed bundle it is exchanged as.

A unit runs the experiment's probes on one release and seals the result as a one-release
sweep bundle, packed (`kvprobe bundle pack`'s deterministic .tar.gz). Wherever it ran (a
thread here, a Ray worker elsewhere), the driver treats the archive as untrusted input:
the one bundle reader with its caps, verify steps 1-5, then the experiment, the release,
the wheel and the probe sources checked against what the driver asked for. Only then are
its raw outputs merged into the sweep bundle.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import platform
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from kvprobe import __version__
from kvprobe.checks import probes
from kvprobe.checks.forkserver import FRESH, ForkServer
from kvprobe.env.cache import default_cache_root
from kvprobe.env.venv import load_profile
from kvprobe.errors import KvprobeError, UsageError
from kvprobe.evidence.archive import extracted
from kvprobe.evidence.bundle import cite, host_facts, seal_bundle
from kvprobe.evidence.safetree import Limits
from kvprobe.evidence.sweep_view import TIMELINE, render_readme, timeline_svg
from kvprobe.experiments import experiment
from kvprobe.files import write_atomic
from kvprobe.model.load import load
from kvprobe.model.receipt import CheckMode, EnvRecord, ProbeRepeat, RunProbeRecord, ScopeRecord, Tool
from kvprobe.model.records import Experiment, PinSet, ProbeCheck, SourceKind, WheelPin
from kvprobe.model.sweep_receipt import (
    Classification,
    ListedRelease,
    Listing,
    ProfileRef,
    ReleaseExecution,
    ReleaseRecord,
    SweepExperimentRef,
    SweepReceipt,
    WheelRecord,
)
from kvprobe.names import LOGS_DIR, PROBES_DIR, RAW_DIR, SIDES, SWEEP_RECEIPT_SCHEMA
from kvprobe.progress import Reporter
from kvprobe.rules import sweep_classification as classify
from kvprobe.rules.sweep_listing import observed_range
from kvprobe.run.release_imports import Release, opened_for, ready, release_modules
from kvprobe.run.session import CheckSession, SessionSettings
from kvprobe.verify.pack import pack
from kvprobe.verify.steps import VerifyOptions, verify_dir


@dataclass(frozen=True)
class UnitRequest:
    """What the driver asks of a unit: picklable, so it travels to a Ray worker as is."""

    experiment_id: str
    experiment_sha256: str
    pin: WheelPin  # resolved by the driver: the worker must fetch exactly this wheel
    timeout_s: float  # per probe
    torch_index: str | None = None
    cache_root: Path | None = None  # None: the worker node's own cache (KVPROBE_CACHE_DIR or default)
    repeat: int = 1  # sweep --repeat N: each probe runs N times; a case that differs is unstable


@dataclass(frozen=True)
class UnitOutcome:
    """What came back: the packed unit bundle, or why there is none."""

    request: UnitRequest
    archive: bytes | None
    problem: str | None = None
    # run ahead of its sweep by the release-by-release pass (run.sweep_runner): its wall time there
    ran_ahead_s: float | None = None


class Executor(Protocol):
    """Runs units somewhere and hands back each one's outcome, in any order."""

    name: str

    def run(self, requests: Sequence[UnitRequest]) -> Iterator[UnitOutcome]: ...


# Units on Ray workers each prepare their own env: they run their probes fresh (one fork
# server per unit would preload for only a release's few probes).
UNIT_FRESH = "a unit on a Ray worker runs its probes in fresh interpreters"


def wheel_pin_set(exp: Experiment) -> PinSet:
    """The experiment's wheel pin set (its default if that is one): it names the package and
    the wheel tags (platform, Python) every release is resolved for."""
    ordered = [exp.pin_sets[exp.default_pin_set], *exp.pin_sets.values()]
    for pin_set in ordered:
        if pin_set.kind is SourceKind.WHEEL:
            return pin_set
    raise UsageError(f"{exp.id} has no wheel pin set: a sweep runs release wheels of the package a wheel pin names")


def open_session(exp: Experiment, settings: SessionSettings, reporter: Reporter) -> CheckSession:
    """The check session of ``exp``'s wheel pin set, its env built (once per lock, from the
    cache) and leased while it lasts. Its probes run fresh (UNIT_FRESH) unless the caller
    starts its fork server: on this host one session, started, serves every unit's probes."""
    session = CheckSession(exp, wheel_pin_set(exp), settings, reporter)  # a bad profile: refused before the build
    session.fresh_reason = UNIT_FRESH
    try:
        session.environment()
    except BaseException:
        session.close()
        raise
    return session


# --- the unit (runs wherever the executor puts it) ------------------------------------------


def produce_unit(
    request: UnitRequest,
    session: CheckSession | None = None,
    reporter: Reporter | None = None,
    exp: Experiment | None = None,
    release: Release | None = None,
) -> bytes:
    """Run one release and return its packed, verified one-release sweep bundle.

    ``exp``: the driver's experiment (a local unit runs exactly what its driver loaded: the
    installed copy in a rerun, or the bundle's copy consented to). On a worker (None), the
    experiment is this node's installed copy (its digest must be the one the driver asked
    for) and the env comes from this node's cache."""
    reporter = reporter or Reporter()
    exp = exp or experiment.load(request.experiment_id)
    if exp.file_sha256 != request.experiment_sha256:
        raise UsageError(
            f"{exp.id} here has experiment.toml sha256 {exp.file_sha256}, the driver's is {request.experiment_sha256}"
        )
    started = datetime.now(UTC)
    with contextlib.ExitStack() as held, tempfile.TemporaryDirectory(prefix="kvprobe-unit-") as tmp:
        work = Path(tmp)
        if session is None:  # on a worker: this node's env, its probes in fresh interpreters
            settings = SessionSettings(request.cache_root or default_cache_root(), request.torch_index)
            session = held.enter_context(open_session(exp, settings, reporter))
        staging = work / "staging"
        experiment.copy_into_bundle(exp, staging)
        entry = run_unit(exp, session, request, staging, work / "scratch", reporter, release)
        ran = SweepRun(
            request.pin.version,
            unit_listing(request.pin, started),
            started,
            session.record,
            (entry,),
            (),
            {},
            sweep_host(1, "unit"),
            request.repeat,
        )
        receipt = sweep_receipt(exp, ran)
        seal_sweep(receipt, staging, work / "bundle")
        return pack(work / "bundle", work / "unit.tar.gz").archive.read_bytes()


def run_unit(
    exp: Experiment,
    session: CheckSession,
    request: UnitRequest,
    staging: Path,
    scratch: Path,
    reporter: Reporter,
    release: Release | None = None,
) -> ReleaseRecord:
    """One release: its wheel (fetched, sha256- and RECORD-checked), its probes, their raw
    outputs under raw/<version>/, and its classification. ``release``: its tree and release
    server, opened by the driver for all the experiments on it (None: opened here for this
    unit alone)."""
    clock = time.monotonic()
    pin, version = request.pin, request.pin.version
    scratch.mkdir(parents=True)
    wheel: WheelRecord | None = None
    docs: dict[str, dict[str, Any]] = {}
    records: list[RunProbeRecord] = []
    repeat_docs: dict[str, list[dict[str, Any] | None]] = {}  # runs 2..N per probe (sweep --repeat N)
    execution: ReleaseExecution | None = None
    session.launch()  # a unit runs: the fork server its session waited to start until one did
    with contextlib.ExitStack() as held:  # probes write nothing into the tree: the cached one, used in place
        if release is None or release.version != version:  # a release of its own, for this unit alone
            reporter.update(f"{version}: wheel")
            # one probe gains nothing from a release's process: it would import the release
            # there instead of in itself, one fork further down (measured ~1 s slower a unit)
            shares = session.server is not None and len(exp.probes) > 1
            modules = release_modules([exp], pin.package) if shares else []
            release = held.enter_context(opened_for(session, pin, modules, scratch))
        problem = release.problem
        if release.identity is not None:
            wheel = WheelRecord(pin.package, pin.version, pin.filename, pin.sha256, release.identity["fetched_via"])
        if problem is None:
            server, reason = session.ready(), session.fresh_reason
            if server is not None:  # the release's server under it, where it started
                server, _ = ready(release, reporter)
            ran = []
            for check in exp.probes:
                reporter.update(f"{version}: probe {check.name}")
                record, run = _probe(exp, session, request, staging, scratch, check, server, release.tree)
                again = []
                for nth in range(2, request.repeat + 1):  # sweep --repeat N: the same probe, same server, again
                    reporter.update(f"{version}: probe {check.name} (run {nth} of {request.repeat})")
                    again.append(_probe(exp, session, request, staging, scratch, check, server, release.tree, nth))
                if again:
                    repeats = tuple(ProbeRepeat(r.raw, r.exit_code, r.problem) for r, _ in again)
                    record = RunProbeRecord(
                        record.name, record.source, record.raw, record.exit_code, record.problem, repeats
                    )
                    repeat_docs[check.name] = [r.output if r.ok else None for _, r in again]
                records.append(record)
                ran.append(run)
                if run.ok:
                    assert run.output is not None, "a probe run is ok with an output"
                    docs[check.name] = run.output
            execution = _execution(server, reason, ran)
    # the lease is gone: `cache prune` may remove the tree again
    problems = classify.release_problems(problem, records)
    classification = Classification.from_json(
        classify.classify_release(_expect(exp), docs, problems, repeat_docs or None)
    )
    duration = round(time.monotonic() - clock, 3)
    return ReleaseRecord(version, wheel, problem, tuple(records), classification, duration, execution)


def _expect(exp: Experiment) -> dict[str, Any]:
    return {side: exp.expectations.get(side, {}) for side in SIDES}


def _execution(server: ForkServer | None, reason: str | None, ran: list[probes.ProbeRun]) -> ReleaseExecution:
    """How this release's probes ran (the sweep receipt's optional ``execution``)."""
    rows = tuple(
        CheckMode(r.name, r.execution.mode, r.execution.reason or (reason if r.execution.mode == FRESH else None))
        for r in ran
    )
    return ReleaseExecution(dict(sorted(server.preloaded.items())) if server else {}, rows)


def _probe(
    exp: Experiment,
    session: CheckSession,
    request: UnitRequest,
    staging: Path,
    scratch: Path,
    check: ProbeCheck,
    server: ForkServer | None,
    tree: Path,
    nth: int = 1,
) -> tuple[RunProbeRecord, probes.ProbeRun]:
    """One run of a probe on one release (its tree at ``tree``); runs 2..N (``sweep --repeat``)
    write ``<name>.repeat-<run>.json`` and log under ``repeat-<run>/``."""
    name, path = check.name, check.path
    version = request.pin.version
    raw_dir = staging / RAW_DIR / version / "probes"
    log_dir = staging / LOGS_DIR / version / "probes" / (f"repeat-{nth}" if nth > 1 else "")
    raw_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    out = raw_dir / (f"{name}.json" if nth == 1 else f"{name}.repeat-{nth}.json")
    home = scratch / "home"
    home.mkdir(exist_ok=True)
    run = probes.run_probe(
        python=session.python,
        probe_file=exp.directory / path,
        python_path=[tree],
        out_json=out,
        log_dir=log_dir,
        side_config={"side": "release", "release": version},
        env_extra=session.variables,
        scratch=home,
        timeout_s=request.timeout_s,
        server=server,
    )
    if not run.ok and out.exists():
        out.rename(out.with_suffix(".invalid.json"))
    source = cite(staging / PROBES_DIR / exp.id / path, staging)
    return RunProbeRecord(name, source, cite(out, staging) if run.ok else None, run.exit_code, run.problem), run


# --- the receipt and the bundle (a unit's and the sweep's) -----------------------------------


def sweep_host(jobs: int, executor: str) -> dict[str, Any]:
    """The machine (the driver's, or the worker's in a unit bundle) and how units ran."""
    return {**host_facts(), "jobs": jobs, "executor": executor}


# A unit reads no index: its listing is the one pin its driver handed it.
UNIT_INDEX = "the wheel pin the sweep driver handed this unit"


def unit_listing(pin: WheelPin, started: datetime) -> Listing:
    """A unit's listing: the release its driver resolved, and nothing else."""
    entry = ListedRelease(pin.version, pin.filename, pin.sha256, None, None)
    return Listing(pin.package, UNIT_INDEX, started.strftime("%Y-%m-%dT%H:%M:%SZ"), (pin.version,), (entry,))


@dataclass(frozen=True)
class SweepRun:
    """What a sweep (or one unit) ran, for its receipt: ``spec`` the --releases SPEC (a unit:
    its version), ``listing`` the index's releases it worked from, ``env`` the env its units
    ran in (None: no unit said)."""

    spec: str | None
    listing: Listing
    started: datetime
    env: EnvRecord | None
    releases: tuple[ReleaseRecord, ...]
    unserved: tuple[str, ...]
    timings: dict[str, float]
    host: dict[str, Any]
    repeats: int = 1  # sweep --repeat N: each release's probes ran N times


def sweep_receipt(exp: Experiment, ran: SweepRun) -> SweepReceipt:
    profile = load_profile(exp.profile)
    stamp = ran.started.strftime("%Y%m%dT%H%M%SZ")
    per_release = [r.duration_s for r in ran.releases]
    profile_ref = ProfileRef(profile.name, profile.serves, profile.serves_why)
    timings = {**ran.timings, "release_max_s": max(per_release), "release_min_s": min(per_release)}
    return SweepReceipt(
        schema=SWEEP_RECEIPT_SCHEMA,
        tool=Tool(__version__),
        run_id=f"{exp.id}-sweep-{stamp}-{uuid.uuid4().hex[:6]}",
        created_utc=ran.started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        experiment=SweepExperimentRef(
            exp.id,
            exp.title,
            f"{PROBES_DIR}/{exp.id}/experiment.toml",
            exp.file_sha256,
            exp.upstream,
            exp.fix,
            exp.vulnerability,
        ),
        profile=profile_ref,
        spec=ran.spec,
        listing=ran.listing,
        algorithm=classify.ALGORITHM,
        env=ran.env,
        host=ran.host,
        settings=dict(sorted(profile.env)),
        expectations=_expect(exp),
        releases=ran.releases,
        unserved=ran.unserved,
        summary=classify.summary(ran.releases),
        observed=observed_range(ran.releases, ran.listing, profile_ref, ran.spec),
        evidence=ScopeRecord(
            shows=exp.scope.shows,
            does_not_show=exp.scope.does_not_show,
            limits=(
                f"host: {platform.system()} {platform.machine()}, CPU only; no GPU, RDMA or model weights",
                "release wheels carry no upstream tests: only the probes ran on each release",
                f"releases the {profile.name} profile does not serve ({profile.serves}) were not run: see unserved",
            ),
        ),
        timings={k: round(v, 3) for k, v in timings.items()},
        repeats=ran.repeats if ran.repeats > 1 else None,
    )


def staged_sweep(receipt: SweepReceipt, staging: Path) -> tuple[dict[str, Any], str]:
    """The sweep receipt as JSON and its README, its timeline written into ``staging``."""
    write_atomic(staging / TIMELINE, timeline_svg(receipt).encode("utf-8"))
    return receipt.to_json(), render_readme(receipt)


def seal_sweep(receipt: SweepReceipt, staging: Path, final: Path) -> str:
    """A unit's bundle sealed (its driver verifies it when it comes back)."""
    doc, readme = staged_sweep(receipt, staging)
    return seal_bundle(doc, SWEEP_RECEIPT_SCHEMA, readme, staging, final)


# --- the driver's side: accept a returned unit, or say why not --------------------------------


@dataclass(frozen=True)
class Expected:
    """What the driver holds a returned unit to."""

    exp: Experiment
    staging: Path  # the sweep's staging dir: its probes/<id>/ is the driver's copy
    env: EnvRecord | None  # the env units must have run in (None: the first accepted unit's)
    limits: Limits = Limits()


def accept_unit(
    outcome: UnitOutcome,
    expected: Expected,
    work: Path,
    accepted: Callable[[Path, SweepReceipt], None] | None = None,
) -> tuple[ReleaseRecord, EnvRecord | None]:
    """(the release's receipt entry, the env it ran in): the unit's own entry with its raw
    outputs merged into the sweep, or a could-not-observe entry saying why it was refused.
    ``accepted`` sees an accepted unit's verified bundle and receipt before they are removed."""
    version = outcome.request.pin.version
    if outcome.archive is None:
        return failed_entry(expected.exp, version, outcome.problem or "the unit returned nothing"), None
    if len(outcome.archive) > expected.limits.max_total_bytes:
        return failed_entry(expected.exp, version, f"returned {len(outcome.archive)} bytes > cap"), None
    archive = work / f"unit-{uuid.uuid4().hex}.tar.gz"
    archive.write_bytes(outcome.archive)
    try:
        with extracted(archive, expected.limits) as (root, defects):
            if root is None:
                return failed_entry(expected.exp, version, f"unit bundle refused: {defects[0]}"), None
            unit = _check_unit(root, outcome.request, expected)
            problem = unit if isinstance(unit, str) else _room_problem(root, version, expected)
            if problem is not None or isinstance(unit, str):
                return failed_entry(expected.exp, version, f"unit bundle refused: {problem}"), None
            _merge(root, version, expected.staging)
            if accepted is not None:
                accepted(root, unit)
            return unit.releases[0], unit.env
    except KvprobeError as exc:
        return failed_entry(expected.exp, version, f"unit bundle refused: {exc}"), None
    finally:
        archive.unlink(missing_ok=True)


def _check_unit(root: Path, request: UnitRequest, expected: Expected) -> SweepReceipt | str:
    """The unit bundle's receipt at ``root``, or the first reason to refuse it."""
    report = verify_dir(root, VerifyOptions(limits=expected.limits))
    if not report.ok:
        first = report.defects[0].message if report.defects else "a step did not pass"
        return f"does not verify: {first}"
    assert report.receipt is not None, "a verified bundle has a receipt"
    receipt = load(report.receipt)  # step 2 held it to its schema
    if not isinstance(receipt, SweepReceipt):
        return f"not a sweep receipt ({receipt.schema})"
    if receipt.tool.version != __version__:
        return f"made by kvprobe {receipt.tool.version}, the driver is {__version__}"
    if receipt.experiment.sha256 != expected.exp.file_sha256:
        return f"experiment sha256 {receipt.experiment.sha256} is not the driver's"
    if [r.version for r in receipt.releases] != [request.pin.version]:
        return f"releases {[r.version for r in receipt.releases]}, asked for {request.pin.version}"
    if (receipt.repeats or 1) != request.repeat:
        return f"ran its probes {receipt.repeats or 1} time(s), asked for {request.repeat}"
    return _entry_problem(receipt.releases[0], request, expected) or _env_problem(receipt.env, expected) or receipt


def _entry_problem(entry: ReleaseRecord, request: UnitRequest, expected: Expected) -> str | None:
    wheel, pin = entry.wheel, request.pin
    if wheel is None and not entry.problem:
        return "no wheel and no problem stated"
    if wheel is not None and (wheel.sha256, wheel.file) != (pin.sha256, pin.filename):
        return f"ran wheel {wheel.file} sha256 {wheel.sha256}, asked for {pin.filename} sha256 {pin.sha256}"
    for probe in entry.probes:
        mine = expected.staging / probe.source.path
        if not mine.is_file() or cite(mine, expected.staging) != probe.source:
            return f"probe source {probe.source.path} is not the driver's"
    return None


def _env_problem(env: EnvRecord | None, expected: Expected) -> str | None:
    key = None if env is None else env.key
    want = None if expected.env is None else expected.env.key
    if expected.env is None or key == want:
        return None
    return f"ran in env {key!r}, the sweep's is {want!r}"


# What the sweep adds beside its units' files (receipt, README, timeline, manifest, sums), kept free.
_SWEEP_OWN_FILES = 16
_SWEEP_OWN_BYTES = 64 << 20


def _room_problem(root: Path, version: str, expected: Expected) -> str | None:
    """A unit whose files would take the merged sweep past the bundle limits: each unit fits
    them alone, but one must not make the whole sweep fail its own verification."""
    files, size = _tally([root / top / version for top in (RAW_DIR, LOGS_DIR)])
    have_files, have_size = _tally([expected.staging])
    limits = expected.limits
    if have_files + files > limits.max_files - _SWEEP_OWN_FILES:
        return f"its {files} files would take the sweep past {limits.max_files} files"
    if have_size + size > limits.max_total_bytes - _SWEEP_OWN_BYTES:
        return f"its {size} bytes would take the sweep past {limits.max_total_bytes} bytes"
    return None


def _tally(tops: list[Path]) -> tuple[int, int]:
    """(files, bytes) under ``tops`` (symlinks counted as entries, never followed)."""
    files = size = 0
    for top in tops:
        for dirpath, _dirs, names in os.walk(top):
            files += len(names)
            size += sum(os.lstat(os.path.join(dirpath, name)).st_size for name in names)
    return files, size


def _merge(root: Path, version: str, staging: Path) -> None:
    """The release's raw outputs and logs (checked by verify step 3) into the sweep."""
    for top in (RAW_DIR, LOGS_DIR):
        source = root / top / version
        if source.is_dir():
            shutil.copytree(source, staging / top / version)


def failed_entry(exp: Experiment, version: str, problem: str) -> ReleaseRecord:
    """A release whose unit left nothing usable: could-not-observe, with why."""
    problems = classify.release_problems(problem, ())
    classification = Classification.from_json(classify.classify_release(_expect(exp), {}, problems))
    return ReleaseRecord(version, None, problem, (), classification, 0.0)


# --- the local executor ---------------------------------------------------------------------


@dataclass
class LocalExecutor:
    """Units in threads of this process, sharing the driver's experiment and its check session."""

    exp: Experiment
    session: CheckSession
    jobs: int
    reporter: Reporter
    name: str = "local"
    # units the driver already ran, release by release with other experiments' (run.sweep)
    done: dict[UnitRequest, UnitOutcome] = field(default_factory=dict)

    def run(self, requests: Sequence[UnitRequest]) -> Iterator[UnitOutcome]:
        """Each unit runs the driver's experiment, in a copy of the caller's context: a thread
        does not inherit it, and a rerun's units must find profiles only where the rerun does
        (builtin_search_path), never in ./probes. A unit in ``done`` is not run again."""
        ran = [self.done.pop(r) for r in requests if r in self.done]
        requests = [r for r in requests if r not in {outcome.request for outcome in ran}]
        yield from ran
        with ThreadPoolExecutor(max_workers=max(1, self.jobs)) as pool:
            futures = {
                pool.submit(contextvars.copy_context().run, produce_unit, r, self.session, self.reporter, self.exp): r
                for r in requests
            }
            for future in as_completed(futures):
                request = futures[future]
                try:
                    yield UnitOutcome(request, future.result())
                except KvprobeError as exc:
                    yield UnitOutcome(request, None, f"the unit failed: {exc}")

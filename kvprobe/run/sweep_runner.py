"""`kvprobe sweep`: one experiment's probes on every release of a range, into one bundle.

The driver resolves each release's wheel on the index (sha256 recorded) and hands one
unit per release to an executor (threads here with --jobs, or Ray tasks on a cluster with
--executor ray). Every unit comes back as a packed one-release bundle that the driver
verifies before merging (run/sweep_unit); a unit that fails, times out or does not verify
is that release's could-not-observe, and the sweep completes.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from kvprobe.env.cache import default_cache_root
from kvprobe.env.installer import pip_config
from kvprobe.env.venv import Profile, load_profile
from kvprobe.errors import DigestMismatch, FetchError, KvprobeError, UsageError
from kvprobe.experiments.experiment import copy_into_bundle
from kvprobe.model.receipt import EnvRecord
from kvprobe.model.records import Experiment, WheelPin
from kvprobe.model.sweep_receipt import ListedRelease, Listing, ReleaseRecord, SweepReceipt
from kvprobe.names import MAX_BUNDLE_FILES, SIDES, SWEEP_RECEIPT_SCHEMA
from kvprobe.progress import Reporter
from kvprobe.rules.sweep_listing import unserved_reason
from kvprobe.run.release_imports import opened_for, release_modules
from kvprobe.run.session import CheckSession, SessionSettings
from kvprobe.run.sweep_unit import (
    Executor,
    Expected,
    LocalExecutor,
    SweepRun,
    UnitOutcome,
    UnitRequest,
    accept_unit,
    failed_entry,
    open_session,
    produce_unit,
    staged_sweep,
    sweep_host,
    sweep_receipt,
    wheel_pin_set,
)
from kvprobe.run.unit_cache import SweepUnits
from kvprobe.run.workspace import SealedBundle, Workspace, bundle_path
from kvprobe.sources import releases
from kvprobe.sources.wheel import platform_args
from kvprobe.verify.steps import VerifyOptions


@dataclass
class SweepOptions:
    releases: str | None = None  # --releases SPEC; None: every release the profile serves
    out: Path | None = None
    cache_root: Path = field(default_factory=lambda: default_cache_root())
    torch_index: str | None = None
    jobs: int = field(default_factory=lambda: min(2, os.cpu_count() or 1))
    timeout_s: float = 900.0
    bundles_dir: Path = field(default_factory=lambda: Path("bundles"))
    executor: str = "local"  # local | ray
    address: str | None = None  # --address of the Ray cluster
    unit_timeout_s: float | None = None  # a Ray unit's limit; None: every probe's limit + 10 min
    preload: bool = True  # local units' probes fork from one preloaded interpreter; False: fresh ones
    reuse: bool = True  # take units the kvprobe cache holds (run/unit_cache); False: observe all again
    repeat: int = 1  # --repeat N: each release's probes run N times; a case that differs is unstable


# per profile: its session, the experiments on it, each release's units, and --jobs
_ReleaseGroup = tuple[CheckSession, list[Experiment], dict[WheelPin, list[UnitRequest]], int]


class SweepShare:
    """What the sweeps of one invocation (`kvprobe sweep A B --releases SPEC`) share: the
    index's listing of a package and each release's wheel resolved on it (read once, the same
    in every bundle), and per profile the env and its preloaded fork server, started by the
    first sweep and stopped when the share closes. A release's tree is the tree cache's, so
    the second sweep materializes from the cache what the first fetched. ``planned``: the
    invocation's experiments, whose probes bound the server's lifetime.
    """

    def __init__(self, planned: Sequence[Experiment]) -> None:
        self._held = contextlib.ExitStack()
        self._work = Path(tempfile.mkdtemp(prefix="kvprobe-sweeps-"))
        self._probes = sum(len(exp.probes) for exp in planned)
        self._listings: dict[tuple[str, ...], tuple[list[str], str]] = {}
        self._index: str | None = None
        self._pins: dict[tuple[str, ...], WheelPin | str] = {}
        self._sessions: dict[tuple[str, ...], CheckSession] = {}
        self._done: dict[UnitRequest, UnitOutcome] = {}  # units run release by release (run_by_release)

    def __enter__(self) -> SweepShare:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._held.close()
        finally:
            shutil.rmtree(self._work, ignore_errors=True)

    def index(self) -> str:
        """The index the listing is read from (pip's configuration, asked once)."""
        if self._index is None:
            self._index = index_url()
        return self._index

    def listing(self, package: str, flags: list[str]) -> tuple[list[str], str]:
        """The versions the index lists for ``package`` and when it was read (once)."""
        key = (package, *flags)
        if key not in self._listings:
            work = self._work / f"index-{len(self._listings)}"
            available = releases.index_versions(package, flags, work)
            self._listings[key] = (available, datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        return self._listings[key]

    def resolve(self, package: str, flags: list[str], versions: list[str], jobs: int) -> dict[str, WheelPin | str]:
        """Each version's wheel pin (or why not), resolved once per version for every sweep."""
        todo = [v for v in versions if (package, *flags, v) not in self._pins]
        if todo:
            work = self._work / f"resolve-{len(self._pins)}"
            for version, pin in _resolve(package, flags, todo, work, jobs).items():
                self._pins[(package, *flags, version)] = pin
        return {v: self._pins[(package, *flags, v)] for v in versions}

    def session(
        self, exp: Experiment, package: str, opts: SweepOptions, reporter: Reporter, releases_n: int
    ) -> CheckSession:
        """The check session of ``exp``'s profile (its env, and its fork server once a unit is to
        run: CheckSession.launch), opened by the first sweep that needs it."""
        key = (exp.profile, package, opts.torch_index or "", str(opts.cache_root), str(opts.preload))
        if key not in self._sessions:
            work = self._work / f"server-{len(self._sessions)}"
            work.mkdir()
            session = self._held.enter_context(open_session(exp, _session_settings(opts), reporter))
            lifetime = opts.timeout_s * self._probes * releases_n * opts.repeat + 600
            session.start(work, lifetime, when_needed=True)
            self._sessions[key] = session
        return self._sessions[key]

    def run_by_release(self, planned: Sequence[tuple[Experiment, SweepOptions]], reporter: Reporter) -> None:
        """Every local unit of the ``planned`` sweeps, release by release: each release's tree
        placed once and its modules imported once (run.release_imports) for the units of all
        the experiments on it, then closed; releases in parallel up to --jobs. The sweeps
        then take their units from here (an experiment that cannot plan runs as before)."""
        groups: dict[
            tuple[str, ...], tuple[CheckSession, list[Experiment], dict[WheelPin, list[UnitRequest]], int]
        ] = {}
        for exp, opts in planned:
            if opts.executor != "local":
                continue
            try:
                pin_set = wheel_pin_set(exp)
                assert isinstance(pin_set.head, WheelPin), "wheel_pin_set returns a wheel pin set"
                package, flags = pin_set.head.package, platform_args(pin_set.head.filename)
                profile = load_profile(exp.profile)
                available, _ = self.listing(package, flags)
                _, served = _selected(exp, opts, available, profile)
                session = self.session(exp, package, opts, reporter, len(available))
                kept = _unit_cache(exp, dict(profile.env), opts, session, reporter)
                if not kept.may_hold_all(served):  # a unit will run: the server preloads while the wheels resolve
                    session.launch()
                pins = self.resolve(package, flags, served, opts.jobs)
            except KvprobeError:
                continue  # its own sweep says why
            key = (exp.profile, package, opts.torch_index or "", str(opts.cache_root), str(opts.preload))
            _, exps, units, _ = groups.setdefault(key, (session, [], {}, opts.jobs))
            exps.append(exp)
            for pin in pins.values():
                if isinstance(pin, str):
                    continue
                request = _unit_request(exp, pin, opts, opts.cache_root)
                if not kept.holds(request, session.record):  # a cached unit is the sweep's to check and reuse
                    units.setdefault(pin, []).append(request)
        for session, exps, units, jobs in groups.values():
            if not units:
                continue  # every unit is the cache's: no server started for them
            session.launch()
            shares = session.server is not None and sum(len(exp.probes) for exp in exps) > 1  # see run_unit
            modules = release_modules(exps, next(iter(units)).package) if shares else []
            by_id = {exp.id: exp for exp in exps}
            with (
                reporter.step(f"sweeping {len(units)} releases x {len(exps)} experiments, release by release"),
                ThreadPoolExecutor(max_workers=max(1, jobs)) as pool,
            ):
                tasks = [
                    pool.submit(
                        contextvars.copy_context().run, self._release, pin, reqs, session, by_id, modules, reporter
                    )
                    for pin, reqs in units.items()
                ]
                for task in tasks:
                    task.result()

    def _release(
        self,
        pin: WheelPin,
        requests: list[UnitRequest],
        session: CheckSession,
        by_id: dict[str, Experiment],
        modules: list[str],
        reporter: Reporter,
    ) -> None:
        work = Path(tempfile.mkdtemp(dir=self._work, prefix=f"release-{pin.version}-"))
        with opened_for(session, pin, modules, work) as release:
            for request in requests:
                clock = time.monotonic()
                try:
                    archive = produce_unit(request, session, reporter, by_id[request.experiment_id], release)
                    outcome = UnitOutcome(request, archive, ran_ahead_s=time.monotonic() - clock)
                except KvprobeError as exc:
                    outcome = UnitOutcome(request, None, f"the unit failed: {exc}", time.monotonic() - clock)
                self._done[request] = outcome
        reporter.note(f"{pin.version}: {len(requests)} experiments done")
        shutil.rmtree(work, ignore_errors=True)

    def done(self) -> dict[UnitRequest, UnitOutcome]:
        """The units :meth:`run_by_release` ran, for the sweeps to take (shared, not copied)."""
        return self._done


# A probe run leaves at least its raw output, stdout and stderr in the bundle.
FILES_PER_RUN = 3


def _selected(
    exp: Experiment, opts: SweepOptions, available: list[str], profile: Profile
) -> tuple[list[str], list[str]]:
    """The releases --releases selects and those of them the profile serves; refused
    (UsageError) when it serves none or --repeat's runs would not fit in one bundle."""
    chosen = releases.select(opts.releases, available) if opts.releases else available
    served = [v for v in chosen if unserved_reason(profile.name, profile.serves, v) is None]
    if not served:
        why = f" ({profile.serves_why})" if profile.serves_why else ""
        raise UsageError(
            f"no selected release is served by profile {profile.name!r} (serves {profile.serves}){why}: "
            f"nothing would be observed; selected: {', '.join(chosen) or 'none'}"
        )
    _repeat_fits(exp, opts.repeat, len(served))
    return chosen, served


def _shown(versions: list[str], most: int = 6) -> str:
    """``versions`` for one progress line: the first and last few, and how many between."""
    if len(versions) <= most:
        return ", ".join(versions)
    half = most // 2
    return f"{', '.join(versions[:half])}, ... ({len(versions) - most} more), {', '.join(versions[-half:])}"


def _unit_request(exp: Experiment, pin: WheelPin, opts: SweepOptions, cache_root: Path | None) -> UnitRequest:
    """The one request for ``exp``'s unit on ``pin``: the pass ahead (run_by_release) and the
    sweep must ask alike, as the sweep takes the pass's outcome by its request."""
    return UnitRequest(exp.id, exp.file_sha256, pin, opts.timeout_s, opts.torch_index, cache_root, opts.repeat)


def _repeat_fits(exp: Experiment, repeat: int, releases_n: int) -> None:
    """`--repeat N` whose runs cannot fit in one bundle is refused before anything runs: past
    the limit the merge refuses the later units (could-not-observe) after they ran."""
    files = releases_n * len(exp.probes) * repeat * FILES_PER_RUN
    if repeat > 1 and files > MAX_BUNDLE_FILES:
        raise UsageError(
            f"--repeat {repeat}: {releases_n} release(s) x {len(exp.probes)} probe(s) x {repeat} runs leave at "
            f"least {files} files, past a bundle's {MAX_BUNDLE_FILES}: repeat fewer times or sweep fewer releases"
        )


def sweep_experiment(
    exp: Experiment,
    opts: SweepOptions,
    reporter: Reporter | None = None,
    executor: Executor | None = None,
    share: SweepShare | None = None,
) -> SealedBundle[SweepReceipt]:
    """Run ``exp``'s probes on each selected release and write the sweep bundle.

    ``executor``: where units run (default: from ``opts``, threads or Ray tasks); ``share``:
    what the invocation's other sweeps share with this one (None: nothing)."""
    reporter = reporter or Reporter()
    pin_set = wheel_pin_set(exp)
    if not any(exp.expectations.get(side) for side in SIDES):
        raise UsageError(f"{exp.id} declares no [expect] tables: a sweep classifies releases against them")
    profile = load_profile(exp.profile)
    assert isinstance(pin_set.head, WheelPin), "wheel_pin_set returns a wheel pin set"
    package, flags = pin_set.head.package, platform_args(pin_set.head.filename)
    started = datetime.now(UTC)
    workspace = Workspace(_final_path(opts, exp, started), "kvprobe-sweep-")
    work = workspace.work
    held = contextlib.ExitStack()
    try:
        if executor is None and opts.executor != "local":
            executor = _cluster_executor(exp, opts, held)  # before anything else: a bad --address fails fast
        with reporter.step(f"{package}: releases on the index"):
            if share is not None:
                available, read_utc = share.listing(package, flags)
            else:
                available = releases.index_versions(package, flags, work / "index")
                read_utc = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        chosen, served = _selected(exp, opts, available, profile)
        unserved = [v for v in chosen if v not in served]
        if unserved:  # said before anything runs: these are selected, and will never be observed here
            reporter.note(
                f"not run: {len(unserved)} selected release(s) profile {profile.name} does not serve "
                f"({profile.serves}): {_shown(unserved)}" + (f" ({profile.serves_why})" if profile.serves_why else "")
            )
        clock = time.monotonic()
        if executor is None and share is not None:  # the invocation's env and server for this profile
            executor = LocalExecutor(
                exp,
                share.session(exp, package, opts, reporter, len(available)),
                opts.jobs,
                reporter,
                done=share.done(),
            )
        elif executor is None:  # threads sharing the env the driver builds, and its fork server
            session = held.enter_context(open_session(exp, _session_settings(opts), reporter))
            lifetime = opts.timeout_s * len(exp.probes) * len(served) * opts.repeat + 600
            session.start(work, lifetime, when_needed=True)  # started by the first unit that runs
            executor = LocalExecutor(exp, session, opts.jobs, reporter)
        local = executor.session if isinstance(executor, LocalExecutor) else None
        kept = _unit_cache(exp, dict(profile.env), opts, local, reporter)
        if local is not None and not kept.may_hold_all(served):  # a unit will run: preload while wheels resolve
            local.launch()
        timings = {"environment_s": time.monotonic() - clock}  # the driver's (none with Ray)
        staging = workspace.stage(beside=True)
        copy_into_bundle(exp, staging)
        clock = time.monotonic()
        with reporter.step(f"{package}: each release's wheel on the index"):
            # unserved ones too: the listing has them
            if share is not None:
                pins = share.resolve(package, flags, chosen, opts.jobs)
            else:
                pins = _resolve(package, flags, chosen, work, opts.jobs)
        listing = Listing(
            package,
            share.index() if share is not None else index_url(),
            read_utc,
            tuple(available),
            tuple(_listed(v, pins[v], profile.name, profile.serves, profile.serves_why) for v in chosen),
        )
        pins = {v: pins[v] for v in served}
        local_env = executor.session.record if isinstance(executor, LocalExecutor) else None
        timings["resolve_s"] = time.monotonic() - clock  # units_s includes it, as before units had it
        expected = Expected(exp, staging, local_env)
        # Ray: units are looked up by the env this host's cache holds for the profile (the
        # workers' own is known only once one returns); a unit reused makes it the sweep's env
        if local is not None or not opts.reuse:
            lookup = expected
        else:
            lookup = Expected(exp, staging, _driver_env(exp, opts, reporter))
        units = {v: failed_entry(exp, v, pin) for v, pin in pins.items() if isinstance(pin, str)}
        cache_root = opts.cache_root if local_env is not None else None  # Ray: each node's own cache
        kept.began = started.strftime("%Y-%m-%dT%H:%M:%SZ")  # the receipt's created_utc
        requests = [_unit_request(exp, pin, opts, cache_root) for pin in pins.values() if not isinstance(pin, str)]
        with reporter.step(f"sweeping {len(requests)} releases ({executor.name})"):
            todo = []
            for request in requests:  # a unit the cache holds goes through the same checks
                entry = kept.reuse(request, lookup, work)
                if entry is None:
                    todo.append(request)
                    continue
                expected = lookup  # every unit of the sweep ran in the env of those reused
                units[entry.version] = entry
                reporter.note(progress_line(len(kept.reused), len(requests), entry))
            for done, outcome in enumerate(executor.run(todo), len(kept.reused) + 1):
                entry, env = accept_unit(outcome, expected, work, functools.partial(kept.keep, outcome))
                if env is not None and expected.env is None:
                    expected = Expected(exp, staging, env)
                units[outcome.request.pin.version] = entry
                reporter.note(progress_line(done, len(requests), entry, outcome))
        timings["units_s"] = time.monotonic() - clock
        ordered = tuple(units[v] for v in served)
        host = sweep_host(opts.jobs, executor.name)
        receipt = sweep_receipt(
            exp,
            SweepRun(
                opts.releases, listing, started, expected.env, ordered, tuple(unserved), timings, host, opts.repeat
            ),
        )
        doc, readme = staged_sweep(receipt, staging)
        return workspace.seal(receipt, doc, SWEEP_RECEIPT_SCHEMA, readme, VerifyOptions())
    finally:
        held.close()
        workspace.close()


def _session_settings(opts: SweepOptions) -> SessionSettings:
    """What a sweep's check session is opened with."""
    return SessionSettings(opts.cache_root, opts.torch_index, opts.preload)


def check_sweep(exp: Experiment, opts: SweepOptions) -> Path:
    """What a sweep of ``exp`` refuses before anything runs (UsageError, BundleExistsError):
    no wheel pin set, no expectations, a bundle path taken. Returns the bundle path."""
    wheel_pin_set(exp)
    if not any(exp.expectations.get(side) for side in SIDES):
        raise UsageError(f"{exp.id} declares no [expect] tables: a sweep classifies releases against them")
    load_profile(exp.profile)
    return _final_path(opts, exp, datetime.now(UTC))


def sweep_experiments(
    planned: Sequence[tuple[Experiment, SweepOptions]], reporter: Reporter | None = None
) -> Generator[tuple[Experiment, SealedBundle[SweepReceipt] | KvprobeError], None, None]:
    """Sweep each experiment in turn, sharing what :class:`SweepShare` shares; yields each
    one's result, or the error that kept it from a bundle (the next ones still run). Check
    :func:`check_sweep` for every one first."""
    reporter = reporter or Reporter()
    with SweepShare([exp for exp, _ in planned]) as share:
        share.run_by_release(planned, reporter)
        for done, (exp, opts) in enumerate(planned, 1):
            reporter.note(f"experiment {exp.id} ({done}/{len(planned)})")  # the lines below are its
            try:
                yield exp, sweep_experiment(exp, opts, reporter, share=share)
            except KvprobeError as exc:
                yield exp, exc


PYPI_SIMPLE = "https://pypi.org/simple"  # pip's own default index


def index_url() -> str:
    """The index pip reads releases from, as ``pip install`` is configured (its extra indexes
    and find-links after it); PyPI when pip has no index setting."""
    config = pip_config(Path(sys.prefix))
    if config.no_index:
        return "none (pip is configured with no-index)"
    links = [f"find-links {link}" for link in config.find_links]
    return " ".join([config.index_url or PYPI_SIMPLE, *config.extra_index_urls, *links])


def _listed(version: str, pin: WheelPin | str, profile: str, serves: str | None, why: str | None) -> ListedRelease:
    """A selected version as the listing records it: its wheel (or why the index named none),
    and why the sweep does not run it (the profile does not serve it, and the profile's why)."""
    reason = unserved_reason(profile, serves, version, why)
    if isinstance(pin, str):
        return ListedRelease(version, None, None, pin, reason)
    return ListedRelease(version, pin.filename, pin.sha256, None, reason)


def _cluster_executor(exp: Experiment, opts: SweepOptions, held: contextlib.ExitStack) -> Executor:
    """Ray tasks on the cluster at --address, connected while the sweep lasts (each worker
    node builds its env in its own cache)."""
    if opts.executor != "ray":
        raise UsageError(f"--executor {opts.executor!r}: expected local or ray")
    if opts.address is None:
        raise UsageError("--executor ray needs --address HOST:PORT of the Ray cluster")
    from kvprobe.run.ray_executor import RayExecutor

    unit_timeout = opts.unit_timeout_s or opts.timeout_s * len(exp.probes) * opts.repeat + 600.0
    return held.enter_context(RayExecutor(opts.address, unit_timeout))


def _driver_env(exp: Experiment, opts: SweepOptions, reporter: Reporter) -> EnvRecord | None:
    """The env this host's cache holds for ``exp``'s profile (never built here), or None: what a
    Ray sweep looks its cached units up by, as a worker on this kind of host builds the same."""
    with CheckSession(exp, wheel_pin_set(exp), _session_settings(opts), reporter) as session:
        env = session.cached()
        return None if env is None else env.record


def _unit_cache(
    exp: Experiment, settings: dict[str, str], opts: SweepOptions, session: CheckSession | None, reporter: Reporter
) -> SweepUnits:
    """The driver's unit cache for this sweep (its own cache, whatever the executor; ``session``:
    the local units' check session, None on Ray)."""
    forked = session is not None and session.forks
    repeat = opts.repeat  # `sweep --repeat N` records N runs: another unit
    return SweepUnits(
        exp,
        opts.cache_root,
        settings,
        "forked" if forked else "fresh",
        repeat=repeat,
        reuse=opts.reuse,
        reporter=reporter,
    )


def progress_line(done: int, total: int, entry: ReleaseRecord, outcome: UnitOutcome | None = None) -> str:
    """A release's progress line: its class, and what its unit was: reused from the cache (and
    when it observed), run ahead by the release-by-release pass (and how long it took there),
    not observed (why), or run now (how long it took)."""
    head = f"{done}/{total} {entry.version} {entry.classification.overall}"
    if entry.reused is not None:
        return f"{head} (reused from {entry.reused.observed_utc})"
    if outcome is not None and outcome.ran_ahead_s is not None:
        how = "release by release, ahead of this sweep"
        took = f"{how}: {_seconds(outcome.ran_ahead_s)}"
        return f"{head} ({took})" if entry.problem is None else f"{head} ({took}; {_clipped(entry.problem)})"
    if not entry.probes and entry.problem is not None:  # nothing ran here: no time to give
        return f"{head} ({_clipped(entry.problem)})"
    return f"{head} ({_seconds(entry.duration_s)})"


def _seconds(value: float) -> str:
    """A duration as a line says it: tenths under 10 s (a unit under a second is not "0 s")."""
    return f"{value:.1f} s" if value < 9.95 else f"{value:.0f} s"


def _clipped(text: str, width: int = 100) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def _resolve(package: str, flags: list[str], versions: list[str], work: Path, jobs: int) -> dict[str, WheelPin | str]:
    """Each version's wheel pin, or why it could not be resolved (that release's problem)."""

    def one(version: str) -> WheelPin | str:
        try:
            return releases.resolve(package, version, flags, work / "resolve" / version)
        except (FetchError, DigestMismatch, UsageError) as exc:
            return f"wheel: {exc}"

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return dict(zip(versions, pool.map(one, versions), strict=True))


def _final_path(opts: SweepOptions, exp: Experiment, started: datetime) -> Path:
    return bundle_path(opts.out, opts.bundles_dir, f"{exp.id}-sweep-{started.strftime('%Y%m%dT%H%M%SZ')}")

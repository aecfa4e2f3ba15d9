"""One experiment end to end: materialize -> env -> tests -> probes -> compare -> bundle."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from kvprobe import __version__
from kvprobe.env.cache import default_cache_root
from kvprobe.env.venv import check_index_url
from kvprobe.errors import FetchError, KvprobeError, UsageError
from kvprobe.evidence.bundle import cite, host_facts
from kvprobe.evidence.bundle_readme import render_readme
from kvprobe.experiments.experiment import copy_into_bundle
from kvprobe.model.receipt import (
    Comparison,
    EnvRecord,
    EvidenceScope,
    ExecutionRecord,
    ExperimentRef,
    PinSetRef,
    ProbeRepeat,
    Receipt,
    RunProbeRecord,
    SharedServerRecord,
    SideRecord,
    TestRecord,
    Tool,
)
from kvprobe.model.records import Experiment, GitPin, PinSet, Side, SourceKind, WheelPin
from kvprobe.names import PROBES_DIR, RECEIPT_SCHEMA, SIDES
from kvprobe.progress import Reporter
from kvprobe.rules import compare
from kvprobe.rules.run_limits import run_limits
from kvprobe.run.session import CheckSession, SessionEnv, SessionSettings, env_lease, fork_server, preload_modules
from kvprobe.run.side import CheckContext, run_side
from kvprobe.run.workspace import SealedBundle, Workspace, bundle_path

if TYPE_CHECKING:
    from kvprobe.checks.forkserver import ForkServer
    from kvprobe.sources.git import GitSource
    from kvprobe.sources.wheel import WheelSource


@dataclass
class RunOptions:
    pin_set: str | None = None
    out: Path | None = None
    repo: str | None = None
    cache_root: Path = field(default_factory=lambda: default_cache_root())
    torch_index: str | None = None
    jobs: int = field(default_factory=lambda: min(2, os.cpu_count() or 1))  # sides in parallel where there are cores
    timeout_s: float = 1800.0
    preload: bool = True  # checks fork from one preloaded interpreter; False: a fresh one each
    keep_server_s: float | None = None  # that interpreter kept between runs, exiting after this long unused
    bundles_dir: Path = field(default_factory=lambda: Path("bundles"))
    repeat: int = 1  # run --repeat N: each side's probes run N times; a case that differs is unstable


@dataclass(frozen=True)
class RunPlan:
    """What is run, fixed before anything runs: it names the receipt."""

    exp: Experiment
    pin_set: PinSet
    run_id: str
    started: datetime


@dataclass(frozen=True)
class RunOutputs:
    """What the run produced in ``staging``, before it is written down as a receipt."""

    sides: dict[Side, dict[str, Any]]  # materialized tree and identity per side
    env: EnvRecord
    env_vars: dict[str, str]
    checks: dict[Side, dict[str, Any]]  # run.side.run_side per side
    staging: Path
    timings: dict[str, float]
    execution: ExecutionRecord  # CheckSession.execution: fresh or forked, and what was preloaded


class ServerPool:
    """The fork servers of one invocation that runs several experiments (`kvprobe run A B`):
    experiments whose checks need the same server (one env python, the same variables and
    preload list) fork from one, started by the first of them and stopped when the pool
    closes. ``planned`` names the experiments of the invocation per profile, which the
    receipts' ``execution.shared`` records; ``lifetime_s`` covers every check of all of them.
    """

    def __init__(self, planned: Sequence[tuple[Experiment, RunOptions]]) -> None:
        self._held = contextlib.ExitStack()
        self.leases = self._held  # the envs' leases: `cache prune` leaves them while a server may fork from them
        self._work = Path(tempfile.mkdtemp(prefix="kvprobe-servers-"))
        self._servers: dict[tuple[object, ...], tuple[ForkServer | None, str | None, str]] = {}
        self._lifetime_s = sum(_lifetime(exp, _pin_set(exp, o.pin_set), o) for exp, o in planned)
        self._profiles: dict[str, list[str]] = {}
        for exp, _ in planned:
            self._profiles.setdefault(exp.profile, []).append(exp.id)

    def __enter__(self) -> ServerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._held.close()
        finally:
            shutil.rmtree(self._work, ignore_errors=True)

    def get(
        self, env: SessionEnv, settings: SessionSettings, modules: tuple[str, ...]
    ) -> tuple[ForkServer | None, str | None]:
        """The server for ``env`` and ``modules``: the one already started for them, or a new one."""
        python, env_vars, keep_s = env.python, env.variables, settings.keep_server_s
        key = (python, tuple(sorted(env_vars.items())), modules, settings.preload, keep_s)
        if key not in self._servers:
            work = self._work / f"server-{len(self._servers)}"
            work.mkdir()
            started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            lease = env_lease(env.directory) if keep_s is not None else None
            server, reason = fork_server(
                python, env_vars, work, self._lifetime_s, settings.preload, modules, keep_s, lease=lease
            )
            if server is not None:
                self._held.enter_context(server)
            self._servers[key] = (server, reason, started)
        server, reason, _ = self._servers[key]
        return server, reason

    def record(self, exp: Experiment, server: ForkServer | None) -> SharedServerRecord | None:
        """What ``exp``'s receipt says of the server it shared with the invocation's other
        experiments of its profile (None: it had none, or no other experiment plans to use it)."""
        sharing = self._profiles.get(exp.profile, [])
        for started_server, _, started in self._servers.values():
            if server is not None and started_server is server and len(sharing) > 1:
                return SharedServerRecord(started, tuple(sharing))
        return None


def run_experiments(
    planned: Sequence[tuple[Experiment, RunOptions]], reporter: Reporter | None = None
) -> Generator[tuple[Experiment, SealedBundle[Receipt] | KvprobeError], None, None]:
    """Run each experiment in turn with its options, experiments of one profile sharing one env
    and one fork server; yields each one's result, or the error that kept it from a bundle (the
    next ones still run). Check :func:`check_run` for every one first: bad input is refused
    before anything runs."""
    reporter = reporter or Reporter()
    with ServerPool(planned) as servers:
        for done, (exp, opts) in enumerate(planned, 1):
            reporter.note(f"experiment {exp.id} ({done}/{len(planned)})")  # the lines below are its
            try:
                yield exp, run_experiment(exp, opts, reporter, servers)
            except KvprobeError as exc:
                yield exp, exc


def check_run(exp: Experiment, opts: RunOptions) -> Path:
    """What a run of ``exp`` refuses before anything runs (UsageError, BundleExistsError,
    ExperimentError): its pin set, inputs, sources and bundle path. Returns the bundle path."""
    pin_set = _pin_set(exp, opts.pin_set)
    check_inputs(exp, pin_set, opts)
    _check_sources(exp, pin_set, opts)
    return _final_path(opts, exp, pin_set, datetime.now(UTC))


def run_experiment(
    exp: Experiment, opts: RunOptions, reporter: Reporter | None = None, servers: ServerPool | None = None
) -> SealedBundle[Receipt]:
    """Run ``exp`` and write its bundle; raises only when no honest receipt can be written.

    ``servers``: the invocation's fork servers, shared with its other experiments (None: the
    run starts its own)."""
    reporter = reporter or Reporter()
    pin_set = _pin_set(exp, opts.pin_set)
    check_inputs(exp, pin_set, opts)
    started = datetime.now(UTC)
    run_id = f"{exp.id}-{pin_set.name}-{started.strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:6]}"
    final = _final_path(opts, exp, pin_set, started)
    # with servers, the env stays leased until the invocation ends, as its server lives on
    session = CheckSession(exp, pin_set, _session_settings(opts), reporter, servers)
    workspace = Workspace(final, "kvprobe-run-")
    work, staging = workspace.work, workspace.stage()  # published at `final` only once sealed and verified
    timings: dict[str, float] = {}
    held = contextlib.ExitStack()  # the trees' leases: `cache prune` leaves them alone until we end
    lifetime_s = _lifetime(exp, pin_set, opts)
    try:
        clock = time.monotonic()
        _check_sources(exp, pin_set, opts)  # bad input is refused before a server starts
        # a cached env's python is known now: its fork server preloads while the trees are made
        if opts.preload:
            session.cached()
        session.start(work, lifetime_s)
        timings["preload_start_s"] = time.monotonic() - clock
        clock = time.monotonic()
        # a first run's env is built while the trees are fetched and unpacked: one waits on the
        # network and uv, the other on the wheel downloads; neither reads the other
        if not opts.preload:
            session.cached()
        with ThreadPoolExecutor(max_workers=1) as building:
            pending = None if session.env is not None else building.submit(session.environment)
            sides = _materialize(exp, pin_set, opts, work, reporter, held)
            timings["materialize_s"] = time.monotonic() - clock
            clock = time.monotonic()
            session.environment() if pending is None else pending.result()
        timings["environment_s"] = time.monotonic() - clock  # what the env took beyond the trees
        clock = time.monotonic()
        head_tests = _head_test_files(exp, pin_set, sides)
        session.start(work, lifetime_s)  # where the env was not cached
        server = session.ready()  # what the first check waits on
        if server is None and opts.keep_server_s is not None:
            reporter.note(f"checks run fresh: {session.fresh_reason}")  # asked for a kept server, not given one
        ctx = CheckContext(
            exp, pin_set, session.python, session.variables, staging, work, opts.timeout_s, server, opts.repeat
        )
        timings["preload_s"] = time.monotonic() - clock
        clock = time.monotonic()
        with ThreadPoolExecutor(max_workers=max(1, min(opts.jobs, 2))) as pool:
            futures = {
                side: pool.submit(run_side, ctx, side, sides[side], head_tests, reporter)
                for side in (Side.BASE, Side.HEAD)
            }
            checks = {side: f.result() for side, f in futures.items()}
        timings["checks_s"] = time.monotonic() - clock
        plan = RunPlan(exp, pin_set, run_id, started)
        execution = session.execution(checks)
        if servers is not None:
            execution = replace(execution, shared=servers.record(exp, server))
        outputs = RunOutputs(sides, session.record, session.variables, checks, staging, timings, execution)
        record = _receipt(plan, outputs, opts.repeat)
        return workspace.seal(record, record.to_json(), RECEIPT_SCHEMA, render_readme(record))
    finally:
        held.close()
        session.close()
        workspace.close()


def _session_settings(opts: RunOptions) -> SessionSettings:
    """What a run's check session is opened with."""
    return SessionSettings(opts.cache_root, opts.torch_index, opts.preload, opts.keep_server_s)


def _lifetime(exp: Experiment, pin_set: PinSet, opts: RunOptions) -> float:
    """How long a fork server may live for one run: every check of both sides at its timeout."""
    checks = 2 * (len(exp.tests_for(pin_set.name)) + len(exp.probes))
    return opts.timeout_s * max(1, checks) + 600


def check_inputs(exp: Experiment, pin_set: PinSet, opts: RunOptions) -> None:
    """Bad input is refused before anything runs (no fetch, no env build, nothing written):
    the index, and the profile, its lock and its preload list, checked whole."""
    check_index_url(opts.torch_index)
    preload_modules(exp, pin_set)


def _pin_set(exp: Experiment, name: str | None) -> PinSet:
    name = name or exp.default_pin_set
    if name not in exp.pin_sets:
        raise UsageError(f"{exp.id} has no pin set {name!r} (have: {', '.join(exp.pin_sets)})")
    return exp.pin_sets[name]


def _final_path(opts: RunOptions, exp: Experiment, pin_set: PinSet, started: datetime) -> Path:
    return bundle_path(opts.out, opts.bundles_dir, f"{exp.id}-{pin_set.name}-{started.strftime('%Y%m%dT%H%M%SZ')}")


# --- sources -----------------------------------------------------------------------------


def _materialize(
    exp: Experiment, pin_set: PinSet, opts: RunOptions, work: Path, reporter: Reporter, held: contextlib.ExitStack
) -> dict[Side, dict[str, Any]]:
    """Each side's tree (its own directory, no .git; for a pin set that runs no upstream tests,
    a link to the cached tree itself, leased in ``held`` while the run lasts) and identity.

    Sides are unpacked in parallel with --jobs 2: a release wheel is thousands of small
    files, and unpacking one took 2-3 s of a ~30 s warm run (a git store's lock still
    serializes git exports). A wheel pin set with a tests commit exports that commit first,
    so an unreachable repository fails before any wheel is downloaded.
    """
    commit = pin_set.tests_commit
    tests_from = _tests_checkout(exp, pin_set, commit, opts, work, reporter) if commit else None
    source = _source(exp, pin_set, opts, reporter)
    python = _bytecode_python(exp, pin_set)
    # a pin set that runs no upstream tests writes nothing into its trees: they are used in place
    hold = None if pin_set.runs_tests else held
    with ThreadPoolExecutor(max_workers=max(1, min(opts.jobs, 2))) as pool:
        futures = {
            side: pool.submit(_materialize_side, source, pin_set, side, work, reporter, python, hold)
            for side in (Side.BASE, Side.HEAD)
        }
        sides = {side: f.result() for side, f in futures.items()}
    if tests_from is not None:
        tests_tree, identity = tests_from
        support = _test_support(tests_tree, [t.path for t in exp.tests_for(pin_set.name)])
        for side in sides.values():
            _place(side["tree"], support)
            side["tests_tree"] = tests_tree
        sides[Side.HEAD]["tests_from"] = {**identity, "support_files": sorted(support)}
    return sides


def _tests_checkout(
    exp: Experiment, pin_set: PinSet, commit: GitPin, opts: RunOptions, work: Path, reporter: Reporter
) -> tuple[Path, dict[str, Any]]:
    """The tests commit's tree, exported from the upstream (or --repo) with its tree hash checked."""
    from kvprobe.sources.git import GitSource, validate_url

    url = validate_url(opts.repo or exp.upstream or "")
    source = _GitWithHints(GitSource(url, opts.cache_root), exp, pin_set, opts.repo is not None)
    tree = work / "tests-commit" / "tree"
    tree.parent.mkdir(parents=True)
    with reporter.step(f"tests: materializing {commit.commit[:12]} from {url}"):
        identity = source.materialize(commit, tree, pr=pin_set.pr)
    return tree, identity


# pytest's own configuration along a test file's path: what makes test/ the rootdir upstream
_SUPPORT_NAMES = ("conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml")


def _test_support(tests_tree: Path, test_paths: list[str]) -> dict[str, bytes]:
    """conftest.py and pytest config files in the directories from the root to each test file."""
    found: dict[str, bytes] = {}
    for rel in test_paths:
        for directory in reversed(PurePosixPath(rel).parents):
            for name in _SUPPORT_NAMES:
                candidate = tests_tree.joinpath(*directory.parts, name)
                if candidate.is_file() and not candidate.is_symlink():
                    found[(directory / name).as_posix()] = candidate.read_bytes()
    return found


def _place(tree: Path, files: dict[str, bytes]) -> None:
    """Copy the tests commit's support files into a wheel tree (which has none of its own)."""
    for rel, data in files.items():
        target = tree.joinpath(*PurePosixPath(rel).parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def _bytecode_python(exp: Experiment, pin_set: PinSet) -> str | None:
    """The interpreter the env is made from (same bytecode tag): wheel and git trees are
    cached compiled for it, so no side pays SGLang's compile time again."""
    if pin_set.kind is SourceKind.SYNTHETIC:
        return None
    from kvprobe.env.venv import find_python, load_profile

    return find_python(load_profile(exp.profile).python)


def _materialize_side(
    source: WheelSource | _GitWithHints | None,
    pin_set: PinSet,
    side: Side,
    work: Path,
    reporter: Reporter,
    python: str | None = None,
    hold: contextlib.ExitStack | None = None,
) -> dict[str, Any]:
    pin = pin_set.pin(side)
    tree = work / side.value / "tree"
    tree.parent.mkdir(parents=True)
    with reporter.step(f"{side.value}: materializing {_describe_pin(pin_set, side)}"):
        if source is None:
            tree.mkdir()
            identity = pin.identity()
        elif pin_set.kind is SourceKind.GIT:
            assert isinstance(source, _GitWithHints) and isinstance(pin, GitPin), "_source: git pins, git source"
            identity = source.materialize(pin, tree, pr=pin_set.pr, python=python)
        else:
            assert not isinstance(source, _GitWithHints) and isinstance(pin, WheelPin), "_source: wheel pins, wheels"
            identity = source.materialize(pin, tree, python=python, hold=hold)
    return {
        "tree": tree,
        "pin": pin.identity(),
        "source": identity,
        "git": source if pin_set.kind is SourceKind.GIT else None,
    }


def _check_sources(exp: Experiment, pin_set: PinSet, opts: RunOptions) -> None:
    """The repository URLs and --repo's use, refused as :func:`_materialize` would (pure)."""
    if pin_set.tests_commit is not None:
        from kvprobe.sources.git import validate_url

        validate_url(opts.repo or exp.upstream or "")
    _source(exp, pin_set, opts, None)


def _source(
    exp: Experiment, pin_set: PinSet, opts: RunOptions, reporter: Reporter | None
) -> WheelSource | _GitWithHints | None:
    if opts.repo is not None and not pin_set.runs_tests:
        from kvprobe.sources.git import validate_url

        validate_url(opts.repo)  # a hostile value is named as such, not just as misplaced
        raise UsageError(
            f"--repo applies to git pin sets; {exp.id} pin set {pin_set.name!r} is "
            f"{pin_set.kind.value}" + _git_pin_sets_hint(exp)
        )
    if pin_set.kind is SourceKind.SYNTHETIC:
        return None
    if pin_set.kind is SourceKind.WHEEL:
        from kvprobe.sources.wheel import WheelSource

        return WheelSource(opts.cache_root, reporter=reporter)
    from kvprobe.sources.git import GitSource, validate_url

    url = validate_url(opts.repo or exp.upstream or "")
    return _GitWithHints(GitSource(url, opts.cache_root), exp, pin_set, opts.repo is not None)


def _git_pin_sets_hint(exp: Experiment) -> str:
    names = [n for n, p in exp.pin_sets.items() if p.kind is SourceKind.GIT]
    return f" (use --pins {names[0]})" if names else ""


class _GitWithHints:
    """Adds what to do next to fetch failures: a mirror (--repo) or the release pins."""

    def __init__(self, source: GitSource, exp: Experiment, pin_set: PinSet, has_repo: bool) -> None:
        self.source, self.exp, self.pin_set, self.has_repo = source, exp, pin_set, has_repo

    def materialize(self, pin: GitPin, dest: Path, pr: int | None = None, python: str | None = None) -> dict[str, Any]:
        try:
            return self.source.materialize(pin, dest, pr=pr, python=python)
        except FetchError as exc:
            others = [n for n, p in self.exp.pin_sets.items() if not p.runs_tests]
            hint = "point the run at a mirror or local clone with --repo URL_OR_PATH"
            if others:
                hint += f", or use the release wheels without upstream tests with --pins {others[0]}"
            raise FetchError(f"{exc.message}; {hint}") from exc

    def read_file(self, pin: GitPin, path: str) -> bytes | None:
        return self.source.read_file(pin, path)


def _describe_pin(pin_set: PinSet, side: Side) -> str:
    ident = pin_set.pin(side).identity()
    return ident.get("filename") or ident.get("commit", "")[:12] or "model switches"


# --- checks ------------------------------------------------------------------------------


def _head_test_files(exp: Experiment, pin_set: PinSet, sides: dict[Side, dict[str, Any]]) -> dict[str, bytes]:
    """Head's version of each listed test file (the tests commit's, for wheel pin sets); a
    path absent there is bad input."""
    found = {}
    head = pin_set.head
    for test in exp.tests_for(pin_set.name):
        if isinstance(head, GitPin):
            data, commit = sides[Side.HEAD]["git"].read_file(head, test.path), head.commit
        elif pin_set.tests_commit is not None:
            path = sides[Side.HEAD]["tests_tree"].joinpath(*PurePosixPath(test.path).parts)
            data = path.read_bytes() if path.is_file() and not path.is_symlink() else None
            commit = pin_set.tests_commit.commit
        else:
            continue
        if data is None:
            raise UsageError(f"{exp.id}: test {test.path} does not exist at {commit}")
        found[test.path] = data
    return found


# --- receipt and bundle ------------------------------------------------------------------


def _receipt(plan: RunPlan, out: RunOutputs, repeat: int = 1) -> Receipt:
    exp, pin_set, staging = plan.exp, plan.pin_set, out.staging
    timings = dict(out.timings)
    probe_dir = copy_into_bundle(exp, staging)
    side_records: dict[str, SideRecord] = {}
    probe_docs: dict[str, dict[str, Any]] = {}
    problems: dict[str, dict[str, str]] = {}
    test_runs: dict[str, dict[str, Any]] = {}
    mocks: dict[str, Any] = {}
    repeat_docs: dict[str, dict[str, list[Any]]] = {}
    for side in (Side.BASE, Side.HEAD):
        c = out.checks[side]
        side_records[side.value] = SideRecord(
            pin=out.sides[side]["pin"],
            source=out.sides[side]["source"],
            tests=tuple(_test_record(t, staging) for t in c["tests"]),
            probes=tuple(_probe_record(p, probe_dir, staging) for p in c["probes"]),
        )
        probe_docs[side.value] = {p["name"]: p["run"].output for p in c["probes"] if p["run"].ok}
        problems[side.value] = {p["name"]: p["run"].problem for p in c["probes"] if not p["run"].ok}
        if repeat > 1:
            again = {p["name"]: [r["run"] for r in p.get("repeats", [])] for p in c["probes"]}
            repeat_docs[side.value] = {n: [r.output if r.ok else None for r in runs] for n, runs in again.items()}
            failed = {n: [None if r.ok else r.problem for r in runs] for n, runs in again.items()}
            problems[side.value] |= compare.repeat_problems(failed)
        for t in c["tests"]:
            test_runs.setdefault(t["path"], {})[side.value] = t["doc"]
        for p in c["probes"]:
            if p["run"].ok:
                mocks.setdefault(p["name"], p["run"].output["mocks"])
        timings[f"{side.value}_checks_s"] = sum(t["duration_s"] for t in c["tests"]) + sum(
            p["run"].duration_s + sum(r["run"].duration_s for r in p.get("repeats", [])) for p in c["probes"]
        )
    expectations = {s: exp.expectations.get(s, {}) for s in SIDES}
    if exp.expectations.get("tests"):
        expectations["tests"] = exp.expectations["tests"]
    comparison = Comparison.from_json(
        compare.compare(
            expect=expectations,
            probe_docs=probe_docs,
            probe_problems=problems,
            test_runs=test_runs,
            repeats=repeat_docs if repeat > 1 else None,  # a run without probes still says it repeated
        )
    )
    records = compare.probe_records(probe_docs)
    host = host_facts()
    return Receipt(
        schema=RECEIPT_SCHEMA,
        tool=Tool(__version__),
        run_id=plan.run_id,
        created_utc=plan.started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        experiment=ExperimentRef(
            id=exp.id,
            title=exp.title,
            layer=exp.layer,
            file=f"{PROBES_DIR}/{exp.id}/experiment.toml",
            sha256=exp.file_sha256,
            upstream=exp.upstream,
            profile=exp.profile,
            fix=exp.fix,
            vulnerability=exp.vulnerability,
            source=exp.source or None,
        ),
        pin_set=PinSetRef(
            pin_set.name, pin_set.kind, pin_set.pr, pin_set.python_path, out.sides[Side.HEAD].get("tests_from")
        ),
        sides=side_records,
        env=out.env,
        host=host,
        settings=dict(sorted(out.env_vars.items())),
        expectations=expectations,
        comparison=comparison,
        verdict=comparison.verdict,
        evidence=EvidenceScope(
            layer=exp.layer,
            shows=exp.scope.shows,
            does_not_show=exp.scope.does_not_show,
            mocks=mocks,
            limits=tuple(_limits(pin_set, out.env, host)),
            configuration=records["configuration"],
            absorbed=records["absorbed"],
        ),
        timings={k: round(v, 3) for k, v in timings.items()},
        execution=out.execution,
        repeats=repeat if repeat > 1 else None,
    )


def _test_record(ran: dict[str, Any], staging: Path) -> TestRecord:
    doc = ran["doc"]
    junit = cite(ran["junit"], staging) if ran["junit"] is not None else None
    return TestRecord(ran["path"], cite(ran["raw"], staging), junit, doc["exit_code"], doc["overlay"], doc["problem"])


def _probe_record(ran: dict[str, Any], probe_dir: Path, staging: Path) -> RunProbeRecord:
    raw = cite(ran["raw"], staging) if ran["raw"] is not None else None
    repeats = tuple(
        ProbeRepeat(cite(r["raw"], staging) if r["raw"] is not None else None, r["run"].exit_code, r["run"].problem)
        for r in ran.get("repeats", [])
    )
    return RunProbeRecord(
        ran["name"],
        cite(probe_dir / ran["path"], staging),
        raw,
        ran["run"].exit_code,
        ran["run"].problem,
        repeats or None,
    )


def _limits(pin_set: PinSet, env: EnvRecord, host: dict[str, Any]) -> list[str]:
    """The receipt's limits, by the rule verify recomputes them with (rules/run_limits)."""
    tests_commit = pin_set.tests_commit.commit if pin_set.tests_commit is not None else None
    return run_limits(host, pin_set.kind, tests_commit, env.torch, env.torch_index)

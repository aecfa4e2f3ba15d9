"""One side's checks, and the environment they run in: shared by `kvprobe run` and gate 2.

A side is one materialized tree (base or head); its checks are the upstream test files
(head's version on both sides) and the experiment's probes. Raw outputs go to
``raw/<side>/...`` and logs to ``logs/<side>/...`` of the bundle being staged.
"""

from __future__ import annotations

import contextlib
import json
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from kvprobe import __version__
from kvprobe.checks import probes, upstream
from kvprobe.checks.forkserver import FRESH, PRELOAD, BadReply, ForkServer
from kvprobe.checks.keptserver import KeptServer
from kvprobe.errors import ExperimentError, ObserveError
from kvprobe.files import write_json
from kvprobe.model.receipt import CheckExecution, EnvRecord, ExecutionRecord, InstallerRecord, KeptServerRecord
from kvprobe.model.records import EnvInfo, Experiment, ModelPin, PinSet, ProbeCheck, Side, SourceKind, WheelPin
from kvprobe.names import LOGS_DIR, RAW_DIR, TEST_RUN_SCHEMA
from kvprobe.progress import Reporter


class EnvOptions(Protocol):
    """What :func:`environment` reads of ``run.runner.RunOptions`` (side sits below runner)."""

    cache_root: Path
    torch_index: str | None


def environment(
    exp: Experiment,
    pin_set: PinSet,
    opts: EnvOptions,
    reporter: Reporter,
    held: contextlib.ExitStack | None = None,
) -> tuple[EnvRecord, str, dict[str, str]]:
    """The env both sides share (one lock), its python, and the variables pinned for checks."""
    if pin_set.kind is SourceKind.SYNTHETIC:
        import hypothesis

        packages = {"hypothesis": hypothesis.__version__, "kvprobe": __version__}
        return (
            EnvRecord("kvprobe-interpreter", platform.python_version(), exp.profile, None, None, packages, None, None),
            sys.executable,
            {},
        )
    from kvprobe.env.venv import EnvManager, load_profile

    profile = load_profile(exp.profile)
    info: EnvInfo = EnvManager(opts.cache_root, reporter=reporter).ensure(
        profile, torch_index=opts.torch_index, hold=held
    )
    return _described(info, profile.name, dict(profile.env))


def cached_environment(
    exp: Experiment,
    pin_set: PinSet,
    opts: EnvOptions,
    reporter: Reporter,
    held: contextlib.ExitStack | None = None,
) -> tuple[EnvRecord, str, dict[str, str]] | None:
    """:func:`environment` when it is already there (nothing to build), else None: its python
    is then known early enough to start the fork server before the trees are materialized."""
    if pin_set.kind is SourceKind.SYNTHETIC:
        return environment(exp, pin_set, opts, reporter, held)
    from kvprobe.env.venv import EnvManager, load_profile

    profile = load_profile(exp.profile)
    info = EnvManager(opts.cache_root, reporter=reporter).cached(profile, torch_index=opts.torch_index, hold=held)
    return None if info is None else _described(info, profile.name, dict(profile.env))


def _described(info: EnvInfo, profile: str, env_vars: dict[str, str]) -> tuple[EnvRecord, str, dict[str, str]]:
    env = EnvRecord(
        key=info.key,
        python=info.python,
        profile=profile,
        lock_name=info.lock_name,
        lock_sha256=info.lock_sha256,
        packages=dict(sorted(info.packages.items())),
        torch=info.build.get("torch"),
        torch_index=info.build.get("torch_index"),
        installer=installer_record(info),
    )
    return env, str(info.path / "bin" / "python"), env_vars


def installer_record(info: EnvInfo) -> InstallerRecord | None:
    """The installer the env's build recorded (``kvprobe-env.json``), with its version: uv's
    as it reported it, pip's the one in the env. None when the build recorded none."""
    how = info.build.get("installer")
    if not isinstance(how, dict) or how.get("tool") not in ("uv", "pip"):
        return None
    if how["tool"] == "uv":
        words = str(how.get("version", "")).split()  # "uv 0.13.9 (x86_64-unknown-linux-gnu)"
        version = words[1] if len(words) > 1 and words[0] == "uv" and words[1][:1].isdigit() else None
        return InstallerRecord("uv", version)
    return InstallerRecord("pip", info.packages.get("pip"))


@dataclass(frozen=True)
class CheckContext:
    """What every check of one run needs: the experiment, its env, where outputs go."""

    exp: Experiment
    pin_set: PinSet
    python: str
    env_vars: dict[str, str]
    staging: Path
    work: Path
    timeout_s: float
    server: ForkServer | None = None  # checks fork from its preloaded interpreter; None: fresh ones
    repeat: int = 1  # run --repeat N: each probe runs N times


@dataclass(frozen=True)
class CheckPaths:
    """Where one side's checks import from and write to: raw outputs, logs, a scratch home."""

    side: Side
    python_path: list[Path]
    raw: Path
    logs: Path
    scratch: Path

    def sub(self, kind: str) -> CheckPaths:
        """The same, writing under ``raw/<kind>`` and ``logs/<kind>`` (tests, probes)."""
        return replace(self, raw=self.raw / kind, logs=self.logs / kind)


def run_side(
    ctx: CheckContext, side: Side, materialized: dict[str, Any], head_tests: dict[str, bytes], reporter: Reporter
) -> dict[str, Any]:
    tree = materialized["tree"]
    scratch = ctx.work / side.value / "home"
    scratch.mkdir(parents=True, exist_ok=True)
    paths = CheckPaths(
        side,
        [tree / p for p in ctx.pin_set.python_path],
        ctx.staging / RAW_DIR / side.value,
        ctx.staging / LOGS_DIR / side.value,
        scratch,
    )
    tests: list[dict[str, Any]] = []
    probe_runs: list[dict[str, Any]] = []
    with reporter.step(f"{side.value}: running checks"):
        for rel, data in head_tests.items():
            reporter.update(f"{side.value}: pytest {rel}")
            tests.append(run_test(ctx, paths.sub("tests"), tree, rel, data))
        for check in ctx.exp.probes:
            reporter.update(f"{side.value}: probe {check.name}")
            probe_runs.append(run_probe(ctx, paths.sub("probes"), check))
            again = []
            for run in range(2, ctx.repeat + 1):  # run --repeat N: the same probe, same server, again
                reporter.update(f"{side.value}: probe {check.name} (run {run} of {ctx.repeat})")
                again.append(run_probe(ctx, paths.sub("probes"), check, run))
            if again:
                probe_runs[-1]["repeats"] = again
    return {"tests": tests, "probes": probe_runs}


def run_test(ctx: CheckContext, paths: CheckPaths, tree: Path, rel: str, data: bytes) -> dict[str, Any]:
    raw_dir = paths.raw
    raw_dir.mkdir(parents=True, exist_ok=True)
    run = upstream.run_test_file(
        python=Path(ctx.python),
        tree=tree,
        rootdir_hint=None,
        test_rel=rel,
        head_test_bytes=data,
        python_path=paths.python_path,
        out_dir=raw_dir,
        log_dir=paths.logs,
        timeout_s=ctx.timeout_s,
        env_extra=ctx.env_vars,
        server=ctx.server,
    )
    report = None
    if run.report_path and Path(run.report_path).is_file():
        report = json.loads(Path(run.report_path).read_text(encoding="utf-8"))
        Path(run.report_path).unlink()  # embedded below: one raw document per check per side
    # timeouts and crashes are inside the report as per-test results; these two are not results
    problem = None if report is not None else f"pytest left no report (exit {run.exit_code})"
    if run.exit_code == 5:
        problem = "pytest collected no tests (exit 5): nothing ran"
    doc = {
        "schema": TEST_RUN_SCHEMA,
        "path": rel,
        "side": paths.side.value,
        "exit_code": run.exit_code,
        "timed_out": run.timed_out,
        "overlay": run.overlay,
        "problem": problem,
        "report": report,
    }
    raw_path = raw_dir / f"{_safe_name(rel)}.json"
    write_json(raw_path, doc)
    junit = Path(run.junit_path) if run.junit_path else None
    return {
        "path": rel,
        "doc": doc,
        "raw": raw_path,
        "junit": junit if junit and junit.is_file() else None,
        "duration_s": run.duration_s,
        "execution": run.execution,
    }


def run_probe(ctx: CheckContext, paths: CheckPaths, check: ProbeCheck, nth: int = 1) -> dict[str, Any]:
    """One run of a probe on one side; run 2..N (``run --repeat``) write ``<name>.repeat-<run>.json``."""
    if nth > 1:
        paths = replace(paths, logs=paths.logs / f"repeat-{nth}")
    paths.raw.mkdir(parents=True, exist_ok=True)
    paths.logs.mkdir(parents=True, exist_ok=True)
    out = paths.raw / (f"{check.name}.json" if nth == 1 else f"{check.name}.repeat-{nth}.json")
    pin = ctx.pin_set.pin(paths.side)
    side_config: dict[str, Any] = {"side": paths.side.value}
    if isinstance(pin, ModelPin):  # the synthetic pin set's sides are model switches
        side_config["switches"] = dict(pin.switches)
    run = probes.run_probe(
        python=ctx.python,
        probe_file=ctx.exp.directory / check.path,
        python_path=paths.python_path,
        out_json=out,
        log_dir=paths.logs,
        side_config=side_config,
        env_extra=ctx.env_vars,
        scratch=paths.scratch,
        timeout_s=ctx.timeout_s,
        server=ctx.server,
    )
    if not run.ok and out.exists():
        out.rename(out.with_suffix(".invalid.json"))
    return {"name": check.name, "path": check.path, "run": run, "raw": out if run.ok else None}


def _safe_name(rel: str) -> str:
    return rel.replace("/", "__")


def preload_modules(exp: Experiment, pin_set: PinSet) -> tuple[str, ...]:
    """What the checks' fork server imports: the profile's ``preload`` (PRELOAD where it names
    none). Never the package under test (ExperimentError): its code comes from each side's tree."""
    if pin_set.kind is SourceKind.SYNTHETIC:
        return PRELOAD
    from kvprobe.env.venv import load_profile

    modules = load_profile(exp.profile).preload
    modules = PRELOAD if modules is None else modules
    wheels = [pin for pin in (pin_set.base, pin_set.head) if isinstance(pin, WheelPin)]
    tested = {pin.package.lower().replace("-", "_") for pin in wheels}
    for name in modules:
        if name.split(".")[0].lower() in tested:
            raise ExperimentError(
                f"profile {exp.profile}: preload names {name!r}, part of the package under test "
                "(its code must come from each side's tree)"
            )
    return modules


def fork_server(
    python: str,
    env_vars: dict[str, str],
    work: Path,
    lifetime_s: float,
    preload: bool,
    modules: Sequence[str],
    keep_s: float | None = None,
    reporter: Reporter | None = None,
) -> tuple[ForkServer | None, str | None]:
    """The run's fork server importing ``modules``, started (its preload runs while the caller
    goes on), or None and why its checks run in fresh interpreters. :func:`server_ready` waits.
    With ``keep_s``, the server kept between runs (found running, or started to stay up
    ``keep_s`` seconds unused), holding a lease on its env when the env is a cache entry.
    """
    if not preload:
        return None, "--no-preload"
    reporter = reporter or Reporter()
    server: ForkServer
    try:
        if keep_s is not None:
            server = KeptServer(
                python, preload=modules, env=env_vars, idle_s=keep_s, lease=_env_lease(python), wait=False
            )
        else:
            server = ForkServer(
                python, preload=modules, env=env_vars, work=work / "forkserver", lifetime_s=lifetime_s, wait=False
            )
    except ObserveError as exc:
        reporter.note(f"preload: the fork server did not start ({exc}); checks run in fresh interpreters")
        return None, f"the fork server did not start: {exc}"
    if isinstance(server, KeptServer) and server.reused:
        reporter.note(f"preload: the kept fork server is running ({_listed(modules)})")
    else:
        reporter.note(f"preload: fork server started, importing {_listed(modules)} in the background")
    return server, None


def _listed(modules: Sequence[str]) -> str:
    return ", ".join(modules) if modules else "nothing"


def _env_lease(python: str) -> Path | None:
    """A lease file on the cache env ``python`` belongs to (its runs hold leases beside it);
    None for an interpreter outside the cache (a synthetic experiment's, kvprobe's own)."""
    from kvprobe.env.cache import lease_file

    env_dir = Path(python).parent.parent
    return lease_file(env_dir) if (env_dir.parent / f"{env_dir.name}.users").is_dir() else None


def server_ready(
    server: ForkServer | None, reason: str | None, reporter: Reporter | None = None
) -> tuple[ForkServer | None, str | None]:
    """The server once it has preloaded, or None and why: a server that cannot start is not a
    failed run, its checks run fresh and the receipt says why (it is closed here). The first
    wait is a reporter step (a heartbeat while torch and the rest import, then its time)."""
    if server is None:
        return None, reason
    reporter = reporter or Reporter()
    waited = not server.is_ready
    try:
        if waited:
            with reporter.step(f"preload: fork server importing {_listed(server.modules)}"):
                server.ready()
        else:
            server.ready()
    except BadReply as exc:  # a kept server found on the run's key is any process of this user
        server.close()
        return None, f"ignored a fork server whose reply is not one: {exc}"
    except ObserveError as exc:
        server.close()
        reporter.note(f"preload: the fork server did not start ({exc}); checks run in fresh interpreters")
        return None, f"the fork server did not start: {exc}"
    if waited:
        reporter.note(f"preload: fork server ready, {time.monotonic() - server.started:.1f}s after it started")
    return server, None


def execution_record(
    server: ForkServer | None, fresh_reason: str | None, checks: dict[Side, dict[str, Any]]
) -> ExecutionRecord:
    """The receipt's ``execution``: how each check ran, and what its interpreter had preloaded."""
    rows = []
    for side, ran in checks.items():
        named = [("test", t["path"], t["execution"]) for t in ran["tests"]]
        named += [("probe", p["name"], p["run"].execution) for p in ran["probes"]]
        for kind, name, how in named:
            reason = how.reason or (fresh_reason if how.mode == FRESH else None)
            rows.append(CheckExecution(name=name, mode=how.mode, reason=reason, side=side.value, check=kind))
    kept = None
    if isinstance(server, KeptServer):
        kept = KeptServerRecord(server.kept.started_utc, server.reused, server.kept.idle_s)
    return ExecutionRecord(dict(sorted(server.preloaded.items())) if server else {}, tuple(rows), kept)

"""Gate 2, reject/admission: the experiment A and B probes, head side, run against the operator's
SGLang; their outputs are decided by the pure rule in :mod:`kvprobe.evidence.gate2`.

The probes fork from one preloaded interpreter per gates run, as `kvprobe run`'s checks do
(``--no-preload``: fresh ones); the receipt's ``execution`` says how each ran."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvprobe.checks.forkserver import FRESH, Execution, ForkServer
from kvprobe.evidence import gate2
from kvprobe.evidence.bundle import cite
from kvprobe.evidence.gate_status import Check
from kvprobe.experiments.experiment import copy_into_bundle
from kvprobe.gates.gate import Gate, GateOptions
from kvprobe.gates.target import VERSION_RE, Target
from kvprobe.model.gates_receipt import Gate2Basis, GateExperimentRecord, GateProbeRecord
from kvprobe.model.receipt import EnvRecord, ExecutionRecord
from kvprobe.model.records import Experiment, PinSet, Side
from kvprobe.names import LOGS_DIR, RAW_DIR
from kvprobe.progress import Reporter
from kvprobe.run import runner
from kvprobe.run.side import (
    CheckContext,
    CheckPaths,
    cached_environment,
    environment,
    execution_record,
    fork_server,
    preload_modules,
    run_probe,
    server_ready,
)

TITLE = "reject/admission: fixes #38935 and #36988 behave as fixed on this SGLang"


@dataclass(frozen=True)
class Gate2Run:
    """Gate 2, the probe records and what they were decided from, and the env (None when nothing ran)."""

    gate: Gate
    probes: list[GateProbeRecord]
    basis: Gate2Basis
    env: EnvRecord | None
    execution: ExecutionRecord | None = None  # how each probe ran (None when nothing ran)


@dataclass
class _ProbeOutcome:
    checks: list[Check]
    refs: list[GateProbeRecord]
    experiment: GateExperimentRecord
    ran: list[dict[str, Any]]  # {"name": "<experiment>/<probe>", "run": ProbeRun}


@dataclass(frozen=True)
class Serving:
    """Gate 2's fork server in ``python``'s env, or None and why its probes run fresh."""

    server: ForkServer | None
    reason: str | None
    python: str | None


def start_server(opts: GateOptions, work: Path, reporter: Reporter, held: contextlib.ExitStack) -> Serving | None:
    """The gates run's fork server, started now when gate 2 will fetch a release and its env is
    already in the cache (it preloads while the wheel is fetched and unpacked), stopped with
    ``held``; None when it starts once :func:`run_gate2` has the env (a path or wheel file is
    materialized in moments, and a spec that is neither is refused before any server starts)."""
    if opts.sglang is None or not opts.preload or not VERSION_RE.match(opts.sglang) or Path(opts.sglang).exists():
        return None
    experiments = _experiments()
    early = cached_environment(*experiments[0], _run_options(opts), reporter, held)
    return None if early is None else _serve(experiments, early[1], early[2], opts, work, held, reporter)


def _serve(
    experiments: list[tuple[Experiment, PinSet]],
    python: str,
    env_vars: dict[str, str],
    opts: GateOptions,
    work: Path,
    held: contextlib.ExitStack,
    reporter: Reporter,
) -> Serving:
    lifetime = opts.timeout_s * max(1, sum(len(e.probes) for e, _p in experiments)) + 600
    modules = preload_modules(*experiments[0])  # gate 2's experiments share one profile (one env)
    server, reason = fork_server(python, env_vars, work, lifetime, opts.preload, modules, reporter=reporter)
    if server is not None:
        held.enter_context(server)
    return Serving(server, reason, python)


def _experiments() -> list[tuple[Experiment, PinSet]]:
    """Gate 2's experiments, each with a non-synthetic pin set: it only selects their env's profile."""
    from kvprobe.experiments import experiment

    loaded = [experiment.load(i) for i in gate2.EXPERIMENTS]
    return [(e, next(p for p in e.pin_sets.values() if p.kind.value != "synthetic")) for e in loaded]


def _run_options(opts: GateOptions) -> runner.RunOptions:
    return runner.RunOptions(cache_root=opts.cache_root, torch_index=opts.torch_index)


def run_gate2(
    target: Target | None,
    opts: GateOptions,
    staging: Path,
    work: Path,
    reporter: Reporter,
    held: contextlib.ExitStack,
    started: Serving | None = None,
) -> Gate2Run:
    """Gate 2 against the target, or unknown without one; its probes fork from ``started``
    (:func:`start_server`) or from a server started here once the env is there, stopped
    with ``held`` (which also holds the env's lease)."""
    if target is None:
        return Gate2Run(Gate(2, TITLE, (gate2.NO_TARGET,)), [], Gate2Basis(gate2.ALGORITHM, ()), None)
    checks: list[Check] = []
    refs: list[GateProbeRecord] = []
    experiments: list[GateExperimentRecord] = []
    ran: list[dict[str, Any]] = []
    env: EnvRecord | None = None
    serving = started
    loaded = _experiments()
    for exp, pin_set in loaded:
        env, python, env_vars = environment(exp, pin_set, _run_options(opts), reporter, held)
        serving = serving or _serve(loaded, python, env_vars, opts, work, held, reporter)
        serving = Serving(*server_ready(serving.server, serving.reason, reporter), serving.python)
        elsewhere = serving.server is not None and python != serving.python  # it forks only its env's python
        server = None if elsewhere else serving.server
        ctx = CheckContext(exp, pin_set, python, env_vars, staging, work, opts.timeout_s, server)
        outcome = _probe_experiment(ctx, target, reporter)
        checks += outcome.checks
        refs += outcome.refs
        experiments.append(outcome.experiment)
        ran += [_elsewhere(r) for r in outcome.ran] if elsewhere else outcome.ran
    assert serving is not None, "gate 2 has experiments"
    execution = execution_record(serving.server, serving.reason, {Side.HEAD: {"tests": [], "probes": ran}})
    basis = Gate2Basis(gate2.ALGORITHM, tuple(experiments))
    return Gate2Run(Gate(2, TITLE, tuple(checks)), refs, basis, env, execution)


def _elsewhere(ran: dict[str, Any]) -> dict[str, Any]:
    """A probe whose env is not the fork server's ran fresh, and says so."""
    return {**ran, "run": replace(ran["run"], execution=Execution(FRESH, "its env is not the fork server's"))}


def _probe_experiment(ctx: CheckContext, target: Target, reporter: Reporter) -> _ProbeOutcome:
    exp, staging = ctx.exp, ctx.staging
    probe_dir = copy_into_bundle(exp, staging)
    cited = GateExperimentRecord(exp.id, cite(probe_dir / "experiment.toml", staging))
    scratch = ctx.work / "home" / exp.id
    scratch.mkdir(parents=True, exist_ok=True)
    raw, logs = staging / RAW_DIR / "gate2" / exp.id, staging / LOGS_DIR / "gate2" / exp.id
    paths = CheckPaths(Side.HEAD, [target.import_root], raw, logs, scratch)
    docs: dict[str, Any] = {}
    problems: list[str] = []
    refs: list[GateProbeRecord] = []
    ran: list[dict[str, Any]] = []
    for check in exp.probes:
        with reporter.step(f"gate 2: {exp.id} probe {check.name} against {target.spec}"):
            ran_probe = run_probe(ctx, paths, check)
        run = ran_probe["run"]
        ran.append({"name": f"{exp.id}/{check.name}", "run": run})
        if run.ok:
            docs[check.name] = run.output
        else:
            problems.append(run.problem)
        found = docs.get(check.name, {})
        refs.append(
            GateProbeRecord(
                experiment=exp.id,
                name=check.name,
                source=cite(probe_dir / check.path, staging),
                raw=cite(ran_probe["raw"], staging) if ran_probe["raw"] is not None else None,
                exit_code=run.exit_code,
                problem=run.problem,
                duration_s=round(run.duration_s, 3),
                # what the probe set and what its mocks stood in for: the limits of its evidence
                configuration=found.get("configuration", []),
                absorbed=found.get("absorbed", []),
            )
        )
    checks = gate2.experiment_checks(exp.id, exp.fix.prs, exp.expectations.get("head", {}), docs, problems)
    return _ProbeOutcome(checks, refs, cited, ran)

"""The behavioural gates: experiments' probes, head side, run against the operator's SGLang;
their outputs are decided by the pure rule in :mod:`kvprobe.rules.gate_probes`.

Gate 2 (reject/admission) runs experiments A and B, gate 3 (transfer/read) experiment F, gate 4
(lifetime) experiments C, D and E (``gate_probes.RULES``). Every probe of the gates run forks
from one preloaded interpreter, as `kvprobe run`'s checks do (``--no-preload``: fresh ones);
the receipt's ``execution`` says how each ran. Gate 2's checks are its gate; gates 3 and 4 add
the deployment's settings to theirs (:mod:`kvprobe.gates.settings`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvprobe.checks.forkserver import FRESH, Execution
from kvprobe.evidence.bundle import cite
from kvprobe.experiments.experiment import copy_into_bundle
from kvprobe.gates.gate import GateOptions
from kvprobe.gates.target import VERSION_RE, Target
from kvprobe.model.gates_receipt import BehaviourBasis, GateExperimentRecord, GateProbeRecord
from kvprobe.model.receipt import EnvRecord, ExecutionRecord
from kvprobe.model.records import Experiment, PinSet, Side
from kvprobe.names import LOGS_DIR, RAW_DIR
from kvprobe.progress import Reporter
from kvprobe.rules import gate_probes
from kvprobe.rules.gate_probes import ProbeRule
from kvprobe.rules.gate_status import Check
from kvprobe.run.session import CheckSession, SessionSettings
from kvprobe.run.side import CheckContext, CheckPaths, run_probe


@dataclass(frozen=True)
class ProbeGate:
    """One behavioural gate's probe checks, the probe records and what they were decided from."""

    number: int
    checks: tuple[Check, ...]
    probes: list[GateProbeRecord]
    basis: BehaviourBasis


@dataclass(frozen=True)
class BehaviourRun:
    """Every behavioural gate's probe checks, and the env and execution (None when nothing ran)."""

    gates: dict[int, ProbeGate]
    env: EnvRecord | None
    execution: ExecutionRecord | None = None  # how each probe ran (None when nothing ran)

    @property
    def probes(self) -> list[GateProbeRecord]:
        return [p for n in sorted(self.gates) for p in self.gates[n].probes]

    @property
    def bases(self) -> tuple[BehaviourBasis, ...]:
        return tuple(self.gates[n].basis for n in sorted(self.gates))


@dataclass
class _ProbeOutcome:
    checks: list[Check]
    refs: list[GateProbeRecord]
    experiment: GateExperimentRecord
    ran: list[dict[str, Any]]  # {"name": "<experiment>/<probe>", "run": ProbeRun}


def start_server(opts: GateOptions, work: Path, reporter: Reporter, held: contextlib.ExitStack) -> CheckSession | None:
    """The gates run's check session, closed with ``held``, its fork server started now when
    a release will be fetched and the probes' env is already in the cache (it preloads while
    the wheel is fetched and unpacked); None when :func:`run_behaviour` opens it once it has
    the env (a path or wheel file is materialized in moments, and a spec that is neither is
    refused before any server starts)."""
    if opts.sglang is None or not opts.preload or not VERSION_RE.match(opts.sglang) or Path(opts.sglang).exists():
        return None
    experiments = [e for _rule, e in _experiments()]
    session = held.enter_context(_open(experiments, opts, reporter))
    if session.cached() is None:
        return None  # nothing held: run_behaviour opens the session once the env is built
    session.start(work, _lifetime(experiments, opts))
    return session


def _open(experiments: list[tuple[Experiment, PinSet]], opts: GateOptions, reporter: Reporter) -> CheckSession:
    """The session of the first experiment's env: the behavioural experiments share one profile (one env)."""
    return CheckSession(*experiments[0], SessionSettings(opts.cache_root, opts.torch_index, opts.preload), reporter)


def _lifetime(experiments: list[tuple[Experiment, PinSet]], opts: GateOptions) -> float:
    return opts.timeout_s * max(1, sum(len(e.probes) for e, _p in experiments)) + 600


def _experiments() -> list[tuple[ProbeRule, tuple[Experiment, PinSet]]]:
    """Every behavioural gate's experiments in gate order, each with a non-synthetic pin set: it
    only selects their env's profile."""
    from kvprobe.experiments import experiment

    found = []
    for number in gate_probes.BEHAVIOURAL:
        rule = gate_probes.RULES[number]
        for exp_id in rule.experiments:
            exp = experiment.load(exp_id)
            found.append((rule, (exp, next(p for p in exp.pin_sets.values() if p.kind.value != "synthetic"))))
    return found


def run_behaviour(
    target: Target | None,
    opts: GateOptions,
    staging: Path,
    work: Path,
    reporter: Reporter,
    held: contextlib.ExitStack,
    session: CheckSession | None = None,
) -> BehaviourRun:
    """Every behavioural gate's probes against the target, or each gate's one unknown check
    without one; the probes fork from the server of ``session`` (:func:`start_server`) or of
    one opened here, closed with ``held``, its server started once the env is there."""
    rules = [gate_probes.RULES[n] for n in gate_probes.BEHAVIOURAL]
    if target is None:
        gates = {
            r.gate: ProbeGate(r.gate, (gate_probes.NO_TARGET,), [], BehaviourBasis(r.algorithm, (), r.gate))
            for r in rules
        }
        return BehaviourRun(gates, None)
    found: dict[int, tuple[list[Check], list[GateProbeRecord], list[GateExperimentRecord]]] = {
        r.gate: ([], [], []) for r in rules
    }
    ran: list[dict[str, Any]] = []
    loaded = _experiments()
    behavioural = [e for _r, e in loaded]
    session = session or held.enter_context(_open(behavioural, opts, reporter))
    sessions = {session.exp.profile: session}  # by profile: one env, one lease
    env: EnvRecord | None = None
    for rule, (exp, pin_set) in loaded:
        if exp.profile not in sessions:
            sessions[exp.profile] = held.enter_context(CheckSession(exp, pin_set, session.settings, reporter))
        mine = sessions[exp.profile]
        env = mine.environment().record
        session.environment()
        session.start(work, _lifetime(behavioural, opts))  # once, in the first experiment's env
        server = session.ready()
        elsewhere = server is not None and mine.python != session.python  # it forks only its env's python
        ctx = CheckContext(
            exp, pin_set, mine.python, mine.variables, staging, work, opts.timeout_s, None if elsewhere else server
        )
        outcome = _probe_experiment(rule, ctx, target, reporter)
        checks, refs, experiments = found[rule.gate]
        checks += outcome.checks
        refs += outcome.refs
        experiments.append(outcome.experiment)
        ran += [_elsewhere(r) for r in outcome.ran] if elsewhere else outcome.ran
    execution = session.execution({Side.HEAD: {"tests": [], "probes": ran}})
    gates = {
        r.gate: ProbeGate(
            r.gate,
            tuple(found[r.gate][0]),
            found[r.gate][1],
            BehaviourBasis(r.algorithm, tuple(found[r.gate][2]), r.gate),
        )
        for r in rules
    }
    return BehaviourRun(gates, env, execution)


def _elsewhere(ran: dict[str, Any]) -> dict[str, Any]:
    """A probe whose env is not the fork server's ran fresh, and says so."""
    return {**ran, "run": replace(ran["run"], execution=Execution(FRESH, "its env is not the fork server's"))}


def _probe_experiment(rule: ProbeRule, ctx: CheckContext, target: Target, reporter: Reporter) -> _ProbeOutcome:
    exp, staging = ctx.exp, ctx.staging
    probe_dir = copy_into_bundle(exp, staging)
    cited = GateExperimentRecord(exp.id, cite(probe_dir / "experiment.toml", staging))
    scratch = ctx.work / "home" / exp.id
    scratch.mkdir(parents=True, exist_ok=True)
    where = f"gate{rule.gate}"
    raw, logs = staging / RAW_DIR / where / exp.id, staging / LOGS_DIR / where / exp.id
    paths = CheckPaths(Side.HEAD, [target.import_root], raw, logs, scratch)
    docs: dict[str, Any] = {}
    problems: list[str] = []
    refs: list[GateProbeRecord] = []
    ran: list[dict[str, Any]] = []
    for check in exp.probes:
        with reporter.step(f"gate {rule.gate}: {exp.id} probe {check.name} against {target.spec}"):
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
                gate=rule.gate,
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
    head = exp.expectations.get("head", {})
    checks = gate_probes.experiment_checks(rule, exp.id, exp.fix.prs, head, docs, problems)
    return _ProbeOutcome(checks, refs, cited, ran)

"""Gate 2, reject/admission: the experiment A and B probes, head side, run against the operator's
SGLang; their outputs are decided by the pure rule in :mod:`kvprobe.evidence.gate2`."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvprobe.evidence import gate2
from kvprobe.evidence.bundle import cite
from kvprobe.evidence.gate_status import Check
from kvprobe.experiments.experiment import copy_into_bundle
from kvprobe.gates.gate import Gate, GateOptions
from kvprobe.gates.target import Target
from kvprobe.model.gates_receipt import Gate2Basis, GateExperimentRecord, GateProbeRecord
from kvprobe.model.receipt import EnvRecord
from kvprobe.model.records import Side
from kvprobe.names import LOGS_DIR, RAW_DIR
from kvprobe.progress import Reporter
from kvprobe.run import runner
from kvprobe.run.side import CheckContext, CheckPaths, environment, run_probe

TITLE = "reject/admission: fixes #38935 and #36988 behave as fixed on this SGLang"


@dataclass(frozen=True)
class Gate2Run:
    """Gate 2, the probe records and what they were decided from, and the env (None when nothing ran)."""

    gate: Gate
    probes: list[GateProbeRecord]
    basis: Gate2Basis
    env: EnvRecord | None


@dataclass
class _ProbeOutcome:
    checks: list[Check]
    refs: list[GateProbeRecord]
    experiment: GateExperimentRecord


def run_gate2(
    target: Target | None,
    opts: GateOptions,
    staging: Path,
    work: Path,
    reporter: Reporter,
    held: contextlib.ExitStack | None = None,
) -> Gate2Run:
    """Gate 2 against the target, or unknown without one."""
    if target is None:
        return Gate2Run(Gate(2, TITLE, (gate2.NO_TARGET,)), [], Gate2Basis(gate2.ALGORITHM, ()), None)
    from kvprobe.experiments import experiment

    run_opts = runner.RunOptions(cache_root=opts.cache_root, torch_index=opts.torch_index)
    checks: list[Check] = []
    refs: list[GateProbeRecord] = []
    experiments: list[GateExperimentRecord] = []
    env: EnvRecord | None = None
    for exp in (experiment.load(i) for i in gate2.EXPERIMENTS):
        # any non-synthetic pin set: it only selects the experiment's dependency profile
        pin_set = next(p for p in exp.pin_sets.values() if p.kind.value != "synthetic")
        env, python, env_vars = environment(exp, pin_set, run_opts, reporter, held)
        ctx = CheckContext(exp, pin_set, python, env_vars, staging, work, opts.timeout_s)
        outcome = _probe_experiment(ctx, target, reporter)
        checks += outcome.checks
        refs += outcome.refs
        experiments.append(outcome.experiment)
    return Gate2Run(Gate(2, TITLE, tuple(checks)), refs, Gate2Basis(gate2.ALGORITHM, tuple(experiments)), env)


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
    for check in exp.probes:
        with reporter.step(f"gate 2: {exp.id} probe {check.name} against {target.spec}"):
            ran = run_probe(ctx, paths, check)
        run = ran["run"]
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
                raw=cite(ran["raw"], staging) if ran["raw"] is not None else None,
                exit_code=run.exit_code,
                problem=run.problem,
                duration_s=round(run.duration_s, 3),
                # what the probe set and what its mocks stood in for: the limits of its evidence
                configuration=found.get("configuration", []),
                absorbed=found.get("absorbed", []),
            )
        )
    checks = gate2.experiment_checks(exp.id, exp.fix.prs, exp.expectations.get("head", {}), docs, problems)
    return _ProbeOutcome(checks, refs, cited)

"""Gate 2, reject/admission: the experiment A and B probes, head side, run against the operator's SGLang."""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvprobe.evidence import compare
from kvprobe.evidence.bundle import cite
from kvprobe.evidence.gate_status import Status
from kvprobe.gates.gate import Check, Gate, GateOptions
from kvprobe.gates.target import GATE_EXPERIMENTS, Target
from kvprobe.model.gates_receipt import GateProbeRecord
from kvprobe.model.receipt import EnvRecord
from kvprobe.model.records import Experiment, Side
from kvprobe.names import LOGS_DIR, PROBES_DIR, RAW_DIR
from kvprobe.progress import Reporter
from kvprobe.run import runner
from kvprobe.run.side import CheckContext, CheckPaths, environment, run_probe


def gate2_checks(exp: Experiment, docs: dict[str, Any], problems: list[str]) -> list[Check]:
    """Head-side expectations of one experiment against the probe output from the target."""
    head_expect = exp.expectations.get("head", {})
    table = compare.case_table(docs)
    rows = compare.observation_rows({"head": head_expect}, {"base": {}, "head": table})
    label = f"{exp.id} (#{', #'.join(map(str, exp.fix.prs))})"
    if problems:
        return [Check(label, Status.UNKNOWN, "probe did not run to the end: " + "; ".join(problems))]
    if not table:
        return [Check(label, Status.UNKNOWN, "nothing ran: the probe reported no case")]
    checks = []
    for case in sorted(head_expect):
        if table.get(case, {}).get("observation", compare.OBSERVED) != compare.OBSERVED:
            # set-up drift or a missing code path: neither fixed nor unfixed
            checks.append(Check(f"{exp.id}: {case}", Status.UNKNOWN, compare.unobserved_text(table[case])))
            continue
        case_rows = [r for r in rows if r["case"] == case and r["expected_head_declared"]]
        bad = [r for r in case_rows if not r["head_ok"]]
        if not bad:
            checks.append(
                Check(f"{exp.id}: {case}", Status.PASS, f"{len(case_rows)}/{len(case_rows)} observations as fixed")
            )
            continue
        got = [
            f"{r['observation']} expected {r['expected_head']!r}, got {r['head']!r}"
            if r["head_recorded"]
            else f"{r['observation']} not recorded"
            for r in bad
        ]
        checks.append(
            Check(
                f"{exp.id}: {case}",
                Status.FAIL,
                f"{len(case_rows) - len(bad)}/{len(case_rows)} as fixed; " + "; ".join(got[:4]),
            )
        )
    return checks


@dataclass
class _ProbeOutcome:
    checks: list[Check]
    refs: list[GateProbeRecord]


def run_gate2(
    target: Target | None,
    opts: GateOptions,
    staging: Path,
    work: Path,
    reporter: Reporter,
    held: contextlib.ExitStack | None = None,
) -> tuple[Gate, list[GateProbeRecord], EnvRecord | None]:
    """Gate 2, the probe references for the receipt and the env block (None when nothing ran)."""
    title = "reject/admission: fixes #38935 and #36988 behave as fixed on this SGLang"
    if target is None:
        return (
            Gate(2, title, (Check("probes", Status.UNKNOWN, "no SGLang given: pass --sglang PATH|WHEEL|VERSION"),)),
            [],
            None,
        )
    from kvprobe.experiments import experiment

    run_opts = runner.RunOptions(cache_root=opts.cache_root, torch_index=opts.torch_index)
    checks: list[Check] = []
    refs: list[GateProbeRecord] = []
    env: EnvRecord | None = None
    for exp in (experiment.load(i) for i in GATE_EXPERIMENTS):
        # any non-synthetic pin set: it only selects the experiment's dependency profile
        pin_set = next(p for p in exp.pin_sets.values() if p.kind.value != "synthetic")
        env, python, env_vars = environment(exp, pin_set, run_opts, reporter, held)
        ctx = CheckContext(exp, pin_set, python, env_vars, staging, work, opts.timeout_s)
        outcome = _probe_experiment(ctx, target, reporter)
        checks += outcome.checks
        refs += outcome.refs
    return Gate(2, title, tuple(checks)), refs, env


def _probe_experiment(ctx: CheckContext, target: Target, reporter: Reporter) -> _ProbeOutcome:
    exp, staging = ctx.exp, ctx.staging
    probe_dir = staging / PROBES_DIR / exp.id
    probe_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(exp.directory / "experiment.toml", probe_dir / "experiment.toml")
    scratch = ctx.work / "home" / exp.id
    scratch.mkdir(parents=True, exist_ok=True)
    raw, logs = staging / RAW_DIR / "gate2" / exp.id, staging / LOGS_DIR / "gate2" / exp.id
    paths = CheckPaths(Side.HEAD, [target.import_root], raw, logs, scratch)
    docs: dict[str, Any] = {}
    problems: list[str] = []
    refs: list[GateProbeRecord] = []
    for check in exp.probes:
        shutil.copy2(exp.directory / check.path, probe_dir / check.path)
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
    return _ProbeOutcome(gate2_checks(exp, docs, problems), refs)

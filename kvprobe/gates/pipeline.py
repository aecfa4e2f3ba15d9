"""`kvprobe gates`: check one SGLang PD deployment against the four acceptance gates.

The write-up behind the gates: "A version number is not an acceptance". Each gate is decided from what the
deployment itself shows, and says which file or line decided it:

1. pool/context      the startup log of each worker (scheduler + KV allocation lines)
2. reject/admission  experiment A and B probes, head side, run against the operator's SGLang
3. transfer/read     experiment F's probes (#39500) on that SGLang; checksum / KV canary active
                     on both sides
4. lifetime          experiment C, D and E probes (#40645 #41402 #41404 #41023) on that SGLang;
                     deferred release on and supported on both sides

Gates 2-4's probes fork from one preloaded interpreter per gates run (gates/behaviour.py); the
fix markers in the code are recorded beside gates 3 and 4 as supporting detail, never deciding.

A gate is ``pass`` only when every deciding check passed; any ``fail`` fails it; anything
not observed is ``unknown`` (never a pass). The bundle never copies the operator's logs or
arguments (they can hold keys): it records their sha256 and the lines that decided.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kvprobe import __version__
from kvprobe.env.venv import check_index_url
from kvprobe.errors import UsageError
from kvprobe.evidence.bundle import host_facts
from kvprobe.evidence.gates_readme import render_readme
from kvprobe.gates import serverlog
from kvprobe.gates.behaviour import BehaviourRun, ProbeGate, run_behaviour, start_server
from kvprobe.gates.environment import Environment
from kvprobe.gates.fixmarkers import CodeSettings, CodeTree, Finding, code_settings
from kvprobe.gates.gate import Gate, GateOptions
from kvprobe.gates.inputs import InputFile, read_env, read_logs, read_server_args
from kvprobe.gates.pool import classify, gate1, main_kv
from kvprobe.gates.settings import collect_sources, gate3, gate4
from kvprobe.gates.target import Target, resolve_target
from kvprobe.model.gates_receipt import (
    DeploymentScope,
    Gate4Basis,
    GatesReceipt,
    Inputs,
    MarkerRecord,
    TargetRecord,
)
from kvprobe.model.receipt import Tool
from kvprobe.names import GATES_RECEIPT_SCHEMA
from kvprobe.progress import Reporter
from kvprobe.rules import gate_scope
from kvprobe.rules.gate_status import RECORDED_EXIT_CODE, Status, combine
from kvprobe.run.workspace import SealedBundle, Workspace, bundle_path


@dataclass(frozen=True)
class GateInputs:
    """What was examined: the operator's logs and argument files, the SGLang that runs."""

    logs: list[tuple[InputFile, serverlog.WorkerLog]]
    files: list[tuple[InputFile, str | None, serverlog.ServerArgs]]
    target: Target | None
    code: CodeSettings | None
    envs: list[tuple[InputFile, Environment]] = field(default_factory=list)


@dataclass(frozen=True)
class GatesRun:
    """What this run decided (the four gates, with the markers and probes behind them) and measured."""

    started: datetime
    gates: tuple[Gate, ...]
    findings: list[Finding]
    behaviour: BehaviourRun  # gates 2-4's probe records, what they were decided from and the env
    timings: dict[str, float]
    gate4: Gate4Basis | None = None  # what gate 4's deferred checks were decided from


def run_gates(opts: GateOptions, reporter: Reporter | None = None) -> SealedBundle[GatesReceipt]:
    """Decide all four gates and write the bundle; raises only on bad input or a broken env."""
    reporter = reporter or Reporter()
    if not (opts.logs or opts.server_args or opts.sglang or opts.env):
        raise UsageError("nothing to check: give --log, --server-args, --env and/or --sglang")
    check_index_url(opts.torch_index)
    started = datetime.now(UTC)
    clock = time.monotonic()
    logs = read_logs(opts.logs)
    files = read_server_args(opts.server_args)
    envs = read_env(opts.env)
    workspace = Workspace(_final_path(opts, started), "kvprobe-gates-")
    work, staging = workspace.work, workspace.stage()  # published at `final` only once sealed and verified
    timings: dict[str, float] = {"read_inputs_s": time.monotonic() - clock}
    held = contextlib.ExitStack()  # the env's lease: `cache prune` leaves it alone until we end
    try:
        clock = time.monotonic()
        # the probes' env cached: the fork server preloads while a release is fetched
        serving = start_server(opts, work, reporter, held)
        if serving is not None:
            timings["preload_start_s"] = time.monotonic() - clock
        clock = time.monotonic()
        target = resolve_target(opts.sglang, work, opts.cache_root, reporter) if opts.sglang else None
        tree = CodeTree(target.code_root, target.identity.get("version")) if target else None
        code = code_settings(tree) if tree else None
        timings["materialize_s"] = time.monotonic() - clock
        clock = time.monotonic()
        behaviour = run_behaviour(target, opts, staging, work, reporter, held, serving)
        timings["probes_s"] = time.monotonic() - clock
        worker_logs = [log for _f, log in logs]
        sources = collect_sources(worker_logs, files, envs)
        findings: list = []
        gate4_result, gate4_basis = gate4(sources, tree, code, findings)
        gates = (
            gate1(worker_logs),
            with_probes(Gate(2, ADMISSION, ()), behaviour.gates[2]),
            with_probes(gate3(sources, tree, code, findings), behaviour.gates[3]),
            with_probes(gate4_result, behaviour.gates[4]),
        )
        record = build_receipt(
            GateInputs(logs, files, target, code, envs),
            GatesRun(started, gates, findings, behaviour, timings, gate4_basis),
        )
        return workspace.seal(record, record.to_json(), GATES_RECEIPT_SCHEMA, render_readme(record))
    finally:
        held.close()
        workspace.close()


def _final_path(opts: GateOptions, started: datetime) -> Path:
    return bundle_path(opts.out, opts.bundles_dir, f"gates-{started.strftime('%Y%m%dT%H%M%SZ')}")


ADMISSION = "reject/admission: fixes #38935 and #36988 behave as fixed on this SGLang"


def with_probes(gate: Gate, probes: ProbeGate) -> Gate:
    """``gate`` with its behavioural probe checks first: they decide beside its own deciding checks."""
    assert gate.number == probes.number, "a gate's own probes"
    return Gate(gate.number, gate.title, (*probes.checks, *gate.checks))


def overall(gates: Iterable[Gate]) -> Status:
    return combine(g.status for g in gates)


def build_receipt(inputs: GateInputs, run: GatesRun) -> GatesReceipt:
    logs, files, started = inputs.logs, inputs.files, run.started
    verdict = overall(run.gates)
    host = host_facts()
    return GatesReceipt(
        schema=GATES_RECEIPT_SCHEMA,
        tool=Tool(__version__),
        run_id=f"gates-{started.strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:6]}",
        created_utc=started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        layer="deployment",
        overall=verdict,
        exit_code=RECORDED_EXIT_CODE[verdict],
        gates=tuple(g.record() for g in run.gates),
        inputs=Inputs(
            logs=tuple(f.record(log.role, log.redacted) for f, log in logs),
            server_args=tuple(f.record(role, args.redacted) for f, role, args in files),
            env=tuple(f.record(f.role_flag, env.secrets) for f, env in inputs.envs),
        ),
        workers=tuple(_worker_json(log) for _f, log in logs),
        target=None if inputs.target is None else _target(inputs.target, inputs.code, run.findings),
        probes=tuple(run.behaviour.probes),
        behaviour=run.behaviour.bases,
        gate4=run.gate4,
        env=run.behaviour.env,
        host=host,
        evidence=DeploymentScope.from_json(gate_scope.scope(GATES_RECEIPT_SCHEMA, host)),
        timings={k: round(v, 3) for k, v in run.timings.items()},
        execution=run.behaviour.execution,
    )


def _target(target: Target, code: CodeSettings | None, findings: list[Finding]) -> TargetRecord:
    markers = tuple(
        MarkerRecord(
            f.marker.pr,
            f.marker.gate,
            f.marker.title,
            f.presence.value,
            f.evidence,
            f.marker.first_release,
            f.marker.basis,
        )
        for f in findings
    )
    settings = None
    if code is not None:
        settings = {
            "checksum_flag": code.has_checksum_flag,
            "checksum_evidence": code.checksum_evidence,
            "canary_flag": code.has_canary_flag,
            "deferred_default": code.deferred_default,
            "deferred_declared": code.deferred_declared,
            "deferred_evidence": code.deferred_evidence,
            "deferred_backends": list(code.deferred_backends) if code.deferred_capability_flag else None,
        }
    spec = target.spec if target.kind == "version" else Path(target.spec).name
    return TargetRecord(spec, target.kind, target.identity, markers, settings)


def _startup_json(startup: serverlog.Startup) -> dict[str, Any]:
    """What one earlier startup of a log had (the gates decide on the last)."""
    return {
        "startup": startup.number,
        "line": startup.line,
        "role": startup.role,
        "pools": [p.pool_tokens for p in startup.pools],
        "context_len": sorted({p.context_len for p in startup.pools}),
        "canary": startup.canary.cite() if startup.canary else None,
        "args": serverlog.redacted(startup.args.values) if startup.args else None,
        "summary": startup.summary(),
    }


def _worker_json(log: serverlog.WorkerLog) -> dict[str, Any]:
    kv = main_kv(log)
    return {
        "log": log.path,  # the file's name: logs are read by name, never recorded by path
        "role": log.role,
        "role_flag": log.role_flag,
        "role_from_log": log.role_from_log,
        "pools": [
            {
                "pool_tokens": p.pool_tokens,
                "context_len": p.context_len,
                "ranks": p.ranks,
                "evidence": p.evidence.cite(),
            }
            for p in log.pools
        ],
        "kv_allocations": [
            {
                "label": a.line.label,
                "kind": a.line.kind,
                "tokens": a.line.tokens,
                "pool": a.pool,
                "why": a.why,
                "evidence": a.line.evidence.cite(),
            }
            for a in classify(log.current)
        ],
        "sliding_window": [
            {
                "source": w.source,
                "full_tokens": w.full_tokens,
                "swa_tokens": w.swa_tokens,
                "evidence": w.evidence.cite(),
            }
            for w in log.swa
        ],
        "main_kv_tokens": kv.tokens if kv else None,
        "startup": {"number": log.current.number, "line": log.current.line, "of": len(log.startups)},
        "earlier_startups": [_startup_json(s) for s in log.earlier],
        "wrappers_stripped": dict(sorted(log.wrappers.items())),
        "sources": dict(sorted(log.sources.items())),
        "canary": log.canary.cite() if log.canary else None,
        "args": serverlog.redacted(log.args.values) if log.args else None,
        "problems": list(log.problems),
        "lines": log.lines,
    }

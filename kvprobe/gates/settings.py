"""Gates 3 and 4, the deployment's half: the settings each worker ran with, and the fix
markers in the code as supporting detail.

3 transfer/read: checksum or KV canary active on both sides.
4 lifetime: deferred release on and supported by the backend, on both sides.

Each gate's other half is behavioural: the probes of experiment F (gate 3) and of C, D and E
(gate 4) run on the operator's SGLang (:mod:`kvprobe.gates.behaviour`); the pipeline puts
their checks first. A marker ("#PR in code") never decides: "the text is there" is not "the
behaviour is fixed" (issue #23), so its check is recorded with ``decides=False``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvprobe.gates import serverlog
from kvprobe.gates.environment import Environment
from kvprobe.gates.fixmarkers import CodeSettings, CodeTree, find_all, markers
from kvprobe.gates.gate import Gate
from kvprobe.gates.inputs import InputFile
from kvprobe.model.gates_receipt import DeferredWorkers, Gate4Basis, ReleaseFacts, WorkerFacts
from kvprobe.rules import gate4 as gate4_rule
from kvprobe.rules import markers as marker_rule
from kvprobe.rules.gate_status import Check, Status, combine


@dataclass(frozen=True)
class Sources:
    """Every place a worker's settings were read, by role."""

    args: dict[str, list[serverlog.ServerArgs]]
    logs: dict[str, list[serverlog.WorkerLog]]
    unassigned: list[serverlog.ServerArgs]
    # --env inputs: by role, and those without one (they apply to every worker)
    env: dict[str | None, list[tuple[InputFile, Environment]]] = field(default_factory=dict)


def collect_sources(
    logs: list[serverlog.WorkerLog],
    files: list[tuple[InputFile, str | None, serverlog.ServerArgs]],
    envs: list[tuple[InputFile, Environment]] = (),  # type: ignore[assignment]
) -> Sources:
    args: dict[str, list[serverlog.ServerArgs]] = {"prefill": [], "decode": []}
    by_role: dict[str, list[serverlog.WorkerLog]] = {"prefill": [], "decode": []}
    unassigned = []
    for log in logs:
        if log.role in by_role:
            by_role[log.role].append(log)
            if log.args is not None:
                args[log.role].append(log.args)
    for _file, role, parsed in files:
        if role in args:
            args[role].append(parsed)
        elif role is None:
            unassigned.append(parsed)
    env: dict[str | None, list[tuple[InputFile, Environment]]] = {}
    for file, found in envs:
        env.setdefault(file.role_flag, []).append((file, found))
    return Sources(args, by_role, unassigned, env)


def marker_checks(tree: CodeTree | None, gate: int, findings_out: list) -> list[Check]:
    if tree is None:
        return [
            Check(f"#{m.pr} in code", Status.UNKNOWN, f"{m.title}: no code to read (pass --sglang)", decides=False)
            for m in markers()
            if m.gate == gate
        ]
    checks = []
    for finding in find_all(tree, gate):
        findings_out.append(finding)
        status = marker_rule.STATUS[finding.presence.value]
        checks.append(
            Check(
                f"#{finding.marker.pr} in code",
                status,
                f"{finding.marker.title}: {finding.presence.value}",
                finding.evidence,
                decides=False,  # supporting detail: the probes decide whether the fix behaves
            )
        )
    return checks


def checksum_state(args: serverlog.ServerArgs, code: CodeSettings | None) -> tuple[Status, str]:
    value = args.values.get("disaggregation_enable_kv_checksum")
    if code is not None and not code.has_checksum_flag:
        return Status.FAIL, "not present in this release (--disaggregation-enable-kv-checksum does not exist)"
    if value is None:
        if args.full_dump:
            return Status.FAIL, "not present in this release (the resolved server_args have no such field)"
        if code is not None:
            return Status.FAIL, "off (flag not given; its default is False)"
        return Status.UNKNOWN, "not in these arguments, and the release is unknown (no --sglang)"
    if not serverlog.as_bool(value):
        return Status.FAIL, "off"
    device = args.values.get("device")
    if device not in (None, "cuda"):
        return Status.FAIL, (
            f"on, but device={device!r}: the checksum kernels run on CUDA only "
            "(KvChecksumComputer): does not count as a defence"
        )
    if args.values.get("disaggregation_transfer_backend") == "fake":
        return Status.FAIL, "on, but transfer backend 'fake' moves no KV: does not count as a defence"
    return Status.PASS, "on"


def canary_state(role: str, sources: Sources) -> tuple[Status, str, str]:
    """Active only when the worker's log shows install_canary (DOMAIN: logs must show it)."""
    logs = sources.logs[role]
    modes = {str(a.values["kv_canary"]) for a in sources.args[role] if "kv_canary" in a.values}
    configured = bool(modes - {"none"})
    canaries = [log.canary for log in logs if log.canary is not None]
    if logs and len(canaries) == len(logs):
        return Status.PASS, "active: install_canary logged", canaries[0].cite()
    if logs and any(log.pools for log in logs):  # a complete startup that never installed it
        missing = next(log for log in logs if log.canary is None)
        why = f"configured (kv_canary={'/'.join(sorted(modes))}) but" if configured else "off:"
        before = [s for s in missing.earlier if s.canary is not None]
        was = (
            f"; an earlier startup in this log ({before[-1].canary.cite()}) installed it, the running one "
            f"({missing.current.where()}) did not"
            if before and before[-1].canary is not None
            else ""
        )
        return Status.FAIL, f"{why} no install_canary line in the startup log{was}", missing.path
    if modes and not configured:
        return Status.FAIL, "off (kv_canary=none)", sources.args[role][0].evidence.cite()
    if configured:
        return Status.UNKNOWN, "configured, but no startup log shows it installed", "-"
    return Status.UNKNOWN, "no log or arguments for this worker", "-"


def _restarts(logs: list[serverlog.WorkerLog]) -> str:
    """What earlier startups in these logs had: the checks read the last (the server that runs)."""
    return "".join(
        f"; {log.path}: decided on {log.current.where()}, the running server; earlier: "
        + "; ".join(f"{s.where()}: {s.summary()}" for s in log.earlier)
        for log in logs
        if log.earlier
    )


def _role_args_state(
    role: str, sources: Sources, fn: Callable[[serverlog.ServerArgs], tuple[Status, str]]
) -> tuple[Status, str, str]:
    """Decide per worker of ``role``; every worker must pass. Logs are the workers' own record."""
    workers = worker_args(role, sources)
    if not workers:
        return Status.UNKNOWN, f"no server arguments for the {role} worker (log line or --server-args)", "-"
    states = [(fn(args), args, notes) for args, notes in workers]
    status = combine(s for (s, _d), _a, _n in states)
    (_, detail), args, notes = next((x for x in states if x[0][0] is status), states[0])
    return status, detail + "".join(f"; {n}" for n in notes), args.evidence.cite()


def worker_args(role: str, sources: Sources) -> list[tuple[serverlog.ServerArgs, list[str]]]:
    """Each worker's arguments: its log line, completed by the --server-args files for the role.

    Files add what a log cannot show (the environment); where both name a key the log wins,
    because it is what the process printed, and the disagreement is noted.
    """
    from_logs = [log.args for log in sources.logs[role] if log.args is not None]
    files = [a for a in sources.args[role] if a not in from_logs]
    extra_values: dict[str, Any] = {}
    extra_env: dict[str, str] = {}
    for args in files:
        extra_values.update(args.values)
        extra_env.update(args.env)
    if not from_logs:
        return [(a, []) for a in files]
    merged = []
    for args in from_logs:
        notes = [
            f"--server-args says {k}={v!r}, the log {args.values[k]!r}: the log wins"
            for k, v in extra_values.items()
            if k in args.values and args.values[k] != v
        ]
        merged.append(
            (
                serverlog.ServerArgs(
                    {**extra_values, **args.values}, {**extra_env, **args.env}, args.full_dump, args.evidence
                ),
                notes,
            )
        )
    return merged


def gate3(sources: Sources, tree: CodeTree | None, code: CodeSettings | None, findings: list) -> Gate:
    checks = marker_checks(tree, 3, findings)
    per_role = {}
    for role in ("prefill", "decode"):
        cs = _role_args_state(role, sources, lambda a: checksum_state(a, code))
        cn = canary_state(role, sources)
        per_role[role] = (cs[0], cn[0])
        checks.append(Check(f"{role}: KV checksum", cs[0], cs[1] + _restarts(sources.logs[role]), cs[2], decides=False))
        checks.append(Check(f"{role}: KV canary", cn[0], cn[1], cn[2], decides=False))
    checks += _unassigned(sources)
    checksum_both = combine(per_role[r][0] for r in per_role)
    canary_both = combine(per_role[r][1] for r in per_role)
    if Status.PASS in (checksum_both, canary_both):
        which = "checksum" if checksum_both is Status.PASS else "KV canary"
        defence = Check("read-integrity defence", Status.PASS, f"{which} active on prefill and decode")
    elif checksum_both is Status.FAIL and canary_both is Status.FAIL:
        defence = Check(
            "read-integrity defence",
            Status.FAIL,
            "neither the handoff checksum nor the KV canary "
            "is active on both sides: HTTP 200 or transfer-complete is no proof of what decode read",
        )
    else:
        defence = Check(
            "read-integrity defence",
            Status.UNKNOWN,
            "could not establish that a checksum or canary is active on both sides",
        )
    return Gate(
        3,
        "transfer/read: what decode reads is verified (#39500's checksum behaves as fixed; checksum or canary active)",
        (*checks, defence),
    )


def release_facts(code: CodeSettings | None) -> ReleaseFacts | None:
    if code is None:
        return None
    return ReleaseFacts(
        declared=code.deferred_declared,
        default=code.deferred_default,
        evidence=code.deferred_evidence,
        capability_flag=code.deferred_capability_flag,
        backends=code.deferred_backends if code.deferred_capability_flag else (),
    )


def deferred_workers(role: str, sources: Sources) -> list[WorkerFacts]:
    """Each worker's deferred-release setting and backend: --env inputs first (the role's,
    then those without a role), else the "env" of its --server-args; no log shows it."""
    envs = sources.env.get(role, []) + sources.env.get(None, [])
    given: dict[str, tuple[str, str, bool]] = {}  # key -> (value, where, from a role-less input)
    env_notes: list[str] = []
    for file, env in envs:
        env_notes += env.notes
        for name, setting in env.values.items():
            if name in given and given[name][0] != setting:
                env_notes.append(
                    f"--env {env.where[name]} says {name}={setting!r}, {given[name][1]} {given[name][0]!r}: "
                    "the first wins"
                )
                continue
            given.setdefault(name, (setting, env.where[name], file.role_flag is None))
    workers = worker_args(role, sources)
    if not workers and not given:
        return []
    key = gate4_rule.ENV_KEY
    found = []
    pairs: list[tuple[serverlog.ServerArgs | None, list[str]]] = list(workers) or [(None, [])]
    for args, args_notes in pairs:
        value: str | None = None
        source: str | None = None
        notes = list(args_notes) + env_notes
        if key in given:
            value, source, shared = given[key]
            if shared:
                notes.append(f"{source} has no role: it is taken for every worker")
            if args is not None and key in args.env and args.env[key] != value:
                notes.append(f"--server-args says {key}={args.env[key]!r}; --env {source} wins")
        elif args is not None and key in args.env:
            value, source = args.env[key], f"{args.evidence.file} (env)"
        backend = None
        if args is not None:
            backend = args.values.get("disaggregation_transfer_backend", "mooncake" if args.full_dump else None)
        evidence = args.evidence.cite() if args is not None else (source or "-")
        found.append(WorkerFacts(value, source, None if backend is None else str(backend), evidence, tuple(notes)))
    return found


def gate4(
    sources: Sources, tree: CodeTree | None, code: CodeSettings | None, findings: list
) -> tuple[Gate, Gate4Basis]:
    """Gate 4, and what its deferred-release checks were decided from (the receipt's ``gate4``)."""
    checks = marker_checks(tree, 4, findings)
    workers = DeferredWorkers(tuple(deferred_workers("prefill", sources)), tuple(deferred_workers("decode", sources)))
    basis = Gate4Basis(gate4_rule.ALGORITHM, release_facts(code), workers)
    checks += gate4_rule.checks_from_basis(basis)
    checks += _unassigned(sources)
    gate = Gate(
        4,
        "lifetime/ownership: pages outlive in-flight writes (#40645 #41402 #41404 #41023 behave as fixed; "
        "deferred release on and supported)",
        tuple(checks),
    )
    return gate, basis


def _unassigned(sources: Sources) -> list[Check]:
    return [
        Check(
            "server args (role?)",
            Status.INFO,
            "no disaggregation_mode in these arguments: use --server-args prefill=FILE or decode=FILE",
            a.evidence.cite(),
            decides=False,
        )
        for a in sources.unassigned
    ]

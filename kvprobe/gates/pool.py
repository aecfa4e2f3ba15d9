"""Gate 1, pool/context: each worker's KV pool covers the context length its startup log declares."""

from __future__ import annotations

from pathlib import Path

from kvprobe.evidence.gate_status import Check, Status
from kvprobe.gates import serverlog
from kvprobe.gates.gate import Gate


def _fmt(n: int) -> str:
    return f"{n:,}"


def main_kv(log: serverlog.WorkerLog) -> serverlog.KvLine | None:
    """The smallest full-attention KV pool the worker allocated (post-capture sizes included).

    Every allocation line counts: a DP group or a restart that allocated less is the pool
    some requests get, whatever a later, larger line says.
    """
    main = [k for k in log.kv_lines if k.label in (None, "Full") and k.kind in ("allocated", "post-capture")]
    return min(main, key=lambda k: k.tokens, default=None)


def pool_check(log: serverlog.WorkerLog) -> Check:
    name = f"{log.role or 'unknown role'}: {Path(log.path).name}"
    if log.problems and not log.pools:
        return Check(name, Status.UNKNOWN, "; ".join(log.problems), log.path)
    if not log.pools:
        kv = main_kv(log)
        seen = f" (KV allocation #tokens {_fmt(kv.tokens)} seen, but no context length)" if kv else ""
        return Check(
            name,
            Status.UNKNOWN,
            "no 'max_total_num_tokens=... context_len=...' scheduler line: "
            f"partial log or not an SGLang startup log{seen}",
            f"{log.path} ({log.lines} lines)",
        )
    worst = min(log.pools, key=lambda p: p.pool_tokens - p.context_len)
    pool, context, evidence = worst.pool_tokens, worst.context_len, worst.evidence
    kv = main_kv(log)
    if kv is not None and kv.tokens < pool:
        pool, evidence = kv.tokens, kv.evidence
    numbers = f"pool {_fmt(pool)} tokens, context {_fmt(context)} tokens"
    if kv is not None:
        numbers += f" (smallest KV allocation #tokens {_fmt(kv.tokens)})"
    if log.role == "null":
        return Check(
            name,
            Status.INFO,
            f"{numbers}; not a PD worker (disaggregation_mode=null): not counted for the PD gate",
            evidence.cite(),
            decides=False,
        )
    if pool < context:  # short whatever the role: either side of a PD pair fails on it
        unsure = "".join(f"; {p}" for p in log.problems) + ("; role not in the log" if log.role is None else "")
        return Check(
            name,
            Status.FAIL,
            f"{numbers}: the pool is {_fmt(context - pool)} tokens short of the context it declares{unsure}",
            evidence.cite(),
        )
    if log.role is None:
        return Check(
            name,
            Status.UNKNOWN,
            f"{numbers}; role unknown: no disaggregation_mode in the log, pass --log prefill=FILE or --log decode=FILE",
            evidence.cite(),
        )
    if log.problems:
        return Check(name, Status.UNKNOWN, f"{numbers}; " + "; ".join(log.problems), evidence.cite())
    return Check(name, Status.PASS, f"{numbers}: the pool covers the context", evidence.cite())


def gate1(logs: list[serverlog.WorkerLog]) -> Gate:
    checks = [pool_check(log) for log in logs]
    for role in ("prefill", "decode"):
        if not any(log.role == role for log in logs):
            checks.append(
                Check(
                    f"{role}: (no log)",
                    Status.UNKNOWN,
                    f"no {role} worker startup log given: both sides must be checked",
                )
            )
    return Gate(1, "pool/context: each worker's KV pool covers its context length", tuple(checks))

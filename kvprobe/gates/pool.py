"""Gate 1, pool/context: each worker's KV pool covers the context length its startup log declares.

The scheduler's own ``max_total_num_tokens`` is the pool; a KV allocation line may lower it
only with a reason the check states. Which allocation is which is read from the log, never
guessed from order or size: labels ("Full", "SWA", "... index"), and for unlabelled lines the
sliding-window lines (``Use sliding window memory pool. full_layer_tokens=F,
swa_layer_tokens=S``, ``SWAKVPool mem usage: ..., swa size: S, full size: F``). A log of
several startups is decided on the last one (the server that runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvprobe.gates import serverlog
from kvprobe.gates.gate import Gate
from kvprobe.rules.gate_status import Check, Status

# What an allocation line is, as far as the context's pool goes.
FULL = "full"  # the full-attention (main) pool: it holds a request's whole context
SWA = "swa"  # a sliding-window pool: it holds a window, not the context
INDEX = "index"  # an index pool (sparse attention's keys): not the context's KV
EMPTY_FULL = "empty-full"  # the 0-token full pool of an all-SWA model
UNEXPLAINED = "unexplained"  # unlabelled and not explained by a sliding-window line: it counts
UPPER_BOUND = "upper-bound"  # "VA upper bound": reserved address space, resized after capture


def _fmt(n: int) -> str:
    return f"{n:,}"


@dataclass(frozen=True)
class Allocation:
    line: serverlog.KvLine
    pool: str
    why: str

    @property
    def counts(self) -> bool:
        """Does this allocation bound the context's pool?"""
        return self.pool in (FULL, UNEXPLAINED)


def classify(startup: serverlog.Startup) -> list[Allocation]:
    """Each KV allocation line of one startup, with what it is and why."""
    hybrid = [s for s in startup.swa if not s.all_swa]
    all_swa = [s for s in startup.swa if s.all_swa]
    full_sizes = {s.full_tokens: s for s in hybrid}
    swa_sizes = {s.swa_tokens: s for s in startup.swa}
    found = []
    for kv in startup.kv_lines:
        label = kv.label
        words = (label or "").lower().split()
        if kv.kind == "va-upper-bound":
            found.append(Allocation(kv, UPPER_BOUND, "an upper bound, resized after CUDA graph capture"))
        elif "index" in words:
            found.append(Allocation(kv, INDEX, f"labelled {label!r}: an index pool, not the context's KV"))
        elif "swa" in words:
            found.append(Allocation(kv, SWA, f"labelled {label!r}: the SWA pool holds a window, not the context"))
        elif label is not None:
            found.append(Allocation(kv, FULL, f"labelled {label!r}: a full-attention pool"))
        elif kv.kind == "post-capture":
            found.append(Allocation(kv, FULL, "the post-capture pool size"))
        elif kv.tokens in full_sizes:
            shape = full_sizes[kv.tokens]
            found.append(Allocation(kv, FULL, f"#tokens is the full pool's size in line {shape.evidence.line}"))
        elif kv.tokens in swa_sizes:
            shape = swa_sizes[kv.tokens]
            found.append(Allocation(kv, SWA, f"#tokens is the SWA pool's size in line {shape.evidence.line}"))
        elif kv.tokens in {p.pool_tokens for p in startup.pools}:
            found.append(Allocation(kv, FULL, "#tokens is the scheduler's max_total_num_tokens"))
        elif kv.tokens == 0 and all_swa:
            found.append(
                Allocation(kv, EMPTY_FULL, f"the empty full pool of an all-SWA model (line {all_swa[0].evidence.line})")
            )
        else:
            why = "unlabelled, and no sliding-window line says what it is"
            if startup.swa:
                why = "unlabelled, and its #tokens match neither pool of the sliding-window lines"
            found.append(Allocation(kv, UNEXPLAINED, why))
    return found


def main_kv(log: serverlog.WorkerLog) -> serverlog.KvLine | None:
    """The smallest allocation of the running startup that bounds the context's pool.

    Every such line counts: a DP group that allocated less is the pool some requests get,
    whatever a later, larger line says. SWA, index and upper-bound lines never count.
    """
    counted = [a.line for a in classify(log.current) if a.counts]
    return min(counted, key=lambda k: k.tokens, default=None)


def _smallest(log: serverlog.WorkerLog) -> Allocation | None:
    counted = [a for a in classify(log.current) if a.counts]
    return min(counted, key=lambda a: a.line.tokens, default=None)


def _startup_note(log: serverlog.WorkerLog) -> str:
    earlier = log.earlier
    if not earlier:
        return ""
    seen = "; ".join(f"{s.where()}: {s.summary()}" for s in earlier)
    return (
        f"; decided on {log.current.where()}, the last in the log (the server that runs); "
        f"{len(earlier)} earlier startup(s) seen: {seen}"
    )


def _wrapper_note(log: serverlog.WorkerLog) -> str:
    if not log.wrappers:
        return ""
    return "; stripped from the lines: " + ", ".join(sorted(log.wrappers))


def pool_check(log: serverlog.WorkerLog) -> Check:
    name = f"{log.role or 'unknown role'}: {Path(log.path).name}"
    notes = _startup_note(log) + _wrapper_note(log)
    if log.problems and not log.pools:
        return Check(name, Status.UNKNOWN, "; ".join(log.problems) + notes, log.path)
    if not log.pools:
        kv = main_kv(log)
        seen = f" (KV allocation #tokens {_fmt(kv.tokens)} seen, but no context length)" if kv else ""
        where = f" in {log.current.where()}" if log.earlier else ""
        return Check(
            name,
            Status.UNKNOWN,
            f"no 'max_total_num_tokens=... context_len=...' scheduler line{where}: "
            f"partial log or not an SGLang startup log{seen}{notes}",
            f"{log.path} ({log.lines} lines)",
        )
    worst = min(log.pools, key=lambda p: p.pool_tokens - p.context_len)
    pool, context, evidence = worst.pool_tokens, worst.context_len, worst.evidence
    numbers = f"pool {_fmt(pool)} tokens, context {_fmt(context)} tokens"
    smallest = _smallest(log)
    if smallest is not None and smallest.line.tokens < pool:
        numbers = (
            f"pool {_fmt(smallest.line.tokens)} tokens, context {_fmt(context)} tokens: a KV allocation "
            f"of {_fmt(smallest.line.tokens)} tokens (line {smallest.line.evidence.line}; {smallest.why}) "
            f"is smaller than the scheduler's max_total_num_tokens={_fmt(pool)}, and the smaller counts"
        )
        if smallest.pool == UNEXPLAINED:
            numbers += " (a sliding-window pool would be named by a 'Use sliding window memory pool' line)"
        pool, evidence = smallest.line.tokens, smallest.line.evidence
    elif smallest is not None:
        numbers += f" (scheduler line; smallest KV allocation #tokens {_fmt(smallest.line.tokens)})"
    left_out = [a for a in classify(log.current) if a.pool in (SWA, INDEX, EMPTY_FULL)]
    if left_out:
        numbers += "; not the context's pool: " + "; ".join(
            f"#tokens {_fmt(a.line.tokens)} (line {a.line.evidence.line}: {a.why})" for a in left_out
        )
    numbers += notes
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

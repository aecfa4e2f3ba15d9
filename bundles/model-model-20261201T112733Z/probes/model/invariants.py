"""Invariant search: hypothesis stateful testing over random request mixes.

A RuleBasedStateMachine drives pd_model.Cluster with tenants, prompt lengths
around the pool size, slow (in-flight) transfers, client aborts (also while
writes are in flight), late results and decode steps, and checks invariants
after every step. Seed and budget are fixed, so a run is reproducible (same
hypothesis version, same files); on a find hypothesis shrinks the sequence and
the shrunk trace is recorded.

This searches the MODEL: a find is a bug of the modelled guards, and no find
within the budget is evidence about the model only, never about SGLang.
"""

from __future__ import annotations

import ast
import copy
import functools
import tempfile
from typing import Any, Callable

import hypothesis
from hypothesis import HealthCheck, Phase, settings, strategies as st
from hypothesis.configuration import set_hypothesis_home_dir
from hypothesis.stateful import (RuleBasedStateMachine, invariant, precondition, rule,
                                 run_state_machine_as_test)

import kvprobe_probe as kp
import pd_model as m

SEED = 20260827  # the first day of the incident window; chosen before any run
MAX_EXAMPLES = 150  # generated examples per search
STEPS = 10  # rules per example (hypothesis' stateful_step_count)
GEOMETRY = m.Geometry.scaled()
TENANTS = st.sampled_from(["a", "b", "c"])
# prompt lengths: page boundaries (16 tokens a page), short ones that share the pool, and
# lengths right around the 665-token pool and the 1,024-token context
PROMPT_LENGTHS = (1, 16, 17, 100, 160, 300, 600, 664, 665, 666, 667, 700, 1000, 1024)
PROMPTS = st.sampled_from(PROMPT_LENGTHS)
PICK = st.integers(0, 2)  # 0 = the newest eligible request, 1 = the one before, ...

probe = kp.Probe(
    "invariants",
    mocks={
        "sglang": "none imported: hypothesis searches a synthetic model of the PD handoff, not SGLang code",
    },
    description=(
        "Property-based search (hypothesis stateful testing, fixed seed and budget) for "
        "three invariants of the synthetic PD handoff model. A counterexample is a bug of "
        "the MODEL's guards; none within the budget proves nothing about SGLang."
    ),
)


# ---------------------------------------------------------------- invariants

def own_pages_only(cluster: m.Cluster) -> str | None:
    """Decode never returns a token from a page its request did not write."""
    for flow in cluster.flows.values():
        r = flow.response
        if r and r.status == 200 and any(w != flow.rid for w in r.read_writers):
            others = sorted({w or "never written" for w in r.read_writers if w != flow.rid})
            return f"{flow.rid} (tenant {flow.req.tenant}) returned tokens from pages of {others}"
    return None


def freed_exactly_once(cluster: m.Cluster) -> str | None:
    """Resources are freed exactly once (no double free; no leak once all is done)."""
    if doubles := cluster.ledger.double_frees():
        return f"freed more than once: {doubles}"
    if cluster.quiescent() and (leaks := cluster.ledger.leaks()):
        return f"never freed: {leaks}"
    return None


def no_handoff_for_rejected(cluster: m.Cluster) -> str | None:
    """A rejected request creates no handoff object."""
    return cluster.violations[0] if cluster.violations else None


INVARIANTS: dict[str, Callable[[m.Cluster], str | None]] = {
    "decode_reads_own_pages": own_pages_only,
    "resources_freed_once": freed_exactly_once,
    "rejected_no_handoff": no_handoff_for_rejected,
}


def _live(flow: m.Flow) -> bool:
    return not flow.done


def _aborted(flow: m.Flow) -> bool:
    """Requests a late result can belong to: aborted or rejected after a prefill forward."""
    return flow.forwarded and (flow.client_aborted or flow.rejected)


class _Violation(AssertionError):
    """An invariant failed (as opposed to the model itself raising)."""


# ---------------------------------------------------------------- steps
# Each step acts on a Cluster and returns its trace line, which names the step and its
# arguments exactly, so replay() can re-run a trace without hypothesis.

def step_submit(c: m.Cluster, tenant: str, prompt_len: int, slow_transfer: bool) -> str:
    flow = c.submit(tenant, prompt_len, slow_transfer=slow_transfer)
    return f"submit(tenant={tenant!r}, prompt_len={prompt_len}, slow_transfer={slow_transfer}) -> {flow.rid}"


def step_abort_in_flight(c: m.Cluster, tenant: str, prompt_len: int) -> str:
    """A request whose client leaves while its KV writes are still in flight."""
    flow = c.submit(tenant, prompt_len, slow_transfer=True)
    c.abort(flow)
    return (f"abort_in_flight(tenant={tenant!r}, prompt_len={prompt_len}) -> {flow.rid}, "
            f"{len(c.pending_writes)} write(s) in flight")


def step_abort(c: m.Cluster, rid: str) -> str:
    c.abort(c.flows[rid])
    return f"abort(rid={rid!r})"


def step_late_result(c: m.Cluster, rid: str) -> str:
    return f"late_result(rid={rid!r}) -> {c.late_result(c.flows[rid])}"


def step_land_writes(c: m.Cluster) -> str:
    landed = len(c.pending_writes)
    c.land_writes()
    return f"land_writes() -> {landed} write(s) landed"


def step_decode_step(c: m.Cluster) -> str:
    """Time passes: writes in flight land, then decode serves every ready request, oldest first."""
    landed = len(c.pending_writes)
    c.land_writes()
    outcomes = [f"{landed} write(s) landed"] if landed else []
    for flow in [f for f in c.flows.values() if _live(f)]:
        r = c.decode_step(flow)
        outcomes.append(f"{flow.rid}: {r.status if r else 'waiting'}")
    return f"decode_step() -> {', '.join(outcomes)}"


STEPS_BY_NAME = {f.__name__.removeprefix("step_"): f for f in (
    step_submit, step_abort_in_flight, step_abort, step_late_result, step_land_writes, step_decode_step)}


def replay(trace: list[str], switches: m.Switches) -> m.Cluster:
    """Re-run a recorded trace on a fresh cluster (no hypothesis involved)."""
    cluster = m.Cluster(switches, GEOMETRY)
    for line in trace:
        call = ast.parse(line.split(" -> ")[0], mode="eval").body
        kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
        STEPS_BY_NAME[call.func.id](cluster, **kwargs)
    return cluster


# ---------------------------------------------------------------- the search

def search(names: tuple[str, ...], switches: m.Switches, *, seed: int = SEED,
           max_examples: int = MAX_EXAMPLES, steps: int = STEPS) -> dict[str, Any]:
    """Search for a sequence that breaks any invariant in ``names`` (a fresh copy each call)."""
    return copy.deepcopy(_search(names, switches, seed, max_examples, steps))


@functools.lru_cache(maxsize=None)  # same arguments, same (deterministic) result: run once
def _search(names: tuple[str, ...], switches: m.Switches, seed: int,
            max_examples: int, steps: int) -> dict[str, Any]:
    checks = {name: INVARIANTS[name] for name in names}
    failures: list[dict[str, Any]] = []
    runs = [0]

    class PDMachine(RuleBasedStateMachine):
        """Rules that name a request act on the pick-th newest one they make sense for."""

        def __init__(self) -> None:
            super().__init__()
            runs[0] += 1
            self.cluster = m.Cluster(switches, GEOMETRY)
            self.trace: list[str] = []

        def _pick(self, eligible: Callable[[m.Flow], bool], pick: int) -> str:
            rids = [f.rid for f in reversed(self.cluster.flows.values()) if eligible(f)]
            return rids[min(pick, len(rids) - 1)]

        def _any(self, eligible: Callable[[m.Flow], bool]) -> bool:
            return any(eligible(f) for f in self.cluster.flows.values())

        @rule(tenant=TENANTS, prompt_len=PROMPTS, slow=st.booleans())
        def submit(self, tenant: str, prompt_len: int, slow: bool) -> None:
            self.trace.append(step_submit(self.cluster, tenant, prompt_len, slow))

        @rule(tenant=TENANTS, prompt_len=PROMPTS)
        def abort_in_flight(self, tenant: str, prompt_len: int) -> None:
            self.trace.append(step_abort_in_flight(self.cluster, tenant, prompt_len))

        @precondition(lambda self: self._any(_live))
        @rule(pick=PICK)
        def abort(self, pick: int) -> None:
            self.trace.append(step_abort(self.cluster, self._pick(_live, pick)))

        @precondition(lambda self: self._any(_aborted))
        @rule(pick=PICK)
        def late_result(self, pick: int) -> None:
            self.trace.append(step_late_result(self.cluster, self._pick(_aborted, pick)))

        @precondition(lambda self: self.cluster.pending_writes)
        @rule()
        def land_writes(self) -> None:
            self.trace.append(step_land_writes(self.cluster))

        @precondition(lambda self: self._any(_live))
        @rule()
        def decode_step(self) -> None:
            self.trace.append(step_decode_step(self.cluster))

        @invariant()
        def holds(self) -> None:
            for name, check in checks.items():
                if problem := check(self.cluster):
                    failures.append({"invariant": name, "trace": list(self.trace), "violation": problem})
                    raise _Violation(f"{name}: {problem}")

    hypothesis.seed(seed)(PDMachine)
    config = settings(max_examples=max_examples, stateful_step_count=steps, database=None,
                      deadline=None, derandomize=False, print_blob=False,
                      phases=(Phase.generate, Phase.shrink), report_multiple_bugs=False,
                      suppress_health_check=list(HealthCheck))
    result: dict[str, Any] = {"counterexample_found": False, "violation": None, "trace": []}
    with tempfile.TemporaryDirectory(prefix="kvprobe-hypothesis-") as home:
        set_hypothesis_home_dir(home)  # hypothesis' caches go here, never into the cwd
        try:
            run_state_machine_as_test(PDMachine, settings=config)
        except _Violation:
            # hypothesis replays the shrunk example last: the last failure is the shrunk one
            last = failures[-1]
            result.update(counterexample_found=True, violation=f"{last['invariant']}: {last['violation']}",
                          trace=last["trace"])
        finally:
            set_hypothesis_home_dir(None)
    result.update(trace_length=len(result["trace"]), seed=seed, max_examples=max_examples,
                  stateful_step_count=steps, search_scope=list(names),
                  machine_runs=runs[0],  # examples generated plus shrink attempts
                  switches=switches.to_dict())
    return result


def search_invariant(name: str, switches: m.Switches) -> dict[str, Any]:
    """One invariant's result. All three are first checked together on the same examples:
    with no find that equals three separate runs (generation does not depend on the check
    until one fails) at a third of the time; after a find, this invariant is searched alone
    so its trace is its own."""
    joint = search(tuple(INVARIANTS), switches)
    return joint if not joint["counterexample_found"] else search((name,), switches)


# ---------------------------------------------------------------- cases

CASES, case = m.case_registry(probe, kp)


@case("decode_reads_own_pages")
def decode_reads_own_pages(sw: m.Switches) -> dict[str, Any]:
    """Search (side switches) for a response with a token from a page its request did not write."""
    return search_invariant("decode_reads_own_pages", sw)


@case("resources_freed_once")
def resources_freed_once(sw: m.Switches) -> dict[str, Any]:
    """Search (side switches) for a double free, or a leak once everything has finished."""
    return search_invariant("resources_freed_once", sw)


@case("rejected_no_handoff")
def rejected_no_handoff(sw: m.Switches) -> dict[str, Any]:
    """Search (side switches) for a rejected request that created a sender, receiver,
    metadata buffer or decode page reservation."""
    return search_invariant("rejected_no_handoff", sw)


@case("decode_reads_own_pages.no_deferred_release")
def decode_reads_own_pages_no_deferred_release(sw: m.Switches) -> dict[str, Any]:
    """Deferred release pinned off, the rest from the side: on head (door and cleanup
    fixed) the search must still find the lifetime bug: an abort with writes in flight,
    page reuse, the late write lands in another request's page."""
    return search(("decode_reads_own_pages",), sw.replace(deferred_release=False))


@case("resources_freed_once.fixed_door_pre_36988")
def resources_freed_once_fixed_door_pre_36988(sw: m.Switches) -> dict[str, Any]:
    """The #38935 door without #36988 (both pinned): rejected requests stop at the door,
    yet a late result of a client-aborted request still frees its KV a second time."""
    return search(("resources_freed_once",),
                  sw.replace(door="pending_reject", result_cleanup="pre_36988"))


if __name__ == "__main__":
    probe.fact("switches", m.switches_from_side(kp.side_config()).to_dict())
    probe.fact("hypothesis_version", hypothesis.__version__)
    probe.fact("search", {"seed": SEED, "max_examples": MAX_EXAMPLES, "stateful_step_count": STEPS,
                          "database": None, "phases": ["generate", "shrink"],
                          "rules": ["submit", "abort_in_flight", "abort", "late_result",
                                    "land_writes", "decode_step"],
                          "prompt_lengths": list(PROMPT_LENGTHS), "tenants": ["a", "b", "c"]})
    probe.fact("invariants", {name: check.__doc__ for name, check in INVARIANTS.items()})
    probe.fact("geometry_scaled", GEOMETRY.to_dict())
    probe.main()

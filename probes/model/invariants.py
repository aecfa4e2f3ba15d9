"""Invariant search: hypothesis stateful testing over random request mixes.

A RuleBasedStateMachine drives pd_model.Cluster with tenants, prompt lengths
around the pool size, slow (in-flight) transfers, client aborts, late results
and decode steps, and checks one invariant after every step. The seed and the
budget are fixed, so a run is reproducible; on a find, hypothesis shrinks the
sequence and the minimal trace is recorded.

This searches the MODEL: a find is a bug in the modelled guards, and no find
within the budget is evidence about the model only, not about SGLang.
"""

from __future__ import annotations

from typing import Any, Callable

import hypothesis
from hypothesis import HealthCheck, Phase, settings, strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, invariant, precondition, rule,
                                 run_state_machine_as_test)

import kvprobe_probe as kp
import pd_model as m

SEED = 20260827  # the first day of the incident window
MAX_EXAMPLES = 150  # per invariant
STEPS = 10  # rules per example (hypothesis' stateful_step_count)
GEOMETRY = m.Geometry.scaled()
TENANTS = st.sampled_from(["a", "b", "c"])
# lengths right around the 665-token pool, short ones (several fit the pool at once), anything
PROMPTS = st.one_of(st.sampled_from([600, 664, 665, 666, 700, 1024]),
                    st.integers(1, 160),
                    st.integers(1, GEOMETRY.context_tokens))
PICK = st.integers(0, 2)  # 0 = the newest eligible flow, 1 = the one before, ...


def _live(flow: m.Flow) -> bool:
    return not flow.done


def _aborted(flow: m.Flow) -> bool:
    """Flows a late result can belong to: aborted or rejected after a prefill forward."""
    return flow.forwarded and (flow.client_aborted or flow.rejected)

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


def rejected_no_handoff(cluster: m.Cluster) -> str | None:
    """A rejected request creates no handoff object."""
    return cluster.violations[0] if cluster.violations else None


INVARIANTS: dict[str, Callable[[m.Cluster], str | None]] = {
    "decode_reads_own_pages": own_pages_only,
    "resources_freed_once": freed_exactly_once,
    "rejected_no_handoff": rejected_no_handoff,
}


class _Violation(AssertionError):
    """The invariant failed (as opposed to the model itself raising)."""


def search(invariant_name: str, switches: m.Switches, *, seed: int = SEED,
           max_examples: int = MAX_EXAMPLES, steps: int = STEPS) -> dict[str, Any]:
    """Run the state machine for one invariant; return what the search found."""
    check = INVARIANTS[invariant_name]
    failures: list[dict[str, Any]] = []

    class PDMachine(RuleBasedStateMachine):
        """Rules act on the pick-th newest flow that the rule makes sense for."""

        def __init__(self) -> None:
            super().__init__()
            self.cluster = m.Cluster(switches, GEOMETRY)
            self.trace: list[str] = []

        def _flows(self, eligible: Callable[[m.Flow], bool]) -> list[m.Flow]:
            return [f for f in reversed(self.cluster.flows.values()) if eligible(f)]

        def _pick(self, eligible: Callable[[m.Flow], bool], pick: int) -> m.Flow:
            flows = self._flows(eligible)
            return flows[min(pick, len(flows) - 1)]

        @rule(tenant=TENANTS, prompt_len=PROMPTS, slow=st.booleans())
        def submit(self, tenant: str, prompt_len: int, slow: bool) -> None:
            flow = self.cluster.submit(tenant, prompt_len, slow_transfer=slow)
            self.trace.append(f"submit(tenant={tenant!r}, prompt_len={prompt_len}, "
                              f"slow_transfer={slow}) -> {flow.rid}")

        @precondition(lambda self: self._flows(_live))
        @rule()
        def decode_step(self) -> None:
            """Time passes: writes in flight land, then decode serves every ready request."""
            landed = len(self.cluster.pending_writes)
            self.cluster.land_writes()
            outcomes = [f"{landed} write(s) landed"] if landed else []
            for flow in reversed(self._flows(_live)):
                r = self.cluster.decode_step(flow)
                outcomes.append(f"{flow.rid}: {r.status if r else 'waiting'}")
            self.trace.append(f"decode_step() -> {', '.join(outcomes)}")

        @rule(tenant=TENANTS, prompt_len=PROMPTS)
        def abort_in_flight(self, tenant: str, prompt_len: int) -> None:
            """A request whose client leaves while its KV writes are still in flight."""
            flow = self.cluster.submit(tenant, prompt_len, slow_transfer=True)
            self.cluster.abort(flow)
            self.trace.append(f"abort_in_flight(tenant={tenant!r}, prompt_len={prompt_len}) -> "
                              f"{flow.rid}: {len(self.cluster.pending_writes)} write(s) in flight")

        @precondition(lambda self: self._flows(_live))
        @rule(pick=PICK)
        def abort(self, pick: int) -> None:
            flow = self._pick(_live, pick)
            self.cluster.abort(flow)
            self.trace.append(f"abort({flow.rid})")

        @precondition(lambda self: self._flows(_aborted))
        @rule(pick=PICK)
        def late_result(self, pick: int) -> None:
            flow = self._pick(_aborted, pick)
            acted = self.cluster.late_result(flow)
            self.trace.append(f"late_result({flow.rid}) -> {'acted' if acted else 'inert'}")

        @precondition(lambda self: self.cluster.pending_writes)
        @rule()
        def land_writes(self) -> None:
            n = len(self.cluster.pending_writes)
            self.cluster.land_writes()
            self.trace.append(f"land_writes() -> {n} write(s) landed")

        @invariant()
        def holds(self) -> None:
            if problem := check(self.cluster):
                failures.append({"trace": list(self.trace), "violation": problem})
                raise _Violation(problem)

    hypothesis.seed(seed)(PDMachine)
    config = settings(max_examples=max_examples, stateful_step_count=steps, database=None,
                      deadline=None, derandomize=False, print_blob=False,
                      phases=(Phase.generate, Phase.shrink), report_multiple_bugs=False,
                      suppress_health_check=list(HealthCheck))
    result: dict[str, Any] = {"counterexample_found": False}
    try:
        run_state_machine_as_test(PDMachine, settings=config)
    except _Violation:
        # hypothesis replays the shrunk example last, so the last failure is the minimal one
        last = failures[-1]
        result = {"counterexample_found": True, "violation": last["violation"],
                  "trace": last["trace"], "trace_length": len(last["trace"])}
    result.update(seed=seed, max_examples=max_examples, stateful_step_count=steps,
                  switches=switches.to_dict())
    result.setdefault("trace", [])
    result.setdefault("trace_length", 0)
    result.setdefault("violation", None)
    return result


# ---------------------------------------------------------------- cases

CASES: dict[str, Callable[[m.Switches], dict[str, Any]]] = {}


def side() -> m.Switches:
    return m.switches_from_side(kp.side_config())


def case(name: str) -> Callable:
    """Register ``fn(switches)`` as case ``name``, run with the side's switches."""
    def register(fn: Callable[[m.Switches], dict[str, Any]]) -> Callable:
        CASES[name] = fn

        @probe.case(name, (fn.__doc__ or "").strip())
        def run(obs: kp.Observations) -> None:
            for key, value in fn(side()).items():
                obs.record(key, value)
        return fn
    return register


@case("decode_reads_own_pages")
def decode_reads_own_pages(sw: m.Switches) -> dict[str, Any]:
    """Search for a response containing a page its request did not write (side switches)."""
    return search("decode_reads_own_pages", sw)


@case("resources_freed_once")
def resources_freed_once(sw: m.Switches) -> dict[str, Any]:
    """Search for a double free, or a leak once everything has finished (side switches)."""
    return search("resources_freed_once", sw)


@case("rejected_no_handoff")
def rejected_no_handoff_case(sw: m.Switches) -> dict[str, Any]:
    """Search for a rejected request that created a sender/receiver/metadata/decode pages."""
    return search("rejected_no_handoff", sw)


@case("decode_reads_own_pages.no_deferred_release")
def decode_reads_own_pages_no_deferred(sw: m.Switches) -> dict[str, Any]:
    """Deferred release pinned off, everything else from the side: the search must
    find the lifetime bug (abort with writes in flight, page reuse, write lands)
    even where the door and the cleanup are fixed."""
    return search("decode_reads_own_pages", sw.replace(deferred_release=False))


@case("resources_freed_once.fixed_door_pre_36988")
def resources_freed_once_fixed_door_pre_36988(sw: m.Switches) -> dict[str, Any]:
    """The #38935 door without #36988 (door fixed, cleanup pre-#36988 pinned): the
    door stops rejected requests, yet a late result of a client-aborted request still
    frees its KV a second time."""
    return search("resources_freed_once", sw.replace(door="pending_reject", result_cleanup="pre_36988"))


if __name__ == "__main__":
    probe.fact("switches", side().to_dict())
    probe.fact("hypothesis_version", hypothesis.__version__)
    probe.fact("search", {"seed": SEED, "max_examples": MAX_EXAMPLES, "stateful_step_count": STEPS,
                          "database": None, "phases": ["generate", "shrink"]})
    probe.fact("geometry_scaled", GEOMETRY.to_dict())
    probe.main()

"""Handoff cases: what decode reads and what the client gets, per switch setting.

Each case is a plain function ``(switches) -> observations`` (so the unit tests
can call it with any switches) registered as a probe case that runs it with the
side's switches. A case pins only the switches it is about; the rest follow the
side, so base vs head shows what the other fixes change.
"""

from __future__ import annotations

from typing import Any

import kvprobe_probe as kp
import pd_model as m

probe = kp.Probe(
    "handoff",
    mocks={
        "sglang": "none imported: this is a synthetic model of the PD handoff, not SGLang code",
        "kv_pool_and_transport": "simulated in pure Python (pages are list entries, RDMA writes are queued tuples)",
    },
    description=(
        "Synthetic model of the prefill/decode KV handoff (pd_model.py): shows the leak "
        "mechanism and proves how the MODEL's guards behave. It proves nothing about "
        "SGLang's runtime."
    ),
)

CASES, case = m.case_registry(probe, kp)
OVER_POOL_PROMPT = 800  # > the 665-token pool, <= the 1,024-token context (819,200 unscaled)


def _warm(cluster: m.Cluster) -> None:
    """Two other tenants (b: 600 tokens, c: 400) run together and finish: their
    decode pages go back to the pool, uncleared."""
    first, second = cluster.submit("b", 600), cluster.submit("c", 400)
    cluster.decode_step(first)
    cluster.decode_step(second)


@case("normal")
def normal(sw: m.Switches) -> dict[str, Any]:
    """A 100-token prompt well inside the pool: decode reads only pages this request wrote."""
    cluster = m.Cluster(sw)
    _warm(cluster)
    return m.handoff_observations(cluster, cluster.serve("a", 100))


@case("over_pool.buggy_door")
def over_pool_buggy_door(sw: m.Switches) -> dict[str, Any]:
    """An 800-token prompt (fits the context, not the pool) with the door keyed on
    finished() (pre-#38935). Cleanup follows the side: pre-#36988 hands off the
    1-token placeholder and decode reads 49 stale pages of tenants b and c (HTTP 200);
    post-#36988 sends nothing and decode waits 300 s and times out."""
    cluster = m.Cluster(sw.replace(door="finished"))
    _warm(cluster)
    return m.handoff_observations(cluster, cluster.serve("a", OVER_POOL_PROMPT))


@case("over_pool.fixed_door")
def over_pool_fixed_door(sw: m.Switches) -> dict[str, Any]:
    """The same over-pool prompt with the #38935 door: retired before bootstrap,
    400, no handoff object, no page reserved or read."""
    cluster = m.Cluster(sw.replace(door="pending_reject"))
    _warm(cluster)
    return m.handoff_observations(cluster, cluster.serve("a", OVER_POOL_PROMPT))


@case("pool_covers_context")
def pool_covers_context(sw: m.Switches) -> dict[str, Any]:
    """The pool raised to cover the context (2.04 M scaled to 1,992 tokens): the
    same 800-token prompt is not rejected; every page read is its own."""
    cluster = m.Cluster(sw, m.Geometry.scaled(m.INCIDENT_RAISED_POOL_TOKENS))
    _warm(cluster)
    return m.handoff_observations(cluster, cluster.serve("a", OVER_POOL_PROMPT))


@case("over_pool.checksum_on")
def over_pool_checksum_on(sw: m.Switches) -> dict[str, Any]:
    """The leaking combination (buggy door, pre-#36988 cleanup) with the handoff
    checksum on: decode detects that what it would read is not what prefill sent
    and fails the request (500) instead of returning stale pages."""
    cluster = m.Cluster(sw.replace(door="finished", result_cleanup="pre_36988", kv_checksum=True))
    _warm(cluster)
    return m.handoff_observations(cluster, cluster.serve("a", OVER_POOL_PROMPT))


def _inflight(sw: m.Switches) -> dict[str, Any]:
    """Tenant a's transfer is in flight when a's client aborts; tenant b comes next;
    then a's RDMA writes land; then b decodes."""
    cluster = m.Cluster(sw)
    aborted = cluster.submit("a", 300, slow_transfer=True)
    cluster.abort(aborted)
    victim = cluster.submit("b", 300)
    reused = sorted(set(aborted.decode_pages) & set(victim.decode_pages))
    cluster.land_writes()
    cluster.decode_step(victim)
    out = m.handoff_observations(cluster, victim)
    out["aborted_request_status"] = aborted.response.status
    out["aborted_pages_reused_before_write_landed"] = len(reused)
    return out


@case("inflight_write.no_deferred_release")
def inflight_write_no_deferred_release(sw: m.Switches) -> dict[str, Any]:
    """Without deferred release (pre-#41404/#41023) the aborted request's pages are
    reused at once; its late RDMA writes overwrite tenant b's KV and b reads tenant
    a's canaries (HTTP 200). The checksum, checked at transfer-complete, cannot see it."""
    return _inflight(sw.replace(deferred_release=False))


@case("inflight_write.deferred_release")
def inflight_write_deferred_release(sw: m.Switches) -> dict[str, Any]:
    """With deferred release the aborted request's pages stay parked until its
    writes land; tenant b gets other pages and reads only its own."""
    return _inflight(sw.replace(deferred_release=True))


@case("late_result.after_abort")
def late_result_after_abort(sw: m.Switches) -> dict[str, Any]:
    """Tenant a's transfer completes, a's client aborts, tenant b reuses a's pages,
    then a late result of a arrives. Cleanup follows the side: pre-#36988 it acts
    (sends a KV chunk into b's page, frees prefill KV again); post-#36988 it is inert."""
    cluster = m.Cluster(sw)
    aborted = cluster.submit("a", 300)
    cluster.abort(aborted)
    victim = cluster.submit("b", 300)
    late = cluster.late_result(aborted)
    cluster.decode_step(victim)
    out = m.handoff_observations(cluster, victim)
    out["late_result"] = late
    return out


if __name__ == "__main__":
    geometry = m.Geometry.scaled()
    probe.fact("switches", m.switches_from_side(kp.side_config()).to_dict())
    probe.fact("geometry_scaled", geometry.to_dict())
    probe.fact("scale", f"token counts divided by {m.SCALE}: context 1,048,576 -> "
               f"{geometry.context_tokens}, prefill pool 681,280 -> {geometry.prefill_pool_tokens} "
               "(ratio 0.6494 vs 0.6497)")
    probe.fact("incident_tokens", {"context": m.INCIDENT_CONTEXT_TOKENS,
                                   "prefill_pool": m.INCIDENT_PREFILL_POOL_TOKENS,
                                   "raised_pool": m.INCIDENT_RAISED_POOL_TOKENS})
    probe.fact("over_pool_prompt_tokens", OVER_POOL_PROMPT)
    probe.main()

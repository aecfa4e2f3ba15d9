"""Admission/re-entry cases: who the door retires, who it must keep, what is freed.

The door (pd_model.door_admits) follows the side's switches in every case: the
point of these cases is that base and head differ only where they should (a
never-admitted rejection) and agree where the door must keep a request (valid,
re-entering, resource-holding). After the door, an admitted request is released
by its queue; that release follows the side's result_cleanup, so resource counts
also show #36988 (freed exactly once on head).
"""

from __future__ import annotations

from typing import Any

import kvprobe_probe as kp
import pd_model as m

probe = kp.Probe(
    "admission",
    mocks={
        "sglang": "none imported: this is a synthetic model of the PD admission doors, not SGLang code",
        "scheduler_queues": "one model queue per case (prefill bootstrap, decode prealloc, or NULL mode)",
    },
    description=(
        "Synthetic model of the prefill/decode admission doors and re-entry rules "
        "(pd_model.py): proves how the MODEL's guards behave, nothing about SGLang's runtime."
    ),
)

CASES, case = m.case_registry(probe, kp)
CLIENT_ABORT = "FINISH_ABORT: client abort while the request was out of the queue"


def _request(*, rejected: bool = False, aborted: bool = False) -> m.Req:
    req = m.Req("r0", "a", list(range(1, 101)))
    if rejected:  # the length check: a placeholder prompt, the abort waits in to_finish
        req.set_finish_with_abort(m.ABORT_TOO_LONG)
    if aborted:  # a re-entering request aborted meanwhile keeps its prompt
        req.to_finish = CLIENT_ABORT
    return req


def _status(out: m.Admission) -> dict[str, int]:
    """``status`` only when the request ends here (door or NULL-mode batch boundary):
    an enqueued request has no HTTP status yet (and TOML has no null to expect)."""
    return {} if out.status is None else {"status": out.status}


def _admit(sw: m.Switches, worker: str, req: m.Req, holds: tuple[str, ...] = (),
           **flags: bool) -> dict[str, Any]:
    """Give ``req`` what it holds, put it through the door, let the queue release it."""
    queue = m.AdmissionQueue(worker, sw)
    for kind in holds:
        queue.hold(req, kind)
    out = queue.add(req, **flags)
    if out.enqueued:
        queue.finish(req, out)
    ledger = queue.ledger
    return {
        "retired_at_door": out.retired_at_door,
        "enqueued": out.enqueued,
        "handoff_created": out.handoff_created,
        "stub_forward_passes": out.stub_forward_passes,
        **_status(out),
        "resources_held_at_entry": len(holds),
        "resources_freed_count": len(ledger.freed_once()) + len(ledger.double_frees()),
        "double_frees": ledger.double_frees(),
        "leaks": ledger.leaks(),
        "finished_reason_set": req.finished(),
    }


@case("prefill.rejected_new")
def prefill_rejected_new(sw: m.Switches) -> dict[str, Any]:
    """A new request rejected by the length check. finished() is still False, so the
    pre-#38935 door enqueues it, creates a sender and runs a stub forward; the
    #38935 door retires it with 400 and nothing is allocated."""
    return _admit(sw, "prefill", _request(rejected=True))


@case("decode.rejected_new")
def decode_rejected_new(sw: m.Switches) -> dict[str, Any]:
    """The same rejection at decode's prealloc door: a receiver before #38935, none after."""
    return _admit(sw, "decode", _request(rejected=True))


@case("prefill.valid_new")
def prefill_valid_new(sw: m.Switches) -> dict[str, Any]:
    """A valid request: enqueued on both sides, its resources freed once."""
    return _admit(sw, "prefill", _request())


@case("prefill.preempted_reentry")
def prefill_preempted_reentry(sw: m.Switches) -> dict[str, Any]:
    """A preempted request re-enters holding a KV retraction backup and carrying an
    abort: kept by both doors (its queue owes the backup's release)."""
    return _admit(sw, "prefill", _request(aborted=True), ("kv_retraction_backup",))


@case("decode.retracted_reentry")
def decode_retracted_reentry(sw: m.Switches) -> dict[str, Any]:
    """A retracted decode request re-enters (caller passes is_retracted) carrying an
    abort: kept by both doors."""
    return _admit(sw, "decode", _request(aborted=True), is_retracted=True)


@case("decode.rebootstrapped_reentry")
def decode_rebootstrapped_reentry(sw: m.Switches) -> dict[str, Any]:
    """A request re-bootstrapped to decode (caller passes is_rebootstrap) carrying an
    abort: kept by both doors."""
    return _admit(sw, "decode", _request(aborted=True), is_rebootstrap=True)


@case("prefill.holding_kv")
def prefill_holding_kv(sw: m.Switches) -> dict[str, Any]:
    """A request that still holds KV pages and carries an abort: kept; KV freed once."""
    return _admit(sw, "prefill", _request(aborted=True), ("kv",))


@case("prefill.holding_mamba")
def prefill_holding_mamba(sw: m.Switches) -> dict[str, Any]:
    """A request holding Mamba state and carrying an abort: kept by both doors; the
    pre-#36988 release never frees the Mamba state (a leak), #36988 frees it once."""
    return _admit(sw, "prefill", _request(aborted=True), ("mamba",))


@case("prefill.holding_metadata")
def prefill_holding_metadata(sw: m.Switches) -> dict[str, Any]:
    """A re-entering request holding a metadata buffer (metadata_buffer_index >= 0)
    and carrying an abort: kept by both doors (as in the published experiment A);
    pre-#36988 frees the buffer twice, #36988 once."""
    return _admit(sw, "prefill", _request(aborted=True), ("metadata_buffer",))


@case("null_mode.rejected")
def null_mode_rejected(sw: m.Switches) -> dict[str, Any]:
    """NULL (non-disaggregated) mode is deliberately left alone: no door, one cheap
    stub forward pass, and the batch boundary returns 400. Same on both sides."""
    return _admit(sw, "null", _request(rejected=True))


@case("session.streaming_detach")
def session_streaming_detach(sw: m.Switches) -> dict[str, Any]:
    """A rejected request attached to a streaming session. The #38935 door retires it
    and detaches it from the session at once; before, the session stays attached
    until the queue has run and released the request."""
    req = _request(rejected=True)
    req.session = m.Session("s0", attached=req.rid)
    queue = m.AdmissionQueue("prefill", sw)
    out = queue.add(req)
    attached_after_door = req.session.attached is not None
    if out.enqueued:
        queue.finish(req, out)
    return {
        "retired_at_door": out.retired_at_door,
        "enqueued": out.enqueued,
        "handoff_created": out.handoff_created,
        **_status(out),
        "session_detached_at_door": out.session_detached_at_door,
        "session_attached_after_door": attached_after_door,
        "session_detached_in_the_end": req.session.attached is None,
        "double_frees": queue.ledger.double_frees(),
        "leaks": queue.ledger.leaks(),
    }


if __name__ == "__main__":
    probe.fact("switches", m.switches_from_side(kp.side_config()).to_dict())
    probe.fact("door_rule", "retire iff to_finish is set, finished() is False, and the request "
               "neither re-enters (is_retracted/is_rebootstrap) nor holds a resource "
               "(metadata buffer, KV, KV retraction backup, Mamba state)")
    probe.main()

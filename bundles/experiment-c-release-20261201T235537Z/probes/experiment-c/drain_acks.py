"""Diff probe for experiment C: SGLang PRs #40645 and #41402, prefill drain acknowledgements.

What it shows
    When a decode rank aborts a request whose KV transfer is under way, it sends ABORT to
    the prefill rank and holds the request's KV pages until prefill answers ABORT_ACK ("my
    writes into your pages are finished"), or until its release timeout (30 s) runs out.
    The prefill side's real code decides when, and to whom, that ACK goes: the ABORT
    handler (``NixlKVManager._handle_abort_notification``: room Failed, ACK target
    registered, one immediate try), the transfer worker's drain hook
    (``CommonKVManager._maybe_ack_drained_abort``), and the scheduler's reaction to the
    Failed room (``NixlKVSender.failure_exception``, which calls ``clear()``). Each case
    records which decode ranks got an ACK, when: never while a write is still in flight
    (the safety half, both sides), and after the drain.

    * #40645 (``CommonKVSender.clear``): before 0.5.21, ``clear()`` dropped a held ACK
      target even while a write was in flight, so a scheduler that cleared the Failed room
      before the worker drained left that decode rank without an ACK. From 0.5.21 it keeps
      the target until the drain (or ACKs at once when nothing is in flight).
    * #41402 (fan-out): before 0.5.21 the ACK target of a room was one address, overwritten
      by each ABORT, so when several decode ranks share a room (prefill TP < decode TP)
      only the last one to abort got an ACK. From 0.5.21 every decode peer of the room does
      (0.5.21: fan-out over the room's transfer infos plus a snapshot taken at
      registration; 0.5.22: per-endpoint ACK targets).

    Every case's decision point is the first ABORT reaching the real handler: from there on
    an exception is behaviour. Releases without the drain-ACK protocol (before 0.5.19) are
    not-present.

How the rooms get their state
    The way the release builds it: the manager's common state from the release's own
    ``CommonKVManager.__init__`` in prefill mode (on an instance of the real
    ``NixlKVManager`` class, whose own ``__init__`` needs the NIXL agent); each request's
    sender from the real ``NixlKVSender.__init__`` (room Bootstrapping); the decode ranks'
    ``TransferInfo`` entries (SGLang's own class) filed under the room and the room moved to
    WaitingForInput, as the bootstrap thread does; ABORT frames made by the release's own
    encoder where it has one (0.5.22+), else the frames decode sends in 0.5.19-0.5.21.

What it does NOT show
    No RDMA, no NIXL agent, no decode process, no page reuse: the decode side's release
    timeout and what decode does with an ACK are outside this probe. It shows which ACKs
    the prefill code sends, per release.
"""

from __future__ import annotations

import kvprobe_probe as kp

PROBE_NAME = "drain_acks"

probe = kp.Probe(
    PROBE_NAME,
    description=(
        "PRs #40645 + #41402 (v0.5.21): prefill keeps a drain-ACK target across clear() until "
        "the in-flight write drains, and ACKs every decode rank of the room"
    ),
    mocks={
        "wire": (
            "autospec of CommonKVManager._send_multipart_locked on the manager instance: records "
            "(endpoint, frames) of every message the real _send_abort_ack (and anything else) sends; "
            "no socket connects, nothing leaves the process"
        ),
        "transfer_worker": (
            "not run (it needs the NIXL agent and RDMA handles): for one in-flight chunk the probe "
            "plays the two steps NixlKVManager.transfer_worker takes around a transfer in every "
            "release from 0.5.19: at dequeue _staging_outstanding[room] += 1 (room Transferring); "
            "when the chunk's handles are done _staging_outstanding[room] -= 1 and, with deferred "
            "release on, the real _maybe_ack_drained_abort(room)"
        ),
        "nixl_manager_init": (
            "NixlKVManager built with __new__ and the real CommonKVManager.__init__ (prefill mode, "
            "one rank, zmq PULL socket bound on 127.0.0.1); NIXL's own prefill fields set as its "
            "__init__ sets them where the common one did not: exceptions {}, _staging_outstanding "
            "defaultdict(int), enable_staging False, _staging_ctx None; no agent, no worker or "
            "bootstrap threads"
        ),
        "bootstrap_registration": (
            "autospec of CommonKVManager.register_to_bootstrap (the HTTP PUT to the bootstrap server "
            "during __init__): recorded, nothing sent"
        ),
        "bootstrap_thread": (
            "not run: the decode ranks' TransferInfo (SGLang's class) are filed in transfer_infos[room] "
            "and the room set WaitingForInput through the real update_status, as the thread does on "
            "receiving them"
        ),
        "kv_args": "SGLang's real KVArgs with a one-rank, no-buffer layout (no KV pointers: nothing is transferred)",
        "parallel_groups": (
            "rank 0 of a one-process world: get_parallel().override(...) where the runtime context "
            "has the field, else one-process GroupCoordinator autospecs for the parallel_state globals"
        ),
    },
)

# The real SGLang code and the scaffolding around it (drain_world.py, beside this file).
import drain_world  # noqa: E402
from drain_world import DECODE_RANKS, drain_setup, endpoint_of, preconditions  # noqa: E402

drain_world.declare(probe)

DECISION = ("the first ABORT reaching NixlKVManager._handle_abort_notification, then "
            "NixlKVSender.failure_exception (clear) and CommonKVManager._maybe_ack_drained_abort")


def _ranks(world, room: int) -> int:
    return len(set(world.wire.acks(room)))


def _record_wire(obs, world, room: int) -> None:
    obs.record("acked_endpoints", sorted(set(world.wire.acks(room))))
    obs.record("acks_total", len(world.wire.acks(room)))
    obs.record("other_wire_messages", world.wire.others(room))


# --- #40645: clear() must not drop the held target while a write is in flight -----------
@probe.case(
    "ack.clear_while_inflight",
    "PR #40645: a chunk is in flight, decode rank 0 ABORTs, the prefill scheduler sees the room "
    "Failed and clears it (failure_exception) before the worker drains; then the write lands",
    decision=DECISION,
    using=drain_setup,
)
def _(obs: kp.Observations, world) -> None:
    room = 4001
    world.open_room(room, DECODE_RANKS[:1])
    world.dequeue_chunk(room)
    preconditions(obs, world)
    obs.precondition("write_in_flight", world.outstanding(room) == 1)
    with obs.decision():
        world.abort_from(room, DECODE_RANKS[0][1])
        obs.record("abort_accepted", world.abort_accepted(room))
        obs.record("status_after_abort", world.status(room))
        obs.record("acks_after_abort", len(world.wire.acks(room)))
        obs.record("failure_exception_raised", world.scheduler_sees_failed(room))
        obs.record("ack_target_kept_after_clear", world.ack_target_held(room))
        obs.record("acks_while_write_in_flight", len(world.wire.acks(room)))
        world.drain_chunk(room)
        obs.record("acks_after_drain", len(world.wire.acks(room)))
        _record_wire(obs, world, room)


@probe.case(
    "ack.quiescent_abort",
    "PR #40645 control: nothing in flight; decode rank 0 ABORTs, then the scheduler clears the room",
    decision=DECISION,
    using=drain_setup,
)
def _(obs: kp.Observations, world) -> None:
    room = 4002
    world.open_room(room, DECODE_RANKS[:1])
    preconditions(obs, world)
    obs.precondition("nothing_in_flight", world.outstanding(room) == 0)
    with obs.decision():
        world.abort_from(room, DECODE_RANKS[0][1])
        obs.record("abort_accepted", world.abort_accepted(room))
        obs.record("status_after_abort", world.status(room))
        obs.record("acks_after_abort", len(world.wire.acks(room)))
        obs.record("failure_exception_raised", world.scheduler_sees_failed(room))
        obs.record("ack_target_kept_after_clear", world.ack_target_held(room))
        obs.record("acks_after_clear", len(world.wire.acks(room)))
        _record_wire(obs, world, room)


# --- #41402: every decode rank of the room gets its ACK ---------------------------------
@probe.case(
    "fanout.one_decode_rank",
    "PR #41402 control (and #40645's order without the race): one decode rank; a chunk is in flight, "
    "it ABORTs, the write lands, then the scheduler clears the room",
    decision=DECISION,
    using=drain_setup,
)
def _(obs: kp.Observations, world) -> None:
    room = 4101
    world.open_room(room, DECODE_RANKS[:1])
    world.dequeue_chunk(room)
    preconditions(obs, world)
    obs.precondition("write_in_flight", world.outstanding(room) == 1)
    with obs.decision():
        world.abort_from(room, DECODE_RANKS[0][1])
        obs.record("abort_accepted", world.abort_accepted(room))
        obs.record("acks_while_write_in_flight", len(world.wire.acks(room)))
        world.drain_chunk(room)
        obs.record("decode_ranks_acked_after_drain", _ranks(world, room))
        obs.record("failure_exception_raised", world.scheduler_sees_failed(room))
        obs.record("acks_after_clear", len(world.wire.acks(room)))
        _record_wire(obs, world, room)


@probe.case(
    "fanout.two_decode_ranks",
    "PR #41402: two decode ranks share the room (prefill TP < decode TP); a chunk is in flight, "
    "both ABORT (rank 0 first), the write lands, then the scheduler clears the room",
    decision=DECISION,
    using=drain_setup,
)
def _(obs: kp.Observations, world) -> None:
    room = 4102
    world.open_room(room, DECODE_RANKS)
    world.dequeue_chunk(room)
    preconditions(obs, world)
    obs.precondition("write_in_flight", world.outstanding(room) == 1)
    with obs.decision():
        for _agent, port in DECODE_RANKS:
            world.abort_from(room, port)
        obs.record("abort_accepted", world.abort_accepted(room))
        obs.record("acks_while_write_in_flight", len(world.wire.acks(room)))
        world.drain_chunk(room)
        obs.record("decode_ranks_acked_after_drain", _ranks(world, room))
        obs.record("first_aborter_acked", endpoint_of(DECODE_RANKS[0][1]) in world.wire.acks(room))
        obs.record("last_aborter_acked", endpoint_of(DECODE_RANKS[1][1]) in world.wire.acks(room))
        obs.record("failure_exception_raised", world.scheduler_sees_failed(room))
        _record_wire(obs, world, room)


@probe.case(
    "fanout.clear_before_drain",
    "PRs #40645 + #41402: two decode ranks ABORT while a chunk is in flight, the scheduler clears "
    "the Failed room before the worker drains; then the write lands",
    decision=DECISION,
    using=drain_setup,
)
def _(obs: kp.Observations, world) -> None:
    room = 4103
    world.open_room(room, DECODE_RANKS)
    world.dequeue_chunk(room)
    preconditions(obs, world)
    obs.precondition("write_in_flight", world.outstanding(room) == 1)
    with obs.decision():
        for _agent, port in DECODE_RANKS:
            world.abort_from(room, port)
        obs.record("abort_accepted", world.abort_accepted(room))
        obs.record("failure_exception_raised", world.scheduler_sees_failed(room))
        obs.record("transfer_infos_cleared", room not in world.manager.transfer_infos)
        obs.record("ack_target_kept_after_clear", world.ack_target_held(room))
        obs.record("acks_while_write_in_flight", len(world.wire.acks(room)))
        world.drain_chunk(room)
        obs.record("decode_ranks_acked_after_drain", _ranks(world, room))
        _record_wire(obs, world, room)


if __name__ == "__main__":
    probe.main()

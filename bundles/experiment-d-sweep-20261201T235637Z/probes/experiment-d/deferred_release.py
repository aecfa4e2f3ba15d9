"""Diff probe for experiment D: SGLang PR #41404, decode defers the KV release after a
transfer failure it did not initiate.

What it shows
    What SGLang's real decode ``DecodeTransferQueue.pop_transferred`` does with a request
    whose KV transfer failed, with deferred release forced on (the environment variable set
    to 1) on both sides, so only #41404's change can differ. Two prefill ranks (prefill TP 2)
    hold the request's destination. Before the fix a failure decode did not initiate (a
    prefill rank reported Failed) released the KV pages and the metadata slot at once, while
    the sibling prefill rank could still be writing into them; after it, decode sends ABORT
    to every prefill rank, arms the drain-ACK tracker and holds the pages until both ranks
    acknowledge the drain, then releases them exactly once. Controls: a decode-initiated
    abort, driven through the real ``Scheduler.abort_request`` (the arming site of
    0.5.19/0.5.20; 0.5.21 arms inside the receiver it calls), is held on both sides; a
    receiver that never published its destinations releases at once on both.

What runs for real
    ``DecodeTransferQueue.__init__`` / ``pop_transferred`` / ``_defer_release`` /
    ``resolve_deferred_releases`` / ``_do_release``; the decode manager set up by the real
    ``CommonKVManager.__init__`` on the real ``NixlKVManager`` class (its tracker methods
    ``register_deferred_abort_room`` / ``note_abort_ack`` / ``is_abort_release_safe``); a real
    ``NixlKVReceiver`` (``abort``, ``ensure_abort_notified``, ``_send_abort_notification``,
    ``poll``, ``failure_exception``, ``clear``); ``Scheduler.abort_request``; the metadata
    allocator and buffers; the all-reduces over a real one-rank gloo group on 127.0.0.1.

What it does NOT show
    No GPU, no RDMA or NIXL transfer, no second process writing into the pages, no tenant
    data: it shows when decode gives the pages back, not a write landing in reused pages.
"""

from __future__ import annotations

import kvprobe_probe as kp

PROBE_NAME = "deferred_release"

probe = kp.Probe(
    PROBE_NAME,
    description=(
        "PR #41404 (v0.5.21): with deferred release on, a transfer failure decode did not initiate "
        "holds the KV pages until every prefill rank acknowledges the drain, instead of freeing them at once"
    ),
    mocks={
        "release_kv_cache": (
            "autospec of SGLang's release_kv_cache in the decode module (its signature checked per "
            "release): records which request's KV the queue gave back; the pool is not touched"
        ),
        "bootstrap_socket": (
            "autospec of zmq.Socket returned by a patched NixlKVReceiver._connect_to_bootstrap_server, "
            "one per prefill rank: send_multipart records the frames (the ABORT notification); nothing "
            "is sent"
        ),
        "scheduler": (
            "autospec of SGLang's Scheduler with the fields the transfer queue and the real "
            "Scheduler.abort_request read (decode mode, hicache/hisparse off, empty waiting queue, no "
            "chunked or inflight requests: collect_inflight_reqs returns [], or before 0.5.16 an empty "
            "running batch SimpleNamespace(reqs=[]) and no current or last batch); the prealloc queue is an "
            "empty SimpleNamespace and the grammar manager a SimpleNamespace whose abort_requests "
            "does nothing"
        ),
        "output_streamer": "autospec of SGLang's SchedulerOutputStreamer: records the abort sent to the client",
        "metrics_reporter": "autospec of SGLang's SchedulerMetricsReporter with enable_metrics=False",
        "tree_cache": (
            "autospec of SGLang's RadixCache: the queue hands it to release_kv_cache (a recorder); "
            "unlock(None) is accepted as the real one does nothing for it (0.5.22+ failure path), any "
            "other lock refused: no request here takes a tree lock"
        ),
        "kv_manager": (
            "not a mock: an instance of SGLang's NixlKVManager made with __new__ and set up by the real "
            "CommonKVManager.__init__ in decode mode (a zmq PULL socket bound on 127.0.0.1, closed after "
            "the case); NIXL's own __init__ (its agent, threads) is skipped and its transfer_statuses "
            "dict set empty; get_local_ip_auto patched to 127.0.0.1"
        ),
        "prefill_failure": (
            "what the decode manager's receiver thread does on a prefill rank's Failed status: the real "
            "record_failure and update_status(Failed) called directly"
        ),
        "drain_ack": (
            "what the decode manager's receiver thread does on an ABORT_ACK: the real note_abort_ack "
            "called directly (with the generation of the ABORT that rank received, 0.5.22+)"
        ),
        "parallel_groups": (
            "rank 0 of a one-process world: get_parallel().override(...) where the runtime context "
            "exists (attn_tp_group an autospec of GroupCoordinator whose cpu_group is the real one-rank "
            "gloo group), else one-process GroupCoordinator autospecs and rank values for the "
            "parallel_state/dp_attention globals still unset"
        ),
    },
)

# The real SGLang code and the scaffolding around the transfer queue (deferred_world.py, beside this file).
import deferred_world  # noqa: E402
from deferred_world import (  # noqa: E402
    decode_world,
    prefill_reports_failure,
    record_failure_outcome,
    scheduler_abort,
)

deferred_world.declare(probe)

DECISION = "DecodeTransferQueue.pop_transferred"


def _forced_on():
    return decode_world(deferred="1")


@probe.case(
    "release.failure_not_decode_initiated",
    "metadata published to two prefill ranks; a prefill rank reports the transfer Failed; decode never "
    "aborted; then rank 0 and rank 1 acknowledge the drain",
    decision=DECISION,
    using=_forced_on,
)
def _(obs: kp.Observations, world) -> None:
    decode_req = world.new_request("failed-by-prefill", 4101, published=True)
    index = decode_req.metadata_buffer_index
    prefill_reports_failure(world, 4101)
    obs.precondition("decode_did_not_abort", not decode_req.kv_receiver.abort_notified)
    with obs.decision():
        world.queue.pop_transferred()
    record_failure_outcome(obs, world, decode_req, index, 4101)
    obs.record("finish_reason", type(decode_req.req.finished_reason).__name__)


@probe.case(
    "release.after_decode_abort",
    "control: the client aborts mid-transfer (the real Scheduler.abort_request, each release's arming "
    "site), the room reads Failed; then both prefill ranks acknowledge the drain",
    decision=DECISION,
    using=_forced_on,
)
def _(obs: kp.Observations, world) -> None:
    kp.require(type(world.queue), "_defer_release")  # no deferred release at all before 0.5.19
    decode_req = world.new_request("aborted-by-client", 4102, published=True)
    index = decode_req.metadata_buffer_index
    scheduler_abort(world, "aborted-by-client")
    obs.precondition("decode_aborted", decode_req.kv_receiver.abort_notified)
    with obs.decision():
        world.queue.pop_transferred()
    record_failure_outcome(obs, world, decode_req, index, 4102)


@probe.case(
    "release.receiver_never_published",
    "control: the transfer fails before decode sent its destinations (no prefill rank holds them): "
    "nothing can be in flight",
    decision=DECISION,
    using=_forced_on,
)
def _(obs: kp.Observations, world) -> None:
    decode_req = world.new_request("never-published", 4103, published=False)
    index = decode_req.metadata_buffer_index
    prefill_reports_failure(world, 4103)
    obs.precondition("no_destinations_sent", getattr(decode_req.kv_receiver, "bootstrap_infos", None) is None)
    with obs.decision():
        world.queue.pop_transferred()
    obs.record("kv_released_at_failure", world.releases_of(decode_req))
    obs.record("metadata_slot_freed_at_failure", world.frees_of(index) > 0)
    obs.record("held_for_deferred_release", world.held())
    obs.record("abort_sent_to_prefill_ranks", world.aborts_sent())


if __name__ == "__main__":
    probe.main()

"""Diff probe for experiment B: SGLang PR #36988, aborted prefill *result* cleanup.

What it shows
    How SGLang's real prefill-side result handling treats a request that was
    aborted while its prefill forward was in flight, a result that arrives after
    the request was already retired, a result delivered twice, a final result
    while bootstrap is still pending, and a request whose grammar rejects the
    sampled token. Every case's decision point is the real
    ``process_batch_result_disagg_prefill``; what happens before it is set-up
    (an exception there makes the case unobserved), what happens from it on is
    behaviour. Around it the real ``SchedulerDisaggregationPrefillMixin``
    methods run (``process_disagg_prefill_inflight_queue``, ``send_kv_chunk``,
    ``check_bootstrap`` / ``handle_bootstrap_failure``,
    ``optimistic_release_and_requeue`` and, from 0.5.20,
    ``_retire_aborted_prefill_result``), and the probe counts what they do to
    each request: inflight-queue requeues, KV chunk sends, metadata buffer
    frees, KV row releases, HiCache abort releases, abort output. #36988 first
    ships in 0.5.20; the same file runs unchanged on every release from 0.5.13.

How the requests get their state
    The way the release builds it: each request enters the real
    ``PrefillBootstrapQueue`` (built by its own ``__init__``) through ``add``,
    which creates its KV sender; the real ``pop_bootstrapped`` polls that sender
    and either finalizes the bootstrap (metadata buffer from the real
    allocator, ``sender.init``) or lets it prefill optimistically before
    bootstrap completes; its KV row comes from the real CPU ``ReqToTokenPool``
    and ``TokenToKVPoolAllocator``, its fill ids from its own
    ``init_next_round_input``; an earlier chunk goes out through the real
    ``send_kv_chunk``.

What it mocks (see ``Probe(mocks=...)``)
    Transport and collaborators only, all strict: the KV sender is an autospec
    of SGLang's CommonKVSender that behaves like the real one where it matters
    (``send`` before ``init`` is refused, as the real sender fails on a missing
    ``num_kv_indices``); the tree cache is an autospec that refuses to index a
    KV row the request no longer holds; the scheduler is an autospec with the
    prefill mixin bound for real. Every call a mock absorbed is in the output's
    ``absorbed`` list; a call no mock models makes the case unobserved.

What it does NOT show
    No GPU, no model, no RDMA or network transfer, no decode side, no tenant
    data. It is not a reproduction of the cross-request KV leak; it shows a
    code-path difference between releases, one PR at a time.
"""

from __future__ import annotations

import kvprobe_probe as kp

PROBE_NAME = "prefill_result_cleanup"

probe = kp.Probe(
    PROBE_NAME,
    description=(
        "PR #36988 (v0.5.20): an aborted prefill result is retired (not requeued, "
        "no KV send, resources freed once) and late results of retired requests are inert"
    ),
    mocks={
        "kv_sender": (
            "autospec of SGLang's CommonKVSender per request (constructed through the patched "
            "get_kv_class): scripted poll(); init/send/abort/clear/failure_exception behave as "
            "the real sender's contract: send() before init() is refused (RejectedCall: the real "
            "sender has no num_kv_indices yet), failure_exception() clears and raises "
            "KVTransferError; sends on a failed room are recorded (the real manager drops them)"
        ),
        "kv_manager": (
            "autospec of SGLang's CommonKVManager returned by the patched get_kv_class (KVARGS gives "
            "SGLang's real KVArgs to the queue's _init_kv_manager); afterwards its kv_args is a "
            "SimpleNamespace(state_types=[]): no state payloads (no mamba/SWA/DSA state) to send"
        ),
        "collectives": (
            "poll_and_all_reduce_attn_cp_tp_group patched: one rank, no process group, "
            "returns each sender's own poll()"
        ),
        "scheduler": (
            "autospec of SGLang's Scheduler (an instance) with every SchedulerDisaggregationPrefillMixin "
            "method and _release_aborted_request bound for real; other Scheduler methods are "
            "recorded as absorbed (only maybe_send_health_check_signal is modelled)"
        ),
        "tree_cache": (
            "autospec of the cache a HiCache-storage scheduler runs (HiRadixCache up to 0.5.20, "
            "the merged RadixCache from 0.5.21) holding the real CPU pools: supports_mamba() is "
            "False, claim_kv_row() False; insert/finish-style calls are recorded, and any call "
            "that would index the KV row of a request that no longer holds one is refused "
            "(RejectedCall)"
        ),
        "scheduler.ps/tp_worker/model_config": (
            "SimpleNamespaces of plain data: rank 0 of one, a 64-token KV pool under each release's "
            "name for it, 1 layer and 8 KV heads; an unknown field raises AttributeError"
        ),
        "counters": (
            "not mocks: ReqToTokenPool.free, ReqToMetadataIdxAllocator.free and MetadataBuffers.set_buf "
            "are the real methods wrapped to count calls (which request, which slot) before they run"
        ),
        "output_streamer": "autospec of SGLang's SchedulerOutputStreamer: records which requests reach the client",
        "batch_result_processor": (
            "autospec of SGLang's SchedulerBatchResultProcessor: no logits, so logprob and "
            "auxiliary-output plumbing is idle"
        ),
        "metrics_reporter": "autospec of SGLang's SchedulerMetricsReporter with enable_metrics=False",
        "grammar": "autospec of SGLang's BaseGrammarObject whose accept_token raises ValueError (grammar case only)",
        "batch": (
            "SimpleNamespace(reqs=[req], no spec info, no stats) for ScheduleBatch, which needs a model; "
            "the result is SGLang's real GenerationBatchResult with one sampled token"
        ),
        "parallel_groups": (
            "rank 0 of a one-process world: get_parallel().override(...) where the runtime context "
            "exists, else one-process GroupCoordinator autospecs for the parallel_state globals"
        ),
    },
)

# The real SGLang code and the scaffolding around the result path (prefill_world.py, beside this file).
import prefill_world  # noqa: E402
from prefill_world import (  # noqa: E402
    KVPoll,
    PROMPT_LEN,
    abort_running,
    admitted,
    decide,
    deliver_result,
    frees_of,
    holds_kv_row,
    inflight_count,
    kv_chunk_sends,
    kv_releases,
    reason_name,
    record_resources,
    set_extend,
    scheduler_world,
    streamed,
)

prefill_world.declare(probe)

DECISION = "SchedulerDisaggregationPrefillMixin.process_batch_result_disagg_prefill"


# --- cases ---------------------------------------------------------------------
@probe.case(
    "result.aborted_final",
    "a bootstrapped request sent an earlier chunk, is aborted (to_finish=FINISH_ABORT); its final prefill result then arrives",
    decision=DECISION,
    using=scheduler_world,
)
def _(obs: kp.Observations, world) -> None:
    req, index = admitted(obs, world, "aborted-final", 301, bootstrap=KVPoll.WaitingForInput)
    set_extend(req, 0, PROMPT_LEN // 2)
    world.scheduler.send_kv_chunk(req)  # the earlier, non-last chunk, as process_prefill_chunk sends it
    obs.precondition("earlier_chunk_sent", kv_chunk_sends(world, req) == 1)
    world.scripts[req.bootstrap_room].sent.clear()  # count what the result path sends
    set_extend(req, PROMPT_LEN // 2, PROMPT_LEN)
    abort_running(req)

    def record():
        record_resources(obs, world, req, index)
        obs.record("chunk_state_cleared", req.rid not in world.scheduler.disagg_prefill_pending_chunk_rids)
        obs.record("sender_abort_calls", world.scripts[req.bootstrap_room].aborts)
        obs.record("output_token_appended", len(req.output_ids) > 0)
        obs.record("finish_reason", reason_name(req.finished_reason))

    decide(obs, lambda: deliver_result(world, req), record)


@probe.case(
    "result.late_after_retire",
    "an optimistic request's bootstrap fails (real check_bootstrap / handle_bootstrap_failure retire it) "
    "while its final prefill forward is in flight; that late result then arrives",
    decision=DECISION,
    using=scheduler_world,
)
def _(obs: kp.Observations, world) -> None:
    req, index = admitted(obs, world, "late-result", 302, bootstrap=KVPoll.Bootstrapping, later=(KVPoll.Failed,))
    obs.record("bootstrap_ok", world.scheduler.check_bootstrap(req))
    obs.precondition("retired_before_result", not holds_kv_row(req) and req.metadata_buffer_index < 0)
    world.set_buf_indices.clear()

    def record():
        record_resources(obs, world, req, index)
        script = world.scripts[req.bootstrap_room]
        obs.record("sent_from_released_row", any(not s["row_held"] for s in script.sent))
        obs.record("metadata_set_buf_indices", world.set_buf_indices)  # -1: the request owns no slot
        obs.record("output_streams", streamed(world, req))
        obs.record("finish_reason", reason_name(req.finished_reason))

    decide(obs, lambda: deliver_result(world, req), record)  # the late result of the retired request


@probe.case(
    "result.normal_unfinished",
    "control: a normal final prefill result needs its KV transferred; then the transfer completes",
    decision=DECISION,
    using=scheduler_world,
)
def _(obs: kp.Observations, world) -> None:
    req, index = admitted(obs, world, "normal", 303, bootstrap=KVPoll.WaitingForInput,
                           later=(KVPoll.Transferring, KVPoll.Success))

    def record():
        record_resources(obs, world, req, index)
        obs.record("chunk_state_cleared", req.rid not in world.scheduler.disagg_prefill_pending_chunk_rids)

    decide(obs, lambda: deliver_result(world, req), record)
    obs.record("poll1_done", [r.rid for r in world.scheduler.process_disagg_prefill_inflight_queue()])
    obs.record("poll2_done", [r.rid for r in world.scheduler.process_disagg_prefill_inflight_queue()])
    record_resources(obs, world, req, index, prefix="after_transfer.")
    obs.record("after_transfer.finish_reason", reason_name(req.finished_reason))


@probe.case(
    "result.aborted_middle_pending_bootstrap",
    "an optimistic request (bootstrap pending) is aborted; the result of its last in-flight "
    "middle chunk arrives after it yielded (no further chunk launched)",
    decision=DECISION,
    using=scheduler_world,
)
def _(obs: kp.Observations, world) -> None:
    req, index = admitted(obs, world, "aborted-middle", 304, bootstrap=KVPoll.Bootstrapping)
    req.inflight_middle_chunks = 1
    set_extend(req, 0, PROMPT_LEN // 2)  # the chunk that ran; the rest was never launched
    abort_running(req)

    def record():
        record_resources(obs, world, req, index)
        in_waiting = any(r is req for r in world.scheduler.waiting_queue)
        in_bootstrap = any(r is req for r in world.queue.queue)
        obs.record("requeued_waiting", in_waiting)
        obs.record("requeued_bootstrap_queue", in_bootstrap)
        obs.record("requeued_for_retry", in_waiting or in_bootstrap)
        obs.record("sender_abort_calls", world.scripts[req.bootstrap_room].aborts)
        obs.record("still_holds_metadata_buffer", req.metadata_buffer_index >= 0)
        obs.record("finish_reason", reason_name(req.finished_reason))

    decide(obs, lambda: deliver_result(world, req), record)


@probe.case(
    "inflight.aborted_final_poll",
    "a bootstrapped request is aborted, its final result arrives, then the inflight queue is polled "
    "and the KV transfer reports Success",
    decision=DECISION,
    using=scheduler_world,
)
def _(obs: kp.Observations, world) -> None:
    req, index = admitted(obs, world, "aborted-final-poll", 305, bootstrap=KVPoll.WaitingForInput, later=(KVPoll.Success,))
    abort_running(req)
    done = []

    def action():
        deliver_result(world, req)
        done.extend(world.scheduler.process_disagg_prefill_inflight_queue())

    def record():
        obs.record("poll_done", [r.rid for r in done])
        record_resources(obs, world, req, index)
        obs.record("output_streams", streamed(world, req))
        # What the client is told: an abort, or a normal (length) finish.
        obs.record("reported_finish_reason", reason_name(req.finished_reason))

    decide(obs, action, record)


@probe.case(
    "inflight.poll_after_late_result",
    "result.late_after_retire, then the inflight queue is polled (the sender reports Failed)",
    decision=DECISION,
    using=scheduler_world,
)
def _(obs: kp.Observations, world) -> None:
    req, index = admitted(obs, world, "late-poll", 306, bootstrap=KVPoll.Bootstrapping, later=(KVPoll.Failed,))
    world.scheduler.check_bootstrap(req)  # bootstrap fails: real retirement
    obs.precondition("retired_before_result", not holds_kv_row(req))
    done, requeued = [], []

    def action():
        deliver_result(world, req)  # late result
        requeued.append(inflight_count(world, req) > 0)
        done.extend(world.scheduler.process_disagg_prefill_inflight_queue())

    def record():
        obs.record("requeued_inflight", any(requeued))
        obs.record("poll_done", [r.rid for r in done])
        obs.record("kv_releases", kv_releases(world, req))
        obs.record("metadata_frees", frees_of(world, index))
        obs.record("output_streams", streamed(world, req))
        obs.record("kv_chunk_sends", kv_chunk_sends(world, req))

    decide(obs, action, record)


@probe.case(
    "result.delivered_twice",
    "a bootstrapped request is aborted and its final prefill result is delivered twice",
    decision=DECISION,
    using=scheduler_world,
)
def _(obs: kp.Observations, world) -> None:
    req, index = admitted(obs, world, "twice", 307, bootstrap=KVPoll.WaitingForInput)
    abort_running(req)
    first = {}

    def action():
        deliver_result(world, req)
        first.update(inflight=inflight_count(world, req), sends=kv_chunk_sends(world, req),
                     kv_releases=kv_releases(world, req), metadata_frees=frees_of(world, index))
        deliver_result(world, req)

    def record():
        obs.record("after_first", first)
        obs.record("inflight_entries", inflight_count(world, req))
        obs.record("kv_chunk_sends", kv_chunk_sends(world, req))
        obs.record("kv_releases", kv_releases(world, req))
        obs.record("metadata_frees", frees_of(world, index))
        obs.record("output_streams", streamed(world, req))
        obs.record("finish_reason", reason_name(req.finished_reason))

    decide(obs, action, record)


@probe.case(
    "result.aborted_final_pending_bootstrap",
    "an optimistic request (prefilled before its bootstrap completed) is aborted; its final result arrives "
    "while the bootstrap is still pending",
    decision=DECISION,
    using=scheduler_world,
)
def _(obs: kp.Observations, world) -> None:
    req, index = admitted(obs, world, "final-pending", 308, bootstrap=KVPoll.Bootstrapping, later=(KVPoll.Bootstrapping,))
    abort_running(req)

    def record():
        record_resources(obs, world, req, index)
        obs.record("parked_pending_bootstrap", bool(req.pending_bootstrap) and inflight_count(world, req) > 0)
        obs.record("requeued_for_retry", any(r is req for r in (*world.scheduler.waiting_queue, *world.queue.queue)))
        obs.record("sender_abort_calls", world.scripts[req.bootstrap_room].aborts)
        obs.record("finish_reason", reason_name(req.finished_reason))

    decide(obs, lambda: deliver_result(world, req), record)


@probe.case(
    "result.grammar_rejected",
    "a bootstrapped request with a grammar: its final result's sampled token is rejected by the grammar "
    "(accept_token raises ValueError)",
    decision=DECISION,
    using=scheduler_world,
)
def _(obs: kp.Observations, world) -> None:
    from sglang.srt.constrained.base_grammar_backend import BaseGrammarObject

    req, index = admitted(obs, world, "grammar", 309, bootstrap=KVPoll.WaitingForInput)
    grammar = probe.mock("grammar", BaseGrammarObject, absorbs=("accept_token",))
    grammar.accept_token.side_effect = ValueError("token 7 not allowed by the grammar")
    req.grammar = grammar

    def record():
        record_resources(obs, world, req, index)
        script = world.scripts[req.bootstrap_room]
        obs.record("sent_from_released_row", any(not s["row_held"] for s in script.sent))
        obs.record("sender_abort_calls", script.aborts)
        obs.record("finish_reason", reason_name(req.finished_reason or req.to_finish))

    decide(obs, lambda: deliver_result(world, req), record)


if __name__ == "__main__":
    probe.main()

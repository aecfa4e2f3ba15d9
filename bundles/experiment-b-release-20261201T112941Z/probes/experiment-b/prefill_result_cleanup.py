"""Diff probe for experiment B: SGLang PR #36988, aborted prefill *result* cleanup.

What it shows
    How SGLang's real prefill-side result handling treats a request that was
    aborted while its prefill forward was in flight, and a result that arrives
    after the request was already retired. It runs the real
    ``SchedulerDisaggregationPrefillMixin`` methods of whatever sglang is on
    ``sys.path`` (``process_batch_result_disagg_prefill``,
    ``process_disagg_prefill_inflight_queue``, ``send_kv_chunk``,
    ``check_bootstrap`` / ``handle_bootstrap_failure``,
    ``optimistic_release_and_requeue`` and, where it exists,
    ``_retire_aborted_prefill_result``) on real ``Req`` objects, and counts what
    they do to each request: inflight-queue requeues, KV chunk sends, metadata
    buffer frees, KV row releases, HiCache abort releases, abort output.
    #36988 first ships in 0.5.20; 0.5.19 is the base. The same file runs
    unchanged on every release: head-only symbols are recorded as facts.

What it mocks (see ``Probe(mocks=...)``)
    Only transport and collaborators: the KV sender, the TP/CP poll all-reduce,
    the metadata buffers and their index allocator, the req-to-token pool and
    KV allocator, the tree cache / HiCache, the output streamer, the batch
    result processor, metrics, the ScheduleBatch container and the scheduler's
    own (non-mixin) health-check hook. The runtime config is NOT mocked: a real
    default ``ServerArgs`` is published, as every sglang process does at start,
    and this one process states it is TP rank 0 (``get_parallel().override``).
    A mock can swallow a call the real collaborator would reject (for example
    a send built from an already-released KV row); such calls are counted and
    reported, not judged.

What it does NOT show
    No GPU, no model, no RDMA or network transfer, no decode side, no tenant
    data. It is not a reproduction of the cross-request KV leak; it shows a
    code-path difference between pinned releases, one PR at a time.
"""

from __future__ import annotations

import contextlib
import os
from array import array
from types import SimpleNamespace
from unittest import mock

import kvprobe_probe as kp

PROBE_NAME = "prefill_result_cleanup"

probe = kp.Probe(
    PROBE_NAME,
    description=(
        "PR #36988 (v0.5.20): an aborted prefill result is retired (not requeued, "
        "no KV send, resources freed once) and late results of retired requests are inert"
    ),
    mocks={
        "Req.disagg_kv_sender": (
            "MagicMock(spec=BaseKVSender): KV transport; counts send/abort, scripted poll()"
        ),
        "prefill.poll_and_all_reduce_attn_cp_tp_group": (
            "one rank, no process group: returns each sender's own poll()"
        ),
        "scheduler.disagg_metadata_buffers": (
            "MagicMock: set_buf records the slot index it would write, stores nothing"
        ),
        "scheduler.req_to_metadata_buffer_idx_allocator": "MagicMock: counts free(index)",
        "scheduler.req_to_token_pool": (
            "MagicMock holding a real CPU req_to_token tensor; free(req) drops the row "
            "with the real pool's assertion"
        ),
        "scheduler.token_to_kv_pool_allocator": (
            "MagicMock: page_size=1, identity index translation (no unified memory)"
        ),
        "scheduler.tree_cache": (
            "MagicMock radix cache + HiCache: non-mamba; records insert/finish/abort calls"
        ),
        "scheduler.output_streamer": "MagicMock: records which requests reach the client",
        "scheduler.batch_result_processor": (
            "MagicMock: logprob/auxiliary-output plumbing, idle without logits"
        ),
        "scheduler.metrics_reporter/metrics_collector": "MagicMock: metrics off",
        "scheduler.disagg_prefill_bootstrap_queue": (
            "SimpleNamespace: a list as queue, kv_args.state_types=[] (no state payloads)"
        ),
        "scheduler.maybe_send_health_check_signal": (
            "MagicMock: a Scheduler (not mixin) hook at the end of result processing"
        ),
        "prefill.release_kv_cache (one case)": (
            "spy wrapping the real function, only to count release attempts in "
            "inflight.poll_after_late_result"
        ),
        "batch": (
            "SimpleNamespace(reqs=[req]) for ScheduleBatch, which needs a model and pools"
        ),
    },
)

# --- the real code under test -------------------------------------------------
# Base-present symbols are imported plainly: if these fail, nothing can be shown.
import sglang  # noqa: E402
import torch  # noqa: E402
from sglang.srt.disaggregation import prefill as prefill_mod  # noqa: E402
from sglang.srt.disaggregation.base.conn import BaseKVSender, KVPoll, KVTransferMetric  # noqa: E402
from sglang.srt.disaggregation.prefill import SchedulerDisaggregationPrefillMixin  # noqa: E402
from sglang.srt.managers.schedule_batch import FINISH_ABORT, Req  # noqa: E402
from sglang.srt.managers.utils import GenerationBatchResult  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

HAS_RETIRE = hasattr(SchedulerDisaggregationPrefillMixin, "_retire_aborted_prefill_result")

probe.fact("sglang_version", getattr(sglang, "__version__", None))
probe.fact("sglang_file", os.path.abspath(sglang.__file__))
probe.fact("prefill_module_file", os.path.abspath(prefill_mod.__file__))
probe.fact("has_retire_aborted_prefill_result", HAS_RETIRE)
probe.fact("torch_version", torch.__version__)


def _publish_runtime_config() -> None:
    """Publish a real default ServerArgs: Req() and release_kv_cache read it."""
    from sglang.srt.runtime_context import get_context
    from sglang.srt.server_args import ServerArgs

    get_context().set_server_args(ServerArgs(model_path="kvprobe-no-model"))


try:
    _publish_runtime_config()
    probe.fact("runtime_config", "default ServerArgs published (no model loaded)")
except Exception as exc:  # cases will then raise; keep the reason as a fact
    probe.fact("runtime_config", f"publish failed: {type(exc).__name__}: {exc}")

# --- collaborators --------------------------------------------------------------
PAGE_SIZE = 1
PROMPT_LEN = 8
POOL_ROWS = 4
MAX_CONTEXT = 16


def _local_polls(pollers, _attn_cp_group, _attn_tp_group):
    """One rank: the MIN all-reduce of a single poll is that poll."""
    return [int(sender.poll()) for sender in pollers]


def _make_sender(polls=()):
    """A KV sender with the interface of BaseKVSender and a scripted poll()."""
    sender = mock.MagicMock(spec=BaseKVSender, name="kv_sender")
    # CommonKVSender's rule: send when there are pages, or for the last chunk.
    sender.should_send_kv_chunk.side_effect = lambda pages, last: pages > 0 or last
    sender.get_transfer_metric.return_value = KVTransferMetric()
    if hasattr(BaseKVSender, "get_max_transfer_tokens"):  # newer interface; base default
        sender.get_max_transfer_tokens.return_value = None
    script = list(polls)  # polls in order; the last one repeats
    sender.poll.side_effect = lambda: script.pop(0) if len(script) > 1 else script[0]
    sender.sent = []  # what each send() saw, for the report
    return sender


def _make_req_to_token_pool():
    pool = mock.MagicMock(name="req_to_token_pool")
    # Row r holds slot ids r*100 + position, so a send shows which row it read.
    rows = torch.arange(POOL_ROWS, dtype=torch.int64).unsqueeze(1) * 100
    pool.req_to_token = (rows + torch.arange(MAX_CONTEXT)).to(torch.int32)

    def free(req):
        # Same contract as ReqToTokenPool.free: the row must still be held.
        assert req.kv.holds_kv, "request must have req_pool_idx"
        req.kv.req_pool_idx = None

    pool.free.side_effect = free
    return pool


class ProbeScheduler(SchedulerDisaggregationPrefillMixin):
    """The real prefill mixin on a scheduler holding only mocked collaborators."""

    def __init__(self, *, enable_overlap: bool = False) -> None:
        self.enable_overlap = enable_overlap
        self.enable_staging = False
        self.enable_hicache_storage = True  # so HiCache abort releases are visible
        self.kv_checksum_computer = None
        self.scheduler_stage_metrics = None
        self.spec_algorithm = SpeculativeAlgorithm.NONE
        self.ps = SimpleNamespace(tp_rank=0, pp_rank=0)
        self.attn_cp_cpu_group = self.attn_tp_cpu_group = None

        self.req_to_token_pool = _make_req_to_token_pool()
        allocator = mock.MagicMock(name="kv_allocator", page_size=PAGE_SIZE)
        allocator.translate_kv_indices_for_transfer.side_effect = lambda indices: indices
        self.token_to_kv_pool_allocator = allocator
        self.tree_cache = mock.MagicMock(name="tree_cache")
        self.tree_cache.supports_mamba.return_value = False
        self.tree_cache.claim_kv_row.return_value = False
        self.tree_cache.req_to_token_pool = self.req_to_token_pool
        self.tree_cache.token_to_kv_pool_allocator = allocator

        self.req_to_metadata_buffer_idx_allocator = mock.MagicMock(name="metadata_allocator")
        self.disagg_metadata_buffers = mock.MagicMock(name="metadata_buffers")
        # Keep the slot index each set_buf would write (the real one indexes tensors with it).
        self.set_buf_indices = []
        self.disagg_metadata_buffers.set_buf.side_effect = lambda req: self.set_buf_indices.append(
            req.metadata_buffer_index
        )
        self.disagg_prefill_bootstrap_queue = SimpleNamespace(
            queue=[], kv_manager=SimpleNamespace(kv_args=SimpleNamespace(state_types=[]))
        )
        self.output_streamer = mock.MagicMock(name="output_streamer")
        self.batch_result_processor = mock.MagicMock(name="batch_result_processor")
        self.batch_result_processor.snapshot_auxiliary_output_starts.return_value = []
        self.metrics_reporter = mock.MagicMock(name="metrics_reporter", enable_metrics=False)
        self.metrics_collector = mock.MagicMock(name="metrics_collector")
        self.maybe_send_health_check_signal = mock.MagicMock(name="health_check")

        self.disagg_prefill_inflight_queue = []
        self.disagg_prefill_pending_chunk_rids = set()
        self.waiting_queue = []
        self.chunked_req = None


def _set_extend(req: Req, start: int, end: int) -> None:
    """Mark the chunk [start, end) as extended (extend_range <= 0.5.21, extend_end later)."""
    if hasattr(req, "set_extend_range"):
        req.set_extend_range(start, end)
    else:
        req.prefix_len, req.extend_end = start, end


def _make_req(rid: str, *, row: int, metadata_index: int, polls=(KVPoll.Transferring,)) -> Req:
    """A real Req that holds a KV row and a metadata buffer, with a KV sender."""
    req = Req(rid, "", array("q", range(1, PROMPT_LEN + 1)), SamplingParams(max_new_tokens=4))
    sender = req.disagg_kv_sender = _make_sender(polls)

    def send(pages, state_indices=None, num_kv_tokens=None):
        # Whether the request still held its KV row when this send was built.
        shape = list(getattr(pages, "shape", [len(pages)]))
        sender.sent.append({"row_held": req.kv.holds_kv, "pages_shape": shape})

    sender.send.side_effect = send
    req.metadata_buffer_index = metadata_index
    req.kv.req_pool_idx = row
    req.kv.kv_allocated_len = req.kv.kv_committed_len = PROMPT_LEN
    _set_extend(req, 0, PROMPT_LEN)
    req.inflight_middle_chunks = 0
    return req


def _abort_running(req: Req) -> None:
    """Scheduler.abort_request, 'Abort method 3' for a request in a running batch."""
    req.to_finish = FINISH_ABORT()


def _deliver_result(sched: ProbeScheduler, req: Req) -> None:
    """Hand one prefill result for ``req`` to the real result processor."""
    batch = SimpleNamespace(
        reqs=[req], spec_info=None, prefill_stats=None, dp_cooperation_info=None
    )
    result = GenerationBatchResult(next_token_ids=torch.tensor([7]))  # the sampled token
    sched.process_batch_result_disagg_prefill(batch, result)


# --- per-request counters ------------------------------------------------------
def _calls_with_first_arg(method, value, *, identity=False) -> int:
    return sum(
        1
        for call in method.call_args_list
        if call.args and ((call.args[0] is value) if identity else (call.args[0] == value))
    )


def kv_chunk_sends(req: Req) -> int:
    return req.disagg_kv_sender.send.call_count


def metadata_frees(sched: ProbeScheduler, index: int) -> int:
    return _calls_with_first_arg(sched.req_to_metadata_buffer_idx_allocator.free, index)


def kv_releases(sched: ProbeScheduler, req: Req) -> int:
    """Times the request's KV row was given back (every release path ends in pool.free)."""
    return _calls_with_first_arg(sched.req_to_token_pool.free, req, identity=True)


def hicache_abort_releases(sched: ProbeScheduler, req: Req) -> int:
    """tree_cache.release_aborted_request(rid) (<=0.5.19) or finish(handle, ABORT) (later)."""
    old = _calls_with_first_arg(sched.tree_cache.release_aborted_request, req.rid)
    handle = getattr(req, "cache_request_handle", object())
    new = sum(
        1
        for call in sched.tree_cache.finish.call_args_list
        if len(call.args) >= 2
        and call.args[0] is handle
        and getattr(call.args[1], "name", "") == "ABORT"
    )
    return old + new


def streamed(sched: ProbeScheduler, req: Req) -> int:
    calls = sched.output_streamer.stream_output.call_args_list
    return sum(1 for call in calls if any(r is req for r in call.args[0]))


def inflight_count(sched: ProbeScheduler, req: Req) -> int:
    return sum(1 for r in sched.disagg_prefill_inflight_queue if r is req)


def reason_name(reason) -> str | None:
    return None if reason is None else type(reason).__name__


def record_resources(obs, sched: ProbeScheduler, req: Req, index: int, prefix: str = "") -> None:
    """The counts every case compares, optionally under a name prefix."""
    obs.record(prefix + "requeued_inflight", inflight_count(sched, req) > 0)
    obs.record(prefix + "kv_chunk_sends", kv_chunk_sends(req))
    obs.record(prefix + "metadata_frees", metadata_frees(sched, index))
    obs.record(prefix + "kv_releases", kv_releases(sched, req))
    obs.record(prefix + "hicache_abort_releases", hicache_abort_releases(sched, req))
    aborted = isinstance(req.finished_reason, FINISH_ABORT)
    obs.record(prefix + "aborted_output_sent", streamed(sched, req) > 0 and aborted)


# --- cases ---------------------------------------------------------------------
@probe.case(
    "result.aborted_final",
    "a running request is aborted (to_finish=FINISH_ABORT); its final prefill result then arrives",
)
def _(obs: kp.Observations) -> None:
    sched = ProbeScheduler()
    req = _make_req("aborted-final", row=1, metadata_index=3)
    req.start_send_idx = 4  # an earlier non-last chunk went out ...
    sched.disagg_prefill_pending_chunk_rids.add(req.rid)  # ... and left pending chunk state
    _abort_running(req)

    _deliver_result(sched, req)

    record_resources(obs, sched, req, 3)
    obs.record("chunk_state_cleared", req.rid not in sched.disagg_prefill_pending_chunk_rids)
    obs.record("sender_abort_calls", req.disagg_kv_sender.abort.call_count)
    obs.record("output_token_appended", len(req.output_ids) > 0)
    obs.record("finish_reason", reason_name(req.finished_reason))
    obs.record("sends", req.disagg_kv_sender.sent)


@probe.case(
    "result.late_after_retire",
    "an optimistic request's bootstrap fails (real handle_bootstrap_failure retires it) "
    "while its final prefill forward is in flight; that late result then arrives",
)
def _(obs: kp.Observations) -> None:
    sched = ProbeScheduler()
    req = _make_req("late-result", row=2, metadata_index=5, polls=(KVPoll.Failed,))
    req.pending_bootstrap = True  # optimistic prefill: forward runs before bootstrap is done
    sched.disagg_prefill_pending_chunk_rids.add(req.rid)

    # What process_prefill_chunk does for the chunked request: poll its bootstrap.
    obs.record("bootstrap_ok", sched.check_bootstrap(req))
    obs.record("retired_before_result", not req.kv.holds_kv and req.metadata_buffer_index < 0)
    sends_before = kv_chunk_sends(req)

    _deliver_result(sched, req)  # the late result of the retired request

    record_resources(obs, sched, req, 5)
    obs.record("kv_chunk_sends_after_retire", kv_chunk_sends(req) - sends_before)
    obs.record("sent_from_released_row", any(not s["row_held"] for s in req.disagg_kv_sender.sent))
    obs.record("metadata_set_buf_indices", sched.set_buf_indices)  # -1: the request owns no slot
    inserts = _calls_with_first_arg(sched.tree_cache.cache_unfinished_req, req, identity=True)
    inserts += _calls_with_first_arg(sched.tree_cache.checkpoint, req, identity=True)  # 0.5.22 name
    obs.record("tree_cache_inserts_after_retire", inserts)
    obs.record("output_streams", streamed(sched, req))
    obs.record("finish_reason", reason_name(req.finished_reason))
    obs.record("sends", req.disagg_kv_sender.sent)


@probe.case(
    "result.normal_unfinished",
    "control: a normal final prefill result needs its KV transferred; then the transfer completes",
)
def _(obs: kp.Observations) -> None:
    sched = ProbeScheduler()
    req = _make_req("normal", row=1, metadata_index=2, polls=(KVPoll.Transferring, KVPoll.Success))

    _deliver_result(sched, req)
    record_resources(obs, sched, req, 2)
    obs.record("chunk_state_cleared", req.rid not in sched.disagg_prefill_pending_chunk_rids)

    # Two inflight polls: still transferring, then done.
    obs.record("poll1_done", [r.rid for r in sched.process_disagg_prefill_inflight_queue()])
    obs.record("poll2_done", [r.rid for r in sched.process_disagg_prefill_inflight_queue()])
    record_resources(obs, sched, req, 2, prefix="after_transfer.")
    obs.record("after_transfer.finish_reason", reason_name(req.finished_reason))


@probe.case(
    "result.aborted_middle_pending_bootstrap",
    "an optimistic request (bootstrap pending) is aborted; the result of its last in-flight "
    "middle chunk arrives after it yielded (no further chunk launched)",
)
def _(obs: kp.Observations) -> None:
    sched = ProbeScheduler()
    req = _make_req("aborted-middle", row=1, metadata_index=4)
    req.pending_bootstrap = True
    req.inflight_middle_chunks = 1
    _set_extend(req, 0, PROMPT_LEN // 2)  # the chunk that ran; the rest was never launched
    req.kv.kv_allocated_len = req.kv.kv_committed_len = PROMPT_LEN // 2
    _abort_running(req)

    _deliver_result(sched, req)

    record_resources(obs, sched, req, 4)
    in_waiting = any(r is req for r in sched.waiting_queue)
    in_bootstrap = any(r is req for r in sched.disagg_prefill_bootstrap_queue.queue)
    obs.record("requeued_waiting", in_waiting)
    obs.record("requeued_bootstrap_queue", in_bootstrap)
    obs.record("requeued_for_retry", in_waiting or in_bootstrap)
    obs.record("sender_abort_calls", req.disagg_kv_sender.abort.call_count)
    obs.record("still_holds_metadata_buffer", req.metadata_buffer_index >= 0)
    obs.record("finish_reason", reason_name(req.finished_reason))


@probe.case(
    "inflight.aborted_final_poll",
    "result.aborted_final, then the inflight queue is polled and the KV transfer reports Success",
)
def _(obs: kp.Observations) -> None:
    sched = ProbeScheduler()
    req = _make_req("aborted-final-poll", row=1, metadata_index=3, polls=(KVPoll.Success,))
    _abort_running(req)
    _deliver_result(sched, req)

    done = sched.process_disagg_prefill_inflight_queue()
    obs.record("poll_done", [r.rid for r in done])
    record_resources(obs, sched, req, 3)
    obs.record("output_streams", streamed(sched, req))
    # What the client is told: an abort, or a normal (length) finish.
    obs.record("reported_finish_reason", reason_name(req.finished_reason))


@probe.case(
    "inflight.poll_after_late_result",
    "result.late_after_retire, then the inflight queue is polled (the sender reports Failed)",
)
def _(obs: kp.Observations) -> None:
    sched = ProbeScheduler()
    req = _make_req("late-poll", row=2, metadata_index=5, polls=(KVPoll.Failed,))
    req.pending_bootstrap = True
    sched.check_bootstrap(req)  # bootstrap fails: real retirement
    _deliver_result(sched, req)  # late result
    obs.record("requeued_inflight", inflight_count(sched, req) > 0)

    # Spy (wraps the real function) to count release attempts, refused or not. If the
    # request is polled again, the real release_kv_cache asserts on a KV row that is
    # already gone (a non-mamba cache): that exception is the observation, not a bug here.
    spy = mock.Mock(wraps=prefill_mod.release_kv_cache)
    try:
        with mock.patch.object(prefill_mod, "release_kv_cache", spy):
            done = sched.process_disagg_prefill_inflight_queue()
    finally:  # record the counts even if the real code refuses a second release
        obs.record("kv_release_attempts_in_poll", spy.call_count)
        obs.record("kv_releases", kv_releases(sched, req))
        obs.record("metadata_frees", metadata_frees(sched, 5))
        obs.record("output_streams", streamed(sched, req))
    obs.record("poll_done", [r.rid for r in done])
    obs.record("kv_chunk_sends", kv_chunk_sends(req))


def _single_rank(stack: contextlib.ExitStack) -> None:
    """State this process's TP rank (0.5.22 reads it from the runtime context)."""
    from sglang.srt.runtime_context import get_parallel

    try:
        stack.enter_context(get_parallel().override(tp_rank=0))
        probe.fact("parallel_override", "tp_rank=0")
    except Exception as exc:  # older releases default it; keep the reason
        probe.fact("parallel_override", f"not applied: {type(exc).__name__}: {exc}")


def main() -> None:
    with contextlib.ExitStack() as stack:
        _single_rank(stack)
        # The TP/CP poll all-reduce needs a process group; this is one rank.
        stack.enter_context(
            mock.patch.object(prefill_mod, "poll_and_all_reduce_attn_cp_tp_group", _local_polls)
        )
        probe.main()


if __name__ == "__main__":
    main()

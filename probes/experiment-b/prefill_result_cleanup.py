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

import contextlib
import inspect
import os
import types
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

# --- the real code under test -------------------------------------------------
# Present in every release the sglang-cpu profile imports (0.5.13 onwards).
import sglang  # noqa: E402
import torch  # noqa: E402
from sglang.srt.disaggregation import prefill as prefill_mod  # noqa: E402
from sglang.srt.disaggregation import utils as disagg_utils  # noqa: E402
from sglang.srt.disaggregation.base.conn import KVArgs, KVPoll, KVTransferMetric  # noqa: E402
from sglang.srt.disaggregation.common.conn import CommonKVManager, CommonKVSender  # noqa: E402
from sglang.srt.disaggregation.prefill import SchedulerDisaggregationPrefillMixin  # noqa: E402
from sglang.srt.managers import scheduler as scheduler_mod  # noqa: E402
from sglang.srt.managers.schedule_batch import FINISH_ABORT, Req  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer  # noqa: E402
from sglang.srt.managers.utils import GenerationBatchResult  # noqa: E402
from sglang.srt.mem_cache import memory_pool  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402

HAS_RETIRE = hasattr(SchedulerDisaggregationPrefillMixin, "_retire_aborted_prefill_result")
DECISION = "SchedulerDisaggregationPrefillMixin.process_batch_result_disagg_prefill"

probe.fact("sglang_version", getattr(sglang, "__version__", None))
probe.fact("sglang_file", os.path.abspath(sglang.__file__))
probe.fact("prefill_module_file", os.path.abspath(prefill_mod.__file__))
probe.fact("has_retire_aborted_prefill_result", HAS_RETIRE)
probe.fact("torch_version", torch.__version__)

PAGE_SIZE = 1
PROMPT_LEN = 8
POOL_ROWS = 4
POOL_TOKENS = 64
MAX_CONTEXT = 16
METADATA_SLOTS = 4
NUM_KV_HEADS = 8
BOOTSTRAP_PORT = 8998
DUMMY_MODEL = "dummy"

probe.configure("model_path", DUMMY_MODEL, default=None,
                why="SGLang's own dummy-model short-circuit: ServerArgs skips resolving a real model's config")
probe.configure("disaggregation_mode", "prefill", default="null", why="the result path under test is the PD prefill side")
probe.configure("page_size", PAGE_SIZE, default=None,
                why="resolution leaves it unset for the dummy model; release_kv_cache reads it (1 is what it "
                    "resolves to without a backend that needs larger pages)")
probe.configure("enable_hicache_storage", True, default=False,
                why="scheduler flag: HiCache abort releases (tree_cache.finish(handle, ABORT) or "
                    "release_aborted_request) become visible")


# --- configuration and ranks, the way the scheduler process states them ----------
def _optimistic_field() -> str | None:
    """This release's name for the optimistic-prefill budget (it was renamed in 0.5.16)."""
    params = inspect.signature(ServerArgs).parameters
    return next((n for n in ("optimistic_prefill_attempts", "optimistic_prefill_retries") if n in params), None)


OPTIMISTIC = _optimistic_field()
if OPTIMISTIC is not None:
    probe.configure(OPTIMISTIC, 1, default=0, why="lets pop_bootstrapped hand a request to prefill before its "
                                                  "bootstrap completes, the way the pending-bootstrap cases need")


def _publish():
    fields = {"model_path": DUMMY_MODEL, "disaggregation_mode": "prefill", "page_size": PAGE_SIZE}
    if OPTIMISTIC is not None:
        fields[OPTIMISTIC] = 1
    server_args = ServerArgs(**fields)
    set_global_server_args_for_scheduler(server_args)
    return server_args


@contextlib.contextmanager
def _rank0():
    """Rank 0 of a one-process world: runtime-context overrides and/or legacy group globals."""
    runtime_context = kp.optional("sglang.srt.runtime_context")
    with _legacy_groups():
        if runtime_context is None:
            yield
            return
        wanted = {"tp_rank": 0, "pp_rank": 0, "dp_rank": 0, "attn_tp_rank": 0, "attn_cp_rank": 0,
                  "attn_dp_rank": 0, "attn_tp_group": _one_process_group()}
        fields = getattr(runtime_context, "_parallel_fields", None)
        declared = fields() if fields is not None else {
            name for name, _ in inspect.getmembers(type(runtime_context.get_parallel()))}
        with runtime_context.get_parallel().override(**{k: v for k, v in wanted.items() if k in declared}):
            yield


def _one_process_group():
    from sglang.srt.distributed.parallel_state import GroupCoordinator

    return probe.mock("parallel_groups", GroupCoordinator, rank_in_group=0, world_size=1, rank=0,
                      cpu_group=None, device_group=None, is_first_rank=True, is_last_rank=True)


@contextlib.contextmanager
def _legacy_groups():
    from sglang.srt.distributed import parallel_state
    from sglang.srt.layers import dp_attention

    groups = dict.fromkeys(("_TP", "_ATTN_TP", "_ATTN_CP", "_PP"), _one_process_group)
    ranks = {"_ATTN_DP_RANK": 0, "_ATTN_DP_SIZE": 1, "_LOCAL_ATTN_DP_SIZE": 1, "_LOCAL_ATTN_DP_RANK": 0}
    with kp.stand_in_unset(parallel_state, groups), \
            kp.stand_in_unset(dp_attention, {name: (lambda v=v: v) for name, v in ranks.items()}):
        yield


def _local_polls(pollers, *_groups):
    """One rank: the MIN all-reduce of a single poll is that poll."""
    return [int(sender.poll()) for sender in pollers]


# --- strict fakes: what they refuse is behaviour of the code that called them ------------
REFUSED: list[str] = []  # this case's refused calls, in order


def _refuse(call: str, why: str) -> kp.RejectedCall:
    REFUSED.append(call)
    return kp.RejectedCall(why)


# --- the strict KV sender ----------------------------------------------------------
def _kv_transfer_error():
    from sglang.srt.disaggregation.common.conn import KVTransferError

    return KVTransferError


class SenderScript:
    """What one request's transport will report, and what was asked of it."""

    def __init__(self, polls) -> None:
        self.polls = list(polls)  # in order; the last one repeats
        self.initialised = False
        self.aborts = 0
        self.failed = False
        self.cleared = False
        self.sent: list[dict] = []
        self.req: Req | None = None

    def attach(self, sender) -> None:
        sender.poll.side_effect = self.poll
        sender.init.side_effect = self.init
        sender.send.side_effect = self.send
        sender.abort.side_effect = self.abort
        sender.clear.side_effect = self.clear
        sender.failure_exception.side_effect = self.failure_exception
        sender.should_send_kv_chunk.side_effect = lambda pages, last: pages > 0 or last
        sender.get_transfer_metric.side_effect = KVTransferMetric
        sender.pop_decode_prefix_len.side_effect = lambda: 0
        if hasattr(CommonKVSender, "get_max_transfer_tokens"):
            sender.get_max_transfer_tokens.side_effect = lambda: None

    def poll(self):
        if self.failed:
            return KVPoll.Failed
        return self.polls.pop(0) if len(self.polls) > 1 else self.polls[0]

    def init(self, num_kv_indices, aux_index=None):
        self.initialised = True

    def send(self, kv_indices, state_indices=None, num_kv_tokens=None):
        if not self.initialised:
            raise _refuse("kv_sender.send", "CommonKVSender.send before init(): the real sender has no "
                          "num_kv_indices (AttributeError) and cannot address the decode side")
        shape = list(getattr(kv_indices, "shape", [len(kv_indices)]))
        self.sent.append({"row_held": _holds_kv_row(self.req), "pages_shape": shape,
                          "dropped_by_failed_room": self.failed or self.cleared})

    def abort(self):
        self.aborts += 1
        self.failed = True

    def clear(self):
        self.cleared = True

    def failure_exception(self):
        self.failed = True
        self.clear()
        raise _kv_transfer_error()(0, "bootstrap failed (scripted)")


SENDER_CALLS = ("poll", "init", "send", "abort", "clear", "failure_exception", "should_send_kv_chunk",
                "get_transfer_metric", "pop_decode_prefix_len", "get_max_transfer_tokens")


# --- KV row bookkeeping, wherever this release keeps it -------------------------------
# Up to 0.5.15 on the Req; 0.5.16-0.5.18 the row on the Req and its lengths in a
# ReqKvInfo that alloc_for_extend attaches; from 0.5.19 all of it in req.kv.
def _kv_record(req: Req):
    kv = getattr(req, "kv", None)
    return kv if kv is not None and hasattr(kv, "holds_kv") else None


def _holds_kv_row(req: Req) -> bool:
    kv = _kv_record(req)
    return kv.holds_kv if kv is not None else req.req_pool_idx is not None


def _row(req: Req):
    kv = _kv_record(req)
    return kv.req_pool_idx if kv is not None else req.req_pool_idx


def _record_prefilled(req: Req, length: int) -> None:
    """What alloc_for_extend and the forward leave behind for a fully prefilled prompt."""
    kv = _kv_record(req)
    if kv is not None:
        kv.kv_allocated_len = kv.kv_committed_len = length
        return
    req.kv_committed_len = length
    info = getattr(kp.require_module("sglang.srt.managers.schedule_batch"), "ReqKvInfo", None)
    if info is not None:
        req.kv = kp.build(info, kv_allocated_len=length, swa_evicted_seqlen=0)
    else:
        req.kv_allocated_len = length


# --- the scheduler world -------------------------------------------------------------
class World:
    """A prefill scheduler: real pools and bootstrap queue, strict mocks around the mixin."""

    def __init__(self, server_args) -> None:
        self.server_args = server_args
        self.scripts: dict[int, SenderScript] = {}
        self.frees: list[Req] = []
        self.kv_pool = kp.build(
            memory_pool.MHATokenToKVPool, size=POOL_TOKENS, page_size=PAGE_SIZE, dtype=torch.bfloat16,
            head_num=1, head_dim=8, layer_num=1, device="cpu", enable_memory_saver=False,
            start_layer=0, end_layer=0, enable_alt_stream=False)
        self.allocator = kp.build(TokenToKVPoolAllocator, size=POOL_TOKENS, page_size=PAGE_SIZE,
                                  dtype=torch.bfloat16, device="cpu", kvcache=self.kv_pool, need_sort=False)
        self.req_to_token_pool = kp.build(memory_pool.ReqToTokenPool, size=POOL_ROWS, max_context_len=MAX_CONTEXT,
                                          device="cpu", enable_memory_saver=False)
        real_free = self.req_to_token_pool.free

        def free(req):  # count, then the real pool's own check and release
            self.frees.append(req)
            return real_free(req)

        self.req_to_token_pool.free = free
        self.metadata_allocator = kp.build(disagg_utils.ReqToMetadataIdxAllocator, size=METADATA_SLOTS)
        self.metadata_freed: list[int] = []
        real_metadata_free = self.metadata_allocator.free

        def metadata_free(index):  # which slot; the real allocator then frees it
            self.metadata_freed.append(index)
            return real_metadata_free(index)

        self.metadata_allocator.free = metadata_free
        self.metadata_buffers = kp.build(
            disagg_utils.MetadataBuffers, size=METADATA_SLOTS, hidden_size=16, hidden_states_dtype=torch.float32,
            max_sampling_mask_tokens=0)
        self.set_buf_indices: list[int] = []
        real_set_buf = self.metadata_buffers.set_buf

        def set_buf(req):  # the slot it writes; the real set_buf then writes it
            self.set_buf_indices.append(req.metadata_buffer_index)
            return real_set_buf(req)

        self.metadata_buffers.set_buf = set_buf
        self.scheduler = self._scheduler()

    def _tree_cache(self):
        cache = probe.mock("tree_cache", _cache_class(), absorbs=TREE_CACHE_CALLS)
        cache.req_to_token_pool = self.req_to_token_pool
        cache.token_to_kv_pool_allocator = self.allocator
        cache.supports_mamba.side_effect = lambda: False
        spec = _cache_class()
        if hasattr(spec, "claim_kv_row"):
            cache.claim_kv_row.side_effect = lambda req: False
        for name in ROW_READING_CALLS:
            if hasattr(spec, name):
                getattr(cache, name).side_effect = _refuse_released(name)
        return cache

    def _scheduler(self):
        sched = probe.mock("scheduler", Scheduler, absorbs=("maybe_send_health_check_signal",))
        for name, func in vars(SchedulerDisaggregationPrefillMixin).items():
            if inspect.isfunction(func):
                setattr(sched, name, types.MethodType(func, sched))
        if hasattr(Scheduler, "_release_aborted_request"):
            sched._release_aborted_request = types.MethodType(Scheduler._release_aborted_request, sched)
        sched.maybe_send_health_check_signal.side_effect = lambda: None
        sched.server_args = self.server_args
        sched.enable_overlap = False
        sched.enable_staging = False
        sched.enable_hicache_storage = True
        sched.enable_hisparse = False
        sched.kv_checksum_computer = None
        sched.scheduler_stage_metrics = None
        sched.spec_algorithm = _spec_none()
        sched.ps = SimpleNamespace(tp_rank=0, pp_rank=0, pp_size=1, dp_rank=0, gpu_id=0)
        sched.attn_cp_cpu_group = sched.attn_tp_cpu_group = None
        sched.kv_shard_widening = 1
        sched.rust_server = None
        sched.tp_worker = SimpleNamespace(
            model_runner=SimpleNamespace(
                max_token_pool_size=POOL_TOKENS, effective_max_total_num_tokens=POOL_TOKENS,
                effective_logical_max_total_num_tokens=POOL_TOKENS, kv_cache_dtype_str="auto"),
            is_hybrid_swa=False)
        sched.model_config = SimpleNamespace(
            num_hidden_layers=1, hf_text_config=SimpleNamespace(num_hidden_layers=1),
            hf_config=SimpleNamespace(num_hidden_layers=1), get_total_num_kv_heads=lambda: NUM_KV_HEADS)
        sched.req_to_token_pool = self.req_to_token_pool
        sched.token_to_kv_pool_allocator = self.allocator
        sched.tree_cache = self._tree_cache()
        sched.req_to_metadata_buffer_idx_allocator = self.metadata_allocator
        sched.disagg_metadata_buffers = self.metadata_buffers
        sched.output_streamer = probe.mock("output_streamer", SchedulerOutputStreamer, absorbs=("stream_output",))
        processor = probe.mock("batch_result_processor", kp.require(scheduler_mod, "SchedulerBatchResultProcessor"),
                               absorbs=BATCH_RESULT_CALLS)
        if hasattr(processor, "snapshot_auxiliary_output_starts"):
            processor.snapshot_auxiliary_output_starts.side_effect = lambda batch, result: []
        sched.batch_result_processor = processor
        sched.metrics_reporter = probe.mock("metrics_reporter", kp.require(scheduler_mod, "SchedulerMetricsReporter"),
                                            absorbs=("report_prefill_stats",), enable_metrics=False)
        sched.disagg_prefill_inflight_queue = []
        sched.disagg_prefill_pending_chunk_rids = set()
        sched.waiting_queue = []
        sched.chunked_req = None
        sched.processed_tokens_counter = 0
        return sched

    def queue_args(self) -> dict:
        return {
            "token_to_kv_pool": self.kv_pool, "draft_token_to_kv_pool": None,
            "req_to_metadata_buffer_idx_allocator": self.metadata_allocator,
            "metadata_buffers": self.metadata_buffers, "tp_rank": 0, "tp_size": 1, "gpu_id": 0,
            "bootstrap_port": BOOTSTRAP_PORT, "gloo_group": None, "max_total_num_tokens": POOL_TOKENS,
            "scheduler": self.scheduler, "pp_rank": 0, "pp_size": 1, "scheduler_stage_metrics": None,
            "transfer_backend": disagg_utils.TransferBackend.MOONCAKE,
        }

    def new_sender(self, **kwargs):
        """What the patched get_kv_class(SENDER) constructs: a strict sender per request."""
        sender = probe.mock("kv_sender", CommonKVSender, absorbs=SENDER_CALLS)
        script = self.pending_script
        script.attach(sender)
        self.scripts[kwargs.get("bootstrap_room")] = script
        return sender


# Each release's names for "insert the request's prefix", "free its row", "drop its lock".
TREE_CACHE_CALLS = ("supports_mamba", "claim_kv_row", "cache_unfinished_req", "cache_finished_req", "insert_req",
                    "checkpoint", "free_kv_row", "unpin", "unlock", "on_release", "finish",
                    "release_aborted_request", "dec_lock_ref")
ROW_READING_CALLS = ("cache_unfinished_req", "cache_finished_req", "insert_req", "checkpoint")
BATCH_RESULT_CALLS = ("move_logprobs_to_cpu", "snapshot_auxiliary_output_starts")


def _cache_class():
    """The cache a HiCache-storage scheduler runs: HiRadixCache up to 0.5.20, then the merged RadixCache."""
    return kp.optional("sglang.srt.mem_cache.hiradix_cache", "HiRadixCache") or RadixCache


def _refuse_released(name: str):
    def call(req, *args, **kwargs):
        if not _holds_kv_row(req):
            raise _refuse(f"tree_cache.{name}", f"{name} on request {req.rid}, which no longer holds a KV "
                          "row: the real cache would index a released row")
        return None
    return call


def _spec_none():
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return SpeculativeAlgorithm.NONE


@contextlib.contextmanager
def _world():
    """Publish config, state the rank, patch transport and collectives; yield a fresh World."""
    server_args = _publish()
    REFUSED.clear()
    with contextlib.ExitStack() as stack:
        stack.enter_context(_rank0())
        world = World(server_args)
        sender_cls = probe.mock("kv_sender", CommonKVSender, instance=False, absorbs=("()",))
        sender_cls.side_effect = world.new_sender
        manager_cls = probe.mock("kv_manager", CommonKVManager, instance=False, absorbs=("()",))
        classes = {disagg_utils.KVClassType.KVARGS: KVArgs, disagg_utils.KVClassType.MANAGER: manager_cls,
                   disagg_utils.KVClassType.SENDER: sender_cls}

        def get_kv_class(_backend, class_type):
            if class_type not in classes:
                raise kp.RejectedCall(f"get_kv_class({class_type}): no such transport class in this probe")
            return classes[class_type]

        stack.enter_context(mock.patch.object(prefill_mod, "get_kv_class", get_kv_class))
        stack.enter_context(mock.patch.object(prefill_mod, "poll_and_all_reduce_attn_cp_tp_group", _local_polls))
        queue = kp.build(prefill_mod.PrefillBootstrapQueue, **world.queue_args())
        queue.kv_manager.kv_args = SimpleNamespace(state_types=[])
        world.scheduler.disagg_prefill_bootstrap_queue = queue
        world.queue = queue
        yield world


# --- requests, through the release's own admission, bootstrap and allocation --------------
def _admit(world: World, rid: str, room: int, *, bootstrap: KVPoll, later=(KVPoll.Transferring,)) -> Req:
    """add -> pop_bootstrapped (``bootstrap`` is what the sender reports then) -> KV row."""
    req = Req(rid, "", array("q", range(1, PROMPT_LEN + 1)), SamplingParams(max_new_tokens=4),
              bootstrap_host="10.0.0.2", bootstrap_port=BOOTSTRAP_PORT, bootstrap_room=room)
    script = world.pending_script = SenderScript([bootstrap, *later])
    script.req = req
    world.queue.add(req, NUM_KV_HEADS)
    popped = world.queue.pop_bootstrapped()
    if req not in popped:
        raise kp.CannotObserve(f"pop_bootstrapped did not hand {rid} to prefill (sender reported {bootstrap.name})")
    world.req_to_token_pool.alloc([req])
    slots = world.allocator.alloc(PROMPT_LEN)
    world.req_to_token_pool.write((_row(req), slice(0, PROMPT_LEN)), slots)
    _record_prefilled(req, PROMPT_LEN)
    req.init_next_round_input(None)
    _set_extend(req, 0, PROMPT_LEN)
    return req


def _set_extend(req: Req, start: int, end: int) -> None:
    """The chunk [start, end) ran: extend_range (0.5.16-0.5.21), extend_end (0.5.22+), fill_len before."""
    if hasattr(req, "set_extend_range"):
        req.set_extend_range(start, end)
    elif hasattr(req, "extend_end"):
        req.prefix_len, req.extend_end = start, end
    else:
        req.fill_len = end


def _abort_running(req: Req) -> None:
    """Scheduler.abort_request, 'Abort method 3' for a request in a running batch."""
    req.to_finish = FINISH_ABORT()


def _deliver_result(world: World, req: Req) -> None:
    """Hand one prefill result for ``req`` to the real result processor."""
    batch = SimpleNamespace(reqs=[req], spec_info=None, prefill_stats=None, dp_cooperation_info=None)
    result = GenerationBatchResult(next_token_ids=torch.tensor([7]))  # the sampled token
    world.scheduler.process_batch_result_disagg_prefill(batch, result)


# --- per-request counters ------------------------------------------------------
def kv_chunk_sends(world: World, req: Req) -> int:
    return len(world.scripts[req.bootstrap_room].sent)


def _frees_of(world: World, index: int) -> int:
    return sum(1 for i in world.metadata_freed if i == index)


def kv_releases(world: World, req: Req) -> int:
    """Times the request's KV row was given back (every release path ends in pool.free)."""
    return sum(1 for r in world.frees if r is req)


def hicache_abort_releases(world: World, req: Req) -> int:
    """tree_cache.release_aborted_request(rid) (<=0.5.19) or finish(handle, ABORT) (later)."""
    cache = world.scheduler.tree_cache
    spec = _cache_class()
    old = sum(1 for c in cache.release_aborted_request.call_args_list if c.args and c.args[0] == req.rid) \
        if hasattr(spec, "release_aborted_request") else 0
    new = 0
    if hasattr(spec, "finish"):
        handle = getattr(req, "cache_request_handle", object())
        new = sum(1 for c in cache.finish.call_args_list
                  if len(c.args) >= 2 and c.args[0] is handle and getattr(c.args[1], "name", "") == "ABORT")
    return old + new


def streamed(world: World, req: Req) -> int:
    calls = world.scheduler.output_streamer.stream_output.call_args_list
    return sum(1 for call in calls if any(r is req for r in call.args[0]))


def inflight_count(world: World, req: Req) -> int:
    return sum(1 for r in world.scheduler.disagg_prefill_inflight_queue if r is req)


def reason_name(reason) -> str | None:
    return None if reason is None else type(reason).__name__


def record_resources(obs, world: World, req: Req, index: int, prefix: str = "") -> None:
    """The counts every case compares, optionally under a name prefix."""
    obs.record(prefix + "requeued_inflight", inflight_count(world, req) > 0)
    obs.record(prefix + "kv_chunk_sends", kv_chunk_sends(world, req))
    obs.record(prefix + "metadata_frees", _frees_of(world, index))
    obs.record(prefix + "kv_releases", kv_releases(world, req))
    obs.record(prefix + "hicache_abort_releases", hicache_abort_releases(world, req))
    aborted = isinstance(req.finished_reason, FINISH_ABORT)
    obs.record(prefix + "aborted_output_sent", streamed(world, req) > 0 and aborted)


def _admitted(obs, world: World, rid: str, room: int, *, bootstrap: KVPoll, later=(KVPoll.Transferring,)):
    """``_admit``, then the preconditions of a request that finished bootstrap and prefill
    (and, when its sender still reports Bootstrapping, of one prefilled optimistically).

    Returns the request and its metadata slot."""
    req = _admit(world, rid, room, bootstrap=bootstrap, later=later)
    obs.precondition("kv_row_held", _holds_kv_row(req))
    obs.precondition("metadata_buffer_held", req.metadata_buffer_index is not None and req.metadata_buffer_index >= 0)
    if bootstrap == KVPoll.Bootstrapping:
        obs.precondition("pending_bootstrap", bool(req.pending_bootstrap))
    return req, req.metadata_buffer_index


# --- cases ---------------------------------------------------------------------
def _decide(obs: kp.Observations, action, record) -> None:
    """Run the real call under test; what it did is recorded even if it raised."""
    with obs.decision():
        try:
            action()
        finally:
            obs.record("refused_calls", list(REFUSED))
            record()


@probe.case(
    "result.aborted_final",
    "a bootstrapped request sent an earlier chunk, is aborted (to_finish=FINISH_ABORT); its final prefill result then arrives",
    decision=DECISION,
    using=_world,
)
def _(obs: kp.Observations, world) -> None:
    req, index = _admitted(obs, world, "aborted-final", 301, bootstrap=KVPoll.WaitingForInput)
    _set_extend(req, 0, PROMPT_LEN // 2)
    world.scheduler.send_kv_chunk(req)  # the earlier, non-last chunk, as process_prefill_chunk sends it
    obs.precondition("earlier_chunk_sent", kv_chunk_sends(world, req) == 1)
    world.scripts[req.bootstrap_room].sent.clear()  # count what the result path sends
    _set_extend(req, PROMPT_LEN // 2, PROMPT_LEN)
    _abort_running(req)

    def record():
        record_resources(obs, world, req, index)
        obs.record("chunk_state_cleared", req.rid not in world.scheduler.disagg_prefill_pending_chunk_rids)
        obs.record("sender_abort_calls", world.scripts[req.bootstrap_room].aborts)
        obs.record("output_token_appended", len(req.output_ids) > 0)
        obs.record("finish_reason", reason_name(req.finished_reason))

    _decide(obs, lambda: _deliver_result(world, req), record)


@probe.case(
    "result.late_after_retire",
    "an optimistic request's bootstrap fails (real check_bootstrap / handle_bootstrap_failure retire it) "
    "while its final prefill forward is in flight; that late result then arrives",
    decision=DECISION,
    using=_world,
)
def _(obs: kp.Observations, world) -> None:
    req, index = _admitted(obs, world, "late-result", 302, bootstrap=KVPoll.Bootstrapping, later=(KVPoll.Failed,))
    obs.record("bootstrap_ok", world.scheduler.check_bootstrap(req))
    obs.precondition("retired_before_result", not _holds_kv_row(req) and req.metadata_buffer_index < 0)
    world.set_buf_indices.clear()

    def record():
        record_resources(obs, world, req, index)
        script = world.scripts[req.bootstrap_room]
        obs.record("sent_from_released_row", any(not s["row_held"] for s in script.sent))
        obs.record("metadata_set_buf_indices", world.set_buf_indices)  # -1: the request owns no slot
        obs.record("output_streams", streamed(world, req))
        obs.record("finish_reason", reason_name(req.finished_reason))

    _decide(obs, lambda: _deliver_result(world, req), record)  # the late result of the retired request


@probe.case(
    "result.normal_unfinished",
    "control: a normal final prefill result needs its KV transferred; then the transfer completes",
    decision=DECISION,
    using=_world,
)
def _(obs: kp.Observations, world) -> None:
    req, index = _admitted(obs, world, "normal", 303, bootstrap=KVPoll.WaitingForInput,
                           later=(KVPoll.Transferring, KVPoll.Success))

    def record():
        record_resources(obs, world, req, index)
        obs.record("chunk_state_cleared", req.rid not in world.scheduler.disagg_prefill_pending_chunk_rids)

    _decide(obs, lambda: _deliver_result(world, req), record)
    obs.record("poll1_done", [r.rid for r in world.scheduler.process_disagg_prefill_inflight_queue()])
    obs.record("poll2_done", [r.rid for r in world.scheduler.process_disagg_prefill_inflight_queue()])
    record_resources(obs, world, req, index, prefix="after_transfer.")
    obs.record("after_transfer.finish_reason", reason_name(req.finished_reason))


@probe.case(
    "result.aborted_middle_pending_bootstrap",
    "an optimistic request (bootstrap pending) is aborted; the result of its last in-flight "
    "middle chunk arrives after it yielded (no further chunk launched)",
    decision=DECISION,
    using=_world,
)
def _(obs: kp.Observations, world) -> None:
    req, index = _admitted(obs, world, "aborted-middle", 304, bootstrap=KVPoll.Bootstrapping)
    req.inflight_middle_chunks = 1
    _set_extend(req, 0, PROMPT_LEN // 2)  # the chunk that ran; the rest was never launched
    _abort_running(req)

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

    _decide(obs, lambda: _deliver_result(world, req), record)


@probe.case(
    "inflight.aborted_final_poll",
    "a bootstrapped request is aborted, its final result arrives, then the inflight queue is polled "
    "and the KV transfer reports Success",
    decision=DECISION,
    using=_world,
)
def _(obs: kp.Observations, world) -> None:
    req, index = _admitted(obs, world, "aborted-final-poll", 305, bootstrap=KVPoll.WaitingForInput, later=(KVPoll.Success,))
    _abort_running(req)
    done = []

    def action():
        _deliver_result(world, req)
        done.extend(world.scheduler.process_disagg_prefill_inflight_queue())

    def record():
        obs.record("poll_done", [r.rid for r in done])
        record_resources(obs, world, req, index)
        obs.record("output_streams", streamed(world, req))
        # What the client is told: an abort, or a normal (length) finish.
        obs.record("reported_finish_reason", reason_name(req.finished_reason))

    _decide(obs, action, record)


@probe.case(
    "inflight.poll_after_late_result",
    "result.late_after_retire, then the inflight queue is polled (the sender reports Failed)",
    decision=DECISION,
    using=_world,
)
def _(obs: kp.Observations, world) -> None:
    req, index = _admitted(obs, world, "late-poll", 306, bootstrap=KVPoll.Bootstrapping, later=(KVPoll.Failed,))
    world.scheduler.check_bootstrap(req)  # bootstrap fails: real retirement
    obs.precondition("retired_before_result", not _holds_kv_row(req))
    done, requeued = [], []

    def action():
        _deliver_result(world, req)  # late result
        requeued.append(inflight_count(world, req) > 0)
        done.extend(world.scheduler.process_disagg_prefill_inflight_queue())

    def record():
        obs.record("requeued_inflight", any(requeued))
        obs.record("poll_done", [r.rid for r in done])
        obs.record("kv_releases", kv_releases(world, req))
        obs.record("metadata_frees", _frees_of(world, index))
        obs.record("output_streams", streamed(world, req))
        obs.record("kv_chunk_sends", kv_chunk_sends(world, req))

    _decide(obs, action, record)


@probe.case(
    "result.delivered_twice",
    "a bootstrapped request is aborted and its final prefill result is delivered twice",
    decision=DECISION,
    using=_world,
)
def _(obs: kp.Observations, world) -> None:
    req, index = _admitted(obs, world, "twice", 307, bootstrap=KVPoll.WaitingForInput)
    _abort_running(req)
    first = {}

    def action():
        _deliver_result(world, req)
        first.update(inflight=inflight_count(world, req), sends=kv_chunk_sends(world, req),
                     kv_releases=kv_releases(world, req), metadata_frees=_frees_of(world, index))
        _deliver_result(world, req)

    def record():
        obs.record("after_first", first)
        obs.record("inflight_entries", inflight_count(world, req))
        obs.record("kv_chunk_sends", kv_chunk_sends(world, req))
        obs.record("kv_releases", kv_releases(world, req))
        obs.record("metadata_frees", _frees_of(world, index))
        obs.record("output_streams", streamed(world, req))
        obs.record("finish_reason", reason_name(req.finished_reason))

    _decide(obs, action, record)


@probe.case(
    "result.aborted_final_pending_bootstrap",
    "an optimistic request (prefilled before its bootstrap completed) is aborted; its final result arrives "
    "while the bootstrap is still pending",
    decision=DECISION,
    using=_world,
)
def _(obs: kp.Observations, world) -> None:
    req, index = _admitted(obs, world, "final-pending", 308, bootstrap=KVPoll.Bootstrapping, later=(KVPoll.Bootstrapping,))
    _abort_running(req)

    def record():
        record_resources(obs, world, req, index)
        obs.record("parked_pending_bootstrap", bool(req.pending_bootstrap) and inflight_count(world, req) > 0)
        obs.record("requeued_for_retry", any(r is req for r in (*world.scheduler.waiting_queue, *world.queue.queue)))
        obs.record("sender_abort_calls", world.scripts[req.bootstrap_room].aborts)
        obs.record("finish_reason", reason_name(req.finished_reason))

    _decide(obs, lambda: _deliver_result(world, req), record)


@probe.case(
    "result.grammar_rejected",
    "a bootstrapped request with a grammar: its final result's sampled token is rejected by the grammar "
    "(accept_token raises ValueError)",
    decision=DECISION,
    using=_world,
)
def _(obs: kp.Observations, world) -> None:
    from sglang.srt.constrained.base_grammar_backend import BaseGrammarObject

    req, index = _admitted(obs, world, "grammar", 309, bootstrap=KVPoll.WaitingForInput)
    grammar = probe.mock("grammar", BaseGrammarObject, absorbs=("accept_token",))
    grammar.accept_token.side_effect = ValueError("token 7 not allowed by the grammar")
    req.grammar = grammar

    def record():
        record_resources(obs, world, req, index)
        script = world.scripts[req.bootstrap_room]
        obs.record("sent_from_released_row", any(not s["row_held"] for s in script.sent))
        obs.record("sender_abort_calls", script.aborts)
        obs.record("finish_reason", reason_name(req.finished_reason or req.to_finish))

    _decide(obs, lambda: _deliver_result(world, req), record)


if __name__ == "__main__":
    probe.main()

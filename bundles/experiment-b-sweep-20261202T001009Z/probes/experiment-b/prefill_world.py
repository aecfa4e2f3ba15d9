"""Experiment B's scaffolding around the prefill result path (imported by prefill_result_cleanup.py).

The real SGLang code under test (from PYTHONPATH); the strict KV sender and tree cache; the
scheduler world with the real prefill mixin bound; requests admitted, bootstrapped and
allocated the way each release does it; and the per-request counters every case records.
``prefill_result_cleanup.py`` declares the probe, its mocks and its cases; this module
serves that probe (``declare``).
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

probe: kp.Probe  # the probe these helpers serve (declare)

# Present in every release the sglang-cpu profile imports (0.5.13 onwards).
import sglang
import torch
from sglang.srt.disaggregation import prefill as prefill_mod
from sglang.srt.disaggregation import utils as disagg_utils
from sglang.srt.disaggregation.base.conn import KVArgs, KVPoll, KVTransferMetric
from sglang.srt.disaggregation.common.conn import CommonKVManager, CommonKVSender
from sglang.srt.disaggregation.prefill import SchedulerDisaggregationPrefillMixin
from sglang.srt.managers import scheduler as scheduler_mod
from sglang.srt.managers.schedule_batch import FINISH_ABORT, Req
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.mem_cache import memory_pool
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

HAS_RETIRE = hasattr(SchedulerDisaggregationPrefillMixin, "_retire_aborted_prefill_result")

PAGE_SIZE = 1
PROMPT_LEN = 8
POOL_ROWS = 4
POOL_TOKENS = 64
MAX_CONTEXT = 16
METADATA_SLOTS = 4
NUM_KV_HEADS = 8
BOOTSTRAP_PORT = 8998
DUMMY_MODEL = "dummy"

# --- configuration and ranks, the way the scheduler process states them ----------
def _optimistic_field() -> str | None:
    """This release's name for the optimistic-prefill budget (it was renamed in 0.5.16)."""
    params = inspect.signature(ServerArgs).parameters
    return next((n for n in ("optimistic_prefill_attempts", "optimistic_prefill_retries") if n in params), None)


OPTIMISTIC = _optimistic_field()


def declare(served: kp.Probe) -> None:
    """Serve ``served``: its facts about the code under test, then every non-default setting."""
    global probe
    probe = served
    probe.fact("sglang_version", getattr(sglang, "__version__", None))
    probe.fact("sglang_file", os.path.abspath(sglang.__file__))
    probe.fact("prefill_module_file", os.path.abspath(prefill_mod.__file__))
    probe.fact("has_retire_aborted_prefill_result", HAS_RETIRE)
    probe.fact("torch_version", torch.__version__)
    probe.configure("model_path", DUMMY_MODEL, default=None,
                    why="SGLang's own dummy-model short-circuit: ServerArgs skips resolving a real model's config")
    probe.configure("disaggregation_mode", "prefill", default="null", why="the result path under test is the PD prefill side")
    probe.configure("page_size", PAGE_SIZE, default=None,
                    why="resolution leaves it unset for the dummy model; release_kv_cache reads it (1 is what it "
                        "resolves to without a backend that needs larger pages)")
    probe.configure("enable_hicache_storage", True, default=False,
                    why="scheduler flag: HiCache abort releases (tree_cache.finish(handle, ABORT) or "
                        "release_aborted_request) become visible")
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
        self.sent.append({"row_held": holds_kv_row(self.req), "pages_shape": shape,
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


def holds_kv_row(req: Req) -> bool:
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
        if not holds_kv_row(req):
            raise _refuse(f"tree_cache.{name}", f"{name} on request {req.rid}, which no longer holds a KV "
                          "row: the real cache would index a released row")
        return None
    return call


def _spec_none():
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return SpeculativeAlgorithm.NONE


@contextlib.contextmanager
def scheduler_world():
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
    set_extend(req, 0, PROMPT_LEN)
    return req


def set_extend(req: Req, start: int, end: int) -> None:
    """The chunk [start, end) ran: extend_range (0.5.16-0.5.21), extend_end (0.5.22+), fill_len before."""
    if hasattr(req, "set_extend_range"):
        req.set_extend_range(start, end)
    elif hasattr(req, "extend_end"):
        req.prefix_len, req.extend_end = start, end
    else:
        req.fill_len = end


def abort_running(req: Req) -> None:
    """Scheduler.abort_request, 'Abort method 3' for a request in a running batch."""
    req.to_finish = FINISH_ABORT()


def deliver_result(world: World, req: Req) -> None:
    """Hand one prefill result for ``req`` to the real result processor."""
    batch = SimpleNamespace(reqs=[req], spec_info=None, prefill_stats=None, dp_cooperation_info=None)
    result = GenerationBatchResult(next_token_ids=torch.tensor([7]))  # the sampled token
    world.scheduler.process_batch_result_disagg_prefill(batch, result)


# --- per-request counters ------------------------------------------------------
def kv_chunk_sends(world: World, req: Req) -> int:
    return len(world.scripts[req.bootstrap_room].sent)


def frees_of(world: World, index: int) -> int:
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
    obs.record(prefix + "metadata_frees", frees_of(world, index))
    obs.record(prefix + "kv_releases", kv_releases(world, req))
    obs.record(prefix + "hicache_abort_releases", hicache_abort_releases(world, req))
    aborted = isinstance(req.finished_reason, FINISH_ABORT)
    obs.record(prefix + "aborted_output_sent", streamed(world, req) > 0 and aborted)


def admitted(obs, world: World, rid: str, room: int, *, bootstrap: KVPoll, later=(KVPoll.Transferring,)):
    """``_admit``, then the preconditions of a request that finished bootstrap and prefill
    (and, when its sender still reports Bootstrapping, of one prefilled optimistically).

    Returns the request and its metadata slot."""
    req = _admit(world, rid, room, bootstrap=bootstrap, later=later)
    obs.precondition("kv_row_held", holds_kv_row(req))
    obs.precondition("metadata_buffer_held", req.metadata_buffer_index is not None and req.metadata_buffer_index >= 0)
    if bootstrap == KVPoll.Bootstrapping:
        obs.precondition("pending_bootstrap", bool(req.pending_bootstrap))
    return req, req.metadata_buffer_index


# --- the decision point -----------------------------------------------------------
def decide(obs: kp.Observations, action, record) -> None:
    """Run the real call under test; what it did is recorded even if it raised."""
    with obs.decision():
        try:
            action()
        finally:
            obs.record("refused_calls", list(REFUSED))
            record()

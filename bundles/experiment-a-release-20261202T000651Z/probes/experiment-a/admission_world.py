"""Experiment A's scaffolding around the PD admission doors (imported by admission_doors.py).

The real SGLang code under test (from PYTHONPATH), the collaborators built the way each
release builds them, the requests marked the way the scheduler marks them, and what a
door did to one request. ``admission_doors.py`` declares the probe, its mocks and its
cases; this module serves that probe (``declare``).
"""

from __future__ import annotations

import contextlib
import hashlib
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
from sglang.srt.disaggregation import decode as decode_mod
from sglang.srt.disaggregation import prefill as prefill_mod
from sglang.srt.disaggregation import utils as disagg_utils
from sglang.srt.disaggregation.base.conn import KVArgs
from sglang.srt.disaggregation.common.conn import (
    CommonKVManager,
    CommonKVReceiver,
    CommonKVSender,
)
from sglang.srt.managers import utils as managers_utils
from sglang.srt.managers.schedule_batch import FINISH_ABORT, Req
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer
from sglang.srt.mem_cache import memory_pool
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

# Sizes from the incident: 1,048,576-token context, 681,280-token prefill pool.
CONTEXT_LEN = 1_048_576
POOL_TOKENS = 681_280
# tp_worker.get_worker_info: min(context_len - 1, kv_capacity - 1) - 5
MAX_REQ_INPUT_LEN = min(CONTEXT_LEN - 1, POOL_TOKENS - 1) - 5
LONG_PROMPT = POOL_TOKENS + 1
SHORT_PROMPT = 128
NUM_KV_HEADS = 8
HEAD_DIM = 8
BOOTSTRAP_PORT = 8998
REQ_ROWS = 4
METADATA_SLOTS = 8
DUMMY_MODEL = "dummy"


def _sha256(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def _record_facts() -> None:
    probe.fact("sglang_file", sglang.__file__)
    probe.fact("sglang_root", os.path.dirname(os.path.dirname(os.path.abspath(sglang.__file__))))
    probe.fact("sglang_version", getattr(sglang, "__version__", None))
    probe.fact("has_is_unadmitted_reject", hasattr(disagg_utils, "is_unadmitted_reject"))
    probe.fact("has_retire_unadmitted_request", hasattr(Scheduler, "retire_unadmitted_request"))
    probe.fact("prefill_add_signature", str(inspect.signature(prefill_mod.PrefillBootstrapQueue.add)))
    probe.fact("decode_add_signature", str(inspect.signature(decode_mod.DecodePreallocQueue.add)))
    files = {
        "prefill": prefill_mod.__file__,
        "decode": decode_mod.__file__,
        "managers_utils": managers_utils.__file__,
        "disagg_utils": disagg_utils.__file__,
        "schedule_batch": inspect.getsourcefile(Req),
        "scheduler": inspect.getsourcefile(Scheduler),
    }
    probe.fact("source_files", files)
    probe.fact("source_sha256", {k: _sha256(v) for k, v in files.items()})
    probe.fact("incident_sizes", {"context_len": CONTEXT_LEN, "pool_tokens": POOL_TOKENS,
                                  "max_req_input_len": MAX_REQ_INPUT_LEN, "long_prompt": LONG_PROMPT})


def declare(served: kp.Probe) -> None:
    """Serve ``served``: its facts about the code under test, then its probe-wide configuration."""
    global probe
    probe = served
    _record_facts()
    probe.configure("model_path", DUMMY_MODEL, default=None,
                    why="SGLang's own dummy-model short-circuit: ServerArgs skips resolving a real model's config")


# --- configuration, the way the scheduler process publishes it ----------------
@contextlib.contextmanager
def _published(mode: str):
    """Publish PD config for ``mode`` and state that this process is rank 0 of 1."""
    probe.configure("disaggregation_mode", mode, default="null", why="the admission doors exist only in PD mode")
    server_args = ServerArgs(model_path=DUMMY_MODEL, disaggregation_mode=mode)
    set_global_server_args_for_scheduler(server_args)
    with _rank0():
        yield server_args


@contextlib.contextmanager
def _rank0():
    """State that this process is rank 0 of a one-process world (the launcher is not here).

    From 0.5.14 the runtime context takes scoped rank overrides; older code paths
    (all of 0.5.13, some of 0.5.14/0.5.15) read the process groups that
    ``initialize_model_parallel`` would have set, so those globals get
    one-process group stand-ins wherever they are still unset.
    """
    runtime_context = kp.optional("sglang.srt.runtime_context")
    with _legacy_groups():
        if runtime_context is None:
            yield
            return
        wanted = {"tp_rank": 0, "pp_rank": 0, "dp_rank": 0, "attn_tp_rank": 0, "attn_cp_rank": 0,
                  "attn_dp_rank": 0, "attn_tp_group": _one_process_group()}
        with runtime_context.get_parallel().override(**_known_parallel_fields(runtime_context, wanted)):
            yield


def _known_parallel_fields(runtime_context, wanted: dict) -> dict:
    """The subset of ``wanted`` this release's ParallelContext declares."""
    fields = getattr(runtime_context, "_parallel_fields", None)
    if fields is not None:
        return {k: v for k, v in wanted.items() if k in fields()}
    declared = {name for name, _ in inspect.getmembers(type(runtime_context.get_parallel()))}
    return {k: v for k, v in wanted.items() if k in declared}


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


# --- collaborators: real where they run on a CPU, strict mocks elsewhere ---------
class World:
    """One scheduler's pools, queues' collaborators and mocks, built fresh per case."""

    def __init__(self, server_args) -> None:
        self.server_args = server_args
        self.kv_pool = kp.build(
            memory_pool.MHATokenToKVPool, size=POOL_TOKENS, page_size=1, dtype=torch.bfloat16,
            head_num=1, head_dim=HEAD_DIM, layer_num=1, device="cpu", enable_memory_saver=False,
            start_layer=0, end_layer=0, enable_alt_stream=False)
        self.allocator = kp.build(TokenToKVPoolAllocator, size=POOL_TOKENS, page_size=1, dtype=torch.bfloat16,
                                  device="cpu", kvcache=self.kv_pool, need_sort=False)
        self.req_to_token_pool = kp.build(memory_pool.ReqToTokenPool, size=REQ_ROWS, max_context_len=SHORT_PROMPT * 2,
                                          device="cpu", enable_memory_saver=False)
        self.metadata_allocator = kp.build(disagg_utils.ReqToMetadataIdxAllocator, size=METADATA_SLOTS)
        self.metadata_buffers = kp.build(
            disagg_utils.MetadataBuffers, size=METADATA_SLOTS, hidden_size=16, hidden_states_dtype=torch.float32,
            max_sampling_mask_tokens=getattr(server_args, "sampling_mask_max_tokens", None) or 0)
        self.scheduler = self._scheduler()

    def _scheduler(self):
        sched = probe.mock("scheduler", Scheduler)
        model_runner = SimpleNamespace(
            max_token_pool_size=POOL_TOKENS, effective_max_total_num_tokens=POOL_TOKENS,
            effective_logical_max_total_num_tokens=POOL_TOKENS, kv_cache_dtype_str="auto")
        sched.tp_worker = SimpleNamespace(model_runner=model_runner, is_hybrid_swa=False)
        sched.model_config = SimpleNamespace(
            num_hidden_layers=1, hf_text_config=SimpleNamespace(num_hidden_layers=1),
            hf_config=SimpleNamespace(num_hidden_layers=1), get_total_num_kv_heads=lambda: NUM_KV_HEADS)
        sched.server_args = self.server_args
        sched.spec_algorithm = _spec_none()
        sched.req_to_token_pool = self.req_to_token_pool
        sched.token_to_kv_pool_allocator = self.allocator
        sched.tree_cache = probe.mock("tree_cache", RadixCache, absorbs=("finish",))
        sched.output_streamer = probe.mock("output_streamer", SchedulerOutputStreamer, absorbs=("stream_output",))
        sched.enable_hisparse = False
        sched.enable_decode_hicache = False
        sched.kv_shard_widening = 1
        sched.rust_server = None
        sched.random_seed = 0
        sched.sliding_window_size = None
        # The scheduler's own parallel-state snapshot in releases that keep one.
        sched.ps = SimpleNamespace(tp_rank=0, pp_rank=0, pp_size=1, dp_rank=0, gpu_id=0)
        coordinator = _beam_coordinator_class()
        if coordinator is not None:
            sched.beam_coordinator = probe.mock("beam_coordinator", coordinator, absorbs=("retire_group",))
        for name in ("_release_aborted_request", "retire_unadmitted_request"):
            real = getattr(Scheduler, name, None)
            if real is not None:
                setattr(sched, name, _Counting(types.MethodType(real, sched)))
        return sched

    def known_queue_args(self, transfer_queue=None) -> dict:
        """Every argument a release's queue constructors have asked for, by name."""
        return {
            "token_to_kv_pool": self.kv_pool, "draft_token_to_kv_pool": None,
            "req_to_metadata_buffer_idx_allocator": self.metadata_allocator,
            "metadata_buffers": self.metadata_buffers, "tp_rank": 0, "tp_size": 1, "dp_size": 1,
            "gpu_id": 0, "bootstrap_port": BOOTSTRAP_PORT, "gloo_group": None,
            "max_total_num_tokens": POOL_TOKENS, "scheduler": self.scheduler, "pp_rank": 0, "pp_size": 1,
            "transfer_backend": disagg_utils.TransferBackend.MOONCAKE, "scheduler_stage_metrics": None,
            "req_to_token_pool": self.req_to_token_pool, "token_to_kv_pool_allocator": self.allocator,
            "transfer_queue": transfer_queue, "tree_cache": self.scheduler.tree_cache,
            "num_reserved_decode_tokens": 512,
        }


@contextlib.contextmanager
def _world(mode: str):
    """The case's set-up: PD config for ``mode`` published, rank 0 stated, a fresh World."""
    with _published(mode) as server_args:
        yield World(server_args)


def prefill_world():
    """A case's set-up at the prefill door."""
    return _world("prefill")


def decode_world():
    """A case's set-up at the decode door."""
    return _world("decode")


class _Counting:
    """The real bound method, counting its calls (not a mock: nothing is absorbed)."""

    def __init__(self, method) -> None:
        self.method = method
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.method(*args, **kwargs)


def _spec_none():
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return SpeculativeAlgorithm.NONE


def _beam_coordinator_class():
    return kp.optional("sglang.srt.beam_search.coordinator", "BeamCoordinator")


@contextlib.contextmanager
def _transport(module, role_class):
    """Patch ``module.get_kv_class``: real KVArgs, autospec'd manager and ``role_class``."""
    manager_cls = probe.mock("kv_transport", CommonKVManager, instance=False, absorbs=("()",))
    manager_cls.return_value.prefill_info_table = {}  # no prefill peer resolved yet: the slow path
    classes = {
        disagg_utils.KVClassType.KVARGS: KVArgs,
        disagg_utils.KVClassType.MANAGER: manager_cls,
        role_class[0]: probe.mock("kv_transport", role_class[1], instance=False, absorbs=("()",)),
    }

    def get_kv_class(_backend, class_type):
        if class_type not in classes:
            raise kp.RejectedCall(f"get_kv_class({class_type}): this probe provides no such transport class")
        return classes[class_type]

    with mock.patch.object(module, "get_kv_class", get_kv_class):
        yield classes[role_class[0]]


def _prefill_queue(world: World):
    return kp.build(prefill_mod.PrefillBootstrapQueue, **world.known_queue_args())


def _decode_queue(world: World):
    transfer_queue = kp.build(decode_mod.DecodeTransferQueue, **world.known_queue_args())
    return kp.build(decode_mod.DecodePreallocQueue, **world.known_queue_args(transfer_queue))


# --- requests, built and marked the way the scheduler does it --------------------
def new_req(rid: str, prompt_len: int, room: int) -> Req:
    return Req(
        rid,
        "",
        array("q", [7]) * prompt_len,
        SamplingParams(max_new_tokens=16),
        bootstrap_host="10.0.0.2",
        bootstrap_port=BOOTSTRAP_PORT,
        bootstrap_room=room,
    )


def rejected(obs, rid: str, room: int) -> Req:
    """What handle_generate_request does with an over-long prompt: a rejection still pending."""
    req = new_req(rid, LONG_PROMPT, room)
    error_msg = managers_utils.validate_input_length(req, MAX_REQ_INPUT_LEN, False)
    if not error_msg:
        raise kp.CannotObserve("validate_input_length accepted a prompt over the limit")
    req.set_finish_with_abort(error_msg)
    obs.precondition("rejection_pending", req.to_finish is not None and not req.finished())
    return req


def running_abort(req: Req) -> Req:
    """Abort method 3 of Scheduler.abort_request: mark a running request."""
    req.to_finish = FINISH_ABORT()
    return req


def decoded_abort(rid: str, room: int) -> Req:
    """A running request that had decoded three tokens, then marked aborted."""
    req = running_abort(new_req(rid, SHORT_PROMPT, room))
    req.output_ids = [11, 12, 13]
    return req


def holds_kv_row(req: Req) -> bool:
    kv = getattr(req, "kv", None)
    return kv.holds_kv if kv is not None else req.req_pool_idx is not None


def retraction_backup(req: Req):
    """Where this release keeps the host copy of a retracted request's KV."""
    for holder, name in ((getattr(req, "kv", None), "retraction_backup"), (req, "retraction_backup"),
                         (req, "kv_cache_cpu")):
        if holder is not None and getattr(holder, name, None) is not None:
            return getattr(holder, name)
    return None


def take_retraction_backup(world: World, req: Req) -> None:
    """Prefill the request's KV row, back it up with the release's own offload, free the row."""
    world.req_to_token_pool.alloc([req])
    slots = world.allocator.alloc(len(req.origin_input_ids))
    row = req.kv.req_pool_idx if getattr(req, "kv", None) is not None else req.req_pool_idx
    world.req_to_token_pool.write((row, slice(0, len(slots))), slots)
    req.origin_input_ids = req.origin_input_ids  # seqlen reads origin + output ids
    req.offload_kv_cache(world.req_to_token_pool, world.allocator)
    world.req_to_token_pool.free(req)


def _record_before(obs, req: Req) -> None:
    obs.record("finished_before_add", req.finished())
    obs.record("has_pending_abort", req.to_finish is not None)
    obs.record("placeholder_len", len(req.origin_input_ids))
    verdict = getattr(disagg_utils, "is_unadmitted_reject", None)
    obs.record("is_unadmitted_reject", verdict(req) if verdict is not None else None)


def _built_for(transport_cls, req: Req) -> bool:
    return any(c.kwargs.get("bootstrap_room") == req.bootstrap_room for c in transport_cls.call_args_list)


def _abort_output_sent(sched, req: Req) -> bool:
    return any(c.args and req in c.args[0] for c in sched.output_streamer.stream_output.call_args_list)


def _retired(sched) -> bool:
    spy = sched.retire_unadmitted_request if hasattr(Scheduler, "retire_unadmitted_request") else None
    return bool(spy is not None and spy.calls)


def _cache_released(sched, req: Req) -> bool:
    if not hasattr(RadixCache, "finish"):  # the cache of this release has no per-request finish
        return False
    handle = getattr(req, "cache_request_handle", None)
    return any(c.args and c.args[0] is handle for c in sched.tree_cache.finish.call_args_list)


def run_prefill(obs, world: World, req: Req) -> None:
    sched = world.scheduler
    metadata_index_before = req.metadata_buffer_index
    free_slots_before = world.metadata_allocator.available_size()
    with _transport(prefill_mod, (disagg_utils.KVClassType.SENDER, CommonKVSender)) as sender_cls:
        queue = _prefill_queue(world)
        _record_before(obs, req)
        with obs.decision():
            queue.add(req, NUM_KV_HEADS)  # as Scheduler._add_request_to_queue does
    obs.record("enqueued", req in queue.queue)
    obs.record("sender_created", _built_for(sender_cls, req))
    obs.record("retired", _retired(sched))
    obs.record("abort_output_sent", _abort_output_sent(sched, req))
    obs.record("finished_after_add", req.finished())
    obs.record("pending_bootstrap", bool(getattr(req, "pending_bootstrap", False)))
    obs.record("metadata_buffer_allocated", world.metadata_allocator.available_size() < free_slots_before)
    obs.record("metadata_buffer_index_kept", req.metadata_buffer_index == metadata_index_before)
    obs.record("cache_released", _cache_released(sched, req))


def run_decode(obs, world: World, req: Req, **flags) -> None:
    for name in flags:
        kp.require_param(decode_mod.DecodePreallocQueue.add, name)
    sched = world.scheduler
    free_slots_before = world.metadata_allocator.available_size()
    with _transport(decode_mod, (disagg_utils.KVClassType.RECEIVER, CommonKVReceiver)) as receiver_cls:
        queue = _decode_queue(world)
        _record_before(obs, req)
        with obs.decision():
            queue.add(req, **flags)  # as Scheduler._add_request_to_queue / resume paths do
    queued = [d.req for d in queue.queue]
    obs.record("enqueued", req in queued or req in queue.retracted_queue)
    obs.record("in_prealloc_queue", req in queued)
    obs.record("in_retracted_queue", req in queue.retracted_queue)
    obs.record("receiver_created", _built_for(receiver_cls, req))
    obs.record("retired", _retired(sched))
    obs.record("abort_output_sent", _abort_output_sent(sched, req))
    obs.record("finished_after_add", req.finished())
    obs.record("metadata_buffer_allocated", world.metadata_allocator.available_size() < free_slots_before)

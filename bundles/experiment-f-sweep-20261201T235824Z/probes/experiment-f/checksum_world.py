"""Experiment F's scaffolding around the decode-side KV checksum (imported by handoff_checksum.py).

The real SGLang code under test (from PYTHONPATH), a decode scheduler whose prealloc queue
is built by its own ``__init__`` under the published configuration (which is what builds,
or does not build, the checksum computer), real CPU KV pools on both sides of the handoff,
requests built the way each side holds them, and what the decode batch builder did to one
request. ``handoff_checksum.py`` declares the probe, its mocks and its cases; this module
serves that probe (``declare``).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import inspect
import os
import types
import zlib
from array import array
from types import SimpleNamespace
from unittest import mock

import kvprobe_probe as kp

probe: kp.Probe  # the probe these helpers serve (declare)

# Present in every release the sglang-cpu profile imports (0.5.13 onwards).
import sglang
import torch
from sglang.srt.disaggregation import decode as decode_mod
from sglang.srt.disaggregation import utils as disagg_utils
from sglang.srt.disaggregation.base.conn import KVArgs
from sglang.srt.disaggregation.common.conn import CommonKVManager, CommonKVReceiver
from sglang.srt.disaggregation.decode import SchedulerDisaggregationDecodeMixin
from sglang.srt.disaggregation.prefill import SchedulerDisaggregationPrefillMixin
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer
from sglang.srt.mem_cache import memory_pool
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

# The operator-facing option (--disaggregation-enable-kv-checksum) and the module of #39500.
OPTION = "disaggregation_enable_kv_checksum"
CHECKSUM_MODULE = "sglang.srt.disaggregation.checksum"
# The decode-side methods of the fix, bound for real on the scheduler where they exist.
FIX_METHODS = ("get_new_prebuilt_batch", "_verify_kv_checksums", "_handle_kv_checksum_mismatch")

PROMPT_LEN = 8  # what decode reserved: the original prompt's length
PAGE_SIZE = 1
HEAD_DIM = 8
REQ_ROWS = 4
METADATA_SLOTS = 4
NUM_KV_HEADS = 8
BOOTSTRAP_PORT = 8998
DUMMY_MODEL = "dummy"
EARLIER_KV = 3.0  # the bytes an earlier request left in decode's pages
THIS_KV = 5.0  # the bytes this request's prefill computed


def _sha256(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def declare(served: kp.Probe) -> None:
    """Serve ``served``: its facts about the code under test, then its probe-wide configuration."""
    global probe
    probe = served
    checksum = kp.optional(CHECKSUM_MODULE)
    probe.fact("sglang_version", getattr(sglang, "__version__", None))
    probe.fact("sglang_file", os.path.abspath(sglang.__file__))
    probe.fact("decode_module_file", os.path.abspath(decode_mod.__file__))
    probe.fact("decode_module_sha256", _sha256(decode_mod.__file__))
    probe.fact("has_checksum_module", checksum is not None)
    probe.fact("has_option", OPTION in inspect.signature(ServerArgs).parameters)
    probe.fact("decode_fix_methods", [n for n in FIX_METHODS if hasattr(SchedulerDisaggregationDecodeMixin, n)])
    probe.fact("torch_version", torch.__version__)
    probe.configure("model_path", DUMMY_MODEL, default=None,
                    why="SGLang's own dummy-model short-circuit: ServerArgs skips resolving a real model's config")
    probe.configure("disaggregation_mode", "decode", default="null",
                    why="the checksum is verified by the PD decode scheduler")
    probe.configure("page_size", PAGE_SIZE, default=None,
                    why="resolution leaves it unset for the dummy model; one token per page, so a page index "
                        "is a KV slot")


def require_feature():
    """The checksum module, or NotPresent naming what this release lacks of #39500's option."""
    missing = []
    if OPTION not in inspect.signature(ServerArgs).parameters:
        missing.append(f"sglang.srt.server_args.ServerArgs({OPTION}=)")
    checksum = kp.optional(CHECKSUM_MODULE)
    if checksum is None:
        missing.append(CHECKSUM_MODULE)
    if missing:
        raise kp.NotPresent(*missing)
    return checksum


# --- configuration and ranks, the way the scheduler process states them ----------------
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


def _one_rank_flags(flags, _group, _op):
    """One rank: the reduction of a single rank's flags is those flags (SGLang's own single-rank rule)."""
    return list(flags)


# --- the digest: the stand-in for the CUDA kernel ----------------------------------------
class Digests:
    """Counts what the stood-in KvChecksumComputer.compute digested, per computer."""

    def __init__(self) -> None:
        self.calls: dict[int, int] = {}

    def compute(self, computer, kv_page_indices, state_indices=None) -> int:
        """KvChecksumComputer.compute without CUDA: Adler-32 over the same byte regions.

        The real compute hands (data_ptr, item_len, page indices) of every registered KV
        buffer (then every state buffer) to a JIT CUDA kernel that digests, in that order,
        item_len bytes at data_ptr + page * item_len. The buffers here are CPU tensors of the
        real pools, so the same regions are read from host memory and folded with zlib's
        Adler-32 in the same order.
        """
        self.calls[id(computer)] = self.calls.get(id(computer), 0) + 1
        regions = [(p, n, kv_page_indices) for p, n in zip(computer._kv_data_ptrs, computer._kv_item_lens)]
        if computer._state_data_ptrs:
            if state_indices is None:
                raise kp.RejectedCall("state buffers registered but no state indices: the real compute asserts")
            regions += [(p, n, state_indices) for p, n in zip(computer._state_data_ptrs, computer._state_item_lens)]
        value = 1
        for base, item_len, indices in regions:
            for page in indices.reshape(-1).tolist():
                value = zlib.adler32(ctypes.string_at(base + int(page) * item_len, item_len), value)
        return value

    def of(self, computer) -> int:
        return self.calls.get(id(computer), 0)


def digest_inputs_readable(computer) -> bool:
    """Whether the computer keeps what the stand-in reads (names of 0.5.21-0.5.23)."""
    return all(hasattr(computer, n) for n in ("_kv_data_ptrs", "_kv_item_lens", "_state_data_ptrs",
                                              "_state_item_lens"))


# --- KV pools, real, on the CPU -----------------------------------------------------------
class Pools:
    """One side's KV pool, slot allocator and request rows (SGLang's own CPU classes)."""

    def __init__(self, tokens: int) -> None:
        self.kv = kp.build(
            memory_pool.MHATokenToKVPool, size=tokens, page_size=PAGE_SIZE, dtype=torch.bfloat16,
            head_num=1, head_dim=HEAD_DIM, layer_num=1, device="cpu", enable_memory_saver=False,
            start_layer=0, end_layer=0, enable_alt_stream=False)
        self.allocator = kp.build(TokenToKVPoolAllocator, size=tokens, page_size=PAGE_SIZE, dtype=torch.bfloat16,
                                  device="cpu", kvcache=self.kv, need_sort=False)
        self.req_to_token = kp.build(memory_pool.ReqToTokenPool, size=REQ_ROWS, max_context_len=PROMPT_LEN * 2,
                                     device="cpu", enable_memory_saver=False)

    def write(self, slots, value: float) -> None:
        """What a forward pass (or a transfer) leaves in these slots: K and V of every layer."""
        for buffers in (self.kv.k_buffer, self.kv.v_buffer):
            for layer in buffers:
                layer[slots] = value

    def holds(self, slots, value: float) -> bool:
        return all(bool((layer[slots] == value).all()) for b in (self.kv.k_buffer, self.kv.v_buffer) for layer in b)

    def place(self, req: Req, length: int):
        """A KV row for ``req`` and ``length`` slots from the allocator, written into the row."""
        self.req_to_token.alloc([req])
        slots = self.allocator.alloc(length)
        if slots is None:
            raise kp.CannotObserve(f"the allocator could not give {length} slots")
        self.req_to_token.write((req.kv.req_pool_idx, slice(0, length)), slots)
        return slots

    def scheduler_view(self):
        """What page_indices_for_request / state_indices_for_request read of a scheduler."""
        return SimpleNamespace(token_to_kv_pool_allocator=self.allocator, req_to_token_pool=self.req_to_token,
                               sliding_window_size=None)


# --- the decode scheduler ------------------------------------------------------------------
class World:
    """A decode scheduler: real pools and prealloc queue, the fix's methods bound for real."""

    def __init__(self, server_args, digests: Digests) -> None:
        self.server_args = server_args
        self.digests = digests
        self.pools = Pools(PROMPT_LEN)  # exactly one prompt's worth: freed pages come back to the next request
        self.metadata_allocator = kp.build(disagg_utils.ReqToMetadataIdxAllocator, size=METADATA_SLOTS)
        self.metadata_buffers = metadata_buffers(server_args)
        self.scheduler = self._scheduler()

    def _scheduler(self):
        sched = probe.mock("scheduler", Scheduler, absorbs=("_get_new_prebuilt_batch",))
        for name in FIX_METHODS:
            func = getattr(SchedulerDisaggregationDecodeMixin, name, None)
            if func is not None:
                setattr(sched, name, types.MethodType(func, sched))
        sched.server_args = self.server_args
        # Scheduler's own class default (0.5.21+); the prealloc queue's constructor sets it, or leaves it.
        sched.kv_checksum_computer = None
        sched.req_to_token_pool = self.pools.req_to_token
        sched.token_to_kv_pool_allocator = self.pools.allocator
        sched.tree_cache = probe.mock("tree_cache", RadixCache)
        sched.output_streamer = probe.mock("output_streamer", SchedulerOutputStreamer, absorbs=("stream_output",))
        sched.metrics_reporter = probe.mock("metrics_reporter", kp.require(_scheduler_module(), "SchedulerMetricsReporter"),
                                            enable_metrics=False)
        sched.ngram_embedding_manager = probe.mock("ngram_embedding_manager", _ngram_manager_class(),
                                                   absorbs=("prepare_for_forward",))
        sched.spec_algorithm = _spec_none()
        sched.tp_worker = SimpleNamespace(
            model_runner=SimpleNamespace(
                max_token_pool_size=PROMPT_LEN, effective_max_total_num_tokens=PROMPT_LEN,
                effective_logical_max_total_num_tokens=PROMPT_LEN, kv_cache_dtype_str="auto"),
            is_hybrid_swa=False)
        sched.model_config = SimpleNamespace(
            num_hidden_layers=1, hf_text_config=SimpleNamespace(num_hidden_layers=1),
            hf_config=SimpleNamespace(num_hidden_layers=1), get_total_num_kv_heads=lambda: NUM_KV_HEADS)
        sched.ps = SimpleNamespace(tp_rank=0, pp_rank=0, pp_size=1, dp_rank=0, gpu_id=0)
        sched.enable_hisparse = False
        sched.enable_decode_hicache = False
        sched.kv_shard_widening = 1
        sched.rust_server = None
        sched.random_seed = 0
        sched.sliding_window_size = None
        # Nothing waits to be batched but the transferred request, which _get_new_prebuilt_batch hands in;
        # a get_new_prebuilt_batch that still forms the batch itself (0.5.20's) finds nothing to build.
        sched.waiting_queue = []
        sched.grammar_manager = probe.mock(
            "grammar_manager", kp.require(kp.require_module("sglang.srt.constrained.grammar_manager"), "GrammarManager"),
            absorbs=("has_waiting_grammars",))
        sched.grammar_manager.has_waiting_grammars.side_effect = lambda: False
        sched.chunked_req = None
        sched.future_map = None
        sched.attn_tp_cpu_group = None
        return sched

    def known_queue_args(self, transfer_queue=None) -> dict:
        """Every argument a release's decode queue constructors have asked for, by name."""
        return {
            "token_to_kv_pool": self.pools.kv, "draft_token_to_kv_pool": None,
            "req_to_metadata_buffer_idx_allocator": self.metadata_allocator,
            "metadata_buffers": self.metadata_buffers, "tp_rank": 0, "tp_size": 1, "dp_size": 1,
            "gpu_id": 0, "bootstrap_port": BOOTSTRAP_PORT, "gloo_group": None,
            "max_total_num_tokens": PROMPT_LEN, "scheduler": self.scheduler, "pp_rank": 0, "pp_size": 1,
            "transfer_backend": disagg_utils.TransferBackend.MOONCAKE, "scheduler_stage_metrics": None,
            "req_to_token_pool": self.pools.req_to_token, "token_to_kv_pool_allocator": self.pools.allocator,
            "transfer_queue": transfer_queue, "tree_cache": self.scheduler.tree_cache,
            "num_reserved_decode_tokens": 512,
        }

    def build_queues(self) -> None:
        """The decode queues, by their own constructors: the prealloc queue's sets the checksum computer."""
        transfer_queue = kp.build(decode_mod.DecodeTransferQueue, **self.known_queue_args())
        self.prealloc_queue = kp.build(decode_mod.DecodePreallocQueue, **self.known_queue_args(transfer_queue))
        self.transfer_queue = transfer_queue
        self.scheduler.disagg_decode_transfer_queue = transfer_queue
        self.scheduler.disagg_decode_prealloc_queue = self.prealloc_queue

    @property
    def computer(self):
        """What the real prealloc queue constructor left on the scheduler (None: no check)."""
        return self.scheduler.kv_checksum_computer


def metadata_buffers(server_args):
    """MetadataBuffers as Scheduler.init_disaggregation builds them: a checksum column where the option is on."""
    known = {"size": METADATA_SLOTS, "hidden_size": 16, "hidden_states_dtype": torch.float32,
             "max_sampling_mask_tokens": 0, "kv_checksum_enabled": bool(getattr(server_args, OPTION, False))}
    return kp.build(disagg_utils.MetadataBuffers, **known)


def _scheduler_module():
    return kp.require_module("sglang.srt.managers.scheduler")


def _ngram_manager_class():
    return kp.require(kp.require_module("sglang.srt.model_executor.model_runner_components.ngram_embedding_manager"),
                      "NgramEmbeddingManager")


def _spec_none():
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return SpeculativeAlgorithm.NONE


@contextlib.contextmanager
def _transport(tracked_manager):
    """Patch decode's get_kv_class: real KVArgs, an autospec'd manager that keeps the KVArgs it is given."""
    manager_cls = probe.mock("kv_transport", CommonKVManager, instance=False,
                             absorbs=("()", "().should_verify_kv_checksum"))
    manager = manager_cls.return_value
    manager.prefill_info_table = {}

    def construct(kv_args, *args, **kwargs):
        manager.kv_args = kv_args  # the real manager keeps them; the checksum computer is built from them
        return manager

    manager_cls.side_effect = construct
    if hasattr(CommonKVManager, "should_verify_kv_checksum"):
        # BaseKVManager's own answer (every peer's digest is comparable): one prefill peer, same layout.
        manager.should_verify_kv_checksum.side_effect = lambda _addr: True
    classes = {
        disagg_utils.KVClassType.KVARGS: KVArgs,
        disagg_utils.KVClassType.MANAGER: manager_cls,
        disagg_utils.KVClassType.RECEIVER: probe.mock("kv_transport", CommonKVReceiver, instance=False),
    }

    def get_kv_class(_backend, class_type):
        if class_type not in classes:
            raise kp.RejectedCall(f"get_kv_class({class_type}): this probe provides no such transport class")
        return classes[class_type]

    with mock.patch.object(decode_mod, "get_kv_class", get_kv_class):
        tracked_manager.append(manager)
        yield


@contextlib.contextmanager
def decode_world(enable: bool):
    """A case's set-up: #39500 present (else NotPresent), the option on or left at its default,
    PD decode config published, rank 0 stated, transport and the digest kernel stood in."""
    checksum = require_feature()
    fields = {"model_path": DUMMY_MODEL, "disaggregation_mode": "decode", "page_size": PAGE_SIZE}
    if enable:
        fields[OPTION] = probe.configure(
            OPTION, True, default=False,
            why="--disaggregation-enable-kv-checksum on this (decode) engine: the option under test")
    server_args = ServerArgs(**fields)
    set_global_server_args_for_scheduler(server_args)
    digests = Digests()
    real_release = decode_mod.release_kv_cache
    release = probe.track("release_kv_cache", mock.create_autospec(real_release), absorbs=("()",))
    with contextlib.ExitStack() as stack:
        # SGLang's own CI switch turns a mismatch into a RuntimeError; a deployment runs without it.
        stack.enter_context(mock.patch.dict(os.environ))
        os.environ.pop("SGLANG_IS_IN_CI", None)
        stack.enter_context(_rank0())
        # The launcher states this process's GPU; the computer is built for cuda:<gpu_id> (nothing runs there).
        stack.enter_context(kp.require_module("sglang.srt.runtime_context").get_device().override(gpu_id=0))
        stack.enter_context(mock.patch.object(checksum.KvChecksumComputer, "compute",
                                              lambda self, pages, state=None: digests.compute(self, pages, state)))
        stack.enter_context(mock.patch.object(decode_mod, "release_kv_cache", release))
        if hasattr(decode_mod, "all_reduce_flags"):
            stack.enter_context(mock.patch.object(decode_mod, "all_reduce_flags", _one_rank_flags))
        managers: list = []
        stack.enter_context(_transport(managers))
        world = World(server_args, digests)
        world.build_queues()
        world.checksum = checksum
        world.release = release
        world.release_signature = inspect.signature(real_release)
        yield world


# --- the handoff ------------------------------------------------------------------------------
def new_req(rid: str, prompt_len: int, room: int) -> Req:
    return Req(rid, "", array("q", range(1, prompt_len + 1)), SamplingParams(max_new_tokens=4),
               bootstrap_host="10.0.0.2", bootstrap_port=BOOTSTRAP_PORT, bootstrap_room=room)


def set_extend(req: Req, start: int, end: int) -> None:
    """The forward ran [start, end): extend_range (0.5.16-0.5.21), extend_end (0.5.22+)."""
    if hasattr(req, "set_extend_range"):
        req.set_extend_range(start, end)
    else:
        req.prefix_len, req.extend_end = start, end


def _extend_end(req: Req) -> int:
    return req.extend_range.end if getattr(req, "extend_range", None) is not None else req.extend_end


class PrefillSide:
    """The prefill engine's end of the handoff: its own CPU pools and metadata buffers, and an
    autospec'd scheduler with the real SchedulerDisaggregationPrefillMixin.send_kv_chunk bound."""

    def __init__(self, world: World, decode_signature: int | None) -> None:
        self.pools = Pools(PROMPT_LEN)
        self.metadata_buffers = metadata_buffers(world.server_args)
        self.sent: list[int | None] = []
        sched = probe.mock("prefill_scheduler", Scheduler, absorbs=("_send_kv_chunk",))
        sched.send_kv_chunk = types.MethodType(SchedulerDisaggregationPrefillMixin.send_kv_chunk, sched)
        sched._send_kv_chunk.side_effect = lambda req, last_chunk=False, end_idx=None: self.sent.append(end_idx)
        sched.token_to_kv_pool_allocator = self.pools.allocator
        sched.req_to_token_pool = self.pools.req_to_token
        sched.sliding_window_size = None
        sched.disagg_metadata_buffers = self.metadata_buffers
        # 0.5.23 ships the layout signature beside the digest: the same pool shape as this decode's.
        sched.disagg_prefill_bootstrap_queue = SimpleNamespace(kv_checksum_signature=decode_signature)
        self.computer = None
        if getattr(world.server_args, OPTION, False):
            # As PrefillBootstrapQueue.__init__ builds it, from the KVArgs _init_kv_manager fills from its pool.
            data_ptrs, _lens, item_lens = self.pools.kv.get_contiguous_buf_infos()
            self.computer = world.checksum.KvChecksumComputer(
                device=torch.device("cuda:0"), kv_data_ptrs=data_ptrs, kv_item_lens=item_lens)
        sched.kv_checksum_computer = self.computer
        self.scheduler = sched


class Handoff:
    """One request handed from a prefill engine to this decode engine."""

    def __init__(self, obs, world: World, rid: str, room: int, *, placeholder: bool, rid_prefix: str = "") -> None:
        self.world = world
        rid = rid_prefix + rid
        # Decode's copy of the request: the router gave it the original prompt; it reserves all of it.
        self.req = new_req(rid, PROMPT_LEN, room)
        # An earlier request used these pages and was freed: its KV is still in them.
        earlier = new_req(rid + "-earlier", PROMPT_LEN, room + 1000)
        earlier_slots = world.pools.place(earlier, PROMPT_LEN)
        world.pools.write(earlier_slots, EARLIER_KV)
        world.pools.req_to_token.free(earlier)
        world.pools.allocator.free(earlier_slots)
        self.slots = world.pools.place(self.req, PROMPT_LEN)
        obs.precondition("pages_reused_from_earlier_request",
                         sorted(self.slots.tolist()) == sorted(earlier_slots.tolist())
                         and world.pools.holds(self.slots, EARLIER_KV))
        # Prefill's copy: the incident's rejected request was replaced by a 1-token placeholder
        # (Req.set_finish_with_abort) and prefill ran that; a normal request keeps its prompt.
        prefill = PrefillSide(world, getattr(world.prealloc_queue, "kv_checksum_signature", None))
        if prefill.computer is not None:
            obs.precondition("digest_inputs_readable", digest_inputs_readable(prefill.computer))
        preq = new_req(rid, PROMPT_LEN, room)
        if placeholder:
            preq.set_finish_with_abort("prompt longer than the KV pool (the incident's rejection)")
        ran = len(preq.origin_input_ids)
        prefill_slots = prefill.pools.place(preq, ran)
        prefill.pools.write(prefill_slots, THIS_KV)
        set_extend(preq, 0, ran)
        preq.metadata_buffer_index = 0
        # The last chunk goes out through the real send_kv_chunk: with the option on it digests the
        # pages of [0, min(extend end, len(origin_input_ids))) and writes the digest into the slot.
        prefill.scheduler.send_kv_chunk(preq, last_chunk=True)
        obs.precondition("one_last_chunk_sent", len(prefill.sent) == 1)
        end = prefill.sent[0] if prefill.sent[0] is not None else min(_extend_end(preq), ran)
        # The transfer writes the sent pages into decode's first reserved pages; the rest keep the
        # earlier request's KV (the incident's stale pages). The metadata slot travels with them.
        for dst, src in zip(self.slots.tolist()[:end], prefill_slots.tolist()[:end]):
            for side in ("k_buffer", "v_buffer"):
                for d_layer, s_layer in zip(getattr(world.pools.kv, side), getattr(prefill.pools.kv, side)):
                    d_layer[dst] = s_layer[src]
        obs.precondition("transferred_pages_hold_prefill_kv", world.pools.holds(self.slots[:end], THIS_KV))
        slot = 1
        if prefill.metadata_buffers.kv_checksum is not None:
            world.metadata_buffers.kv_checksum[slot] = prefill.metadata_buffers.kv_checksum[0]
        obs.precondition("req_has_expected_kv_checksum", hasattr(self.req, "expected_kv_checksum"))
        if world.computer is not None:
            self.req.expected_kv_checksum = expected_digest(world, slot)
        obs.record("prefill_sent_tokens", end)
        obs.record("prefill_digest_written", prefill.metadata_buffers.kv_checksum is not None
                   and bool(prefill.metadata_buffers.kv_checksum[0, 0].item()))
        obs.record("decode_reserved_tokens", PROMPT_LEN)
        obs.record("stale_pages", PROMPT_LEN - end)


def expected_digest(world: World, slot: int) -> int:
    """What DecodeTransferQueue._commit_transfer_to_req copies into req.expected_kv_checksum before the
    slot is freed: the slot's digest (real get_kv_checksum), and from 0.5.23 only where the real
    _kv_checksum_comparable accepts the layout signature shipped beside it (else 0: unverified)."""
    value = world.metadata_buffers.get_kv_checksum(slot)
    if not isinstance(value, tuple):
        return value
    digest, signature = value
    return digest if world.transfer_queue._kv_checksum_comparable(signature) else 0


def prebuilt_batch(world: World, req: Req):
    """The batch _get_new_prebuilt_batch forms of the transferred request (ScheduleBatch needs a model)."""
    batch = probe.mock("batch", ScheduleBatch, absorbs=("filter_batch", "is_empty", "process_prebuilt"))
    batch.reqs = [req]

    def filter_batch(chunked_req_to_exclude=None, keep_indices=None):
        if keep_indices is None:
            raise kp.RejectedCall("filter_batch without keep_indices: this probe models only the checksum's drop")
        batch.reqs = [batch.reqs[i] for i in keep_indices]

    batch.filter_batch.side_effect = filter_batch
    batch.is_empty.side_effect = lambda: len(batch.reqs) == 0
    world.scheduler._get_new_prebuilt_batch.side_effect = lambda _running: batch
    return batch


def releases(world: World, req: Req) -> list[bool]:
    """Per release_kv_cache call for ``req``: whether it kept the KV in the cache (is_insert /
    checkpoint, by this release's name for it)."""
    found = []
    for call in world.release.call_args_list:
        bound = world.release_signature.bind(*call.args, **call.kwargs)
        bound.apply_defaults()
        if bound.arguments.get("req") is not req:
            continue
        flag = next((bound.arguments[n] for n in ("is_insert", "checkpoint") if n in bound.arguments), None)
        found.append(bool(flag))
    return found


def run_decode(obs, world: World, handoff: Handoff) -> None:
    """get_new_prebuilt_batch on the transferred request; record what it did to it."""
    sched, req = world.scheduler, handoff.req
    obs.record("checksum_computer_built", world.computer is not None)
    if world.computer is not None:
        obs.precondition("decode_digest_inputs_readable", digest_inputs_readable(world.computer))
    batch = prebuilt_batch(world, req)
    running = probe.mock("batch", ScheduleBatch)
    with obs.decision():
        returned = sched.get_new_prebuilt_batch(running)
    obs.record("decode_digests", world.digests.of(world.computer) if world.computer is not None else 0)
    obs.record("kept_in_prebuilt_batch", req in batch.reqs)
    obs.record("prebuilt_batch_returned", returned is not None)
    obs.record("process_prebuilt_called", batch.process_prebuilt.called)
    reason = req.finished_reason
    obs.record("finish_reason", type(reason).__name__ if reason is not None else "none")
    if reason is not None:
        code = getattr(reason, "status_code", None)
        obs.record("status_code", int(code) if code is not None else None)
    streamed = any(c.args and req in c.args[0] for c in sched.output_streamer.stream_output.call_args_list)
    obs.record("abort_streamed", streamed)
    obs.record("kv_release_cache_inserts", releases(world, req))

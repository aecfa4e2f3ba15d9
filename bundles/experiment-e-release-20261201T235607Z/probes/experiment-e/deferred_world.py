"""Experiments D and E's scaffolding around decode's deferred KV release (one file, two copies).

probes/experiment-d/deferred_world.py and probes/experiment-e/deferred_world.py are the same
bytes (tests/unit/test_deferred_world_copies.py holds them so): a bundle carries the .py files
beside its experiment.toml, so each experiment keeps its own copy of what ran.

The real SGLang code under test comes from PYTHONPATH: the decode ``DecodeTransferQueue``
(its own ``__init__``, ``pop_transferred``, ``_defer_release``, ``resolve_deferred_releases``),
the decode KV manager (the real ``CommonKVManager.__init__`` in decode mode on an instance of
the real ``NixlKVManager`` class, so the class's ``supports_deferred_decode_kv_release`` is
the one SGLang ships; only NIXL's own agent set-up is skipped), a real ``NixlKVReceiver``
(its own ``__init__``, ``abort``, ``ensure_abort_notified``, ``_send_abort_notification``,
``poll``, ``failure_exception``, ``clear``), the real ``Scheduler.abort_request`` for a
decode-initiated abort (where 0.5.19/0.5.20 arm the drain-ACK tracker), the real
metadata allocator and buffers, and a real one-rank gloo process group on 127.0.0.1 for the
queue's collectives. Stand-ins (each declared by the probe): the bootstrap socket the ABORT
goes out on, the ``release_kv_cache`` the queue calls, the scheduler around the queue, the
tree cache, the manager's local IP (127.0.0.1) and the rank overrides of a one-process world.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import socket
import threading
import time
from array import array
from types import SimpleNamespace
from unittest import mock

import kvprobe_probe as kp

probe: kp.Probe  # the probe these helpers serve (declare)

# Present in every release the sglang-cpu profile imports (0.5.13 onwards).
import sglang
import torch
import torch.distributed as dist
import zmq
from sglang.srt.disaggregation import decode as decode_mod
from sglang.srt.disaggregation import utils as disagg_utils
from sglang.srt.disaggregation.base.conn import KVArgs, KVPoll
from sglang.srt.disaggregation.common import conn as common_conn
from sglang.srt.disaggregation.common.conn import CommonKVManager
from sglang.srt.disaggregation.nixl.conn import NixlKVManager, NixlKVReceiver
from sglang.srt.managers import scheduler as scheduler_mod
from sglang.srt.managers.io_struct import AbortReq
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

DEFERRED_ENV = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"
DUMMY_MODEL = "dummy"
PROMPT_LEN = 8
METADATA_SLOTS = 4
PREFILL_RANKS = 2  # prefill TP 2: two ranks write into the same decode pages
BOOTSTRAP_ADDR = "127.0.0.1:8998"
LOOPBACK = "127.0.0.1"


def declare(served: kp.Probe) -> None:
    """Serve ``served``: facts about the code under test, then the probe-wide settings."""
    global probe
    probe = served
    probe.fact("sglang_version", getattr(sglang, "__version__", None))
    probe.fact("sglang_file", os.path.abspath(sglang.__file__))
    probe.fact("decode_module_file", os.path.abspath(decode_mod.__file__))
    probe.fact("common_conn_file", os.path.abspath(common_conn.__file__))
    probe.fact("has_defer_release", hasattr(decode_mod.DecodeTransferQueue, "_defer_release"))
    probe.fact("has_ensure_abort_notified", hasattr(common_conn.CommonKVReceiver, "ensure_abort_notified"))
    probe.fact("nixl_class_flag", getattr(NixlKVManager, "supports_deferred_decode_kv_release", None))
    probe.fact("queue_init_signature", str(inspect.signature(decode_mod.DecodeTransferQueue.__init__)))
    probe.fact("torch_version", torch.__version__)
    probe.configure("model_path", DUMMY_MODEL, default=None,
                    why="SGLang's own dummy-model short-circuit: ServerArgs skips resolving a real model's config")
    probe.configure("disaggregation_mode", "decode", default="null",
                    why="deferred KV release is the PD decode side's")
    probe.configure("disaggregation_transfer_backend", "nixl", default="mooncake",
                    why="the manager and receiver classes are NIXL's: its module imports in the sglang-cpu "
                        "profile, Mooncake's needs prometheus_client, which the profile does not hold")


# --- the deferred-release setting, per case ---------------------------------------
@contextlib.contextmanager
def deferred_setting(value: str | None):
    """``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE`` for the case: "1", or unset (None).

    SGLang reads it (EnvBool.get) when the queue and the manager are constructed, so
    it must be in place before the world is built; the previous value comes back after.
    """
    before = os.environ.get(DEFERRED_ENV)
    if value is None:
        os.environ.pop(DEFERRED_ENV, None)
        if before is not None:
            probe.fact("deferred_env_removed_from_inherited_environment", True)
    else:
        probe.configure(f"env.{DEFERRED_ENV}", value, default=None,
                        why="deferred release forced on, on both sides, so the comparison isolates which "
                            "failures defer (#41404) from the default flip (#41023)")
        os.environ[DEFERRED_ENV] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(DEFERRED_ENV, None)
        else:
            os.environ[DEFERRED_ENV] = before


# --- the process: config, ranks, a real one-rank gloo group ---------------------------
def _publish() -> ServerArgs:
    server_args = ServerArgs(model_path=DUMMY_MODEL, disaggregation_mode="decode",
                             disaggregation_transfer_backend="nixl")
    set_global_server_args_for_scheduler(server_args)
    return server_args


_GROUP: list = []


def gloo_group():
    """A real gloo process group of one rank (rank 0), rendezvous on 127.0.0.1; made once."""
    if not _GROUP:
        if not dist.is_initialized():
            with socket.socket() as sock:
                sock.bind((LOOPBACK, 0))
                port = sock.getsockname()[1]
            dist.init_process_group("gloo", init_method=f"tcp://{LOOPBACK}:{port}", rank=0, world_size=1)
        _GROUP.append(dist.group.WORLD)
    return _GROUP[0]


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
                      cpu_group=gloo_group(), device_group=None, is_first_rank=True, is_last_rank=True)


@contextlib.contextmanager
def _legacy_groups():
    from sglang.srt.distributed import parallel_state
    from sglang.srt.layers import dp_attention

    groups = dict.fromkeys(("_TP", "_ATTN_TP", "_ATTN_CP", "_PP"), _one_process_group)
    ranks = {"_ATTN_DP_RANK": 0, "_ATTN_DP_SIZE": 1, "_LOCAL_ATTN_DP_SIZE": 1, "_LOCAL_ATTN_DP_RANK": 0,
             "_ATTN_TP_RANK": 0, "_ATTN_TP_SIZE": 1, "_ATTN_CP_RANK": 0, "_ATTN_CP_SIZE": 1}
    with kp.stand_in_unset(parallel_state, groups), \
            kp.stand_in_unset(dp_attention, {name: (lambda v=v: v) for name, v in ranks.items()}):
        yield


# --- the decode KV manager: the real CommonKVManager.__init__ on a real backend class --------
def kv_args() -> KVArgs:
    """SGLang's KVArgs with the fields a decode manager reads: one 16-byte KV item, no state."""
    args = KVArgs()
    fields = dict(
        engine_rank=0, kv_data_ptrs=[], kv_data_lens=[], kv_item_lens=[16], kv_layer_ids=[],
        kv_cache_dtype_str="auto", aux_data_ptrs=[], aux_data_lens=[], aux_item_lens=[],
        state_types=[], state_data_ptrs=[], state_data_lens=[], state_item_lens=[], state_layer_ids=[],
        state_dim_per_tensor=[], state_slice_outer_counts=[], state_conv_shard_groups=[],
        is_hybrid_mla_backend=False, ib_device=None, gpu_id=0, kv_head_num=1, total_kv_head_num=1,
        page_size=1, system_dp_rank=0, rust_http_port=None, pp_rank=0, prefill_start_layer=0,
        prefill_end_layer=None, host_kv_data_ptrs=None, host_kv_data_lens=None, host_kv_item_lens=None,
    )
    for name, value in fields.items():
        setattr(args, name, value)
    return args


def new_manager(manager_cls: type, server_args: ServerArgs, obs: kp.Observations | None = None):
    """An instance of ``manager_cls`` (built with __new__) set up by the real CommonKVManager.__init__
    in decode mode. With ``obs``, that __init__ is the case's decision point."""
    from sglang.srt.disaggregation.utils import DisaggregationMode

    manager = manager_cls.__new__(manager_cls)
    init = CommonKVManager.__init__
    try:
        with mock.patch.object(common_conn, "get_local_ip_auto", lambda *a, **k: LOOPBACK):
            if obs is None:
                init(manager, kv_args(), DisaggregationMode.DECODE, server_args)
            else:
                with obs.decision():
                    init(manager, kv_args(), DisaggregationMode.DECODE, server_args)
    except BaseException:
        close_manager(manager)  # a bound socket left open would hang the context's term at exit
        raise
    # NIXL's own decode bookkeeping its skipped __init__ would have made (NixlKVReceiver.clear pops it).
    manager.transfer_statuses = {}
    return manager


def close_manager(manager) -> None:
    """Close the manager's bound socket and terminate its context (0.5.13-0.5.20 keep the
    context only as the socket's; an unclosed socket makes a later term() block forever)."""
    server_socket = getattr(manager, "server_socket", None)
    context = getattr(manager, "_zmq_ctx", None) or getattr(server_socket, "context", None)
    if server_socket is not None:
        server_socket.close(linger=0)
    if context is not None:
        context.term()


class NoDrainAckManager(NixlKVManager):
    """A backend whose manager class does not acknowledge drains (supports_... False).

    The probe's own subclass of the real NIXL manager, standing in for a backend that
    ships the flag False (Mori in 0.5.21): only the class attribute differs.
    """

    supports_deferred_decode_kv_release = False


# --- the world: queue, scheduler, receiver per request -------------------------------
class World:
    """A decode scheduler's transfer queue with the real manager, allocator and buffers."""

    def __init__(self, server_args: ServerArgs, manager) -> None:
        self.server_args = server_args
        self.released: list = []  # requests release_kv_cache was called for, in order
        self.sent: list[tuple[int, list]] = []  # (prefill rank, ABORT frames)
        self.metadata_freed: list[int] = []
        self.manager = manager
        self.metadata_allocator = kp.build(disagg_utils.ReqToMetadataIdxAllocator, size=METADATA_SLOTS)
        real_free = self.metadata_allocator.free

        def metadata_free(index):  # which slot; the real allocator then frees it
            self.metadata_freed.append(index)
            return real_free(index)

        self.metadata_allocator.free = metadata_free
        self.metadata_buffers = kp.build(
            disagg_utils.MetadataBuffers, size=METADATA_SLOTS, hidden_size=16,
            hidden_states_dtype=torch.float32, max_sampling_mask_tokens=0)
        self.tree_cache = probe.mock("tree_cache", _cache_class(), absorbs=("unlock",))
        if hasattr(_cache_class(), "unlock"):
            self.tree_cache.unlock.side_effect = _unlock_nothing
        self.scheduler = self._scheduler()
        self.queue = kp.build(
            decode_mod.DecodeTransferQueue, gloo_group=gloo_group(), tp_rank=0,
            req_to_metadata_buffer_idx_allocator=self.metadata_allocator,
            metadata_buffers=self.metadata_buffers, scheduler=self.scheduler, tree_cache=self.tree_cache)
        self.scheduler.disagg_decode_transfer_queue = self.queue

    def _scheduler(self):
        sched = probe.mock("scheduler", Scheduler, absorbs=("collect_inflight_reqs",))
        if hasattr(Scheduler, "collect_inflight_reqs"):  # 0.5.16+; before, abort_request reads the batches
            sched.collect_inflight_reqs.side_effect = lambda: []
        sched.cur_batch = sched.last_batch = None
        sched.running_batch = SimpleNamespace(reqs=[])
        sched.server_args = self.server_args
        sched.spec_algorithm = _spec_none()
        sched.enable_decode_hicache = False
        sched.enable_hisparse = False
        sched.kv_checksum_computer = None
        sched.output_streamer = probe.mock("output_streamer", SchedulerOutputStreamer, absorbs=("stream_output",))
        sched.metrics_reporter = probe.mock(
            "metrics_reporter", kp.require(scheduler_mod, "SchedulerMetricsReporter"), enable_metrics=False)
        sched.ps = SimpleNamespace(tp_rank=0, pp_rank=0, pp_size=1, dp_rank=0, gpu_id=0)
        sched.disaggregation_mode = disagg_utils.DisaggregationMode.DECODE
        sched.disagg_decode_prealloc_queue = SimpleNamespace(queue=[], retracted_queue=[])
        sched.chunked_req = None
        sched.mm_receiver = None
        sched.waiting_queue = []
        sched.dllm_config = None
        sched.grammar_manager = SimpleNamespace(abort_requests=lambda recv_req: None)
        sched.grammar_queue = []
        return sched

    def new_request(self, rid: str, room: int, *, published: bool):
        """A request in the transfer queue: its receiver, KV reserved, its metadata slot.

        ``published``: decode sent its destinations to both prefill ranks (the
        receiver's ``init`` and ``send_metadata`` ran): ``bootstrap_infos`` names them,
        ``init_time`` is set and the room waits for input; otherwise the receiver
        never got that far (no prefill rank holds its destination).
        """
        req = Req(rid, "", array("q", range(1, PROMPT_LEN + 1)), SamplingParams(max_new_tokens=4),
                  bootstrap_host=LOOPBACK, bootstrap_port=8998, bootstrap_room=room)
        receiver = kp.build(NixlKVReceiver, mgr=self.manager, bootstrap_addr=BOOTSTRAP_ADDR, bootstrap_room=room)
        if published:
            receiver.bootstrap_infos = [{"rank_ip": LOOPBACK, "rank_port": 17000 + r, "prefill_rank": r}
                                        for r in range(PREFILL_RANKS)]
            receiver.init_time = time.time()
            self.manager.update_status(room, KVPoll.WaitingForInput)
        index = self.metadata_allocator.alloc()
        decode_req = kp.build(decode_mod.DecodeRequest, req=req, kv_receiver=receiver,
                              metadata_buffer_index=index, waiting_for_input=True)
        self.queue.queue.append(decode_req)
        return decode_req

    # what the probe reads back
    def releases_of(self, decode_req) -> int:
        return sum(1 for r in self.released if r is decode_req.req)

    def held(self) -> int:
        return len(getattr(self.queue, "_deferred_releases", []))

    def armed(self, room: int) -> bool:
        return room in getattr(self.manager, "_deferred_abort_ack_tracker", {})

    def aborts_sent(self) -> list[int]:
        return sorted(rank for rank, frames in self.sent if frames and frames[0] == b"ABORT")

    def frees_of(self, index: int) -> int:
        return sum(1 for i in self.metadata_freed if i == index)


def _unlock_nothing(lock) -> None:
    """BasePrefixCache.unlock(None) does nothing (0.5.22's failure path drops a HiCache restore
    lock this way); no request here ever takes a tree lock, so any other lock is refused."""
    if lock is not None:
        raise kp.RejectedCall(f"tree_cache.unlock({lock!r}): this world's requests hold no tree lock")


def _cache_class():
    from sglang.srt.mem_cache.radix_cache import RadixCache

    return RadixCache


def _spec_none():
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return SpeculativeAlgorithm.NONE


@contextlib.contextmanager
def publish_rank0():
    """Publish the decode server config and state that this process is rank 0 of 1; yield the config."""
    server_args = _publish()
    with _rank0():
        yield server_args


@contextlib.contextmanager
def decode_world(*, deferred: str | None, manager_cls: type = NixlKVManager):
    """Publish config, the deferred setting, one rank; yield a World; close its sockets."""
    with deferred_setting(deferred), contextlib.ExitStack() as stack:
        server_args = stack.enter_context(publish_rank0())
        manager = new_manager(manager_cls, server_args)
        stack.callback(close_manager, manager)
        world = World(server_args, manager)
        release = probe.track("release_kv_cache", mock.create_autospec(decode_mod.release_kv_cache),
                              absorbs=("()",))
        release.side_effect = lambda req, *args, **kwargs: world.released.append(req)
        stack.enter_context(mock.patch.object(decode_mod, "release_kv_cache", release))

        def connect(cls, bootstrap_info):
            sock = probe.mock("bootstrap_socket", zmq.Socket, absorbs=("send_multipart",))
            rank = bootstrap_info["prefill_rank"]
            sock.send_multipart.side_effect = lambda frames, *a, **k: world.sent.append((rank, list(frames)))
            return sock, threading.Lock()

        stack.enter_context(mock.patch.object(NixlKVReceiver, "_connect_to_bootstrap_server", classmethod(connect)))
        yield world


# --- what happens to a room, as the decode manager's threads and the scheduler do it ---------
def prefill_reports_failure(world: World, room: int) -> None:
    """A prefill rank reported the room Failed (a fault decode did not initiate): the decode
    manager's receiver thread records the reason and the status, as it does for that message."""
    world.manager.record_failure(room, "prefill rank 1 reported the transfer failed (probe)")
    world.manager.update_status(room, KVPoll.Failed)


def scheduler_abort(world: World, rid: str) -> None:
    """The client aborted: the real Scheduler.abort_request for that rid (the decode handler,
    which arms the drain-ACK tracker in 0.5.19/0.5.20 and calls receiver.abort() in all)."""
    Scheduler.abort_request(world.scheduler, AbortReq(rid=rid))


def deliver_ack(world: World, room: int, rank: int) -> bool:
    """Prefill ``rank`` acknowledges the drain: the real tracker call the decode receiver thread
    makes for an ABORT_ACK, echoing the generation of the ABORT that rank received (0.5.22+).
    False where this release has no drain ACK at all."""
    note = getattr(world.manager, "note_abort_ack", None)
    if note is None:
        return False
    if "generation" in inspect.signature(note).parameters:
        frames = [f for r, f in world.sent if r == rank and f and f[0] == b"ABORT"]
        generation = int(frames[-1][4]) if frames and len(frames[-1]) > 4 else None
        note(room, rank, generation)
    else:
        note(room, rank)
    return True


def resolve(world: World) -> None:
    """The scheduler loop's resolve_deferred_releases, where the release has one."""
    resolve_fn = getattr(world.queue, "resolve_deferred_releases", None)
    if resolve_fn is not None:
        resolve_fn()


def record_failure_outcome(obs: kp.Observations, world: World, decode_req, index: int, room: int) -> None:
    """What pop_transferred did with the failed request, then what the drain ACKs release."""
    obs.record("kv_released_at_failure", world.releases_of(decode_req))
    obs.record("metadata_slot_freed_at_failure", world.frees_of(index) > 0)
    obs.record("held_for_deferred_release", world.held())
    obs.record("abort_sent_to_prefill_ranks", world.aborts_sent())
    obs.record("drain_tracker_armed", world.armed(room))
    before = world.releases_of(decode_req)
    deliver_ack(world, room, 0)
    resolve(world)
    obs.record("kv_released_after_rank0_ack", world.releases_of(decode_req) - before)
    before = world.releases_of(decode_req)
    deliver_ack(world, room, 1)
    resolve(world)
    obs.record("kv_released_after_all_acks", world.releases_of(decode_req) - before)
    obs.record("kv_releases_total", world.releases_of(decode_req))
    obs.record("metadata_slot_frees_total", world.frees_of(index))
    obs.record("still_held_at_end", world.held())


"""Experiment C's scaffolding around the prefill drain acknowledgement (imported by drain_acks.py).

The real SGLang code under test (from PYTHONPATH): a prefill ``NixlKVManager`` whose common
state comes from the release's own ``CommonKVManager.__init__`` (prefill mode), real
``NixlKVSender`` objects built by their own ``__init__``, the real ABORT handler
(``NixlKVManager._handle_abort_notification``), the real tracker methods it calls
(``update_status``, ``register_deferred_ack_target``, ``_maybe_ack_drained_abort``,
``_send_abort_ack``) and the real ``NixlKVSender.failure_exception`` / ``clear`` the prefill
scheduler calls once it has seen the room Failed. Around them: a recorder for the wire
(``_send_multipart_locked``), a stand-in for the bootstrap server registration, and the
transfer worker's own bookkeeping for one in-flight chunk, replayed (see :class:`DrainWorld`).
``drain_acks.py`` declares the probe, its mocks and its cases; this module serves that
probe (``declare``).
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections import defaultdict
from unittest import mock

import kvprobe_probe as kp

probe: kp.Probe  # the probe these helpers serve (declare)

# Present in every release the sglang-cpu profile imports (0.5.13 onwards); the drain-ACK
# protocol itself is not (first in 0.5.19): cases ``require`` it before building anything.
import numpy as np
import sglang
from sglang.srt.disaggregation.base.conn import KVArgs, KVPoll
from sglang.srt.disaggregation.common import conn as common_conn
from sglang.srt.disaggregation.common.conn import CommonKVManager
from sglang.srt.disaggregation.nixl import conn as nixl_conn
from sglang.srt.disaggregation.nixl.conn import NixlKVManager, NixlKVSender
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

# KVPoll is a plain class of int constants (not an Enum) in these releases.
POLL_NAMES = {value: name for name, value in vars(KVPoll).items()
              if not name.startswith("_") and isinstance(value, int)}
LOOPBACK = "127.0.0.1"
BOOTSTRAP_PORT = 8998
DEFERRED_RELEASE_ENV = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"
HOST_IP_ENV = "SGLANG_HOST_IP"
NUM_KV_INDICES = 8
# Decode ranks' ABORT return addresses: nothing listens there, the wire is a recorder.
DECODE_RANKS = (("decode-rank-0", 17001), ("decode-rank-1", 17002))
# What the real __init__ of NixlKVManager sets in prefill mode beside the common state (it
# also creates the NIXL agent and starts the transfer workers and the bootstrap thread,
# which this probe does not run).
NIXL_PREFILL_FIELDS = {
    "exceptions": dict,
    "_staging_outstanding": lambda: defaultdict(int),
    "enable_staging": lambda: False,
    "_staging_ctx": lambda: None,
}

# The drain-ACK protocol's prefill half, checked before anything is built: a release without
# it (before 0.5.19) is not-present.
PROTOCOL = (
    (CommonKVManager, "_maybe_ack_drained_abort"),
    (CommonKVManager, "register_deferred_ack_target"),
    (CommonKVManager, "_send_abort_ack"),
)
# Where the probe hands decode's ABORT to the real code (NIXL's bootstrap thread calls it, 0.5.19
# onwards). A release with the protocol but without this method moved the handler: the probe
# cannot reach its decision point there (could-not-observe), which is not absence.
ABORT_HANDLER = "_handle_abort_notification"


def declare(served: kp.Probe) -> None:
    """Serve ``served``: its facts about the code under test, then every non-default setting."""
    global probe
    probe = served
    probe.fact("sglang_version", getattr(sglang, "__version__", None))
    probe.fact("sglang_file", os.path.abspath(sglang.__file__))
    probe.fact("common_conn_file", os.path.abspath(common_conn.__file__))
    probe.fact("nixl_conn_file", os.path.abspath(nixl_conn.__file__))
    probe.fact("has_drain_ack_protocol", hasattr(CommonKVManager, "_maybe_ack_drained_abort"))
    probe.fact("register_deferred_ack_target_params", _params(CommonKVManager, "register_deferred_ack_target"))
    probe.fact("has_ack_fanout_targets", hasattr(CommonKVManager, "_abort_ack_fanout_targets"))
    probe.configure(DEFERRED_RELEASE_ENV, "1", default=None,
                    why="deferred decode KV release on, as on both engines of a deployment that holds pages "
                        "until prefill ACKs the drain: 0.5.20 defaults it off and 0.5.21 on (#41023), so it "
                        "is set on both sides to keep #41023's default flip out of this experiment")
    probe.configure(HOST_IP_ENV, LOOPBACK, default=None,
                    why="the real CommonKVManager.__init__ binds its zmq PULL socket on the detected local "
                        "IP; this pins it to the loopback address (nothing connects to it)")
    probe.configure("model_path", "dummy", default=None,
                    why="SGLang's own dummy-model short-circuit: ServerArgs skips resolving a real model")
    probe.configure("disaggregation_mode", "prefill", default="null",
                    why="the drain ACK is sent by the PD prefill side")
    probe.configure("disaggregation_transfer_backend", "nixl", default="mooncake",
                    why="the concrete NIXL manager/sender classes import in this profile (Mooncake's need "
                        "prometheus_client); the drain-ACK code under test is CommonKVManager's and "
                        "CommonKVSender's, shared by both")


def _params(owner, name: str):
    func = getattr(owner, name, None)
    return None if func is None else list(inspect.signature(func).parameters)[1:]


def require_protocol() -> None:
    """NotPresent unless this release has the drain-ACK protocol (0.5.19 onwards); CannotObserve
    if it has no NIXL ABORT handler to hand decode's ABORT to."""
    for owner, name in PROTOCOL:
        kp.require(owner, name)
    if not callable(getattr(NixlKVManager, ABORT_HANDLER, None)):
        raise kp.CannotObserve(f"NixlKVManager.{ABORT_HANDLER} is missing: this release handles decode's ABORT "
                               "elsewhere, and the probe has no way to hand it one")


# --- configuration and ranks, the way the scheduler process states them ----------
def _publish():
    server_args = ServerArgs(model_path="dummy", disaggregation_mode="prefill",
                             disaggregation_transfer_backend="nixl",
                             disaggregation_bootstrap_port=BOOTSTRAP_PORT)
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
                  "attn_dp_rank": 0, "attn_tp_group": _one_process_group(), "pp_group": _one_process_group()}
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

    groups = dict.fromkeys(("_TP", "_ATTN_TP", "_ATTN_CP", "_PP", "_WORLD"), _one_process_group)
    ranks = {"_ATTN_DP_RANK": 0, "_ATTN_DP_SIZE": 1, "_LOCAL_ATTN_DP_SIZE": 1, "_LOCAL_ATTN_DP_RANK": 0}
    with kp.stand_in_unset(parallel_state, groups), \
            kp.stand_in_unset(dp_attention, {name: (lambda v=v: v) for name, v in ranks.items()}):
        yield


def _kv_args():
    """SGLang's real KVArgs with a one-rank, no-buffer prefill layout (nothing is transferred)."""
    args = KVArgs()
    fields = {
        "engine_rank": 0, "kv_data_ptrs": [], "kv_data_lens": [], "kv_item_lens": [], "kv_layer_ids": [],
        "kv_cache_dtype_str": "auto", "aux_data_ptrs": [], "aux_data_lens": [], "aux_item_lens": [],
        "state_types": [], "state_data_ptrs": [], "state_data_lens": [], "state_item_lens": [],
        "state_layer_ids": [], "state_dim_per_tensor": [], "state_slice_outer_counts": [],
        "state_conv_shard_groups": [], "swa_kv_cache_layout": None, "is_hybrid_mla_backend": False,
        "ib_device": None, "gpu_id": 0, "kv_head_num": 1, "total_kv_head_num": 1, "page_size": 1,
        "system_dp_rank": 0, "rust_http_port": None, "pp_rank": 0, "prefill_start_layer": 0,
        "prefill_pp_size": 1, "decode_tp_size": 1,
    }
    for name, value in fields.items():
        setattr(args, name, value)
    return args


# --- the wire ----------------------------------------------------------------------
class Wire:
    """What the manager put on the wire: (endpoint, frames) per _send_multipart_locked call."""

    def __init__(self, recorder) -> None:
        self.recorder = recorder

    def messages(self) -> list[tuple[str, list[bytes]]]:
        out = []
        for call in self.recorder.call_args_list:
            bound = inspect.signature(CommonKVManager._send_multipart_locked).bind(None, *call.args, **call.kwargs)
            out.append((bound.arguments["endpoint"], list(bound.arguments["parts"])))
        return out

    def acks(self, room: int) -> list[str]:
        """The endpoints that got an ABORT_ACK for ``room``, in order."""
        tag = b"ABORT_ACK"
        return [endpoint for endpoint, parts in self.messages()
                if parts and parts[0] == tag and len(parts) > 1 and parts[1] == str(room).encode("ascii")]

    def others(self, room: int) -> list[str]:
        """Anything else it sent (never expected here): tag and endpoint."""
        wanted = [b"ABORT_ACK", str(room).encode("ascii")]
        return [f"{parts[0]!r} -> {endpoint}" if parts else f"(empty) -> {endpoint}"
                for endpoint, parts in self.messages() if parts[:2] != wanted]


def endpoint_of(port: int) -> str:
    return f"tcp://{LOOPBACK}:{port}"


# --- the prefill world -------------------------------------------------------------
class DrainWorld:
    """One prefill rank: the real manager, its wire recorded, rooms opened by real senders.

    The transfer worker is not run (it needs the NIXL agent and RDMA): for an in-flight
    chunk the probe plays the worker's own bookkeeping, the two steps every release from
    0.5.19 takes around a transfer (``NixlKVManager.transfer_worker``): at dequeue it counts
    the chunk in ``_staging_outstanding[room]``; when the chunk's handles are done it
    decrements the count and, with deferred release on, calls the real
    ``_maybe_ack_drained_abort(room)``.
    """

    def __init__(self, server_args) -> None:
        self.manager = NixlKVManager.__new__(NixlKVManager)
        with mock.patch.object(NixlKVManager, "register_to_bootstrap", autospec=True) as register:
            probe.track("bootstrap_registration", register, absorbs=("()",))
            kp.require(CommonKVManager, "__init__")(self.manager, _kv_args(), DisaggregationMode.PREFILL, server_args)
        for name, make in NIXL_PREFILL_FIELDS.items():
            if not hasattr(self.manager, name):
                setattr(self.manager, name, make())
        recorder = mock.create_autospec(self.manager._send_multipart_locked)
        self.manager._send_multipart_locked = probe.track("wire", recorder, absorbs=("()",))
        self.wire = Wire(recorder)
        self.senders: dict[int, NixlKVSender] = {}

    def close(self) -> None:
        socket = getattr(self.manager, "server_socket", None)
        if socket is not None:
            socket.close(linger=0)
        context = getattr(self.manager, "_zmq_ctx", None)
        if context is not None:
            context.term()

    # rooms ------------------------------------------------------------------
    def open_room(self, room: int, decode_ranks) -> NixlKVSender:
        """A request's sender (real __init__: the room starts Bootstrapping), then the decode
        ranks' transfer infos as the bootstrap thread files them, then WaitingForInput."""
        sender = kp.build(NixlKVSender, mgr=self.manager, bootstrap_addr=f"{LOOPBACK}:{BOOTSTRAP_PORT}",
                          bootstrap_room=room, dest_tp_ranks=[0], pp_rank=0,
                          req_has_disagg_prefill_dp_rank=False)
        self.senders[room] = sender
        infos = self.manager.transfer_infos.setdefault(room, {})
        for agent, port in decode_ranks:
            infos[agent] = kp.build(
                nixl_conn.TransferInfo, room=room, endpoint=LOOPBACK, dst_port=port, agent_name=agent,
                dst_kv_indices=np.arange(NUM_KV_INDICES, dtype=np.int32), dst_aux_index=0,
                required_dst_info_num=len(decode_ranks), dst_state_indices=[])
        self.manager.update_status(room, KVPoll.WaitingForInput)
        return sender

    def status(self, room: int) -> str | None:
        status = self.manager.request_status.get(room)
        return None if status is None else POLL_NAMES.get(int(status), str(status))

    # the transfer worker's bookkeeping -----------------------------------------
    def dequeue_chunk(self, room: int) -> None:
        """The worker dequeued a chunk of ``room`` and started writing it."""
        self.manager._staging_outstanding[room] += 1
        self.manager.update_status(room, KVPoll.Transferring)

    def drain_chunk(self, room: int) -> None:
        """The chunk's writes landed: the worker's decrement and its drain hook."""
        self.manager._staging_outstanding[room] -= 1
        if self.manager.enable_deferred_decode_kv_release:
            self.manager._maybe_ack_drained_abort(room)

    def outstanding(self, room: int) -> int:
        return self.manager._staging_outstanding.get(room, 0)

    # decode's ABORT and the prefill scheduler's reaction --------------------------
    def abort_from(self, room: int, port: int) -> None:
        """One decode rank's ABORT for ``room`` reaches the real handler, as the decode sends it."""
        self.manager._handle_abort_notification(abort_message(room, port))

    def scheduler_sees_failed(self, room: int) -> str | None:
        """What the prefill scheduler does for a Failed poll: sender.failure_exception()
        (which clears the room), catching the error it raises; returns its type name."""
        try:
            self.senders[room].failure_exception()
        except Exception as exc:  # failure_exception always raises: the transfer error it reports
            return type(exc).__name__
        return None

    def ack_target_held(self, room: int) -> bool:
        return room in self.manager._deferred_ack_targets

    def abort_accepted(self, room: int) -> bool:
        """The handler took the ABORT as a drain-ACK request: it holds a target or already ACKed.

        Expected on every side: an ABORT the release ignored (say, a frame layout it no longer
        accepts) would otherwise read like the unfixed release's missing ACK.
        """
        return self.ack_target_held(room) or bool(self.wire.acks(room))


def abort_message(room: int, port: int) -> list[bytes]:
    """The decode receiver's ABORT: the release's own encoder where it has one (0.5.22+,
    with a generation), else the frames 0.5.19-0.5.21's ``_send_abort_notification`` sends."""
    notification = getattr(common_conn, "AbortNotification", None)
    if notification is not None:
        return notification(room=room, decode_ip=LOOPBACK, decode_port=port, generation=1).to_zmq()
    return [b"ABORT", str(room).encode("ascii"), LOOPBACK.encode("ascii"), str(port).encode("ascii")]


@contextlib.contextmanager
def drain_setup():
    """Publish config, state the rank, set the deferred-release env var; yield a fresh DrainWorld."""
    require_protocol()
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.dict(os.environ, {DEFERRED_RELEASE_ENV: "1", HOST_IP_ENV: LOOPBACK}))
        server_args = _publish()
        stack.enter_context(_rank0())
        world = DrainWorld(server_args)
        stack.callback(world.close)
        yield world


def preconditions(obs: kp.Observations, world: DrainWorld) -> None:
    """What every case's set-up must have built before the first ABORT."""
    obs.precondition("manager_bound_loopback", getattr(world.manager, "local_ip", None) == LOOPBACK)
    obs.precondition("deferred_release_enabled", bool(world.manager.enable_deferred_decode_kv_release))
    obs.precondition("not_dummy_cp_rank", not world.manager.is_dummy_cp_rank)

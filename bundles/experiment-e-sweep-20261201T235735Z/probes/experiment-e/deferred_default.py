"""Diff probe for experiment E: SGLang PR #41023, deferred decode KV release on by default
for the backends that support it.

What it shows
    What SGLang does in its default configuration: SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE
    is left unset on both sides (removed from the probe's environment if it was inherited).
    Before the fix the setting defaulted to off, so a decode-initiated abort in the middle of a
    transfer (the real ``Scheduler.abort_request``, then the room reads Failed) released the KV
    pages at once while a prefill write could still be in flight; after it the setting
    defaults to on, gated by a per-backend class flag (``supports_deferred_decode_kv_release``,
    True on NIXL's and Mooncake's managers), and the pages are held until both prefill ranks
    acknowledge the drain. The manager's flag comes from the real ``CommonKVManager.__init__``
    run on an instance of the real ``NixlKVManager`` class. Control: a backend whose manager
    class does not set the flag still releases at once on the head.

What runs for real, what is stood in
    The same world as experiment D (deferred_world.py, byte-identical copy): see its docstring
    and the probe's ``mocks``.

What it does NOT show
    No GPU, no RDMA or NIXL transfer, no second process writing into the pages, no tenant
    data; and nothing about a deployment that sets the variable either way.
"""

from __future__ import annotations

import kvprobe_probe as kp

PROBE_NAME = "deferred_default"

probe = kp.Probe(
    PROBE_NAME,
    description=(
        "PR #41023 (v0.5.21): with default settings, a decode-initiated abort mid-transfer holds the KV "
        "pages until the drain is acknowledged on backends that support it (NIXL here), instead of freeing them at once"
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
        "unsupported_backend": (
            "the probe's subclass of SGLang's NixlKVManager whose class attribute "
            "supports_deferred_decode_kv_release is False, standing in for a backend that does not "
            "acknowledge drains (Mori in 0.5.21); set up by the same real CommonKVManager.__init__"
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
    NixlKVManager,
    NoDrainAckManager,
    decode_world,
    deferred_setting,
    new_manager,
    close_manager,
    record_failure_outcome,
    scheduler_abort,
)

deferred_world.declare(probe)

DECISION = "DecodeTransferQueue.pop_transferred"
ENV_NAME = deferred_world.DEFERRED_ENV


def _default_config():
    return decode_world(deferred=None)


def _unsupported_backend():
    return decode_world(deferred=None, manager_cls=NoDrainAckManager)


def _flags(obs: kp.Observations, world) -> None:
    """The two switches the decision reads: the queue's (the setting) and the manager's (setting and backend)."""
    obs.record("queue_deferred_release_on", bool(getattr(world.queue, "enable_deferred_kv_release", False)))
    obs.record("manager_deferred_release_on",
               bool(getattr(world.manager, "enable_deferred_decode_kv_release", False)))


@probe.case(
    "default.decode_abort_mid_transfer",
    "default settings; metadata published to two prefill ranks; the client aborts (the real "
    "Scheduler.abort_request), the room reads Failed; then both prefill ranks acknowledge the drain",
    decision=DECISION,
    using=_default_config,
)
def _(obs: kp.Observations, world) -> None:
    decode_req = world.new_request("aborted-mid-transfer", 4201, published=True)
    index = decode_req.metadata_buffer_index
    scheduler_abort(world, "aborted-mid-transfer")
    obs.precondition("decode_aborted", decode_req.kv_receiver.abort_notified)
    _flags(obs, world)
    with obs.decision():
        world.queue.pop_transferred()
    record_failure_outcome(obs, world, decode_req, index, 4201)


@probe.case(
    "default.manager_flag",
    "default settings: the real CommonKVManager.__init__ (decode mode) on an instance of the real "
    "NixlKVManager class, and the environment default it reads",
    decision="CommonKVManager.__init__",
)
def _(obs: kp.Observations) -> None:
    # No deferred decode release at all before 0.5.19: nothing for a default to switch on.
    kp.require(deferred_world.decode_mod.DecodeTransferQueue, "_defer_release")
    from sglang.srt import environ

    with deferred_setting(None), deferred_world.publish_rank0() as server_args:
        obs.precondition("setting_unset", ENV_NAME not in deferred_world.os.environ)
        manager = None
        try:
            manager = new_manager(NixlKVManager, server_args, obs)
            obs.record("manager_deferred_release_on", bool(manager.enable_deferred_decode_kv_release))
        finally:
            if manager is not None:
                close_manager(manager)
        env_field = getattr(environ.envs, ENV_NAME)
        obs.record("setting_default", bool(env_field.default))
        obs.record("nixl_class_supports_deferred_release",
                   bool(getattr(NixlKVManager, "supports_deferred_decode_kv_release", False)))


@probe.case(
    "default.unsupported_backend",
    "control: default settings, a manager class whose supports_deferred_decode_kv_release is False; the "
    "client aborts mid-transfer and the room reads Failed",
    decision=DECISION,
    using=_unsupported_backend,
)
def _(obs: kp.Observations, world) -> None:
    decode_req = world.new_request("aborted-unsupported", 4202, published=True)
    index = decode_req.metadata_buffer_index
    scheduler_abort(world, "aborted-unsupported")
    obs.precondition("decode_aborted", decode_req.kv_receiver.abort_notified)
    _flags(obs, world)  # the head's queue flag is on (the default); this manager's is not
    with obs.decision():
        world.queue.pop_transferred()
    obs.record("kv_released_at_failure", world.releases_of(decode_req))
    obs.record("metadata_slot_freed_at_failure", world.frees_of(index) > 0)
    obs.record("held_for_deferred_release", world.held())


if __name__ == "__main__":
    probe.main()

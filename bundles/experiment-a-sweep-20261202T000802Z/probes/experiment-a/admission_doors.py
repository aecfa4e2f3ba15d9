"""Experiment A diff probe: the PD admission doors of SGLang PR #38935.

What it shows
    How the real ``PrefillBootstrapQueue.add`` and ``DecodePreallocQueue.add``
    of the SGLang tree on PYTHONPATH treat:
    * a new request the scheduler rejected for an over-long prompt
      (``Req.set_finish_with_abort``: the verdict sits in ``req.to_finish``,
      ``req.finished()`` is still False, the prompt became a 1-token stub);
    * a normal, valid request;
    * re-entering requests that carry a pending abort but are still owed a
      release: prefill holding a metadata buffer, prefill holding a retraction
      backup (taken by the release's own ``Req.offload_kv_cache``), a request
      ``reset_for_retract`` marked ``is_retracted`` that re-enters through a
      bare ``add`` (no flag), and decode callers passing ``is_retracted`` /
      ``is_rebootstrap``.
    Before #38935 (0.5.20) the rejected request is queued and a KV
    sender/receiver is built for it; from 0.5.21 the door hands it to
    ``Scheduler.retire_unadmitted_request``. The probe only observes; it
    asserts nothing. Every case's decision point is the door's ``add``: an
    exception before it is set-up drift (the case is unobserved), a keyword the
    release does not have is not-present.

What runs for real
    ``Req``, ``FINISH_ABORT``, ``validate_input_length`` (the scheduler's
    prompt-length check), both queues built by their own ``__init__`` (with
    ``_init_kv_manager``), ``DecodeTransferQueue.__init__``, the CPU pools
    (``ReqToTokenPool``, ``MHATokenToKVPool`` of the incident's 681,280 tokens,
    ``TokenToKVPoolAllocator``), ``ReqToMetadataIdxAllocator`` and
    ``MetadataBuffers``, ``Req.offload_kv_cache`` / ``reset_for_retract``,
    ``is_unadmitted_reject`` and ``Scheduler.retire_unadmitted_request`` /
    ``_release_aborted_request`` where they exist. Config is published the way
    the scheduler process publishes it (``set_global_server_args_for_scheduler``,
    present in every release) with a ``ServerArgs`` of SGLang's dummy model.

What is mocked (see MOCKS): the KV transport classes (``get_kv_class``), the
    scheduler around the doors (an autospec: unknown attributes raise, every
    call it accepts is recorded as absorbed), its model runner and model config
    (plain data), the tree cache, the output streamer and the beam coordinator.

What it does NOT show: no GPU, no RDMA, no model forward, no tenant data, no
    HTTP status seen by a client, and it is not a reproduction of the
    cross-request KV leak; it shows which code path the admission doors take
    in each release.
"""

from __future__ import annotations

import kvprobe_probe as kp

MOCKS = {
    "kv_transport": "get_kv_class patched in the prefill/decode modules: KVARGS gives SGLang's real KVArgs; MANAGER, SENDER and RECEIVER give autospecs of SGLang's CommonKVManager/CommonKVSender/CommonKVReceiver (the Mooncake classes do not import in this env), so constructor calls are signature-checked; nothing is transferred. The manager's prefill_info_table is empty (no prefill peer resolved yet)",
    "scheduler": "autospec of SGLang's Scheduler (an instance): attributes the probe did not set raise AttributeError, every Scheduler method the doors call is signature-checked and recorded as absorbed; the real retire_unadmitted_request and _release_aborted_request are bound to it where they exist (counting their calls, not mocked)",
    "scheduler.ps": "SimpleNamespace: the scheduler's parallel-state snapshot of older releases (TP/PP/DP rank 0, one PP stage, GPU id 0)",
    "scheduler.tp_worker": "SimpleNamespace of capacity data only: the model runner reports the incident's 681,280-token KV pool under each release's name for it, is_hybrid_swa=False; an unknown field raises AttributeError",
    "scheduler.model_config": "SimpleNamespace: 1 hidden layer, 8 KV heads, no sliding window; an unknown field raises AttributeError",
    "parallel_groups": "rank 0 of a one-process world: get_parallel().override(...) where the runtime context exists (0.5.14+), else the parallel_state/dp_attention globals initialize_model_parallel would set (0.5.13); process groups are autospecs of SGLang's GroupCoordinator with world_size 1 and no CPU/device group (no collectives run)",
    "tree_cache": "autospec of SGLang's RadixCache: the real retire path calls finish(handle, ABORT) on it",
    "output_streamer": "autospec of SGLang's SchedulerOutputStreamer: stream_output carrying the request counts as an abort output sent to the client",
    "beam_coordinator": "autospec of SGLang's BeamCoordinator where it exists: the real retire calls retire_group(req)",
}

probe = kp.Probe(
    "admission_doors",
    mocks=MOCKS,
    description="PR #38935: PD admission doors retire never-admitted rejected requests (any release from 0.5.13)",
)

# The real SGLang code and the scaffolding around the doors (admission_world.py, beside this file).
import admission_world  # noqa: E402
from admission_world import (  # noqa: E402
    SHORT_PROMPT,
    decode_world,
    decoded_abort,
    holds_kv_row,
    new_req,
    prefill_world,
    rejected,
    retraction_backup,
    run_decode,
    run_prefill,
    running_abort,
    take_retraction_backup,
)

admission_world.declare(probe)

# --- cases --------------------------------------------------------------------
DOOR_PREFILL = "PrefillBootstrapQueue.add"
DOOR_DECODE = "DecodePreallocQueue.add"


@probe.case("prefill.rejected_new", "over-long prompt rejected by set_finish_with_abort, then PrefillBootstrapQueue.add",
            decision=DOOR_PREFILL, using=prefill_world)
def _(obs, world):
    run_prefill(obs, world, rejected(obs, "rej-prefill", 101))


@probe.case("prefill.valid", "a normal short request at the prefill door", decision=DOOR_PREFILL, using=prefill_world)
def _(obs, world):
    run_prefill(obs, world, new_req("ok-prefill", SHORT_PROMPT, 102))


@probe.case("prefill.reentry_metadata",
            "pending abort while still holding a metadata buffer (allocated by the real allocator): its queue owes the release",
            decision=DOOR_PREFILL, using=prefill_world)
def _(obs, world):
    req = running_abort(new_req("reentry-prefill", SHORT_PROMPT, 103))
    req.metadata_buffer_index = world.metadata_allocator.alloc()
    obs.precondition("metadata_buffer_held", req.metadata_buffer_index is not None and req.metadata_buffer_index >= 0)
    run_prefill(obs, world, req)


@probe.case("prefill.reentry_retraction_backup",
            "pending abort while holding a retraction backup (Req.offload_kv_cache of its KV row, row then freed), "
            "not marked is_retracted: the backup alone says its queue owes the release",
            decision=DOOR_PREFILL, using=prefill_world)
def _(obs, world):
    req = running_abort(new_req("backup-prefill", SHORT_PROMPT, 104))
    take_retraction_backup(world, req)
    obs.precondition("retraction_backup_held", retraction_backup(req) is not None)
    obs.precondition("kv_row_released", not holds_kv_row(req))
    obs.precondition("not_marked_retracted", not req.is_retracted)
    run_prefill(obs, world, req)


@probe.case("prefill.retracted_no_flag",
            "pending abort on a request reset_for_retract marked is_retracted (KV already freed, no backup), "
            "re-entering through a bare add as priority preemption does",
            decision=DOOR_PREFILL, using=prefill_world)
def _(obs, world):
    req = running_abort(new_req("retracted-prefill", SHORT_PROMPT, 105))
    req.reset_for_retract()
    obs.precondition("marked_retracted", req.is_retracted is True)
    run_prefill(obs, world, req)


@probe.case("decode.rejected_new", "over-long prompt rejected by set_finish_with_abort, then DecodePreallocQueue.add",
            decision=DOOR_DECODE, using=decode_world)
def _(obs, world):
    run_decode(obs, world, rejected(obs, "rej-decode", 201))


@probe.case("decode.valid", "a normal short request at the decode door", decision=DOOR_DECODE, using=decode_world)
def _(obs, world):
    run_decode(obs, world, new_req("ok-decode", SHORT_PROMPT, 202))


@probe.case("decode.reentry_retracted", "pending abort, no resource markers, caller passes is_retracted=True",
            decision=DOOR_DECODE, using=decode_world)
def _(obs, world):
    req = decoded_abort("retracted-decode", 203)
    run_decode(obs, world, req, is_retracted=True)


@probe.case("decode.reentry_rebootstrap", "pending abort, no resource markers, caller passes is_rebootstrap=True",
            decision=DOOR_DECODE, using=decode_world)
def _(obs, world):
    req = decoded_abort("rebootstrap-decode", 204)
    run_decode(obs, world, req, is_rebootstrap=True)


@probe.case("decode.retracted_no_flag",
            "pending abort on a request reset_for_retract marked is_retracted, added without is_retracted "
            "(the bare _add_request_to_queue of priority preemption and pause/retract-all)",
            decision=DOOR_DECODE, using=decode_world)
def _(obs, world):
    req = decoded_abort("retracted-noflag-decode", 205)
    req.reset_for_retract()
    obs.precondition("marked_retracted", req.is_retracted is True)
    run_decode(obs, world, req)


if __name__ == "__main__":
    probe.main()

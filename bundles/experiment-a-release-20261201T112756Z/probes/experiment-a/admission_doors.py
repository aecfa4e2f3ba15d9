"""Experiment A diff probe: the PD admission doors of SGLang PR #38935.

What it shows
    How the real ``PrefillBootstrapQueue.add`` and ``DecodePreallocQueue.add``
    of the SGLang tree on PYTHONPATH treat four kinds of request:
    * a new request the scheduler rejected for an over-long prompt
      (``Req.set_finish_with_abort``: the verdict sits in ``req.to_finish``,
      ``req.finished()`` is still False, the prompt became a 1-token stub);
    * a normal, valid request;
    * re-entering requests that carry a pending abort but are still owed a
      release (prefill: ``metadata_buffer_index >= 0``; decode: the caller
      passes ``is_retracted`` / ``is_rebootstrap``).
    Before #38935 (0.5.20) the rejected request is queued and a KV
    sender/receiver is built for it; from 0.5.21 the door hands it to
    ``Scheduler.retire_unadmitted_request``. The probe only observes; it
    asserts nothing.

What runs for real
    ``Req`` and ``FINISH_ABORT`` (schedule_batch), ``validate_input_length``
    (the scheduler's prompt-length check, used to produce the rejection
    message), ``PrefillBootstrapQueue.add/create_sender``,
    ``DecodePreallocQueue.add`` with its capacity check, ``DecodeRequest``,
    ``is_unadmitted_reject`` where it exists, and ``Scheduler.
    retire_unadmitted_request`` / ``_release_aborted_request`` where they
    exist (bound to a minimal mock scheduler and wrapped in a spy, not
    replaced). Config is published with SGLang's own test-only
    ``override_server_args`` (defaults plus disaggregation_mode).

What is mocked (see MOCKS): KV transport (get_kv_class -> sender/receiver
    classes, kv_manager), metadata buffers and their index allocator, the
    token-to-KV pool/allocator, the tree cache, the scheduler around the
    retire seam, beam coordinator and the output streamer (stream to the
    tokenizer). Both queues are built with ``object.__new__`` plus the
    attributes ``add()`` reads, because their real ``__init__`` builds a KV
    manager, registers GPU buffers and differs in signature per release.

What it does NOT show: no GPU, no RDMA, no model forward, no tenant data, no
    HTTP status seen by a client, and it is not a reproduction of the
    cross-request KV leak; it shows which code path the admission doors take
    in each pinned release.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import types
from array import array
from unittest import mock

import kvprobe_probe as kp

MOCKS = {
    "get_kv_class": "patched in prefill/decode modules: returns MagicMock KV sender/receiver classes; no transport is built, constructor calls are counted",
    "kv_manager": "MagicMock KV manager handed to the sender/receiver; decode's prefill_info_table is an empty dict (no known prefill peer yet)",
    "metadata_buffers": "MagicMock metadata buffers and MagicMock index allocator (alloc -> 0); add() must not touch them, calls are observed",
    "token_to_kv_pool_allocator": "MagicMock allocator (page_size=1, prealloc_ceiling_fits -> None as the base allocator answers, get_kvcache -> MagicMock pool, so no SWA/DeepSeek-V4 path)",
    "tree_cache": "MagicMock radix/tree cache; the real _release_aborted_request calls its finish() on retire",
    "scheduler": "Mock(spec=[names the doors read]) standing in for Scheduler; the real retire_unadmitted_request and _release_aborted_request are bound to it (where they exist) and wrapped in a spy",
    "beam_coordinator": "MagicMock; the real retire calls retire_group(req), a no-op for a request without a beam group",
    "output_streamer": "MagicMock for the stream to the tokenizer/client; calls carrying the request count as an abort output sent",
    "queues_via_object_new": "PrefillBootstrapQueue and DecodePreallocQueue are created with object.__new__ and given only the attributes add() reads (real __init__ builds a KV manager and GPU buffers)",
    "published_config": "not a mock: SGLang's own test-only get_context().override_server_args(disaggregation_mode=...) publishes default ServerArgs, and get_parallel().override(tp_rank=0) states the rank",
}

probe = kp.Probe(
    "admission_doors",
    mocks=MOCKS,
    description="PR #38935: PD admission doors retire never-admitted rejected requests (0.5.20 vs 0.5.21/0.5.22)",
)

# --- the code under test (real SGLang from PYTHONPATH) ----------------------
import sglang  # noqa: E402
from sglang.srt.disaggregation import decode as decode_mod  # noqa: E402
from sglang.srt.disaggregation import prefill as prefill_mod  # noqa: E402
from sglang.srt.disaggregation.decode import DecodePreallocQueue, DecodeRequest  # noqa: E402
from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue  # noqa: E402
from sglang.srt.disaggregation.utils import TransferBackend  # noqa: E402
from sglang.srt.managers.schedule_batch import FINISH_ABORT, Req  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.managers.utils import validate_input_length  # noqa: E402
from sglang.srt.runtime_context import get_context, get_parallel  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

try:  # head-only (#38935); its absence is a fact, not a crash
    from sglang.srt.disaggregation.utils import is_unadmitted_reject
except ImportError:
    is_unadmitted_reject = None

RETIRE = getattr(Scheduler, "retire_unadmitted_request", None)  # head-only
RELEASE_ABORTED = getattr(Scheduler, "_release_aborted_request", None)

# Sizes from the incident: 1,048,576-token context, 681,280-token prefill pool.
CONTEXT_LEN = 1_048_576
POOL_TOKENS = 681_280
# tp_worker.get_worker_info: min(context_len - 1, kv_capacity - 1) - 5
MAX_REQ_INPUT_LEN = min(CONTEXT_LEN - 1, POOL_TOKENS - 1) - 5
LONG_PROMPT = POOL_TOKENS + 1
SHORT_PROMPT = 128
NUM_KV_HEADS = 8
BOOTSTRAP_PORT = 8998


def _sha256(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def _record_facts() -> None:
    probe.fact("sglang_file", sglang.__file__)
    probe.fact("sglang_root", os.path.dirname(os.path.dirname(os.path.abspath(sglang.__file__))))
    probe.fact("sglang_version", getattr(sglang, "__version__", None))
    probe.fact("has_is_unadmitted_reject", is_unadmitted_reject is not None)
    probe.fact("has_retire_unadmitted_request", RETIRE is not None)
    probe.fact("prefill_add_signature", str(inspect.signature(PrefillBootstrapQueue.add)))
    probe.fact("decode_add_signature", str(inspect.signature(DecodePreallocQueue.add)))
    files = {
        "prefill": prefill_mod.__file__,
        "decode": decode_mod.__file__,
        "managers_utils": inspect.getsourcefile(validate_input_length),
        "disagg_utils": inspect.getsourcefile(TransferBackend),
        "schedule_batch": inspect.getsourcefile(Req),
        "scheduler": inspect.getsourcefile(Scheduler),
    }
    probe.fact("source_files", files)
    probe.fact("source_sha256", {k: _sha256(v) for k, v in files.items()})
    probe.fact("incident_sizes", {"context_len": CONTEXT_LEN, "pool_tokens": POOL_TOKENS,
                                  "max_req_input_len": MAX_REQ_INPUT_LEN, "long_prompt": LONG_PROMPT})


_record_facts()


# --- helpers ----------------------------------------------------------------
class _Published:
    """Publish default config for one disaggregation mode, rank 0, then restore."""

    def __init__(self, mode: str) -> None:
        self._override = get_context().override_server_args(disaggregation_mode=mode)
        self._rank = get_parallel().override(tp_rank=0)

    def __enter__(self):
        self._override.install()
        self._rank.__enter__()
        return self

    def __exit__(self, *exc):
        self._rank.__exit__(*exc)
        self._override.restore()


def _new_req(rid: str, prompt_len: int, room: int) -> Req:
    return Req(
        rid,
        "",
        array("q", [7]) * prompt_len,
        SamplingParams(max_new_tokens=16),
        bootstrap_host="10.0.0.2",
        bootstrap_port=BOOTSTRAP_PORT,
        bootstrap_room=room,
    )


def _reject_like_scheduler(req: Req) -> None:
    """What handle_generate_request does with an over-long prompt."""
    error_msg = validate_input_length(req, MAX_REQ_INPUT_LEN, False)
    assert error_msg, "the prompt must be over the limit for this case"
    req.set_finish_with_abort(error_msg)


def _make_scheduler() -> mock.Mock:
    """Minimal scheduler: only the names the doors and the retire path read."""
    names = ["enable_hisparse", "tp_worker", "output_streamer", "tree_cache", "beam_coordinator"]
    if RETIRE is not None:
        names += ["retire_unadmitted_request", "_release_aborted_request"]
    sched = mock.Mock(spec=names, name="scheduler")
    sched.enable_hisparse = False
    sched.output_streamer = mock.MagicMock(name="output_streamer")
    sched.tree_cache = mock.MagicMock(name="tree_cache")
    sched.beam_coordinator = mock.MagicMock(name="beam_coordinator")
    if RETIRE is not None:
        # Real code runs; the spy only counts the call.
        sched._release_aborted_request = types.MethodType(RELEASE_ABORTED, sched)
        sched.retire_unadmitted_request = mock.MagicMock(
            name="retire_unadmitted_request", wraps=types.MethodType(RETIRE, sched)
        )
    return sched


def _allocator() -> mock.MagicMock:
    alloc = mock.MagicMock(name="token_to_kv_pool_allocator")
    alloc.page_size = 1
    alloc.prealloc_ceiling_fits.return_value = None
    alloc.get_kvcache.return_value = mock.MagicMock(name="token_to_kv_pool")
    return alloc


def _metadata_allocator() -> mock.MagicMock:
    allocator = mock.MagicMock(name="req_to_metadata_buffer_idx_allocator")
    allocator.available_size.return_value = 8
    allocator.alloc.return_value = 0
    return allocator


def _prefill_queue(sched) -> PrefillBootstrapQueue:
    queue = object.__new__(PrefillBootstrapQueue)
    queue.scheduler = sched
    queue.queue = []
    queue.max_total_num_tokens = POOL_TOKENS
    queue.transfer_backend = TransferBackend.MOONCAKE
    queue.kv_manager = mock.MagicMock(name="kv_manager")
    queue.bootstrap_port = BOOTSTRAP_PORT
    queue.tp_rank, queue.tp_size, queue.pp_rank, queue.pp_size = 0, 1, 0, 1
    queue.req_to_metadata_buffer_idx_allocator = _metadata_allocator()
    queue.metadata_buffers = mock.MagicMock(name="metadata_buffers")
    queue.token_to_kv_pool = mock.MagicMock(name="token_to_kv_pool")
    return queue


def _decode_queue(sched) -> DecodePreallocQueue:
    queue = object.__new__(DecodePreallocQueue)
    queue.scheduler = sched
    queue.token_to_kv_pool_allocator = _allocator()
    queue.token_to_kv_pool = queue.token_to_kv_pool_allocator.get_kvcache()
    queue.draft_token_to_kv_pool = None
    queue.req_to_token_pool = mock.MagicMock(name="req_to_token_pool")
    queue.tree_cache = sched.tree_cache
    queue.transfer_queue = mock.MagicMock(name="transfer_queue")
    queue.req_to_metadata_buffer_idx_allocator = _metadata_allocator()
    queue.metadata_buffers = mock.MagicMock(name="metadata_buffers")
    queue.kv_manager = mock.MagicMock(name="kv_manager")
    queue.kv_manager.prefill_info_table = {}  # peer not resolved yet: slow path
    queue.bootstrap_port = BOOTSTRAP_PORT
    queue.max_total_num_tokens = POOL_TOKENS
    queue.num_reserved_decode_tokens = 512
    queue.transfer_backend = TransferBackend.MOONCAKE
    queue.tp_rank, queue.tp_size, queue.pp_rank, queue.pp_size, queue.dp_size = 0, 1, 0, 1, 1
    queue.queue, queue.retracted_queue, queue.pending_reqs = [], [], []
    queue.held_rebootstrap_reqs = []
    queue._prefill_dp_rank_queries = {}
    return queue


def _kv_class_patch(module, role: str):
    """Patch get_kv_class in ``module``; returns (patcher, transport class mock)."""
    transport_cls = mock.MagicMock(name=f"kv_{role}_class")
    patcher = mock.patch.object(module, "get_kv_class", return_value=transport_cls)
    return patcher, transport_cls


def _built_for(transport_cls, req: Req) -> bool:
    return any(c.kwargs.get("bootstrap_room") == req.bootstrap_room for c in transport_cls.call_args_list)


def _abort_output_sent(sched, req: Req) -> bool:
    return any(req in (c.args[0] if c.args else []) for c in sched.output_streamer.stream_output.call_args_list)


def _retired(sched) -> bool:
    spy = getattr(sched, "retire_unadmitted_request", None) if RETIRE is not None else None
    return bool(spy is not None and spy.called)


def _record_before(obs, req: Req) -> None:
    obs.record("finished_before_add", req.finished())
    obs.record("has_pending_abort", req.to_finish is not None)
    obs.record("placeholder_len", len(req.origin_input_ids))
    verdict = is_unadmitted_reject(req) if is_unadmitted_reject is not None else None
    obs.record("is_unadmitted_reject", verdict)  # null where the helper does not exist


def _run_prefill(obs, req: Req, metadata_index_before: int) -> None:
    sched = _make_scheduler()
    queue = _prefill_queue(sched)
    patcher, sender_cls = _kv_class_patch(prefill_mod, "sender")
    _record_before(obs, req)
    with patcher:
        queue.add(req, NUM_KV_HEADS)  # as Scheduler._add_request_to_queue does
    obs.record("enqueued", req in queue.queue)
    obs.record("sender_created", _built_for(sender_cls, req))
    obs.record("retired", _retired(sched))
    obs.record("abort_output_sent", _abort_output_sent(sched, req))
    obs.record("finished_after_add", req.finished())
    obs.record("pending_bootstrap", bool(req.pending_bootstrap))
    obs.record("metadata_buffer_allocated", queue.req_to_metadata_buffer_idx_allocator.alloc.called)
    obs.record("metadata_buffer_index_kept", req.metadata_buffer_index == metadata_index_before)
    obs.record("cache_released", sched.tree_cache.finish.called)


def _run_decode(obs, req: Req, **flags) -> None:
    params = inspect.signature(DecodePreallocQueue.add).parameters
    for name in ("is_retracted", "is_rebootstrap"):
        obs.record(f"add_accepts_{name}", name in params)
    missing = [name for name in flags if name not in params]
    if missing:  # the keyword does not exist in this release: observe, don't crash
        obs.record("skipped_missing_keywords", missing)
        return
    sched = _make_scheduler()
    queue = _decode_queue(sched)
    patcher, receiver_cls = _kv_class_patch(decode_mod, "receiver")
    _record_before(obs, req)
    with patcher:
        queue.add(req, **flags)  # as Scheduler._add_request_to_queue / resume paths do
    queued = [d.req for d in queue.queue if isinstance(d, DecodeRequest)]
    obs.record("enqueued", req in queued or req in queue.retracted_queue)
    obs.record("in_prealloc_queue", req in queued)
    obs.record("in_retracted_queue", req in queue.retracted_queue)
    obs.record("receiver_created", _built_for(receiver_cls, req))
    obs.record("retired", _retired(sched))
    obs.record("abort_output_sent", _abort_output_sent(sched, req))
    obs.record("finished_after_add", req.finished())
    obs.record("metadata_buffer_allocated", queue.req_to_metadata_buffer_idx_allocator.alloc.called)


def _rejected(rid: str, room: int) -> Req:
    req = _new_req(rid, LONG_PROMPT, room)
    _reject_like_scheduler(req)
    return req


def _running_abort(req: Req) -> Req:
    """Abort method 3 of Scheduler.abort_request: mark a running request."""
    req.to_finish = FINISH_ABORT()
    return req


# --- cases --------------------------------------------------------------------
@probe.case("prefill.rejected_new", "over-long prompt rejected by set_finish_with_abort, then PrefillBootstrapQueue.add")
def _(obs):
    with _Published("prefill"):
        req = _rejected("rej-prefill", 101)
        _run_prefill(obs, req, req.metadata_buffer_index)


@probe.case("prefill.valid", "a normal short request at the prefill door")
def _(obs):
    with _Published("prefill"):
        req = _new_req("ok-prefill", SHORT_PROMPT, 102)
        _run_prefill(obs, req, req.metadata_buffer_index)


@probe.case("prefill.reentry_metadata", "pending abort while still holding metadata buffer 3: its queue owes the release")
def _(obs):
    with _Published("prefill"):
        req = _running_abort(_new_req("reentry-prefill", SHORT_PROMPT, 103))
        req.metadata_buffer_index = 3
        _run_prefill(obs, req, 3)


@probe.case("decode.rejected_new", "over-long prompt rejected by set_finish_with_abort, then DecodePreallocQueue.add")
def _(obs):
    with _Published("decode"):
        _run_decode(obs, _rejected("rej-decode", 201))


@probe.case("decode.valid", "a normal short request at the decode door")
def _(obs):
    with _Published("decode"):
        _run_decode(obs, _new_req("ok-decode", SHORT_PROMPT, 202))


@probe.case("decode.reentry_retracted", "pending abort, no resource markers, caller passes is_retracted=True")
def _(obs):
    with _Published("decode"):
        req = _running_abort(_new_req("retracted-decode", SHORT_PROMPT, 203))
        req.output_ids = [11, 12, 13]  # it had decoded before retraction
        _run_decode(obs, req, is_retracted=True)


@probe.case("decode.reentry_rebootstrap", "pending abort, no resource markers, caller passes is_rebootstrap=True")
def _(obs):
    with _Published("decode"):
        req = _running_abort(_new_req("rebootstrap-decode", SHORT_PROMPT, 204))
        req.output_ids = [11, 12, 13]
        _run_decode(obs, req, is_rebootstrap=True)


if __name__ == "__main__":
    probe.main()

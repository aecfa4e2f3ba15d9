"""Experiment F diff probe: the optional PD handoff KV checksum of SGLang PR #39500.

What it shows
    How the real decode batch builder, ``get_new_prebuilt_batch`` of
    ``SchedulerDisaggregationDecodeMixin`` (from 0.5.21 it verifies each
    transferred request's KV before the request enters a decode batch), treats:
    * the incident's handoff: prefill replaced a rejected prompt by a 1-token
      placeholder and digested one token's page, while decode reserved the
      original prompt's 8 pages, of which only the first was written by the
      transfer and the other 7 still hold an earlier request's KV;
    * a full handoff (control): every reserved page written by the transfer;
    * the incident's handoff with the option left at its default (off);
    * the incident's handoff of a health-check request (bypasses the check).
    The checksum is opt-in (``--disaggregation-enable-kv-checksum``, ServerArgs
    field ``disaggregation_enable_kv_checksum``, default off; it must be on for
    both engines). Before 0.5.21 neither the option nor the code exists: every
    case is not-present there, which is evidence of absence, not a verdict.
    The probe only observes; it asserts nothing.

What runs for real
    ``get_new_prebuilt_batch``, ``_verify_kv_checksums`` and
    ``_handle_kv_checksum_mismatch`` (bound on the scheduler), SGLang's
    ``prepare_abort``; ``DecodePreallocQueue.__init__`` and
    ``DecodeTransferQueue.__init__`` under the published ``ServerArgs`` (the
    prealloc queue's constructor builds the real ``KvChecksumComputer`` from the
    real ``KVArgs`` of the decode KV pool when the option is on, and sets none
    when it is off); ``page_indices_for_request`` / ``state_indices_for_request``
    on both sides; the prefill side's ``send_kv_chunk`` (which pages it
    digests for the last chunk) and ``MetadataBuffers.set_kv_checksum`` /
    ``get_kv_checksum`` (the digest's slot, sent with the metadata);
    ``Req`` and ``Req.set_finish_with_abort`` (the placeholder);
    the CPU pools (``MHATokenToKVPool``, ``TokenToKVPoolAllocator``,
    ``ReqToTokenPool``) on both sides, whose freed pages come back to the next
    request with their bytes, as on a GPU.

What is mocked (see MOCKS): THE DIGEST ITSELF (KvChecksumComputer.compute is a
    JIT CUDA kernel: a CPU Adler-32 over the same byte regions stands in for
    it, so the evidence shows the decision logic around the digest, not the
    kernel), the KV transfer (a copy of the sent pages), release_kv_cache (a
    recorder), the batch, the scheduler around the builder, the KV transport
    classes, the output streamer and the one-rank collectives.

What it does NOT show: no GPU kernel, no RDMA, no prefill engine (its last
    chunk is digested by the real send_kv_chunk, with the same stand-in, on an
    autospec'd prefill scheduler over a prefill pool), no model forward, no
    tenant data, no HTTP status seen by a client, and not whether a given
    model/backend is covered by the checksum in a deployment.
"""

from __future__ import annotations

import kvprobe_probe as kp

MOCKS = {
    "kv_digest": (
        "STAND-IN ON THE THING BEING CHECKED: SGLang's KvChecksumComputer.compute runs a JIT CUDA "
        "Adler-32 kernel (sglang.kernels.ops.memory.adler32) and asserts CUDA tensors, so it cannot run "
        "on a CPU. It is replaced, on both sides of the handoff, by a CPU Adler-32 (zlib.adler32) over "
        "the same byte regions in the same order: item_len bytes at data_ptr + page * item_len for "
        "every registered KV buffer (then state buffer) of the real computer, read from the real CPU "
        "pools. What is shown is the decision logic around the digest (which pages, which digest is "
        "compared, what happens on a mismatch), not the kernel's arithmetic"
    ),
    "kv_transfer": (
        "the handoff's RDMA writes: the prefill pool's K/V of the tokens the real send_kv_chunk sent (its "
        "end_idx) copied into decode's first reserved pages, and the prefill metadata slot's checksum row "
        "(written by the real set_kv_checksum) copied into decode's real MetadataBuffers; the prefill "
        "forward: those K/V written with a constant. req.expected_kv_checksum is set as "
        "DecodeTransferQueue._commit_transfer_to_req sets it (the rest of that method, output ids and "
        "logprobs, is not run): the real get_kv_checksum of the slot and, from 0.5.23, the real "
        "_kv_checksum_comparable of its layout signature"
    ),
    "prefill_scheduler": (
        "autospec of SGLang's Scheduler for the prefill engine with the real "
        "SchedulerDisaggregationPrefillMixin.send_kv_chunk bound (the digest of the last chunk); "
        "_send_kv_chunk (the KV send itself) records its end_idx and sends nothing; a real "
        "KvChecksumComputer built from the prefill pool's buffer infos as PrefillBootstrapQueue.__init__ "
        "builds it; its bootstrap queue's layout signature (0.5.23) is this decode's (same pool shape)"
    ),
    "kv_transport": (
        "get_kv_class patched in the decode module: KVARGS gives SGLang's real KVArgs (filled by the real "
        "_init_kv_manager from the decode pool); MANAGER an autospec of CommonKVManager that keeps the "
        "KVArgs it is constructed with (the real manager does; the checksum computer is built from "
        "them) and whose should_verify_kv_checksum (0.5.23) answers as BaseKVManager's: True; RECEIVER "
        "an autospec of CommonKVReceiver (never constructed here)"
    ),
    "release_kv_cache": (
        "autospec of this release's release_kv_cache, patched in the decode module: records the call "
        "(request, and is_insert / checkpoint by name) and frees nothing"
    ),
    "scheduler": (
        "autospec of SGLang's Scheduler (an instance) with get_new_prebuilt_batch, _verify_kv_checksums "
        "and _handle_kv_checksum_mismatch bound for real; _get_new_prebuilt_batch (forming the batch from "
        "the waiting queue) hands in the batch of the one transferred request"
    ),
    "batch": (
        "autospec of SGLang's ScheduleBatch (which needs a model) holding the request: filter_batch"
        "(keep_indices=...) keeps those requests, is_empty() is len(reqs) == 0 (as the real ones), "
        "process_prebuilt is recorded (the batch going on to decode)"
    ),
    "tree_cache": "autospec of SGLang's RadixCache, handed to release_kv_cache only",
    "output_streamer": "autospec of SGLang's SchedulerOutputStreamer: stream_output carrying the request counts as the abort sent to the client",
    "metrics_reporter": "autospec of SGLang's SchedulerMetricsReporter with enable_metrics=False",
    "ngram_embedding_manager": "autospec of SGLang's NgramEmbeddingManager: prepare_for_forward recorded",
    "grammar_manager": (
        "autospec of SGLang's GrammarManager: has_waiting_grammars() is False (no grammar pending); with the "
        "scheduler's empty waiting_queue, a batch builder that forms the batch itself finds nothing"
    ),
    "collectives": (
        "all_reduce_flags (0.5.23) patched in the decode module: one rank, the flags unchanged "
        "(SGLang's own single-rank rule)"
    ),
    "scheduler.ps/tp_worker/model_config": (
        "SimpleNamespaces of plain data: rank 0 of one, an 8-token KV pool, 1 layer and 8 KV heads"
    ),
    "parallel_groups": (
        "rank 0 of a one-process world: get_parallel().override(...) where the runtime context exists, "
        "else one-process GroupCoordinator autospecs for the parallel_state globals; GPU id 0 "
        "(get_device().override(gpu_id=0)): the device the real computer is built for, where nothing runs"
    ),
}

probe = kp.Probe(
    "handoff_checksum",
    mocks=MOCKS,
    description="PR #39500 (v0.5.21): optional PD handoff KV checksum, verified by decode before a request enters a batch",
)

# The real SGLang code and the scaffolding around the decode batch builder (beside this file).
import checksum_world  # noqa: E402
from checksum_world import Handoff, decode_world, run_decode  # noqa: E402

checksum_world.declare(probe)

DECISION = "SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch"


def _option_on():
    return decode_world(enable=True)


def _option_off():
    return decode_world(enable=False)


@probe.case("verify.short_handoff_stale_pages",
            "option on: prefill sent and digested a 1-token placeholder, decode reserved the 8-token prompt; "
            "7 reserved pages still hold an earlier request's KV",
            decision=DECISION, using=_option_on)
def _(obs, world):
    run_decode(obs, world, Handoff(obs, world, "short", 301, placeholder=True))


@probe.case("verify.full_handoff",
            "option on (control): the whole 8-token prompt sent, digested and written into every reserved page",
            decision=DECISION, using=_option_on)
def _(obs, world):
    run_decode(obs, world, Handoff(obs, world, "full", 302, placeholder=False))


@probe.case("verify.option_off",
            "the incident's 1-token handoff over stale pages with the option left at its default (off)",
            decision=DECISION, using=_option_off)
def _(obs, world):
    run_decode(obs, world, Handoff(obs, world, "off", 303, placeholder=True))


@probe.case("verify.health_check",
            "option on: the incident's 1-token handoff of a health-check request (rid with SGLang's "
            "health-check prefix), which the check lets through",
            decision=DECISION, using=_option_on)
def _(obs, world):
    constants = kp.require_module("sglang.srt.constants")
    prefix = kp.require(constants, "HEALTH_CHECK_RID_PREFIX")
    run_decode(obs, world, Handoff(obs, world, "health", 304, placeholder=True, rid_prefix=prefix))


if __name__ == "__main__":
    probe.main()

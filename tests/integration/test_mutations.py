"""Mutation tests: each experiment's verdict follows its fix's lines in real SGLang code.

For every experiment a :class:`MutationSpec` names where its fix lives in the release trees
(file + qualified name). tests/mutations.py builds a local git repository from the pinned
wheels: head with the fix's lines reverted, base with them backported. The real ``kvprobe
run ID-mutants --pins mutants --repo REPO`` (real fork server, the real sglang-cpu env) then
runs the experiment's own probes and expectations with base := head-reverted and head :=
base-backported. It reproduces only if the reverted head reads "not fixed" exactly as base
does and the backported base reads "fixed" exactly as head does, every case reaching its
decision point: a probe that says "fixed" whatever the code (or a mutant that merely fails
to import) cannot pass.

Adding an experiment: write its spec below (a few lines) and add it to SPECS. A spec whose
experiment is not in this tree is still checked against the release wheels
(``test_spec_applies_to_the_release_wheels``); only its kvprobe run is skipped, saying so.
"""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from kvprobe.env.cache import default_cache_root
from kvprobe.errors import ExperimentError
from kvprobe.experiments import experiment as experiments
from kvprobe.model.records import WheelPin
from tests.mutations import (
    Define,
    Edit,
    Hunks,
    ImportName,
    MutationSpec,
    apply,
    build_repo,
    experiment_copy,
    judge,
    read_wheel_files,
    release_pins,
)

pytestmark = [pytest.mark.network]

PREFILL = "sglang/srt/disaggregation/prefill.py"
DECODE = "sglang/srt/disaggregation/decode.py"
DISAGG_UTILS = "sglang/srt/disaggregation/utils.py"
SCHEDULER = "sglang/srt/managers/scheduler.py"
COMMON_CONN = "sglang/srt/disaggregation/common/conn.py"
BASE_CONN = "sglang/srt/disaggregation/base/conn.py"
ENVIRON = "sglang/srt/environ.py"

# --- the specs -------------------------------------------------------------------------

# #38935 (0.5.20 -> 0.5.21): the two admission doors retire a never-admitted reject. The
# doors' guards move; the helper and the retire method they call are the fix's scaffolding
# (head keeps them, unused, when its guards are reverted). DecodePreallocQueue.add's
# unrelated dsv41 rebootstrap block, added in the same release, stays where it is.
EXPERIMENT_A = MutationSpec(
    "experiment-a",
    prs=(38935,),
    changes=(
        Define(DISAGG_UTILS, "is_unadmitted_reject", revert=False),
        Define(SCHEDULER, "Scheduler.retire_unadmitted_request", revert=False),
        ImportName(PREFILL, "sglang.srt.disaggregation.utils", "is_unadmitted_reject"),
        ImportName(DECODE, "sglang.srt.disaggregation.utils", "is_unadmitted_reject"),
        Hunks(PREFILL, "PrefillBootstrapQueue.add", select=("is_unadmitted_reject",)),
        Hunks(DECODE, "DecodePreallocQueue.add", select=("is_unadmitted_reject",)),
    ),
    releases=("0.5.20", "0.5.21"),
)

# #36988 (0.5.19 -> 0.5.20): the prefill result path retires an aborted request's result
# (final, middle chunk, grammar-rejected) instead of requeueing it, and streams the aborts.
# The same release's sampling-mask and health-check lines in that method stay. 0.5.19's
# tree cache has no finish(handle, ABORT): the backported helper uses its
# release_aborted_request(rid), the call 0.5.19's own bootstrap-failure path makes.
EXPERIMENT_B = MutationSpec(
    "experiment-b",
    prs=(36988,),
    changes=(
        Define(PREFILL, "SchedulerDisaggregationPrefillMixin._retire_aborted_prefill_result", revert=False),
        Edit(
            PREFILL,
            "SchedulerDisaggregationPrefillMixin._retire_aborted_prefill_result",
            on="base",
            find="self.tree_cache.finish(req.cache_request_handle, CacheRequestOutcome.ABORT)",
            replace="self.tree_cache.release_aborted_request(req.rid)",
        ),
        Hunks(
            PREFILL,
            "SchedulerDisaggregationPrefillMixin.process_batch_result_disagg_prefill",
            select=("_retire_aborted_prefill_result", "aborted_reqs", "grammar", "is_aborted"),
            exclude=("sampling_mask",),
        ),
    ),
    releases=("0.5.19", "0.5.20"),
)

# The specs below follow ../shared/research/more-fixes.md (function names read from the
# 0.5.20 and 0.5.21 wheels). Their experiments were written apart from this file; each spec
# flipped its experiment's verdict against the probes of that experiment's branch (C, D, E
# as committed; F with its branch's compare/5) before the merge.

# #40645 + #41402 (0.5.20 -> 0.5.21): the prefill keeps a drain-ACK target past clear()
# while a write is in flight, and fans the ACK out to every decode peer of the room.
EXPERIMENT_C = MutationSpec(
    "experiment-c",
    prs=(40645, 41402),
    changes=(
        Define(COMMON_CONN, "CommonKVManager._abort_ack_fanout_targets", revert=False),
        Hunks(COMMON_CONN, "CommonKVManager.__init__", select=("_deferred_ack_fanout_snapshots",), revert=False),
        Define(COMMON_CONN, "CommonKVManager.register_deferred_ack_target"),
        Define(COMMON_CONN, "CommonKVManager._maybe_ack_drained_abort"),
        Define(COMMON_CONN, "CommonKVSender.clear"),
    ),
    releases=("0.5.20", "0.5.21"),
)

# #41404 (0.5.20 -> 0.5.21): decode defers the KV release after a failure it did not start:
# ABORT to every prefill rank (force_arm) before the deferral check. 0.5.21's Failed branch
# is entangled with host-staged receive (another change), so both directions are hand
# edits of that branch; ensure_abort_notified and the force_arm keyword are scaffolding.
EXPERIMENT_D = MutationSpec(
    "experiment-d",
    prs=(41404,),
    changes=(
        Define(COMMON_CONN, "CommonKVReceiver.ensure_abort_notified", revert=False),
        Define(COMMON_CONN, "CommonKVReceiver._send_abort_notification", revert=False),
        Edit(
            DECODE,
            "DecodeTransferQueue.pop_transferred",
            on="head",
            find="""
                if deferrable and not decode_req.kv_receiver.abort_notified:
                    # A failure decode did not initiate (prefill fault, transport
                    # error, hicache restore failure) can still have sibling-rank
                    # writes in flight toward these pages. force_arm: a partial
                    # send_metadata leaves init_time None though earlier ranks
                    # already hold destinations; this path always reaches
                    # _do_release, which clears the tracker.
                    decode_req.kv_receiver.ensure_abort_notified(force_arm=True)
            """,
            replace="",
        ),
        Edit(
            DECODE,
            "DecodeTransferQueue.pop_transferred",
            on="base",
            find="""
                if (
                    self.enable_deferred_kv_release
                    and decode_req.kv_receiver.kv_mgr.enable_deferred_decode_kv_release
                    and decode_req.kv_receiver.abort_notified
                ):
            """,
            replace="""
                deferrable = (
                    self.enable_deferred_kv_release
                    and decode_req.kv_receiver.kv_mgr.enable_deferred_decode_kv_release
                )
                if deferrable and not decode_req.kv_receiver.abort_notified:
                    decode_req.kv_receiver.ensure_abort_notified(force_arm=True)
                if deferrable and decode_req.kv_receiver.abort_notified:
            """,
        ),
    ),
    releases=("0.5.20", "0.5.21"),
)

# #41023 (0.5.20 -> 0.5.21): deferred decode KV release on by default, for backends whose
# manager class says it acks the drain: the env default, the manager's AND with the class
# flag, and the flags themselves (read by nothing else in 0.5.21, so they revert too).
EXPERIMENT_E = MutationSpec(
    "experiment-e",
    prs=(41023,),
    changes=(
        Define(ENVIRON, "Envs.SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"),
        Define(BASE_CONN, "BaseKVManager.supports_deferred_decode_kv_release"),
        Define("sglang/srt/disaggregation/mooncake/conn.py", "MooncakeKVManager.supports_deferred_decode_kv_release"),
        Define("sglang/srt/disaggregation/nixl/conn.py", "NixlKVManager.supports_deferred_decode_kv_release"),
        Hunks(COMMON_CONN, "CommonKVManager.__init__", select=("supports_deferred_decode_kv_release",)),
    ),
    releases=("0.5.20", "0.5.21"),
)

# #39500 (0.5.20 -> 0.5.21): the handoff KV checksum. Revert only: the base has no checksum
# module, metadata column or Req field, so a backport by hand would be the whole feature.
# The revert drops the one call that verifies a prebuilt batch (the method was split in
# the same release, so it is a hand edit, not a hunk).
EXPERIMENT_F = MutationSpec(
    "experiment-f",
    prs=(39500,),
    changes=(
        Edit(
            DECODE,
            "SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch",
            on="head",
            find="""
                # Verify after host restore and before process_prebuilt caches any KV.
                self._verify_kv_checksums(batch)
            """,
            replace="",
        ),
    ),
    releases=("0.5.20", "0.5.21"),
    directions=("revert",),
    note="the base has no checksum feature to add the check to",
)

SPECS = {
    spec.experiment: spec
    for spec in (EXPERIMENT_A, EXPERIMENT_B, EXPERIMENT_C, EXPERIMENT_D, EXPERIMENT_E, EXPERIMENT_F)
}

# The release wheels a spec is checked against when its experiment is not in this tree.
RELEASE_WHEELS = {
    "0.5.19": "425e87377e725d03db8262382008f3fd9561a6cf5d82f485f8b9929f02ffe12b",
    "0.5.20": "1573527042f4f6b4ead838302818595fc77fdc611dbcc2e40cd150fbc8f8513c",
    "0.5.21": "96c029f75dec99baa33a5db3d41b1bebefdd6bcfba3a2f7c807fe1cf49a87c20",
    "0.5.22": "cc9a0f15bd8f877a0584fdb7a1702240177a1f1cc8d17c978715161717b9037b",
}


def shipped(experiment: str) -> bool:
    try:
        experiments.find(experiment)
    except ExperimentError:
        return False
    return True


def pins_of(spec: MutationSpec) -> tuple[WheelPin, WheelPin]:
    """The experiment's own wheels when it is shipped (their releases must be the spec's),
    else the spec's releases from RELEASE_WHEELS."""
    if shipped(spec.experiment):
        pins = release_pins(spec.experiment, spec.pins)
        assert (pins[0].version, pins[1].version) == spec.releases, f"{spec.experiment}: the spec's releases"
        return pins
    return tuple(  # type: ignore[return-value]
        WheelPin("sglang", v, f"sglang-{v}-cp311-cp311-manylinux_2_34_x86_64.whl", RELEASE_WHEELS[v])
        for v in spec.releases
    )


def skip_unshipped(spec: MutationSpec) -> None:
    if not shipped(spec.experiment):
        pytest.skip(
            f"{spec.experiment} is not shipped in this tree (written in parallel; its spec is "
            "checked against the wheels and enabled at merge)"
        )


# --- the tests ---------------------------------------------------------------------------


@pytest.mark.parametrize("exp_id", sorted(SPECS))
def test_spec_applies_to_the_release_wheels(exp_id):
    """Every change of the spec matches the pinned wheels' code and leaves files that parse;
    the mutants differ from their release only in the spec's files. Cheap: reads the few
    files from the (cached) wheels, runs nothing."""
    spec = SPECS[exp_id]
    base_pin, head_pin = pins_of(spec)
    cache = default_cache_root()
    base = read_wheel_files(base_pin, spec.files(), cache)
    head = read_wheel_files(head_pin, spec.files(), cache)
    if "revert" in spec.directions:
        reverted = apply(spec.changes, "head", base, head)
        assert reverted and set(reverted) <= set(spec.files())
        assert all(reverted[f] != head[f] for f in reverted)
    if "backport" in spec.directions:
        backported = apply(spec.changes, "base", base, head)
        assert backported and set(backported) <= set(spec.files())
        assert all(backported[f] != base[f] for f in backported)


@pytest.mark.slow
@pytest.mark.parametrize("exp_id", sorted(SPECS))
def test_verdict_follows_the_fix_lines(exp_id, tmp_path):
    spec = SPECS[exp_id]
    skip_unshipped(spec)
    started = time.monotonic()
    cache = default_cache_root()
    repo = build_repo(spec, pins_of(spec), cache)
    built = time.monotonic() - started
    probes = tmp_path / "probes"
    new_id = experiment_copy(spec, repo, probes)
    out = tmp_path / "bundle"
    result = CliRunner(env={"KVPROBE_PROBES_PATH": str(probes)}).invoke(
        main,
        ["run", new_id, "--pins", "mutants", "--repo", str(repo.path), "--out", str(out), "--json"],
        catch_exceptions=False,
    )
    ran = time.monotonic() - started - built
    summary = json.loads(result.stdout)
    receipt = json.loads((out / "receipt.json").read_text(encoding="utf-8"))
    # the sides ran the mutants, nothing else
    base_sha, head_sha = repo.pair(spec)
    assert receipt["sides"]["base"]["source"]["commit"] == base_sha
    assert receipt["sides"]["head"]["source"]["commit"] == head_sha
    report = f"{exp_id}: repo {built:.0f} s, run {ran:.0f} s; {summary['verdict']}: {summary['reasons'][:5]}"
    print(report)
    for direction, (slot, wants) in repo.slots(spec).items():
        verdict = judge(receipt, slot=slot, wants=wants)
        assert not verdict.unobserved, f"{direction}: cases that did not reach their decision point: {verdict}"
        assert verdict.flipped, f"{direction}: no discriminating observation flipped: {verdict}"
        # kept their release's value: the probe does not follow the code, or the spec misses part of the fix
        assert not verdict.not_flipped, f"{direction}: observations that did not flip: {verdict}"
        assert not verdict.controls_broken, f"{direction}: the mutant broke more than the fix: {verdict}"
    if set(spec.directions) == {"revert", "backport"}:
        # base := head minus the fix, head := base plus the fix: the experiment reproduces
        assert (result.exit_code, summary["verdict"]) == (0, "reproduced"), report
    else:
        # the mutant beside the other release: its side alone fails its release's expectations
        assert (result.exit_code, summary["verdict"]) == (1, "not-reproduced"), report
        ((slot, _wants),) = repo.slots(spec).values()
        assert all(reason.startswith(f"{slot}: ") for reason in summary["reasons"]), report

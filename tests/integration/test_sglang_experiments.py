"""Experiments A, B and C end to end on the real SGLang wheels (slow: first run builds the env).

They share the user's kvprobe cache (the sglang-cpu env is several GB and built once per lock),
so a warm CI machine reuses it; a fresh one builds it here.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.network]


def run(tmp_path: Path, exp_id: str, pins: str | None = None) -> tuple[int, dict, Path]:
    out = tmp_path / f"{exp_id}-{pins or 'default'}"
    args = ["run", exp_id, "--out", str(out), "--json"] + (["--pins", pins] if pins else [])
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    summary = json.loads(result.stdout)
    return result.exit_code, summary, out


def observed(summary: dict, case: str) -> dict[str, tuple]:
    return {r["observation"]: (r["base"], r["head"]) for r in summary["observations"] if r["case"] == case}


def test_experiment_a_release_reproduces_on_real_sglang(tmp_path):
    code, summary, bundle = run(tmp_path, "experiment-a")
    assert code == 0, summary["reasons"]
    assert summary["verdict"] == "reproduced"
    rejected = observed(summary, "admission_doors/prefill.rejected_new")
    assert rejected["enqueued"] == (True, False)
    assert rejected["sender_created"] == (True, False)
    assert rejected["retired"] == (False, True)
    assert rejected["placeholder_len"] == (1, 1)
    assert rejected["finished_before_add"] == (False, False)
    decode = observed(summary, "admission_doors/decode.rejected_new")
    assert decode["receiver_created"] == (True, False)
    for case in (
        "prefill.valid",
        "prefill.reentry_metadata",
        "decode.valid",
        "decode.reentry_retracted",
        "decode.reentry_rebootstrap",
    ):
        kept = observed(summary, f"admission_doors/{case}")
        assert kept["enqueued"] == (True, True) and kept["retired"] == (False, False), case
    receipt = json.loads((bundle / "receipt.json").read_text())
    assert receipt["sides"]["base"]["source"]["version"] == "0.5.20"
    assert receipt["sides"]["head"]["source"]["version"] == "0.5.21"
    assert receipt["env"]["packages"]["torch"] == "2.14.1"
    assert receipt["env"]["torch"]["version"].startswith("2.14.1")
    assert receipt["evidence"]["mocks"]["admission_doors"]
    subprocess.run(["sha256sum", "-c", "--strict", "--quiet", "SHA256SUMS"], cwd=bundle, check=True)


def test_experiment_b_release_reproduces_on_real_sglang(tmp_path):
    code, summary, bundle = run(tmp_path, "experiment-b")
    assert code == 0, summary["reasons"]
    aborted = observed(summary, "prefill_result_cleanup/result.aborted_final")
    assert aborted["requeued_inflight"] == (True, False)
    assert aborted["kv_chunk_sends"] == (1, 0)
    assert aborted["metadata_frees"] == (0, 1) and aborted["kv_releases"] == (0, 1)
    late = observed(summary, "prefill_result_cleanup/result.late_after_retire")
    # a real sender or tree cache refuses the released row's cache insert; the strict fake says so
    assert late["refused_calls"] == (["tree_cache.cache_unfinished_req"], [])
    assert late["kv_releases"] == (1, 1)  # freed exactly once on both sides
    control = observed(summary, "prefill_result_cleanup/result.normal_unfinished")
    assert control["requeued_inflight"] == (True, True)
    receipt = json.loads((bundle / "receipt.json").read_text())
    raised = receipt["comparison"]["cases"]["base"]["prefill_result_cleanup/inflight.poll_after_late_result"]
    assert raised["status"] == "raised" and raised["error_type"] == "kvprobe_probe.RejectedCall"
    assert raised["observation"] == "observed"  # the refusal is behaviour: it came after the decision point


def test_experiment_c_release_reproduces_on_real_sglang(tmp_path):
    code, summary, bundle = run(tmp_path, "experiment-c")
    assert code == 0, summary["reasons"]
    assert summary["verdict"] == "reproduced"
    # #40645: the scheduler clears the Failed room before the in-flight write drains
    cleared = observed(summary, "drain_acks/ack.clear_while_inflight")
    assert cleared["ack_target_kept_after_clear"] == (False, True)
    assert cleared["acks_after_drain"] == (0, 1)
    assert cleared["acks_while_write_in_flight"] == (0, 0)  # the safety half: never before the drain
    assert cleared["abort_accepted"] == (True, True)  # the ABORT was taken as a drain-ACK request on both
    # #41402: two decode ranks share the room; before, only the last ABORT sender is ACKed
    fanout = observed(summary, "drain_acks/fanout.two_decode_ranks")
    assert fanout["decode_ranks_acked_after_drain"] == (1, 2)
    assert fanout["first_aborter_acked"] == (False, True)
    assert fanout["acks_while_write_in_flight"] == (0, 0)
    both = observed(summary, "drain_acks/fanout.clear_before_drain")
    assert both["decode_ranks_acked_after_drain"] == (0, 2)
    # controls: a quiescent room is ACKed at once, one decode rank whose write drained first once
    assert observed(summary, "drain_acks/ack.quiescent_abort")["acks_after_abort"] == (1, 1)
    assert observed(summary, "drain_acks/fanout.one_decode_rank")["decode_ranks_acked_after_drain"] == (1, 1)
    receipt = json.loads((bundle / "receipt.json").read_text())
    assert receipt["sides"]["base"]["source"]["version"] == "0.5.20"
    assert receipt["sides"]["head"]["source"]["version"] == "0.5.21"
    assert receipt["experiment"]["vulnerability"]["fix_kind"] == "correctness"
    assert set(receipt["evidence"]["mocks"]["drain_acks"]) >= {"wire", "transfer_worker", "nixl_manager_init"}
    for side in ("base", "head"):
        cases = receipt["comparison"]["cases"][side]
        assert {c["observation"] for c in cases.values()} == {"observed"}, side


@pytest.mark.parametrize("exp_id", ["experiment-a", "experiment-b", "experiment-c"])
def test_head_side_probes_hold_on_sglang_0_5_22(tmp_path, exp_id):
    """A third pinned target: a later refactor that breaks a probe must show, not hide."""
    code, summary, _ = run(tmp_path, exp_id, pins="later-release")
    assert summary["verdict"] == "reproduced", summary["reasons"]
    assert code == 0


def test_unreachable_commit_pins_fail_fast_and_name_the_way_out(tmp_path):
    # a refused connection stands in for GitHub, which these machines cannot reach
    result = CliRunner().invoke(
        main,
        [
            "run",
            "experiment-a",
            "--pins",
            "commits",
            "--repo",
            "https://127.0.0.1:9/sglang.git",
            "--out",
            str(tmp_path / "x"),
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 3
    assert "--repo" in result.stderr and "--pins release" in result.stderr
    assert not (tmp_path / "x").exists()

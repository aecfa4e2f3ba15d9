"""Experiments D (#41404) and E (#41023) end to end on the real SGLang wheels (slow).

One run per experiment on its release pins (0.5.20 -> 0.5.21), shared by the module's
tests; they use the user's kvprobe cache like the experiment A/B tests beside this file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.network]

ENV = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"


def _run(out: Path, exp_id: str) -> tuple[int, dict, dict]:
    result = CliRunner().invoke(main, ["run", exp_id, "--out", str(out), "--json"], catch_exceptions=False)
    return result.exit_code, json.loads(result.stdout), json.loads((out / "receipt.json").read_text())


@pytest.fixture(scope="module")
def experiment_d(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("d") / "bundle", "experiment-d")


@pytest.fixture(scope="module")
def experiment_e(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("e") / "bundle", "experiment-e")


def observed(summary: dict, case: str) -> dict[str, tuple]:
    return {r["observation"]: (r["base"], r["head"]) for r in summary["observations"] if r["case"] == case}


def _raw(bundle: Path, side: str, probe: str) -> dict:
    return json.loads((bundle / "raw" / side / "probes" / f"{probe}.json").read_text())


def test_experiment_d_defers_a_failure_decode_did_not_initiate(experiment_d):
    code, summary, receipt = experiment_d
    assert code == 0, summary["reasons"]
    assert summary["verdict"] == "reproduced"
    failed = observed(summary, "deferred_release/release.failure_not_decode_initiated")
    assert failed["kv_released_at_failure"] == (1, 0)
    assert failed["held_for_deferred_release"] == (0, 1)
    assert failed["abort_sent_to_prefill_ranks"] == ([], [0, 1])
    assert failed["drain_tracker_armed"] == (False, True)
    assert failed["kv_released_after_rank0_ack"] == (0, 0)  # one ACK of two releases nothing
    assert failed["kv_released_after_all_acks"] == (0, 1)
    assert failed["kv_releases_total"] == (1, 1)  # freed exactly once on both sides
    aborted = observed(summary, "deferred_release/release.after_decode_abort")
    assert aborted["held_for_deferred_release"] == (1, 1)
    assert aborted["kv_released_after_all_acks"] == (1, 1)  # armed at each release's own site
    never = observed(summary, "deferred_release/release.receiver_never_published")
    assert never["kv_released_at_failure"] == (1, 1)
    assert receipt["experiment"]["vulnerability"] == {"id": "KVPROBE-2026-0002", "aliases": [], "fix_kind": "security"}
    assert receipt["sides"]["base"]["source"]["version"] == "0.5.20"
    assert receipt["sides"]["head"]["source"]["version"] == "0.5.21"


def test_experiment_d_records_the_forced_setting_per_case(experiment_d):
    _, summary, _ = experiment_d
    bundle = Path(summary["bundle"])
    for side in ("base", "head"):
        settings = _raw(bundle, side, "deferred_release")["configuration"]
        forced = {c["case"] for c in settings if c["name"] == f"env.{ENV}" and c["value"] == "1"}
        assert forced == {
            "release.failure_not_decode_initiated",
            "release.after_decode_abort",
            "release.receiver_never_published",
        }


def test_experiment_e_flips_the_default(experiment_e):
    code, summary, receipt = experiment_e
    assert code == 0, summary["reasons"]
    assert summary["verdict"] == "reproduced"
    abort = observed(summary, "deferred_default/default.decode_abort_mid_transfer")
    assert abort["queue_deferred_release_on"] == (False, True)
    assert abort["manager_deferred_release_on"] == (False, True)
    assert abort["kv_released_at_failure"] == (1, 0)
    assert abort["held_for_deferred_release"] == (0, 1)
    assert abort["kv_releases_total"] == (1, 1)
    flag = observed(summary, "deferred_default/default.manager_flag")
    assert flag["manager_deferred_release_on"] == (False, True)
    assert flag["setting_default"] == (False, True)
    unsupported = observed(summary, "deferred_default/default.unsupported_backend")
    assert unsupported["queue_deferred_release_on"] == (False, True)  # the default is on at head...
    assert unsupported["kv_released_at_failure"] == (1, 1)  # ...and still immediate: the class says no
    bundle = Path(summary["bundle"])
    for side in ("base", "head"):  # the default configuration: the probe set nothing for it
        settings = _raw(bundle, side, "deferred_default")["configuration"]
        assert not [c for c in settings if ENV in c["name"]]
    assert receipt["experiment"]["vulnerability"]["id"] == "KVPROBE-2026-0002"

"""Experiment F (#39500's handoff KV checksum) end to end on the real SGLang wheels (slow).

One run on the release pins: the base (0.5.20) has neither the option nor the code (every case
not-present, checked by the not_present expectation), the head (0.5.21) with the option on
drops the incident's 1-token handoff over stale pages and keeps a full handoff; with the option
off it checks nothing.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvprobe.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.network]

ABSENT = ["sglang.srt.server_args.ServerArgs(disaggregation_enable_kv_checksum=)", "sglang.srt.disaggregation.checksum"]


def test_experiment_f_release_reproduces_a_feature_added_in_head(tmp_path):
    out = tmp_path / "experiment-f"
    result = CliRunner().invoke(main, ["run", "experiment-f", "--out", str(out), "--json"], catch_exceptions=False)
    summary = json.loads(result.stdout)
    assert result.exit_code == 0, summary["reasons"]
    assert summary["verdict"] == "reproduced"
    receipt = json.loads((out / "receipt.json").read_text())
    assert receipt["comparison"]["algorithm"] == "kvprobe.compare/5"
    assert receipt["sides"]["base"]["source"]["version"] == "0.5.20"
    assert receipt["sides"]["head"]["source"]["version"] == "0.5.21"
    assert receipt["experiment"]["vulnerability"]["fix_kind"] == "hardening"
    cases = receipt["comparison"]["cases"]
    for key, case in cases["base"].items():  # evidence of absence, never behaviour
        assert case["observation"] == "not-present" and case["missing"] == ABSENT, key
    head = {k.split("/", 1)[1]: c["observations"] for k, c in cases["head"].items()}
    assert {c["observation"] for c in cases["head"].values()} == {"observed"}
    short = head["verify.short_handoff_stale_pages"]
    assert short["checksum_computer_built"] and short["decode_digests"] == 1
    # the real prefill send_kv_chunk digested only the placeholder's one token and wrote the digest
    assert short["prefill_sent_tokens"] == 1 and short["prefill_digest_written"] and short["stale_pages"] == 7
    assert short["kept_in_prebuilt_batch"] is False and short["prebuilt_batch_returned"] is False
    assert (short["finish_reason"], short["status_code"], short["abort_streamed"]) == ("FINISH_ABORT", 500, True)
    assert short["kv_release_cache_inserts"] == [False]  # released once, nothing cached
    full = head["verify.full_handoff"]
    assert full["kept_in_prebuilt_batch"] and full["process_prebuilt_called"] and full["kv_release_cache_inserts"] == []
    off = head["verify.option_off"]  # an option counts only where it is on
    assert off["checksum_computer_built"] is False and off["decode_digests"] == 0
    assert off["prefill_digest_written"] is False
    assert off["kept_in_prebuilt_batch"] and off["stale_pages"] == 7 and off["finish_reason"] == "none"
    mocks = receipt["evidence"]["mocks"]["handoff_checksum"]
    assert mocks["kv_digest"].startswith("STAND-IN ON THE THING BEING CHECKED")
    assert any("digest itself" in item for item in receipt["evidence"]["does_not_show"])
    assert "expected to lack the code of 4 case(s)" in (out / "README.md").read_text()

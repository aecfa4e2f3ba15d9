"""`kvprobe gates` against the real SGLang wheels 0.5.20 and 0.5.22 (gate 2 runs the probes).

The same deployment description (startup logs with pools that cover the context, the handoff
checksum on on both sides, deferred release on with Mooncake) is checked against two releases:
0.5.22 passes all four gates; 0.5.20 fails gate 2 (experiment A's admission door, #38935, is
not in it) while experiment B's #36988 behaves as fixed, and gates 3 and 4 fail on the code.
Shares the user's kvprobe cache (the sglang-cpu env is built once per lock).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from kvprobe.files import json_bytes
from kvprobe.model.gates_receipt import GatesReceipt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_gates_logs import GLM_CONTEXT, RAISED_POOL, server_args_dict, startup_log

pytestmark = [pytest.mark.slow, pytest.mark.network]


def deployment(tmp_path: Path, version: str) -> list[str]:
    """CLI arguments describing one healthy-looking PD deployment of ``version``."""
    argv = []
    for mode in ("prefill", "decode"):
        on = {"disaggregation_enable_kv_checksum": True} if version >= "0.5.21" else {}
        log = tmp_path / f"{mode}.log"
        log.write_text(startup_log(version, mode, RAISED_POOL, GLM_CONTEXT, args=server_args_dict(version, mode, **on)))
        args = tmp_path / f"{mode}-args.json"
        args.write_text(
            json.dumps(
                {
                    "disaggregation_mode": mode,
                    "disaggregation_transfer_backend": "mooncake",
                    "env": {"SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE": "1"},
                }
            )
        )
        argv += ["--log", str(log), "--server-args", f"{mode}={args}"]
    return argv


def gates(tmp_path: Path, version: str) -> tuple[int, dict, Path]:
    out = tmp_path / f"bundle-{version}"
    argv = ["gates", *deployment(tmp_path, version), "--sglang", version, "--out", str(out), "--json"]
    result = CliRunner().invoke(main, argv, catch_exceptions=False)
    return result.exit_code, json.loads(result.stdout), out


def by_name(gate: dict) -> dict[str, dict]:
    return {c["name"]: c for c in gate["checks"]}


def test_gates_pass_on_0_5_22(tmp_path):
    code, doc, bundle = gates(tmp_path, "0.5.22")
    statuses = [g["status"] for g in doc["gates"]]
    assert code == 0, json.dumps(doc["gates"], indent=1)
    assert statuses == ["pass"] * 4 and doc["overall"] == "pass"
    gate2 = by_name(doc["gates"][1])
    assert gate2["experiment-a: admission_doors/prefill.rejected_new"]["status"] == "pass"
    assert gate2["experiment-b: prefill_result_cleanup/result.aborted_final"]["status"] == "pass"
    markers = {m["pr"]: m["presence"] for m in doc["target"]["markers"]}
    assert markers == {39500: "present", 40645: "present", 41402: "present", 41404: "present", 41023: "present"}
    assert subprocess.run(["sha256sum", "-c", "--strict", "--quiet", "SHA256SUMS"], cwd=bundle).returncode == 0
    receipt = json.loads((bundle / "receipt.json").read_text())
    assert {p["name"]: p["problem"] for p in receipt["probes"]} == {
        "admission_doors": None,
        "prefill_result_cleanup": None,
    }
    assert receipt["target"]["identity"]["version"] == "0.5.22"
    execution = receipt["execution"]  # one preloaded server for the gates run
    assert [(c["name"], c["mode"]) for c in execution["checks"]] == [
        ("experiment-a/admission_doors", "forked"),
        ("experiment-b/prefill_result_cleanup", "forked"),
    ]
    assert execution["preloaded"]["torch"] == receipt["env"]["torch"]["version"]
    cited = receipt["gate2"]["experiments"]  # what verify recomputes gate 2 from, besides the outputs
    assert [(e["id"], e["file"]["path"]) for e in cited] == [
        (i, f"probes/{i}/experiment.toml") for i in ("experiment-a", "experiment-b")
    ]
    verified = CliRunner().invoke(main, ["verify", str(bundle), "--json"], catch_exceptions=False)
    assert verified.exit_code == 0, verified.stdout  # gate 2 recomputed; its experiments the installed copies
    notes = json.loads(verified.stdout)["steps"][4]["notes"]
    assert [n.split(":")[0] for n in notes[:2]] == ["probes/experiment-a/", "probes/experiment-b/"]
    assert json_bytes(GatesReceipt.from_json(receipt).to_json()) == (bundle / "receipt.json").read_bytes()


def test_gates_fail_gate_2_on_0_5_20_door_fix_absent(tmp_path):
    code, doc, _bundle = gates(tmp_path, "0.5.20")
    assert code == 1
    assert [g["status"] for g in doc["gates"]] == ["pass", "fail", "fail", "fail"]
    gate2 = doc["gates"][1]["checks"]
    door = [c for c in gate2 if c["name"].startswith("experiment-a: admission_doors/") and "rejected_new" in c["name"]]
    assert {c["status"] for c in door} == {"fail"} and len(door) == 2
    assert any("enqueued expected False, got True" in c["detail"] for c in door)
    cleanup = [c for c in gate2 if c["name"].startswith("experiment-b:")]
    assert cleanup and {c["status"] for c in cleanup} == {"pass"}  # #36988 is in 0.5.20
    gate3 = by_name(doc["gates"][2])
    assert "not present in this release" in gate3["prefill: KV checksum"]["detail"]
    assert {m["pr"]: m["presence"] for m in doc["target"]["markers"]}[40645] == "absent"


def test_gate_2_passes_on_0_5_23_which_has_both_fixes(tmp_path):
    """0.5.23 is resolved by version on the index (no experiment pins it); its probes reach every
    decision point, so gate 2 is decided, and decided pass (issue #12: once a false alarm)."""
    _code, doc, bundle = gates(tmp_path, "0.5.23")
    gate2 = doc["gates"][1]
    assert gate2["status"] == "pass", json.dumps(gate2, indent=1)
    assert {c["status"] for c in gate2["checks"]} == {"pass"}
    receipt = json.loads((bundle / "receipt.json").read_text())
    assert receipt["target"]["identity"]["version"] == "0.5.23"
    for probe in receipt["probes"]:  # what each probe set and what its mocks absorbed, as its output says
        raw = json.loads((bundle / probe["raw"]["path"]).read_text())
        assert (probe["configuration"], probe["absorbed"]) == (raw.get("configuration", []), raw.get("absorbed", []))

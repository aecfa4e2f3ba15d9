"""`kvprobe gates` against the real SGLang wheels 0.5.20, 0.5.21 and 0.5.23: gates 2, 3 and 4 run
their experiments' probes (A, B; F; C, D, E) on the release, from one fork server.

The same deployment description (startup logs with pools that cover the context, the handoff
checksum on on both sides where the release has it, deferred release on in each worker's
environment (--env), Mooncake) is checked against each release, one gates run per release:
0.5.21 passes all four gates by behaviour; 0.5.20 fails gate 2 (experiment A's admission door,
#38935, is not in it) while experiment B's #36988 behaves as fixed, gate 3 because #39500's
checksum is not present (the defence is absent), and gate 4 because C, D and E observe the
unfixed drain ACKs, release and default. Shares the user's kvprobe cache (the sglang-cpu env is
built once per lock).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from kvprobe.files import json_bytes
from kvprobe.model.gates_receipt import GatesReceipt
from tests.unit.gates.test_gates_logs import GLM_CONTEXT, RAISED_POOL, server_args_dict, startup_log

pytestmark = [pytest.mark.slow, pytest.mark.network]


def deployment(tmp_path: Path, version: str) -> list[str]:
    """CLI arguments describing one healthy-looking PD deployment of ``version``."""
    argv = []
    for mode in ("prefill", "decode"):
        on = {"disaggregation_enable_kv_checksum": True} if version >= "0.5.21" else {}
        log = tmp_path / f"{mode}.log"
        log.write_text(startup_log(version, mode, RAISED_POOL, GLM_CONTEXT, args=server_args_dict(version, mode, **on)))
        args = tmp_path / f"{mode}-args.json"
        args.write_text(json.dumps({"disaggregation_mode": mode, "disaggregation_transfer_backend": "mooncake"}))
        env = tmp_path / f"{mode}.env"
        env.write_text("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=1\n")
        argv += ["--log", str(log), "--server-args", f"{mode}={args}", "--env", f"{mode}={env}"]
    return argv


PROBES = [  # (gate, probe) in the order a gates run runs them
    (2, "experiment-a/admission_doors"),
    (2, "experiment-b/prefill_result_cleanup"),
    (3, "experiment-f/handoff_checksum"),
    (4, "experiment-c/drain_acks"),
    (4, "experiment-d/deferred_release"),
    (4, "experiment-e/deferred_default"),
]


def gates(tmp_path: Path, version: str) -> tuple[int, dict, Path]:
    out = tmp_path / f"bundle-{version}"
    argv = ["gates", *deployment(tmp_path, version), "--sglang", version, "--out", str(out), "--json"]
    result = CliRunner().invoke(main, argv, catch_exceptions=False)
    for gate, name in PROBES:  # a progress line on stderr for each probe
        exp, probe = name.split("/")
        assert f"gate {gate}: {exp} probe {probe} against {version}" in result.stderr, result.stderr
    return result.exit_code, json.loads(result.stdout), out


def by_name(gate: dict) -> dict[str, dict]:
    return {c["name"]: c for c in gate["checks"]}


def probe_checks(gate: dict) -> dict[str, dict]:
    return {c["name"]: c for c in gate["checks"] if c["name"].startswith("experiment-")}


def test_gates_pass_on_0_5_21_by_behaviour(tmp_path):
    code, doc, bundle = gates(tmp_path, "0.5.21")
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
    for number in (3, 4):  # decided by the probes and the settings; the markers only inform
        gate = doc["gates"][number - 1]
        probes = probe_checks(gate)
        assert probes and {c["status"] for c in probes.values()} == {"pass"}, json.dumps(gate, indent=1)
        assert all(not c["decides"] for c in gate["checks"] if c["name"].endswith(" in code"))
    assert "experiment-f: handoff_checksum/verify.short_handoff_stale_pages" in probe_checks(doc["gates"][2])
    assert by_name(doc["gates"][2])["read-integrity defence"]["status"] == "pass"
    assert {by_name(doc["gates"][3])[f"{r}: deferred KV release"]["status"] for r in ("prefill", "decode")} == {"pass"}
    assert {(p["gate"], f"{p['experiment']}/{p['name']}"): p["problem"] for p in receipt["probes"]} == {
        probe: None for probe in PROBES
    }
    assert receipt["target"]["identity"]["version"] == "0.5.21"
    execution = receipt["execution"]  # one preloaded server for the gates run
    assert [(c["name"], c["mode"]) for c in execution["checks"]] == [(name, "forked") for _g, name in PROBES]
    assert execution["preloaded"]["torch"] == receipt["env"]["torch"]["version"]
    # what verify recomputes each behavioural gate from, besides the outputs
    assert [(b["gate"], b["algorithm"], [e["id"] for e in b["experiments"]]) for b in receipt["behaviour"]] == [
        (2, "kvprobe.gate2/1", ["experiment-a", "experiment-b"]),
        (3, "kvprobe.gate3-probes/1", ["experiment-f"]),
        (4, "kvprobe.gate4-probes/1", ["experiment-c", "experiment-d", "experiment-e"]),
    ]
    verified = CliRunner().invoke(main, ["verify", str(bundle), "--json"], catch_exceptions=False)
    assert verified.exit_code == 0, verified.stdout  # gates 2-4 recomputed; their experiments the installed copies
    notes = json.loads(verified.stdout)["steps"][4]["notes"]
    assert [n.split(":")[0] for n in notes[:6]] == [f"probes/{name.split('/')[0]}/" for _g, name in PROBES]
    assert json_bytes(GatesReceipt.from_json(receipt).to_json()) == (bundle / "receipt.json").read_bytes()


def test_gates_2_3_and_4_fail_on_0_5_20_by_behaviour(tmp_path):
    code, doc, bundle = gates(tmp_path, "0.5.20")
    assert code == 1
    assert [g["status"] for g in doc["gates"]] == ["pass", "fail", "fail", "fail"]
    gate2 = doc["gates"][1]["checks"]
    door = [c for c in gate2 if c["name"].startswith("experiment-a: admission_doors/") and "rejected_new" in c["name"]]
    assert {c["status"] for c in door} == {"fail"} and len(door) == 2
    assert any("enqueued expected False, got True" in c["detail"] for c in door)
    cleanup = [c for c in gate2 if c["name"].startswith("experiment-b:")]
    assert cleanup and {c["status"] for c in cleanup} == {"pass"}  # #36988 is in 0.5.20
    gate3 = probe_checks(doc["gates"][2])  # #39500 is not in 0.5.20: the defence is absent
    assert len(gate3) == 4 and {c["status"] for c in gate3.values()} == {"fail"}
    assert all(c["detail"].endswith("the defence is absent") for c in gate3.values())
    assert "sglang.srt.disaggregation.checksum" in gate3["experiment-f: handoff_checksum/verify.full_handoff"]["detail"]
    assert "not present in this release" in by_name(doc["gates"][2])["prefill: KV checksum"]["detail"]
    gate4 = probe_checks(doc["gates"][3])  # the code is there; it behaves as before the fixes
    failed = sorted(n for n, c in gate4.items() if c["status"] == "fail")
    assert failed == [
        "experiment-c: drain_acks/ack.clear_while_inflight",
        "experiment-c: drain_acks/fanout.clear_before_drain",
        "experiment-c: drain_acks/fanout.two_decode_ranks",
        "experiment-d: deferred_release/release.failure_not_decode_initiated",
        "experiment-e: deferred_default/default.decode_abort_mid_transfer",
        "experiment-e: deferred_default/default.manager_flag",
    ]
    assert {c["status"] for n, c in gate4.items() if n not in failed} == {"pass"}  # the controls hold
    assert "the defence is absent" not in " ".join(c["detail"] for c in gate4.values())  # observed, not absent
    assert {m["pr"]: m["presence"] for m in doc["target"]["markers"]}[40645] == "absent"
    verified = CliRunner().invoke(main, ["verify", str(bundle)], catch_exceptions=False)
    assert verified.exit_code == 0, verified.output  # a failing gate verifies: it is what the outputs give


def test_gates_2_3_and_4_pass_on_0_5_23_which_has_every_fix(tmp_path):
    """0.5.23 is resolved by version on the index (no experiment pins it); its probes reach every
    decision point (its changes since 0.5.21 included), so gates 2-4 are decided, and decided
    pass (issue #12: gate 2 was once a false alarm here)."""
    _code, doc, bundle = gates(tmp_path, "0.5.23")
    gate2 = doc["gates"][1]
    assert gate2["status"] == "pass", json.dumps(gate2, indent=1)
    assert {c["status"] for c in gate2["checks"]} == {"pass"}
    for gate in doc["gates"][2:]:
        assert gate["status"] == "pass" and {c["status"] for c in probe_checks(gate).values()} == {"pass"}, gate
    receipt = json.loads((bundle / "receipt.json").read_text())
    assert receipt["target"]["identity"]["version"] == "0.5.23"
    for probe in receipt["probes"]:  # what each probe set and what its mocks absorbed, as its output says
        raw = json.loads((bundle / probe["raw"]["path"]).read_text())
        assert (probe["configuration"], probe["absorbed"]) == (raw.get("configuration", []), raw.get("absorbed", []))

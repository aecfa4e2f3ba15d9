"""Gates 3 and 4 are behavioural (issue #23): their probe checks (experiment F for gate 3; C, D
and E for gate 4) must be what the bundled raw outputs and experiment files give. Verify step 4
recomputes them with the rule `kvprobe gates` decides with (rules/gate_probes); a publisher
who states them passed over outputs that show the fix absent or unfixed, drops an experiment,
or points a probe record at another output, and re-hashes everything, is refused (exit 1).
"""

from __future__ import annotations

import json

import pytest

from tests import forge, forge_gate2
from tests.attacks.harness import assert_outcome

pytestmark = pytest.mark.attack

F_CASE = "handoff_checksum/verify.short_handoff_stale_pages"
E_CASE = "deferred_default/default.decode_abort_mid_transfer"


def checksum_absent() -> forge_gate2.Outputs:
    """Experiment F on a release without #39500 (0.5.20): every case not present."""
    outputs = forge_gate2.as_fixed()
    missing = "sglang.srt.disaggregation.checksum"
    error = {"type": "kvprobe_probe.NotPresent", "message": "m", "root_type": "kvprobe_probe.NotPresent"}
    for case in outputs["experiment-f"]["handoff_checksum"]["cases"]:
        case.update(
            status="raised",
            error={**error, "root_message": "m", "traceback": "t"},
            observation="not-present",
            observations={},
            reason=f"not present in this release: {missing}",
            missing=[missing],
        )
    return outputs


def default_off() -> forge_gate2.Outputs:
    """Experiment E on a release whose deferred release is off by default (0.5.20): freed at once."""
    outputs = forge_gate2.as_fixed()
    case = forge_gate2.case_of(outputs, "experiment-e", E_CASE)
    case["observations"].update(
        queue_deferred_release_on=False,
        manager_deferred_release_on=False,
        kv_released_at_failure=1,
        held_for_deferred_release=0,
    )
    return outputs


def gate(bundle, number: int) -> dict:
    receipt = json.loads((bundle / "receipt.json").read_bytes())
    return next(g for g in receipt["gates"] if g["number"] == number)


def checks(bundle, number: int) -> dict[str, dict]:
    return {c["name"]: c for c in gate(bundle, number)["checks"]}


def test_honest_probe_checks_of_gates_3_and_4_verify(sandbox, gates_bundle):
    """The control: outputs that show the fixes absent or unfixed, stated as they give them."""
    written = checksum_absent()
    written["experiment-e"] = default_off()["experiment-e"]
    forge_gate2.graft(gates_bundle, written=written)
    assert checks(gates_bundle, 3)[f"experiment-f: {F_CASE}"]["status"] == "fail"
    assert checks(gates_bundle, 4)[f"experiment-e: {E_CASE}"]["status"] == "fail"
    assert gate(gates_bundle, 3)["status"] == gate(gates_bundle, 4)["status"] == "fail"
    result = sandbox.run("verify", gates_bundle, "--json")
    assert result.code == 0, result.describe()
    notes = json.loads(result.out)["steps"][4]["notes"]
    assert any(n.startswith("probes/experiment-f/: same as") for n in notes)  # held to the installed copy


@pytest.mark.parametrize(("outputs", "number", "case"), [(checksum_absent, 3, F_CASE), (default_off, 4, E_CASE)])
def test_probe_checks_stated_pass_over_outputs_that_fail_are_refused(sandbox, gates_bundle, outputs, number, case):
    """Attack: the raw outputs show the fix absent (F) or unfixed (E); the receipt states every
    probe check passed (the gate's status as those checks give it), re-hashed consistently."""
    forge_gate2.graft(gates_bundle, written=outputs(), decided=forge_gate2.as_fixed())
    assert {c["status"] for n, c in checks(gates_bundle, number).items() if n.startswith("experiment-")} == {"pass"}
    result = sandbox.run("verify", gates_bundle)
    assert_outcome(sandbox, result, 1, "forged-verdict", f"gate {number}'s probe checks", case)


def test_a_gate_status_stated_pass_over_failing_probe_checks_is_refused(sandbox, gates_bundle):
    """Attack: the probe checks as their outputs give them (F absent: fail), gate 3 and the
    overall result stated pass."""
    forge_gate2.graft(gates_bundle, written=checksum_absent())

    def forge_pass(receipt: dict) -> None:
        receipt["gates"][2]["status"] = "pass"

    forge.edit_receipt(gates_bundle, forge_pass)
    result = sandbox.run("verify", gates_bundle)
    assert_outcome(sandbox, result, 1, "forged-verdict", "gate 3 states 'pass'")


def test_dropping_an_experiment_from_gate_4_is_refused(sandbox, gates_bundle):
    """Attack: experiment D's outputs show #41404 missing, so the receipt drops D from gate 4
    (its probe records, its cited file, its checks) and keeps C and E."""
    forge_gate2.graft(gates_bundle)

    def drop_d(receipt: dict) -> None:
        receipt["probes"] = [p for p in receipt["probes"] if p["experiment"] != "experiment-d"]
        basis = next(b for b in receipt["behaviour"] if b["gate"] == 4)
        basis["experiments"] = [e for e in basis["experiments"] if e["id"] != "experiment-d"]
        g4 = next(g for g in receipt["gates"] if g["number"] == 4)
        g4["checks"] = [c for c in g4["checks"] if not c["name"].startswith("experiment-d")]

    forge.edit_receipt(gates_bundle, drop_d)
    result = sandbox.run("verify", gates_bundle)
    assert_outcome(sandbox, result, 1, "record-mismatch", "gate 4 cites experiments ['experiment-c', 'experiment-e']")


def test_dropping_gate_3s_basis_is_refused(sandbox, gates_bundle):
    """Attack: gate 3's basis and probes removed, so nothing is recomputed and its stated checks stand."""
    forge_gate2.graft(gates_bundle, written=checksum_absent(), decided=forge_gate2.as_fixed())

    def drop_gate3(receipt: dict) -> None:
        receipt["behaviour"] = [b for b in receipt["behaviour"] if b["gate"] != 3]
        receipt["probes"] = [p for p in receipt["probes"] if p["gate"] != 3]

    forge.edit_receipt(gates_bundle, drop_gate3)
    result = sandbox.run("verify", gates_bundle)
    assert_outcome(sandbox, result, 1, "record-mismatch", "probe bases for gates [2, 4]")


def test_a_probe_record_pointing_at_another_output_is_refused(sandbox, gates_bundle):
    """Attack: experiment E's output shows the default off; its probe record is pointed at a
    passing output of the same name copied from gate 2's directory, re-cited and re-hashed."""
    forge_gate2.graft(gates_bundle, written=default_off(), decided=forge_gate2.as_fixed())
    fixed = forge_gate2.as_fixed()["experiment-e"]["deferred_default"]
    swapped = "raw/gate2/experiment-e/deferred_default.json"
    (gates_bundle / swapped).parent.mkdir(parents=True)
    (gates_bundle / swapped).write_bytes(forge.dumps(fixed))

    def point(receipt: dict) -> None:
        probe = next(p for p in receipt["probes"] if p["experiment"] == "experiment-e")
        probe["raw"] = {"path": swapped, "sha256": forge.sha((gates_bundle / swapped).read_bytes())}

    forge.edit_receipt(gates_bundle, point)
    result = sandbox.run("verify", gates_bundle)
    assert_outcome(sandbox, result, 1, "citation-misplaced", "expected raw/gate4/experiment-e/deferred_default.json")


def test_swapping_a_raw_output_for_a_fixed_one_changes_nothing_the_receipt_states(sandbox, gates_bundle):
    """Attack: the receipt states gate 4's probe checks from unfixed outputs (honestly), then the
    raw output of E is swapped for a fixed one and re-hashed: the stated fails no longer follow."""
    forge_gate2.graft(gates_bundle, written=default_off())
    rel = "raw/gate4/experiment-e/deferred_default.json"
    (gates_bundle / rel).write_bytes(forge.dumps(forge_gate2.as_fixed()["experiment-e"]["deferred_default"]))

    def recite(receipt: dict) -> None:
        probe = next(p for p in receipt["probes"] if p["experiment"] == "experiment-e")
        probe["raw"]["sha256"] = forge.sha((gates_bundle / rel).read_bytes())

    forge.edit_receipt(gates_bundle, recite)
    result = sandbox.run("verify", gates_bundle)
    assert_outcome(sandbox, result, 1, "forged-verdict", "gate 4's probe checks", E_CASE)


def test_a_marker_stated_as_deciding_is_refused(sandbox, gates_bundle):
    """Attack: a fix marker present in the code made to decide gate 4 (a receipt of /4, where the
    probes decide): the text being there is not the behaviour being fixed."""
    forge_gate2.graft(gates_bundle)

    def decides(receipt: dict) -> None:
        g4 = next(g for g in receipt["gates"] if g["number"] == 4)
        next(c for c in g4["checks"] if c["name"] == "#41404 in code")["decides"] = True

    forge.edit_receipt(gates_bundle, decides)
    result = sandbox.run("verify", gates_bundle)
    assert_outcome(sandbox, result, 1, "record-mismatch", "'#41404 in code' decides")

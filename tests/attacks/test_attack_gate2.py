"""A gates receipt's gate 2 must be what its raw probe outputs give (issue #12): verify step 4
recomputes every gate-2 check from the bundled outputs and the bundled experiments' head
expectations (rules/gate2, the rule `kvprobe gates` decides with), then each gate and the
overall result. A publisher who states gate 2 passed while the outputs show the door behaving
as unfixed, or not observed, and re-hashes everything consistently, is refused with one line,
exit 1. The experiment files gate 2 was held to are step 5's: the installed copies.
"""

from __future__ import annotations

import json

import pytest

from kvprobe.rules import gate_scope
from tests import forge, forge_gate2
from tests.attacks.harness import assert_outcome

pytestmark = pytest.mark.attack

# experiment A's prefill door: a rejected request must not be enqueued
CASE = "admission_doors/prefill.rejected_new"


def unfixed() -> forge_gate2.Outputs:
    """The outputs of a release whose prefill door still enqueues the rejected request."""
    outputs = forge_gate2.as_fixed()
    case = forge_gate2.case_of(outputs, "experiment-a", CASE)
    case["observations"] = {k: not v if isinstance(v, bool) else v for k, v in case["observations"].items()}
    return outputs


def unobserved() -> forge_gate2.Outputs:
    """The outputs of a release on which the probe's set-up drifted before the door."""
    outputs = forge_gate2.as_fixed()
    case = forge_gate2.case_of(outputs, "experiment-a", CASE)
    case.update(observation="unobserved", reason="'PrefillBootstrapQueue' has no max_input_len", decision_point=None)
    return outputs


def gate2(bundle):
    receipt = json.loads((bundle / "receipt.json").read_bytes())
    return next(g for g in receipt["gates"] if g["number"] == 2)


def test_a_gates_bundle_whose_gate2_its_outputs_give_verifies(sandbox, gates_bundle):
    """The control: gate 2 grafted honestly (every case as fixed) passes and verifies, steps 4 and 5."""
    forge_gate2.graft(gates_bundle)
    assert gate2(gates_bundle)["status"] == "pass"
    result = sandbox.run("verify", gates_bundle, "--json")
    assert result.code == 0, result.describe()
    step5 = json.loads(result.out)["steps"][4]
    assert any("probes/experiment-a/: same as" in n for n in step5["notes"]), step5


@pytest.mark.parametrize(("outputs", "honest"), [(unfixed, "fail"), (unobserved, "unknown")])
def test_the_honest_gate2_of_such_outputs_verifies(sandbox, gates_bundle, outputs, honest):
    """The same outputs with gate 2 stated as they give it: verified (so what fails below is the forgery)."""
    forge_gate2.graft(gates_bundle, written=outputs())
    assert gate2(gates_bundle)["status"] == honest
    result = sandbox.run("verify", gates_bundle)
    assert result.code == 0, result.describe()


@pytest.mark.parametrize("outputs", [unfixed, unobserved])
def test_gate2_stated_pass_over_outputs_that_do_not_pass_is_refused(sandbox, gates_bundle, outputs):
    """Attack: the raw outputs show the door behaving as unfixed (or the case not observed); the
    receipt states every gate-2 check passed and gate 2 passed, re-hashed consistently."""
    forge_gate2.graft(gates_bundle, written=outputs(), decided=forge_gate2.as_fixed())
    assert gate2(gates_bundle)["status"] == "pass"
    result = sandbox.run("verify", gates_bundle)
    assert_outcome(sandbox, result, 1, "forged-verdict", "gate 2", CASE)


def test_a_downgrade_to_schema_1_does_not_escape_the_recompute(sandbox, gates_bundle):
    """Attack: the same forged pass, the receipt rewritten as /1 (which cites no experiment files)."""
    forge_gate2.graft(gates_bundle, written=unfixed(), decided=forge_gate2.as_fixed())
    receipt = forge.load(gates_bundle, "receipt.json")
    forge_gate2.as_schema_3(receipt)
    del receipt["gate2"], receipt["gate4"], receipt["inputs"]["env"]
    receipt["schema"] = "kvprobe.gates-receipt/1"
    receipt["evidence"] = gate_scope.scope(receipt["schema"], receipt["host"])  # /1's own words
    forge_gate2.reseal(gates_bundle, receipt)
    result = sandbox.run("verify", gates_bundle)
    assert_outcome(sandbox, result, 1, "forged-verdict", "gate 2", CASE)


def test_expectations_rewritten_to_the_unfixed_behaviour_differ_from_the_installed_copy(sandbox, gates_bundle):
    """Attack: the bundled experiment A's head expectation rewritten to what the unfixed door does,
    so step 4's recompute agrees with the forged pass; the file is cited and re-hashed."""
    expected = forge_gate2.case_of(forge_gate2.as_fixed(), "experiment-a", CASE)["observations"]

    def as_unfixed(text: str) -> str:
        block = text.index(f'[expect.head."{CASE}"]')
        end = text.index("\n[", block + 1)
        head = text[block:end]
        for key, value in expected.items():
            if isinstance(value, bool):
                head = head.replace(f"{key} = {str(value).lower()}", f"{key} = {str(not value).lower()}")
        return text[:block] + head + text[end:]

    forge_gate2.graft(gates_bundle, written=unfixed(), edit_toml=as_unfixed)
    assert gate2(gates_bundle)["status"] == "pass"
    result = sandbox.run("verify", gates_bundle)
    assert_outcome(sandbox, result, 1, "differs-from-installed", "probes/experiment-a/experiment.toml")


def test_dropping_an_experiment_from_gate2_is_refused(sandbox, gates_bundle):
    """Attack: experiment B's outputs show its fix missing, so the receipt drops B from gate 2
    (its probe records, its cited file, its checks) and states gate 2 passed on A alone."""
    forge_gate2.graft(gates_bundle)

    def drop_b(receipt: dict) -> None:
        receipt["probes"] = [p for p in receipt["probes"] if p["experiment"] != "experiment-b"]
        basis = next(b for b in receipt["behaviour"] if b["gate"] == 2)
        basis["experiments"] = [e for e in basis["experiments"] if e["id"] != "experiment-b"]
        gate = next(g for g in receipt["gates"] if g["number"] == 2)
        gate["checks"] = [c for c in gate["checks"] if not c["name"].startswith("experiment-b")]

    forge.edit_receipt(gates_bundle, drop_b)
    assert gate2(gates_bundle)["status"] == "pass"
    result = sandbox.run("verify", gates_bundle)
    assert_outcome(sandbox, result, 1, "record-mismatch", "gate 2 cites experiments ['experiment-a']")

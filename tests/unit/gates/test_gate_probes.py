"""Gates 3 and 4's behavioural half (issue #23): experiment F's probes for gate 3, C, D and E's
for gate 4, read by the pure rule in rules/gate_probes that `kvprobe gates` decides with and
verify recomputes with; and how the pipeline puts those checks beside the deployment's settings."""

from __future__ import annotations

import copy
import json

import pytest

from kvprobe.experiments import experiment
from kvprobe.gates import pipeline, serverlog, settings
from kvprobe.gates.behaviour import ProbeGate
from kvprobe.gates.fixmarkers import CodeTree, code_settings
from kvprobe.model.gates_receipt import BehaviourBasis
from kvprobe.rules import gate2, gate_probes
from kvprobe.rules.gate_status import Check, Status
from tests.unit.gates.test_gates_logs import fake_tree, server_args_dict, sources_for, write
from tests.unit.rules.test_gates_admission import as_fixed

G3, G4 = gate_probes.RULES[3], gate_probes.RULES[4]


def checks(rule, exp_id: str, docs: dict, problems=()) -> dict[str, Check]:
    exp = experiment.load(exp_id)
    found = gate_probes.experiment_checks(rule, exp.id, exp.fix.prs, exp.expectations["head"], docs, list(problems))
    return {c.name: c for c in found}


def as_base_not_present(exp_id: str) -> dict:
    """Outputs of a release without the fix's code: every case not present, naming the symbols
    the experiment's base expects missing (experiment F on 0.5.20)."""
    exp = experiment.load(exp_id)
    docs = as_fixed(exp)
    for key, expected in exp.expectations["base"].items():
        probe, name = key.split("/")
        case = next(c for c in docs[probe]["cases"] if c["name"] == name)
        case.update(observation="not-present", observations={}, missing=expected["not_present"], reason="absent")
    return docs


def test_the_rules_name_the_experiments_each_gate_runs():
    assert gate_probes.RULES[2].experiments == gate2.EXPERIMENTS == ("experiment-a", "experiment-b")
    assert G3.experiments == ("experiment-f",)
    assert G4.experiments == ("experiment-c", "experiment-d", "experiment-e")
    assert gate2.ALGORITHM == "kvprobe.gate2/1"  # gate 2's receipts keep verifying by the same rule
    assert len({r.algorithm for r in gate_probes.RULES.values()}) == 3
    assert gate_probes.rule_for("kvprobe.gate3-probes/1") is G3 and gate_probes.rule_for("kvprobe.gate3/9") is None


@pytest.mark.parametrize(
    ("rule", "exp_id"), [(G3, "experiment-f"), (G4, "experiment-c"), (G4, "experiment-d"), (G4, "experiment-e")]
)
def test_every_head_expectation_holding_passes(rule, exp_id):
    found = checks(rule, exp_id, as_fixed(experiment.load(exp_id)))
    assert found and {c.status for c in found.values()} == {Status.PASS}
    assert all(rule.owns(name) for name in found)


def test_a_fix_whose_code_is_not_present_fails_gate_3_naming_what_is_missing():
    """0.5.20 has no handoff checksum at all: the defence gate 3 asks for is absent, a fail."""
    found = checks(G3, "experiment-f", as_base_not_present("experiment-f"))
    check = found["experiment-f: handoff_checksum/verify.short_handoff_stale_pages"]
    assert check.status is Status.FAIL
    assert check.detail == (
        "not present in this release: sglang.srt.server_args.ServerArgs(disaggregation_enable_kv_checksum=), "
        "sglang.srt.disaggregation.checksum: the defence is absent"
    )
    assert {c.status for c in found.values()} == {Status.FAIL}


def test_the_same_not_present_case_stays_unknown_under_gate_2s_rule():
    """Gate 2's rule (kvprobe.gate2/1) is unchanged: there a missing code path is not a verdict."""
    exp = experiment.load("experiment-f")
    docs = as_base_not_present("experiment-f")
    found = gate2.experiment_checks(exp.id, exp.fix.prs, exp.expectations["head"], docs, [])
    assert {c.status for c in found} == {Status.UNKNOWN}


def test_a_case_that_could_not_observe_is_unknown_not_a_fail():
    """Set-up drift (the probe never reached its decision point) is no verdict on any gate."""
    exp = experiment.load("experiment-d")
    docs = as_fixed(exp)
    case = docs["deferred_release"]["cases"][0]
    case.update(observation="unobserved", observations={}, reason="DecodeTransferQueue() takes no 'generation'")
    found = checks(G4, "experiment-d", docs)
    check = found[f"experiment-d: deferred_release/{case['name']}"]
    assert check.status is Status.UNKNOWN
    assert check.detail == "could not observe: DecodeTransferQueue() takes no 'generation'"


def test_an_unfixed_default_fails_gate_4():
    """0.5.20's default: deferred release off, the abort freed at once (experiment E's base)."""
    exp = experiment.load("experiment-e")
    docs = as_fixed(exp)
    key = "deferred_default/default.decode_abort_mid_transfer"
    case = next(c for c in docs["deferred_default"]["cases"] if c["name"] == key.split("/")[1])
    case["observations"].update(copy.deepcopy(exp.expectations["base"][key]))
    check = checks(G4, "experiment-e", docs)[f"experiment-e: {key}"]
    assert check.status is Status.FAIL
    assert (
        check.detail.startswith("6/12 as fixed; ")
        and "manager_deferred_release_on expected True, got False" in check.detail
    )


def test_a_probe_that_did_not_run_is_unknown_under_the_experiments_label():
    found = checks(G4, "experiment-c", {}, problems=["probe timed out after 900 s"])
    assert list(found) == ["experiment-c (#40645, #41402)"]
    assert found["experiment-c (#40645, #41402)"].status is Status.UNKNOWN
    assert G4.owns("experiment-c (#40645, #41402)") and not G4.owns("experiment-f: x") and not G3.owns("#39500 in code")


# --- the gate: the probes beside the deployment's settings ------------------------------------------


def _probe_gate(number: int, status: Status) -> ProbeGate:
    rule = gate_probes.RULES[number]
    check = Check(f"{rule.experiments[0]}: p/case", status, "as fixed" if status is Status.PASS else "not")
    return ProbeGate(number, (check,), [], BehaviourBasis(rule.algorithm, (), number))


def _deployment(tmp_path, checksum: bool, deferred: str):
    """Both workers with the checksum on (or not) and deferred release set (in their arguments' env)."""
    found = {}
    for mode in ("prefill", "decode"):
        on = {"disaggregation_enable_kv_checksum": True} if checksum else {}
        doc = {**server_args_dict("0.5.22", mode, disaggregation_transfer_backend="mooncake", **on)}
        doc["env"] = {"SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE": deferred}
        found[mode] = serverlog.read_args_file(write(tmp_path, f"{mode}-{checksum}-{deferred}.json", json.dumps(doc)))
    return settings.collect_sources([], [(None, found[m].role, found[m]) for m in found])


@pytest.mark.parametrize(
    ("probes", "checksum", "deferred", "want3", "want4"),
    [
        (Status.PASS, True, "1", Status.PASS, Status.PASS),  # fixed behaviour, settings on: pass
        (Status.FAIL, True, "1", Status.FAIL, Status.FAIL),  # settings on, behaviour unfixed: fail
        (Status.PASS, False, "0", Status.FAIL, Status.FAIL),  # behaviour fixed, settings off: fail
        (Status.UNKNOWN, True, "1", Status.UNKNOWN, Status.UNKNOWN),  # not observed: never a pass
    ],
)
def test_gates_3_and_4_pass_only_with_the_behaviour_and_the_settings(
    tmp_path, probes, checksum, deferred, want3, want4
):
    tree = CodeTree(fake_tree(tmp_path / "t", fixed=True))
    code = code_settings(tree)
    src = _deployment(tmp_path, checksum, deferred)
    gate3 = pipeline.with_probes(settings.gate3(src, tree, code, []), _probe_gate(3, probes))
    gate4 = pipeline.with_probes(settings.gate4(src, tree, code, [])[0], _probe_gate(4, probes))
    assert (gate3.status, gate4.status) == (want3, want4)
    assert gate3.checks[0].name == "experiment-f: p/case" and gate4.checks[0].name == "experiment-c: p/case"


def test_markers_present_do_not_pass_a_gate_whose_probes_fail(tmp_path):
    """The code has every marker; the probes observe the unfixed behaviour: the gate fails."""
    tree = CodeTree(fake_tree(tmp_path / "t", fixed=True))
    src = _deployment(tmp_path, True, "1")
    gate4 = pipeline.with_probes(settings.gate4(src, tree, code_settings(tree), [])[0], _probe_gate(4, Status.FAIL))
    markers = [c for c in gate4.checks if c.name.endswith(" in code")]
    assert markers and {c.status for c in markers} == {Status.PASS} and not any(c.decides for c in markers)
    assert gate4.status is Status.FAIL


def test_without_an_sglang_every_behavioural_gate_is_unknown(tmp_path):
    from kvprobe.gates.behaviour import run_behaviour
    from kvprobe.gates.gate import GateOptions

    run = run_behaviour(None, GateOptions(), tmp_path, tmp_path, reporter=None, held=None)  # type: ignore[arg-type]
    assert sorted(run.gates) == [2, 3, 4] and run.probes == [] and run.env is None
    for number, gate in run.gates.items():
        assert gate.checks == (gate_probes.NO_TARGET,)
        assert gate.basis == BehaviourBasis(gate_probes.RULES[number].algorithm, (), number)
    src = sources_for(None, None)
    assert pipeline.with_probes(settings.gate3(src, None, None, []), run.gates[3]).status is Status.UNKNOWN

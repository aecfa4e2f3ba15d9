"""Gate 2's reading of the probe output from the operator's SGLang (synthetic probe documents),
by the pure rule in rules/gate2 that `kvprobe gates` decides with and verify recomputes with."""

from __future__ import annotations

from typing import Any

import pytest

from kvprobe.experiments import experiment
from kvprobe.rules.gate2 import experiment_checks
from kvprobe.rules.gate_status import Status


@pytest.fixture(scope="module")
def exp_a():
    return experiment.load("experiment-a")


def as_fixed(exp) -> dict[str, Any]:
    """One probe document in which every head expectation of ``exp`` holds (probe API v2)."""
    cases: dict[str, list] = {}
    for key, obs in exp.expectations["head"].items():
        probe, case = key.split("/")
        raised = obs.get("raised") or None
        cases.setdefault(probe, []).append(
            {
                "name": case,
                "status": "raised" if raised else "ok",
                "observations": {k: v for k, v in obs.items() if k != "raised"},
                "error": {"type": raised, "root_type": raised} if raised else None,
                "observation": "observed",
                "reason": None,
                "missing": [],
                "decision_point": "Q.add",
            }
        )
    return {probe: {"cases": entries} for probe, entries in cases.items()}


def drift(docs: dict, key: str, **how: Any) -> dict:
    probe, case = key.split("/")
    entry = next(c for c in docs[probe]["cases"] if c["name"] == case)
    entry.update(status="raised", observations={}, error={"type": "X", "root_type": "X"}, **how)
    return docs


def gate2_checks(exp, docs: dict, problems: list[str]):
    return experiment_checks(exp.id, exp.fix.prs, exp.expectations["head"], docs, problems)


def by_name(checks) -> dict[str, Any]:
    return {c.name: c for c in checks}


def test_every_head_expectation_holding_passes(exp_a):
    checks = gate2_checks(exp_a, as_fixed(exp_a), [])
    assert checks and all(c.status is Status.PASS for c in checks)


def test_a_case_that_could_not_observe_is_unknown_naming_case_and_cause(exp_a):
    key = "admission_doors/prefill.valid"
    docs = drift(as_fixed(exp_a), key, observation="unobserved", reason="'PrefillBootstrapQueue' has no max_input_len")
    checks = by_name(gate2_checks(exp_a, docs, []))
    check = checks[f"experiment-a: {key}"]
    assert check.status is Status.UNKNOWN
    assert check.detail == "could not observe: 'PrefillBootstrapQueue' has no max_input_len"
    assert [c.status for n, c in checks.items() if n != check.name] == [Status.PASS] * (len(checks) - 1)


def test_a_case_not_present_is_unknown_naming_the_symbols(exp_a):
    key = "admission_doors/decode.reentry_rebootstrap"
    docs = drift(
        as_fixed(exp_a),
        key,
        observation="not-present",
        reason="no is_rebootstrap",
        missing=["DecodePreallocQueue.add(is_rebootstrap=)"],
    )
    check = by_name(gate2_checks(exp_a, docs, []))[f"experiment-a: {key}"]
    assert check.status is Status.UNKNOWN
    assert check.detail == "not present in this release: DecodePreallocQueue.add(is_rebootstrap=)"


def test_an_observed_exception_is_still_a_failure(exp_a):
    key = "admission_doors/prefill.rejected_new"
    docs = drift(as_fixed(exp_a), key, observation="observed", reason=None, missing=[])
    check = by_name(gate2_checks(exp_a, docs, []))[f"experiment-a: {key}"]
    assert check.status is Status.FAIL and check.detail.startswith("0/")  # behaviour, not drift

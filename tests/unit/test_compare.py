"""The pure comparison: observations x expectations -> verdict."""

from __future__ import annotations

from kvprobe.evidence.compare import compare


def doc(name: str, cases: dict, raised: dict | None = None) -> dict:
    raised = raised or {}
    return {"probe": name, "cases": [
        {"name": case, "status": "raised" if case in raised else "ok", "observations": obs,
         "error": {"type": raised[case], "root_type": raised[case]} if case in raised else None}
        for case, obs in cases.items()]}


def run(expect, base, head, problems=None, tests=None):
    return compare(expect=expect, probe_docs={"base": {"p": base}, "head": {"p": head}},
                   probe_problems=problems or {}, test_runs=tests or {})


EXPECT = {"base": {"p/c": {"enqueued": True}}, "head": {"p/c": {"enqueued": False}}}


def test_reproduced_when_every_expectation_holds():
    result = run(EXPECT, doc("p", {"c": {"enqueued": True}}), doc("p", {"c": {"enqueued": False}}))
    assert result["verdict"] == "reproduced" and result["reasons"] == []
    row = next(r for r in result["observations"] if r["observation"] == "enqueued")
    assert row["changed"] and row["base_ok"] and row["head_ok"]
    assert result["counts"]["observations_expected"] == 1


def test_not_reproduced_names_side_case_and_values():
    result = run(EXPECT, doc("p", {"c": {"enqueued": True}}), doc("p", {"c": {"enqueued": True}}))
    assert result["verdict"] == "not-reproduced"
    assert result["reasons"] == ["head: p/c: enqueued expected False, got True"]


def test_bool_is_not_int():
    result = run({"base": {"p/c": {"n": 1}}}, doc("p", {"c": {"n": True}}), doc("p", {"c": {"n": 1}}))
    assert result["verdict"] == "not-reproduced"


def test_a_raised_case_is_not_behaviour():
    result = run(EXPECT, doc("p", {"c": {}}, raised={"c": "AttributeError"}), doc("p", {"c": {"enqueued": False}}))
    assert result["verdict"] == "not-reproduced"
    assert "nothing (case raised AttributeError)" in result["reasons"][0]
    assert result["cases"]["base"]["p/c"]["error_type"] == "AttributeError"


def test_raised_can_be_expected():
    expect = {"base": {"p/c": {"raised": "AssertionError"}}, "head": {"p/c": {"raised": False}}}
    result = run(expect, doc("p", {"c": {}}, raised={"c": "AssertionError"}), doc("p", {"c": {}}))
    assert result["verdict"] == "reproduced"


def test_probe_problem_is_an_error_not_a_result():
    result = run(EXPECT, doc("p", {"c": {"enqueued": True}}), None,
                 problems={"head": {"p": "probe p exited 1 without output"}})
    assert result["verdict"] == "error"
    assert "head: probe p exited 1 without output" in result["reasons"]


def test_nothing_ran_is_an_error():
    result = compare(expect={}, probe_docs={"base": {}, "head": {}}, probe_problems={}, test_runs={})
    assert result["verdict"] == "error" and "nothing ran" in result["reasons"][0]


def test_no_expectations_is_never_reproduced():
    result = run({}, doc("p", {"c": {"x": 1}}), doc("p", {"c": {"x": 2}}))
    assert result["verdict"] == "no-expectations"
    assert "no expectations declared" in result["reasons"][0]

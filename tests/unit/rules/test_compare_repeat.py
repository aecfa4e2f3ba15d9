"""run --repeat N in the pure comparison: a case that differs between runs is unstable."""

from __future__ import annotations

from kvprobe.rules.compare import ALGORITHM, compare, repeat_problems


def doc(name: str, cases: dict, raised: dict | None = None) -> dict:
    raised = raised or {}
    return {
        "probe": name,
        "cases": [
            {
                "name": case,
                "status": "raised" if case in raised else "ok",
                "observations": obs,
                "error": {"type": raised[case], "root_type": raised[case]} if case in raised else None,
            }
            for case, obs in cases.items()
        ],
    }


EXPECT = {"base": {"p/c": {"enqueued": True}}, "head": {"p/c": {"enqueued": False}}}

BASE = doc("p", {"c": {"enqueued": True}, "d": {"n": 1}})
HEAD = doc("p", {"c": {"enqueued": False}, "d": {"n": 2}})


def run(expect, repeats, problems=None):
    return compare(
        expect=expect,
        probe_docs={"base": {"p": BASE}, "head": {"p": HEAD}},
        probe_problems=problems or {},
        test_runs={},
        repeats=repeats,
    )


def test_one_run_writes_no_repeat_keys():
    once = compare(
        expect=EXPECT, probe_docs={"base": {"p": BASE}, "head": {"p": HEAD}}, probe_problems={}, test_runs={}
    )
    assert once["algorithm"] == ALGORITHM
    assert "unstable" not in once and "unstable_cases" not in once["counts"]
    assert not any("unstable" in r for r in once["observations"])


def test_stable_repeats_give_the_single_run_verdict():
    result = run(EXPECT, {"base": {"p": [BASE, BASE]}, "head": {"p": [HEAD, HEAD]}})
    assert result["verdict"] == "reproduced" and result["reasons"] == []
    assert result["unstable"] == {"base": {}, "head": {}} and result["counts"]["unstable_cases"] == 0


def test_an_expected_case_that_differs_between_runs_is_could_not_observe():
    flipped = doc("p", {"c": {"enqueued": False}, "d": {"n": 1}})
    result = run(EXPECT, {"base": {"p": [BASE, flipped]}, "head": {"p": [HEAD, HEAD]}})
    assert result["verdict"] == "could-not-observe"
    assert result["reasons"] == [
        "base: p/c: unstable across repeats: observation 'enqueued' was True in run 1, False in run 3"
    ]
    rows = [r for r in result["observations"] if r["case"] == "p/c"]
    assert rows and all(r["unstable"] and r["base_ok"] is None and r["head_ok"] is None for r in rows)
    assert result["counts"]["observations_matched"] == 0 and result["counts"]["unstable_cases"] == 1


def test_an_unstable_case_without_expectations_does_not_decide_the_verdict():
    jitter = doc("p", {"c": {"enqueued": False}, "d": {"n": 7}})
    result = run(EXPECT, {"base": {"p": [BASE]}, "head": {"p": [jitter]}})
    assert result["verdict"] == "reproduced"
    assert list(result["unstable"]["head"]) == ["p/d"]
    assert "observation 'n' was 2 in run 1, 7 in run 2" in result["unstable"]["head"]["p/d"]
    row = next(r for r in result["observations"] if r["case"] == "p/d")
    assert row["unstable"] and row["head_ok"] is None  # shown, never a match


def test_a_status_change_or_a_missing_case_is_unstable():
    raised = doc("p", {"c": {}, "d": {"n": 2}}, raised={"c": "KeyError"})
    result = run(EXPECT, {"base": {"p": [BASE]}, "head": {"p": [raised]}})
    assert result["verdict"] == "could-not-observe"
    assert "status was 'ok' in run 1, 'raised' in run 2" in result["reasons"][0]
    fewer = doc("p", {"c": {"enqueued": False}})
    result = run(EXPECT, {"base": {"p": [BASE]}, "head": {"p": [fewer]}})
    assert result["unstable"]["head"] == {
        "p/d": "unstable across repeats: the case was recorded in run 1, not in run 2"
    }


def test_true_and_1_differ_between_runs():
    as_bool = doc("p", {"c": {"enqueued": True}, "d": {"n": True}})
    result = run({"base": {"p/d": {"n": 1}}}, {"base": {"p": [as_bool]}, "head": {"p": [HEAD]}})
    assert result["verdict"] == "could-not-observe"


def test_a_repeat_with_a_problem_is_an_error():
    problems = {"base": repeat_problems({"p": [None, "probe crashed"]}), "head": {}}
    assert problems["base"] == {"p#3": "p (run 3): probe crashed"}
    result = run(EXPECT, {"base": {"p": [BASE, None]}, "head": {"p": [HEAD, HEAD]}}, problems)
    assert result["verdict"] == "error" and result["reasons"] == ["base: p (run 3): probe crashed"]

"""`sweep --repeat N` in the pure classification: a release whose expected case differs between
its runs is could-not-observe (unstable), never affected or fixed; verify recomputes it from
the raw outputs of every run the release entry cites."""

from __future__ import annotations

from kvprobe.model.sweep_receipt import Classification
from kvprobe.rules.sweep_classification import ALGORITHM, classify_release, release_problems, release_repeats

EXPECT = {
    "base": {"p/door": {"enqueued": True}, "p/valid": {"enqueued": True}},
    "head": {"p/door": {"enqueued": False}, "p/valid": {"enqueued": True}},
}


def doc(door: bool, other: int = 1) -> dict:
    cases = [
        {"name": "door", "status": "ok", "error": None, "observations": {"enqueued": door}},
        {"name": "valid", "status": "ok", "error": None, "observations": {"enqueued": True}},
        {"name": "extra", "status": "ok", "error": None, "observations": {"n": other}},
    ]
    return {"probe": "p", "cases": cases}


AFFECTED = {"p": doc(True)}


def test_one_run_writes_no_unstable_key():
    once = classify_release(EXPECT, AFFECTED, {})
    assert once["overall"] == "affected" and "unstable" not in once
    assert Classification.from_json(once).to_json() == once


def test_stable_repeats_give_the_single_run_class_and_say_so():
    result = classify_release(EXPECT, AFFECTED, {}, {"p": [doc(True), doc(True)]})
    assert result["algorithm"] == ALGORITHM
    assert (result["overall"], result["reasons"], result["unstable"]) == ("affected", [], {})
    assert Classification.from_json(result).to_json() == result


def test_an_expected_case_that_differs_between_runs_is_could_not_observe_never_affected():
    """Run 1 alone says affected; run 3 saw the fixed behaviour: no class is honest."""
    result = classify_release(EXPECT, AFFECTED, {}, {"p": [doc(True), doc(False)]})
    why = "unstable across repeats: observation 'enqueued' was True in run 1, False in run 3"
    assert result["overall"] == "could-not-observe"
    assert result["reasons"] == [f"p/door: {why}"]
    assert result["cases"]["p/door"] == {"class": "could-not-observe", "reason": why}
    assert result["cases"]["p/valid"] == {"class": "control"}
    assert result["unstable"] == {"p/door": why}


def test_a_case_without_expectations_that_differs_is_recorded_but_decides_nothing():
    result = classify_release(EXPECT, AFFECTED, {}, {"p": [doc(True, other=2)]})
    assert result["overall"] == "affected"
    assert result["unstable"] == {"p/extra": "unstable across repeats: observation 'n' was 1 in run 1, 2 in run 2"}


def test_a_repeat_that_left_no_output_is_could_not_observe():
    release = {
        "problem": None,
        "probes": [
            {
                "name": "p",
                "raw": {"path": "raw/1.0/probes/p.json", "sha256": "0" * 64},
                "problem": None,
                "repeats": [{"raw": None, "exit_code": 1, "problem": "exit 1"}],
            }
        ],
    }
    problems = release_problems(release)
    assert problems == {"p#2": "p (run 2): exit 1"}
    assert release_repeats(release, lambda rel: {}) == {"p": [None]}
    result = classify_release(EXPECT, AFFECTED, problems, {"p": [None]})
    assert result["overall"] == "could-not-observe" and result["reasons"] == ["p#2: p (run 2): exit 1"]


def test_release_repeats_reads_each_cited_run_and_none_for_a_single_run():
    cited = {"raw/1.0/probes/p.repeat-2.json": doc(False)}
    ref = {"path": "raw/1.0/probes/p.repeat-2.json", "sha256": "0" * 64}
    repeated = {"probes": [{"name": "p", "repeats": [{"raw": ref, "exit_code": 0, "problem": None}]}]}
    assert release_repeats(repeated, cited.__getitem__) == {"p": [doc(False)]}
    assert release_repeats({"probes": [{"name": "p"}]}, cited.__getitem__) is None
    assert release_repeats({"probes": []}, cited.__getitem__) is None  # a release whose wheel could not be had

"""The pure comparison: observations x expectations -> verdict."""

from __future__ import annotations

from kvprobe.rules.compare import compare


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


def run(expect, base, head, problems=None, tests=None):
    return compare(
        expect=expect,
        probe_docs={"base": {"p": base}, "head": {"p": head}},
        probe_problems=problems or {},
        test_runs=tests or {},
    )


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
    result = run(
        EXPECT, doc("p", {"c": {"enqueued": True}}), None, problems={"head": {"p": "probe p exited 1 without output"}}
    )
    assert result["verdict"] == "error"
    assert "head: probe p exited 1 without output" in result["reasons"]


def test_nothing_ran_is_an_error():
    result = compare(expect={}, probe_docs={"base": {}, "head": {}}, probe_problems={}, test_runs={})
    assert result["verdict"] == "error" and "nothing ran" in result["reasons"][0]


def test_no_expectations_is_never_reproduced():
    result = run({}, doc("p", {"c": {"x": 1}}), doc("p", {"c": {"x": 2}}))
    assert result["verdict"] == "no-expectations"
    assert "no expectations declared" in result["reasons"][0]


def _subtest_rollup_run(side: str) -> dict:
    """A test-run record whose one test failed only through one of its two subtests."""
    node = "t/test_x.py::T::test_s"

    def entry(when="call", outcome="passed", exception=None, subtest=None):
        return {
            "nodeid": node,
            "when": when,
            "outcome": outcome,
            "duration": 0.01,
            "exception": exception,
            "subtest": subtest,
            "xfail": None,
            "wasxfail": None,
            "longrepr": "",
        }

    error = {
        "top_type": "AttributeError",
        "root_type": "AttributeError",
        "root_module": "builtins",
        "root_message": "no scrub",
        "chain": ["AttributeError"],
        "assertion": False,
    }
    tests = [
        entry("setup"),
        entry(subtest={"msg": None, "kwargs": {"i": "0"}}),
        entry("call", "failed", error, {"msg": None, "kwargs": {"i": "1"}}),
        entry("call", "failed"),
        entry("teardown"),
    ]
    report = {
        "schema": "kvprobe.pytest-report/1",
        "complete": True,
        "exitstatus": 1,
        "pytest_version": "9.2.0",
        "collected": 1,
        "tests": tests,
        "collection_errors": [],
        "running": None,
        "runner": {"file_nodeid": "t/test_x.py", "returncode": 1, "timed_out": False, "timeout_s": 60},
    }
    return {
        "schema": "kvprobe.test-run/1",
        "path": "t/test_x.py",
        "side": side,
        "exit_code": 1,
        "timed_out": False,
        "overlay": "identical",
        "problem": None,
        "report": report,
    }


def test_failure_kinds_of_a_subtest_rollup_are_its_subtests_root_causes():
    # The parent failed only through its subtests: it is no failure kind of its own (the old
    # comparison counted it as one more "infrastructure" failure, unlike the upstream runner).
    runs = {"t/test_x.py": {"base": _subtest_rollup_run("base"), "head": _subtest_rollup_run("head")}}
    summary = compare(expect={}, probe_docs={}, probe_problems={}, test_runs=runs)["test_summary"]["t/test_x.py"]
    assert summary["base"]["failure_kinds"] == {"assertion": 0, "AttributeError": 1}
    assert summary["base"]["tests"] == {"failed": 1} and summary["base"]["subtests"] == {"passed": 1, "failed": 1}


# --- upstream tests (compare/3): collection errors, declared sets ------------------------

TF = "tests/test_x.py"


def _report(tests=(), collection_errors=(), exitstatus=0) -> dict:
    report = {
        "schema": "kvprobe.pytest-report/1",
        "complete": True,
        "exitstatus": exitstatus,
        "collected": len(tests),
        "collection_errors": list(collection_errors),
        "tests": list(tests),
        "running": None,
        "runner": {"file_nodeid": TF, "returncode": exitstatus, "timed_out": False},
    }
    return {"path": TF, "exit_code": exitstatus, "problem": None, "report": report}


def _test(name, failure=None):
    entry = {"nodeid": f"{TF}::{name}", "when": "call", "outcome": "failed" if failure else "passed"}
    if failure:
        entry["exception"] = {"root_type": failure, "top_type": failure, "root_message": "m"}
    return entry


def _tests_only(expect, base, head, algorithm=None):
    kw = {"algorithm": algorithm} if algorithm else {}
    return compare(expect=expect, probe_docs={}, probe_problems={}, test_runs={TF: {"base": base, "head": head}}, **kw)


IMPORT_ERROR = {"nodeid": TF, "exception": {"root_type": "ImportError", "root_message": "cannot import name 'scrub'"}}
HEAD_PASSES = _report([_test("a"), _test("b")])


def test_base_that_cannot_collect_is_error_to_pass_per_head_test():
    result = _tests_only({}, _report(collection_errors=[IMPORT_ERROR], exitstatus=2), HEAD_PASSES)
    assert [(r["test"], r["transition"], r["base_kind"], r["base_exc_type"]) for r in result["tests"]] == [
        (f"{TF}::a", "ERROR_TO_PASS", "collection", "ImportError"),
        (f"{TF}::b", "ERROR_TO_PASS", "collection", "ImportError"),
    ]
    base = result["test_summary"][TF]["base"]
    assert base["collection_errors"] == [
        {"nodeid": TF, "exc_type": "ImportError", "message": "cannot import name 'scrub'"}
    ]
    assert result["test_summary"][TF]["head"]["tests"] == {"passed": 2}
    assert result["counts"]["error_to_pass"] == 2 and result["counts"]["fail_to_pass"] == 0
    assert result["verdict"] == "no-expectations"  # nothing declared: nothing pinned which tests
    sets = {TF: {"FAIL_TO_PASS": [f"{TF}::a", f"{TF}::b"], "PASS_TO_PASS": []}}
    again = _tests_only({"tests": sets}, _report(collection_errors=[IMPORT_ERROR], exitstatus=2), HEAD_PASSES)
    assert again["verdict"] == "reproduced", again["reasons"]


def test_compare_2_rules_keep_the_old_rows_for_old_bundles():
    result = _tests_only(
        {}, _report(collection_errors=[IMPORT_ERROR], exitstatus=2), HEAD_PASSES, algorithm="kvprobe.compare/2"
    )
    assert {r["test"]: r["transition"] for r in result["tests"]} == {
        TF: "ERROR",
        f"{TF}::a": "NOT_RUN",
        f"{TF}::b": "NOT_RUN",
    }
    assert result["verdict"] == "not-reproduced" and f"head: {TF}: {TF} not run" in result["reasons"]
    assert "error_to_pass" not in result["counts"] and "collection_errors" not in result["test_summary"][TF]["base"]


def test_declared_sets_name_every_test_that_moved():
    base = _report([_test("a", "AttributeError"), _test("b"), _test("c", "ValueError")], exitstatus=1)
    head = _report([_test("a"), _test("b"), _test("c")])
    declared = {
        "FAIL_TO_PASS": [f"{TF}::a", f"{TF}::b", f"{TF}::gone"],
        "PASS_TO_PASS": [],
        "base_failure_kind": {f"{TF}::a": "ValueError"},
    }
    result = _tests_only({"tests": {TF: declared}}, base, head)
    assert result["verdict"] == "not-reproduced"
    assert sorted(result["reasons"]) == sorted(
        [
            f"{TF}: {TF}::b: expected FAIL_TO_PASS, got PASS_TO_PASS",
            f"{TF}: {TF}::gone: expected FAIL_TO_PASS, not run on either side",
            f"{TF}: {TF}::c: FAIL_TO_PASS, in no declared set",
            f"{TF}: {TF}::a: base failure expected ValueError, got AttributeError",
        ]
    )


def test_declared_sets_of_a_file_that_did_not_run_are_not_checked():
    declared = {"other/test_y.py": {"FAIL_TO_PASS": ["other/test_y.py::z"], "PASS_TO_PASS": []}}
    result = run(
        {**EXPECT, "tests": declared}, doc("p", {"c": {"enqueued": True}}), doc("p", {"c": {"enqueued": False}})
    )
    assert result["verdict"] == "reproduced", result["reasons"]


def test_a_head_that_cannot_collect_is_named():
    base = _report([_test("a", "AttributeError")], exitstatus=1)
    head = _report(collection_errors=[IMPORT_ERROR], exitstatus=2)
    result = _tests_only({}, base, head)
    assert result["verdict"] == "not-reproduced"
    assert f"head: {TF}: {TF}::a could not be collected (ImportError)" in result["reasons"]


def seen(doc_: dict, case: str, observation: str, reason: str | None = None, missing: list | None = None) -> dict:
    """``doc_`` with ``case`` declaring how far it got (a probe API v2 case document)."""
    for entry in doc_["cases"]:
        if entry["name"] == case:
            entry.update(observation=observation, reason=reason, missing=missing or [], decision_point="Q.add")
    return doc_


def test_case_table_carries_how_far_each_case_got():
    base = seen(
        doc("p", {"c": {}}, raised={"c": "AttributeError"}), "c", "unobserved", reason="stub lacks max_input_len"
    )
    head = seen(doc("p", {"c": {"enqueued": False}}), "c", "observed")
    cases = run(EXPECT, base, head)["cases"]
    assert cases["base"]["p/c"] == {
        "status": "raised",
        "error_type": "AttributeError",
        "root_type": "AttributeError",
        "observations": {},  # no reserved `raised`: the exception came before the decision point
        "observation": "unobserved",
        "reason": "stub lacks max_input_len",
        "missing": [],
        "decision_point": "Q.add",
    }
    assert cases["head"]["p/c"]["observations"] == {"enqueued": False, "raised": False}


def test_a_case_written_before_observation_existed_counts_as_observed():
    cases = run(EXPECT, doc("p", {"c": {"enqueued": True}}), doc("p", {"c": {}}, raised={"c": "KeyError"}))["cases"]
    assert cases["base"]["p/c"]["observation"] == "observed" and cases["base"]["p/c"]["missing"] == []
    assert cases["head"]["p/c"]["observations"] == {"raised": "KeyError"}
    assert cases["head"]["p/c"]["reason"] is None and cases["head"]["p/c"]["decision_point"] is None


def test_a_case_that_could_not_observe_is_neither_base_nor_head():
    base = seen(
        doc("p", {"c": {}}, raised={"c": "AttributeError"}), "c", "unobserved", reason="stub lacks max_input_len"
    )
    result = run(EXPECT, base, seen(doc("p", {"c": {"enqueued": False}}), "c", "observed"))
    assert result["verdict"] == "could-not-observe"
    assert result["reasons"] == ["base: p/c: could not observe: stub lacks max_input_len"]
    row = next(r for r in result["observations"] if r["observation"] == "enqueued")
    assert row["base_ok"] is None and row["head_ok"] is True  # unknown, not failed
    assert result["counts"]["observations_matched"] == 0


def test_a_case_not_present_names_the_missing_symbols():
    head = seen(doc("p", {"c": {}}, raised={"c": "NotPresent"}), "c", "not-present", reason="gone", missing=["Q.add"])
    result = run(EXPECT, doc("p", {"c": {"enqueued": True}}), head)
    assert result["verdict"] == "could-not-observe"
    assert result["reasons"] == ["head: p/c: not present in this release: Q.add"]
    assert "raised" not in result["cases"]["head"]["p/c"]["observations"]


def test_could_not_observe_is_decided_before_a_mismatch_elsewhere():
    expect = {"base": {"p/c": {"enqueued": True}, "p/d": {"n": 1}}}
    base = seen(doc("p", {"c": {"enqueued": False}, "d": {}}), "d", "unobserved", reason="precondition x failed")
    result = run(expect, base, doc("p", {"c": {}, "d": {}}))
    assert result["verdict"] == "could-not-observe"
    assert result["reasons"] == ["base: p/d: could not observe: precondition x failed"]


def test_an_unobserved_case_without_expectations_on_that_side_changes_nothing():
    expect = {"head": {"p/c": {"enqueued": False}}}
    base = seen(doc("p", {"c": {}}, raised={"c": "TypeError"}), "c", "unobserved", reason="constructor changed")
    result = run(expect, base, doc("p", {"c": {"enqueued": False}}))
    assert result["verdict"] == "reproduced"


def test_old_documents_without_observation_keep_their_verdict():
    result = run(EXPECT, doc("p", {"c": {}}, raised={"c": "AttributeError"}), doc("p", {"c": {"enqueued": False}}))
    assert result["verdict"] == "not-reproduced"
    assert result["reasons"] == ["base: p/c: enqueued expected True, got nothing (case raised AttributeError)"]


# --- compare/5: a test with a failed subtest has not passed; flips apart from controls ----


def _sub(name, label, failure=None):
    entry = _test(name, failure)
    entry["subtest"] = {"msg": label, "kwargs": {}}
    return entry


def test_a_test_that_passed_itself_with_a_failed_subtest_is_not_pass_to_pass():
    """pytest's unittest integration reports the function passed; compare/5 reads it failed."""
    base = _report([_sub("a", "x", "AssertionError"), _test("a")], exitstatus=1)
    head = _report([_sub("a", "x"), _test("a")])
    current = {r["test"]: r["transition"] for r in _tests_only({}, base, head)["tests"]}
    assert current == {f"{TF}::a": "FAIL_TO_PASS", f"{TF}::a [x]": "FAIL_TO_PASS"}
    old = _tests_only({}, base, head, algorithm="kvprobe.compare/4")
    assert {r["test"]: r["transition"] for r in old["tests"]}[f"{TF}::a"] == "PASS_TO_PASS"


def test_counts_tell_flips_from_controls_and_unchecked_rows():
    expect = {
        "base": {"p/c": {"enqueued": True, "valid": True}},
        "head": {"p/c": {"enqueued": False, "valid": True, "retired": True}},
    }
    base = doc("p", {"c": {"enqueued": True, "valid": True, "extra": 1}})
    head = doc("p", {"c": {"enqueued": False, "valid": False, "retired": True, "extra": 2}})
    counts = run(expect, base, head)["counts"]
    assert {k: counts[k] for k in counts if k.endswith(("_expected", "_held")) or k == "unchecked"} == {
        "observations_expected": 3,
        "flips_expected": 1,
        "flips_held": 1,
        "controls_expected": 1,
        "controls_held": 0,  # head's valid is False: a control that did not hold
        "one_sided_expected": 1,
        "one_sided_held": 1,
        "unchecked": 1,
    }


# --- a feature added in head: the base is expected not-present (compare/5's not_present) -------
ABSENT = ["m.Feature(option=)", "m.feature"]
FEATURE = {"base": {"p/c": {"not_present": ABSENT}}, "head": {"p/c": {"aborted": True}}}


def _absent(missing: list[str]) -> dict:
    return {
        "probe": "p",
        "cases": [
            {
                "name": "c",
                "status": "raised",
                "observations": {},
                "observation": "not-present",
                "reason": "gone",
                "missing": missing,
                "decision_point": "Q.run",
                "error": {"type": "NotPresent", "root_type": "NotPresent"},
            }
        ],
    }


def _seen(observations: dict) -> dict:
    return {
        "probe": "p",
        "cases": [
            {
                "name": "c",
                "status": "ok",
                "observations": observations,
                "observation": "observed",
                "reason": None,
                "missing": [],
                "decision_point": "Q.run",
                "error": None,
            }
        ],
    }


def test_a_base_expected_not_present_is_checked_and_reproduces():
    result = run(FEATURE, _absent(ABSENT), _seen({"aborted": True}))
    assert result["algorithm"] == "kvprobe.compare/5"
    assert result["verdict"] == "reproduced", result["reasons"]
    row = next(r for r in result["observations"] if r["observation"] == "not_present")
    assert row["base"] == ABSENT and row["base_recorded"] and row["base_ok"]
    assert row["head"] is None and not row["head_recorded"] and row["head_ok"]
    assert result["counts"]["observations_expected"] == 2 and result["counts"]["observations_matched"] == 2


def test_a_base_that_has_the_code_is_not_reproduced():
    # The feature is present on the base after all: the claim "added in head" does not hold.
    result = run(FEATURE, _seen({"aborted": False}), _seen({"aborted": True}))
    assert result["verdict"] == "not-reproduced"
    assert result["reasons"] == [
        "base: p/c: not_present expected ['m.Feature(option=)', 'm.feature'], "
        "got present (the case reached its decision point)"
    ]


def test_a_base_absent_for_other_symbols_is_not_reproduced():
    result = run(FEATURE, _absent(["m.something_else"]), _seen({"aborted": True}))
    assert result["verdict"] == "not-reproduced"
    assert result["reasons"] == [
        "base: p/c: not_present expected ['m.Feature(option=)', 'm.feature'], got ['m.something_else']"
    ]


def test_a_base_that_did_not_get_far_enough_cannot_tell_absence():
    drift = _seen({})
    drift["cases"][0].update(observation="unobserved", reason="set-up raised KeyError", status="raised")
    result = run(FEATURE, drift, _seen({"aborted": True}))
    assert result["verdict"] == "could-not-observe"
    assert result["reasons"] == ["base: p/c: could not observe: set-up raised KeyError"]


def test_a_head_without_the_feature_cannot_observe_it():
    # Head's own expectations stay unknown on a not-present head, never a match.
    result = run(FEATURE, _absent(ABSENT), _absent(ABSENT))
    assert result["verdict"] == "could-not-observe"
    assert result["reasons"] == ["head: p/c: not present in this release: m.Feature(option=), m.feature"]


def test_compare_4_reads_not_present_as_an_observation_no_probe_records():
    # The predecessor's rules (how verify recomputes a compare/4 bundle): unknown, not a match.
    result = compare(
        expect=FEATURE,
        probe_docs={"base": {"p": _absent(ABSENT)}, "head": {"p": _seen({"aborted": True})}},
        probe_problems={},
        test_runs={},
        algorithm="kvprobe.compare/4",
    )
    assert result["algorithm"] == "kvprobe.compare/4" and result["verdict"] == "could-not-observe"

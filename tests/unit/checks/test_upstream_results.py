"""results_from_report, transitions and the summaries, on hand-made report documents."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kvprobe.checks.upstream import finalize_report, load_report
from kvprobe.errors import SchemaError
from kvprobe.model import records as models
from kvprobe.model.records import FailureKind, Outcome, Transition
from kvprobe.names import PYTEST_REPORT_SCHEMA
from kvprobe.proc import CommandResult
from kvprobe.rules.pytest_results import (
    collection_errors,
    count_results,
    failure_kinds,
    results_from_report,
    spread_collection_errors,
    subtest_label,
    transitions,
)

FILE = "unit/test_x.py"


def exc(root: str, *, top: str | None = None, message: str = "boom", assertion: bool = False):
    chain = [top, root] if top else [root]
    return {
        "top_type": chain[0],
        "root_type": root,
        "root_module": "builtins",
        "root_message": message,
        "chain": chain,
        "assertion": assertion,
    }


def entry(
    name: str,
    when: str = "call",
    outcome: str = "passed",
    *,
    exception=None,
    subtest=None,
    xfail=None,
    wasxfail=None,
    longrepr: str = "",
):
    return {
        "nodeid": f"{FILE}::{name}",
        "when": when,
        "outcome": outcome,
        "duration": 0.01,
        "exception": exception,
        "subtest": subtest,
        "xfail": xfail,
        "wasxfail": wasxfail,
        "longrepr": longrepr,
    }


def passing(name: str):
    return [entry(name, "setup"), entry(name), entry(name, "teardown")]


def failing(name: str, exception, when: str = "call"):
    phases = {"setup": entry(name, "setup"), "call": entry(name), "teardown": entry(name, "teardown")}
    phases[when] = entry(name, when, "failed", exception=exception)
    return list(phases.values()) if when != "setup" else [phases["setup"], phases["teardown"]]


def doc(tests=(), *, exitstatus=0, collection_errors=(), complete=True, runner=None, running=None):
    return {
        "schema": PYTEST_REPORT_SCHEMA,
        "complete": complete,
        "exitstatus": exitstatus,
        "pytest_version": "9.2.0",
        "collected": 1,
        "tests": list(tests),
        "collection_errors": list(collection_errors),
        "running": running,
        "runner": runner
        if runner is not None
        else {"file_nodeid": FILE, "returncode": exitstatus, "timed_out": False, "timeout_s": 60},
    }


def by_key(results):
    return {r.key: r for r in results}


# ------------------------------------------------------------------ results_from_report


def test_unknown_schema_is_refused():
    with pytest.raises(SchemaError):
        results_from_report({**doc(), "schema": "kvprobe.pytest-report/2"})


def test_input_is_not_mutated():
    report = doc([*passing("test_a"), *failing("test_b", exc("KeyError"))], exitstatus=1)
    before = copy.deepcopy(report)
    results_from_report(report)
    assert report == before


def test_retry_wrapper_is_judged_by_its_root_exception():
    report = doc(
        failing("test_retry", exc("AttributeError", top="Exception", message="no attribute 'x'")), exitstatus=1
    )
    [result] = results_from_report(report)
    assert (result.outcome, result.kind, result.exc_type) == (Outcome.FAILED, FailureKind.EXCEPTION, "AttributeError")
    assert result.message == "no attribute 'x'"


@pytest.mark.parametrize(
    "exception",
    [
        exc("AssertionError", top="Exception"),
        exc("Failed", assertion=True),
        exc("MyAssertionError", assertion=True),
    ],
)
def test_assertions_are_their_own_kind(exception):
    [result] = results_from_report(doc(failing("test_a", exception), exitstatus=1))
    assert result.kind is FailureKind.ASSERTION
    assert result.exc_type == exception["root_type"]


def test_setup_failure_is_an_error_with_its_exception_kind():
    [result] = results_from_report(doc(failing("test_a", exc("KeyError"), "setup"), exitstatus=1))
    assert (result.outcome, result.kind, result.exc_type) == (Outcome.ERROR, FailureKind.EXCEPTION, "KeyError")


def test_teardown_failure_after_a_pass_is_an_error_but_keeps_a_call_failure():
    passed_then_teardown = [
        entry("test_a", "setup"),
        entry("test_a"),
        entry("test_a", "teardown", "failed", exception=exc("OSError")),
    ]
    failed_then_teardown = [
        entry("test_b", "setup"),
        entry("test_b", "call", "failed", exception=exc("ValueError")),
        entry("test_b", "teardown", "failed", exception=exc("OSError")),
    ]
    results = by_key(results_from_report(doc(passed_then_teardown + failed_then_teardown)))
    assert (results[f"{FILE}::test_a"].outcome, results[f"{FILE}::test_a"].exc_type) == (Outcome.ERROR, "OSError")
    assert (results[f"{FILE}::test_b"].outcome, results[f"{FILE}::test_b"].exc_type) == (Outcome.FAILED, "ValueError")


def test_skips_and_xfails():
    report = doc(
        [
            entry("test_s", "setup"),
            entry("test_s", "call", "skipped"),
            entry("test_xf", "setup"),
            entry("test_xf", "call", "skipped", xfail="xfailed", wasxfail="r"),
            entry("test_xp", "setup"),
            entry("test_xp", "call", "passed", xfail="xpassed", wasxfail="r"),
            entry("test_strict", "setup"),
            entry("test_strict", "call", "failed", longrepr="[XPASS(strict)] r"),
        ]
    )
    results = {r.nodeid.rsplit("::")[-1]: r for r in results_from_report(report)}
    assert results["test_s"].outcome is Outcome.SKIPPED
    assert results["test_xf"].outcome is Outcome.XFAILED
    assert results["test_xp"].outcome is Outcome.XPASSED
    strict = results["test_strict"]
    assert (strict.outcome, strict.kind, strict.message) == (Outcome.FAILED, FailureKind.ASSERTION, "[XPASS(strict)] r")


def test_subtests_are_separate_results_with_labels():
    sub = lambda msg, **kw: {"msg": msg, "kwargs": kw, "report_type": "SubtestReport"}  # noqa: E731
    report = doc(
        [
            entry("T::test_s", "setup"),
            entry("T::test_s", subtest=sub("case", i="0")),
            entry("T::test_s", "call", "failed", subtest=sub("case", i="1"), exception=exc("AssertionError")),
            entry("T::test_s", subtest=sub(None)),
            entry("T::test_s", subtest=sub(None)),
            entry("T::test_s", "call", "failed", longrepr="contains 1 failed subtest"),
            entry("T::test_s", "teardown"),
        ],
        exitstatus=1,
    )
    results = results_from_report(report)
    assert [r.key for r in results] == [
        f"{FILE}::T::test_s",
        f"{FILE}::T::test_s [case, i=0]",
        f"{FILE}::T::test_s [case, i=1]",
        f"{FILE}::T::test_s [<subtest>]",
        f"{FILE}::T::test_s [<subtest> #2]",
    ]
    parent, _, failed_sub, *_ = results
    assert (parent.outcome, parent.kind) == (Outcome.FAILED, None)  # a rollup of its subtests
    assert (failed_sub.outcome, failed_sub.kind, failed_sub.subtest) == (
        Outcome.FAILED,
        FailureKind.ASSERTION,
        "case, i=1",
    )
    assert failure_kinds(results) == {"assertion": 1}
    counts = count_results(results)
    assert (counts["tests_failed"], counts["subtests_passed"], counts["subtests_failed"]) == (1, 3, 1)


def test_subtest_label():
    assert subtest_label({"msg": "m", "kwargs": {"a": "1", "b": "'x'"}}) == "m, a=1, b='x'"
    assert subtest_label({"msg": None, "kwargs": {}}) == "<subtest>"


def test_collection_error_is_a_result():
    error = {
        "nodeid": FILE,
        "exception": exc("ImportError", top="Collector.CollectError", message="cannot import name 'gone'"),
        "longrepr": "ImportError while importing test module",
    }
    [result] = results_from_report(doc(collection_errors=[error], exitstatus=2))
    assert (result.nodeid, result.outcome, result.kind, result.exc_type) == (
        FILE,
        Outcome.ERROR,
        FailureKind.COLLECTION,
        "ImportError",
    )
    assert failure_kinds([result]) == {"assertion": 0, "collection": 1}


def test_no_tests_collected_is_an_error_never_a_pass():
    [result] = results_from_report(doc(exitstatus=5))
    assert (result.nodeid, result.outcome, result.kind) == (FILE, Outcome.ERROR, FailureKind.COLLECTION)


@pytest.mark.parametrize("status", [2, 3, 4])
def test_interrupted_internal_and_usage_errors_are_infrastructure(status):
    [result] = results_from_report(doc(exitstatus=status))
    assert (result.outcome, result.kind) == (Outcome.ERROR, FailureKind.INFRASTRUCTURE)


def test_timeout_marks_the_running_test_and_keeps_earlier_results():
    report = doc(
        [*passing("test_fast"), entry("test_slow", "setup")],
        complete=False,
        exitstatus=None,
        running=f"{FILE}::test_slow",
        runner={"file_nodeid": FILE, "returncode": -15, "timed_out": True, "timeout_s": 2},
    )
    results = by_key(results_from_report(report))
    assert results[f"{FILE}::test_fast"].outcome is Outcome.PASSED
    slow = results[f"{FILE}::test_slow"]
    assert (slow.outcome, slow.kind) == (Outcome.ERROR, FailureKind.TIMEOUT)


def test_timeout_outside_a_test_marks_the_file():
    report = doc(
        complete=False,
        exitstatus=None,
        runner={"file_nodeid": FILE, "returncode": -9, "timed_out": True, "timeout_s": 2},
    )
    [result] = results_from_report(report)
    assert (result.nodeid, result.kind) == (FILE, FailureKind.TIMEOUT)


def test_missing_report_is_infrastructure():
    report = doc(complete=False, exitstatus=None, runner={"file_nodeid": FILE, "returncode": -11, "timed_out": False})
    [result] = results_from_report(report)
    assert (result.nodeid, result.kind) == (FILE, FailureKind.INFRASTRUCTURE)
    assert "-11" in result.message


def test_failure_kinds_name_unexpected_exceptions():
    tests = [
        *failing("a1", exc("AttributeError")),
        *failing("a2", exc("AttributeError", top="Exception")),
        *failing("v", exc("ValueError")),
        *passing("ok"),
    ]
    assert failure_kinds(results_from_report(doc(tests, exitstatus=1))) == {
        "assertion": 0,
        "AttributeError": 2,
        "ValueError": 1,
    }


# ------------------------------------------------------------------ finalize_report


def test_finalize_rebuilds_a_killed_run_from_the_journal(tmp_path: Path):
    report_path = tmp_path / "r.json"
    events = [
        {"event": "meta", "data": {"pytest_version": "9.2.0", "rootdir": "/t"}},
        {"event": "start", "data": f"{FILE}::test_fast"},
        *({"event": "test", "data": e} for e in passing("test_fast")),
        {"event": "finish", "data": f"{FILE}::test_fast"},
        {"event": "start", "data": f"{FILE}::test_slow"},
    ]
    text = "".join(json.dumps(e) + "\n" for e in events) + '{"event": "test", "da'
    Path(f"{report_path}.journal").write_text(text)
    result = CommandResult(
        argv=("python",),
        returncode=-15,
        duration_s=2.5,
        timed_out=True,
        stdout_path=tmp_path / "o",
        stderr_path=tmp_path / "e",
    )
    finalized = finalize_report(report_path, result, file_nodeid=FILE, timeout_s=2)
    assert load_report(report_path) == finalized
    assert not Path(f"{report_path}.journal").exists()
    assert finalized["runner"]["report_source"] == "journal"
    assert finalized["running"] == f"{FILE}::test_slow"
    results = by_key(results_from_report(finalized))
    assert results[f"{FILE}::test_fast"].outcome is Outcome.PASSED
    assert results[f"{FILE}::test_slow"].kind is FailureKind.TIMEOUT


def test_load_report_refuses_duplicate_keys(tmp_path: Path):
    path = tmp_path / "r.json"
    path.write_text(f'{{"schema": "{PYTEST_REPORT_SCHEMA}", "schema": "{PYTEST_REPORT_SCHEMA}"}}')
    with pytest.raises(SchemaError, match="duplicate"):
        load_report(path)


# ------------------------------------------------------------------ transitions


def R(name, outcome=Outcome.PASSED, kind=None, subtest=None):  # noqa: N802
    return models.TestResult(f"{FILE}::{name}", outcome, kind, subtest=subtest)


FAIL = (Outcome.FAILED, FailureKind.EXCEPTION)


def test_the_four_transitions():
    base = [R("f2p", *FAIL), R("p2p"), R("p2f"), R("f2f", Outcome.FAILED, FailureKind.ASSERTION)]
    head = [R("f2p"), R("p2p"), R("p2f", *FAIL), R("f2f", *FAIL)]
    assert transitions(base, head) == {
        f"{FILE}::f2p": Transition.FAIL_TO_PASS,
        f"{FILE}::p2p": Transition.PASS_TO_PASS,
        f"{FILE}::p2f": Transition.PASS_TO_FAIL,
        f"{FILE}::f2f": Transition.FAIL_TO_FAIL,
    }


def test_setup_errors_count_as_failures_and_xfail_as_pytest_judges_it():
    base = [R("setup_err", Outcome.ERROR, FailureKind.EXCEPTION), R("xf", Outcome.XFAILED)]
    head = [R("setup_err"), R("xf", Outcome.XPASSED)]
    assert list(transitions(base, head).values()) == [Transition.FAIL_TO_PASS, Transition.PASS_TO_PASS]


def test_collection_error_on_base_unspread_is_one_error_row():
    base = [models.TestResult(FILE, Outcome.ERROR, FailureKind.COLLECTION, "ImportError")]
    head = [R("test_a"), R("test_b")]
    expected = {FILE: Transition.ERROR, f"{FILE}::test_a": Transition.NOT_RUN, f"{FILE}::test_b": Transition.NOT_RUN}
    assert transitions(base, head) == expected
    assert transitions(base, head, collection_states=False) == expected  # compare/2's rule


def test_collection_error_on_base_spread_over_head_tests_is_error_to_pass():
    error = models.TestResult(FILE, Outcome.ERROR, FailureKind.COLLECTION, "ImportError", "cannot import name 'x'")
    head = [R("test_a"), R("test_b", *FAIL), R("test_b", subtest="i=1")]
    base = spread_collection_errors([error], head)
    assert [(r.key, r.kind, r.exc_type, r.message) for r in base] == [
        (f"{FILE}::test_a", FailureKind.COLLECTION, "ImportError", "cannot import name 'x'"),
        (f"{FILE}::test_b", FailureKind.COLLECTION, "ImportError", "cannot import name 'x'"),
        (f"{FILE}::test_b [i=1]", FailureKind.COLLECTION, "ImportError", "cannot import name 'x'"),
    ]
    assert transitions(base, head) == {
        f"{FILE}::test_a": Transition.ERROR_TO_PASS,
        f"{FILE}::test_b": Transition.ERROR,  # head failed: not a fail-to-pass of any kind
        f"{FILE}::test_b [i=1]": Transition.ERROR_TO_PASS,
    }
    assert transitions(base, head, collection_states=False)[f"{FILE}::test_a"] == Transition.ERROR
    assert collection_errors([error]) == [
        {"nodeid": FILE, "exc_type": "ImportError", "message": "cannot import name 'x'"}
    ]


def test_a_collection_error_elsewhere_is_not_spread():
    error = models.TestResult("other/test_y.py", Outcome.ERROR, FailureKind.COLLECTION, "ImportError")
    assert spread_collection_errors([error], [R("test_a")]) == [error]


@pytest.mark.parametrize("kind", [FailureKind.TIMEOUT, FailureKind.INFRASTRUCTURE, FailureKind.COLLECTION])
def test_errors_on_either_side_are_errors(kind):
    errored = R("t", Outcome.ERROR, kind)
    to_pass = Transition.ERROR_TO_PASS if kind is FailureKind.COLLECTION else Transition.ERROR
    assert transitions([errored], [R("t")]) == {f"{FILE}::t": to_pass}
    assert transitions([errored], [R("t")], collection_states=False) == {f"{FILE}::t": Transition.ERROR}
    assert transitions([R("t", *FAIL)], [errored]) == {f"{FILE}::t": Transition.ERROR}


def test_skips_and_one_sided_tests_are_not_run():
    base = [R("skipped", Outcome.SKIPPED), R("only_base")]
    head = [R("skipped"), R("only_head", *FAIL)]
    assert set(transitions(base, head).values()) == {Transition.NOT_RUN}


def test_subtests_have_their_own_transitions():
    base = [R("t"), R("t", *FAIL, subtest="i=1")]
    head = [R("t"), R("t", subtest="i=1")]
    assert transitions(base, head) == {
        f"{FILE}::t": Transition.PASS_TO_PASS,
        f"{FILE}::t [i=1]": Transition.FAIL_TO_PASS,
    }


def test_a_passed_test_with_a_failed_subtest_has_not_passed():
    sub = {"msg": "case", "kwargs": {"i": "1"}, "report_type": "SubtestReport"}
    report = doc(
        [
            entry("T::test_s", "setup"),
            entry("T::test_s", "call", "failed", subtest=sub, exception=exc("AssertionError")),
            entry("T::test_s", "call", "passed"),
            entry("T::test_s", "teardown"),
        ],
        exitstatus=1,
    )
    parent = by_key(results_from_report(report))[f"{FILE}::T::test_s"]
    assert (parent.outcome, parent.kind) == (Outcome.FAILED, None)
    assert "1 of its subtests failed" in parent.message
    as_reported = by_key(results_from_report(report, failed_subtests_fail=False))[f"{FILE}::T::test_s"]
    assert as_reported.outcome is Outcome.PASSED  # compare/4's reading, for its bundles

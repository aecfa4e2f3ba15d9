"""Per-test results from a pytest report document, failure kinds and transitions. Pure.

The report is ``kvprobe.pytest-report/1``, written inside the target interpreter by
``probe_api/kvprobe_pytest_report.py`` and completed by :mod:`kvprobe.checks.upstream` with a
``runner`` block, so every result (timeouts and crashes included) can be re-derived from the
one JSON file: the verifier does exactly that.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from kvprobe.errors import SchemaError
from kvprobe.model.records import FailureKind, Outcome, TestResult, Transition
from kvprobe.names import PYTEST_REPORT_SCHEMA

_ERROR_KINDS = frozenset({FailureKind.COLLECTION, FailureKind.INFRASTRUCTURE, FailureKind.TIMEOUT})
_MAX_MESSAGE = 1000
_EXIT_REASONS = {
    2: "pytest was interrupted (exit 2) without a collection error",
    3: "pytest internal error (exit 3)",
    4: "pytest usage error (exit 4)",
}


def check_report_schema(doc: Any) -> None:
    """SchemaError unless ``doc`` is a kvprobe.pytest-report/1 document."""
    if not isinstance(doc, dict) or doc.get("schema") != PYTEST_REPORT_SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise SchemaError(f"not a {PYTEST_REPORT_SCHEMA} document (schema: {found!r})")


# --------------------------------------------------------------------------- results


def results_from_report(doc: dict[str, Any], *, failed_subtests_fail: bool = True) -> list[TestResult]:
    """Per-test (and per-subtest) results from a report document. Pure.

    A test whose own phases passed but one of whose subtests failed has not passed: it is
    FAILED with no kind of its own (its subtests carry the kinds), as pytest's unittest
    integration reports such a test passed. ``failed_subtests_fail=False`` keeps the rule of
    kvprobe.compare/4 and earlier (the test as pytest reported it), so their bundles verify.
    Raises SchemaError for a document that is not ``kvprobe.pytest-report/1``.
    """
    check_report_schema(doc)
    results = [_collection_result(entry) for entry in doc.get("collection_errors", [])]
    results += _test_results(doc.get("tests", []), failed_subtests_fail)
    return _apply_run_state(doc, results)


def _collection_result(entry: Mapping[str, Any]) -> TestResult:
    exc = entry.get("exception") or {}
    message = exc.get("root_message") or _first_line(entry.get("longrepr", ""))
    return TestResult(entry["nodeid"], Outcome.ERROR, FailureKind.COLLECTION, exc.get("root_type"), _clip(message))


def _test_results(entries: Iterable[Mapping[str, Any]], failed_subtests_fail: bool) -> list[TestResult]:
    phases: dict[str, list[Mapping[str, Any]]] = {}
    subtests: dict[str, list[TestResult]] = {}
    labels: Counter[tuple[str, str]] = Counter()
    for entry in entries:
        nodeid = entry["nodeid"]
        phases.setdefault(nodeid, [])
        if entry.get("subtest"):
            label = subtest_label(entry["subtest"])
            labels[(nodeid, label)] += 1
            if labels[(nodeid, label)] > 1:
                label = f"{label} #{labels[(nodeid, label)]}"
            subtests.setdefault(nodeid, []).append(_from_entry(entry, subtest=label))
        else:
            phases[nodeid].append(entry)
    results: list[TestResult] = []
    for nodeid, entries_of_test in phases.items():
        subs = subtests.get(nodeid, [])
        if entries_of_test:
            merged = _merge_phases(nodeid, entries_of_test, subs)
            results.append(_failed_through_subtests(merged, subs) if failed_subtests_fail else merged)
        results += subs
    return results


def subtest_label(subtest: Mapping[str, Any]) -> str:
    """``msg, k=v, ...`` from a subtest's context; ``<subtest>`` when it has neither."""
    parts = [] if subtest.get("msg") is None else [str(subtest["msg"])]
    parts += [f"{k}={v}" for k, v in (subtest.get("kwargs") or {}).items()]
    return ", ".join(parts) or "<subtest>"


def _merge_phases(nodeid: str, entries: list[Mapping[str, Any]], subs: list[TestResult]) -> TestResult:
    """setup/call/teardown -> one result: a failed setup or teardown is an ERROR."""
    by_when = {e.get("when"): e for e in entries}
    setup, call, teardown = by_when.get("setup"), by_when.get("call"), by_when.get("teardown")
    rollup = any(s.outcome is Outcome.FAILED for s in subs)
    if setup is not None and setup["outcome"] != "passed":
        result = _from_entry(setup, phase_error=True)
    elif call is not None:
        result = _from_entry(call, rollup=rollup)
    else:
        return TestResult(
            nodeid, Outcome.ERROR, FailureKind.INFRASTRUCTURE, message="the test never reached its call phase"
        )
    if (
        teardown is not None
        and teardown["outcome"] == "failed"
        and result.outcome is not Outcome.FAILED
        and result.outcome is not Outcome.ERROR
    ):
        result = _from_entry(teardown, phase_error=True)
    return result


def _failed_through_subtests(result: TestResult, subs: list[TestResult]) -> TestResult:
    """A passed test with a failed subtest, as FAILED (kind None: the subtests carry the kinds)."""
    failed = sum(1 for s in subs if s.outcome in (Outcome.FAILED, Outcome.ERROR))
    if not failed or result.outcome not in (Outcome.PASSED, Outcome.XPASSED):
        return result
    return TestResult(result.nodeid, Outcome.FAILED, message=f"passed itself, but {failed} of its subtests failed")


def _from_entry(
    entry: Mapping[str, Any], *, phase_error: bool = False, subtest: str | None = None, rollup: bool = False
) -> TestResult:
    outcome = _outcome(entry, phase_error)
    if outcome not in (Outcome.FAILED, Outcome.ERROR):
        message = _clip(str(entry.get("wasxfail") or "")) if entry.get("xfail") else ""
        return TestResult(entry["nodeid"], outcome, message=message, subtest=subtest)
    kind, exc_type, message = classify_failure(entry.get("exception"), entry.get("longrepr", ""), rollup=rollup)
    return TestResult(entry["nodeid"], outcome, kind, exc_type, message, subtest)


def _outcome(entry: Mapping[str, Any], phase_error: bool) -> Outcome:
    if entry.get("xfail") in ("xfailed", "xpassed"):
        return Outcome(entry["xfail"])
    raw = entry.get("outcome")
    if raw == "failed":
        return Outcome.ERROR if phase_error else Outcome.FAILED
    if raw in ("passed", "skipped"):
        return Outcome(raw)
    raise SchemaError(f"unknown test outcome {raw!r} for {entry.get('nodeid')!r}")


def classify_failure(
    exc: Mapping[str, Any] | None, longrepr: str = "", *, rollup: bool = False
) -> tuple[FailureKind | None, str | None, str]:
    """(kind, exc_type, message) from a failure's exception chain, judged by its root.

    No exception: a parent failed only through its subtests gets kind None (its
    subtests carry the kinds); otherwise (e.g. strict XPASS) it is an assertion.
    """
    if not exc:
        return (None if rollup else FailureKind.ASSERTION), None, _clip(_first_line(longrepr))
    root = exc.get("root_type") or exc.get("top_type")
    message = _clip(exc.get("root_message") or "")
    if exc.get("assertion") or root == "AssertionError":
        return FailureKind.ASSERTION, root, message
    return FailureKind.EXCEPTION, root, message


def _apply_run_state(doc: Mapping[str, Any], results: list[TestResult]) -> list[TestResult]:
    """Add what the run itself says: timeout, crash, no tests, interrupted."""
    runner = doc.get("runner") or {}
    file_nodeid = runner.get("file_nodeid") or "<session>"
    running = doc.get("running")
    if runner.get("timed_out"):
        hung = " after pytest finished (the process did not exit)" if doc.get("complete") else ""
        return _replace(
            results,
            running or file_nodeid,
            FailureKind.TIMEOUT,
            f"killed at the {runner.get('timeout_s')}s timeout{hung}",
        )
    if doc.get("complete") is not True:
        return _replace(
            results,
            running or file_nodeid,
            FailureKind.INFRASTRUCTURE,
            f"pytest exited {runner.get('returncode')} without writing its report",
        )
    status = doc.get("exitstatus")
    if status == 5:
        return [
            *results,
            TestResult(
                file_nodeid, Outcome.ERROR, FailureKind.COLLECTION, message="no tests collected (pytest exit 5)"
            ),
        ]
    if status in _EXIT_REASONS and not (status == 2 and doc.get("collection_errors")):
        return [
            *results,
            TestResult(file_nodeid, Outcome.ERROR, FailureKind.INFRASTRUCTURE, message=_EXIT_REASONS[status]),
        ]
    return results


def _replace(results: list[TestResult], nodeid: str, kind: FailureKind, message: str) -> list[TestResult]:
    """Drop ``nodeid``'s own (partial) result and record it as an error of ``kind``."""
    kept = [r for r in results if not (r.nodeid == nodeid and r.subtest is None)]
    return [*kept, TestResult(nodeid, Outcome.ERROR, kind, message=message)]


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


# --------------------------------------------------------------------------- summaries


def count_results(results: Iterable[TestResult]) -> dict[str, int]:
    """tests_<outcome> and subtests_<outcome> counted apart."""
    counts = Counter({f"{p}_{o}": 0 for p in ("tests", "subtests") for o in ("passed", "failed", "error", "skipped")})
    for r in results:
        counts[f"{'subtests' if r.subtest else 'tests'}_{r.outcome.value}"] += 1
    return dict(counts)


def failure_kinds(results: Iterable[TestResult]) -> dict[str, int]:
    """ "6 AttributeError + 1 ValueError, 0 assertion failures" as data: failures by root-cause
    kind, unexpected exceptions by type name; "assertion" always present.

    A test that failed only through its subtests (kind None) adds nothing: its subtests,
    counted here too, carry the kinds.
    """
    kinds: Counter[str] = Counter({"assertion": 0})
    for r in results:
        if r.outcome in (Outcome.FAILED, Outcome.ERROR) and r.kind is not None:
            label = (r.exc_type or "Exception") if r.kind is FailureKind.EXCEPTION else r.kind.value
            kinds[label] += 1
    return dict(sorted(kinds.items()))


# --------------------------------------------------------------------------- transitions


def transitions(
    base: Iterable[TestResult], head: Iterable[TestResult], *, collection_states: bool = True
) -> dict[str, Transition]:
    """Per result key (nodeid [+ subtest]): how base's outcome became head's. Pure.

    ``collection_states`` tells a collection error from other errors (ERROR_TO_PASS);
    False is the rule of kvprobe.compare/2 and earlier, kept so their bundles verify.
    """
    base_by_key, head_by_key = _index(base), _index(head)
    keys = list(base_by_key) + [k for k in head_by_key if k not in base_by_key]
    return {k: _transition(base_by_key.get(k), head_by_key.get(k), collection_states) for k in keys}


def spread_collection_errors(results: Iterable[TestResult], other: Iterable[TestResult]) -> list[TestResult]:
    """A module this side could not collect, stated once per test the other side ran in it.

    A base that cannot import head's test module reports one error, for the file; head
    reports each test. Stating the error per test (same root exception) turns
    "ERROR 1, NOT_RUN n" into n honest ERROR_TO_PASS rows.
    """
    results, other = list(results), list(other)
    own = {r.nodeid for r in results}
    spread: list[TestResult] = []
    for r in results:
        covered = (
            [o for o in other if o.nodeid.startswith(f"{r.nodeid}::") and o.nodeid not in own]
            if r.kind is FailureKind.COLLECTION and r.subtest is None and r.nodeid
            else []
        )
        spread += [replace(r, nodeid=o.nodeid, subtest=o.subtest) for o in covered] or [r]
    return spread


def collection_errors(results: Iterable[TestResult]) -> list[dict[str, Any]]:
    """What could not be collected, with its root exception: the first thing a reader needs."""
    return [
        {"nodeid": r.nodeid, "exc_type": r.exc_type, "message": r.message}
        for r in results
        if r.kind is FailureKind.COLLECTION and r.subtest is None
    ]


def failure_label(kind: str | None, exc_type: str | None) -> str | None:
    """One test's failure as an expectation names it: "assertion", "AttributeError",
    "collection:ImportError", "timeout"...; None when it did not fail by a kind."""
    if kind is None:
        return None
    if kind == FailureKind.EXCEPTION.value:
        return exc_type or "Exception"
    if kind == FailureKind.COLLECTION.value and exc_type:
        return f"collection:{exc_type}"
    return kind


def _index(results: Iterable[TestResult]) -> dict[str, TestResult]:
    index: dict[str, TestResult] = {}
    for r in results:
        index.setdefault(r.key, r)
    return index


def _state(result: TestResult | None, collection_states: bool) -> str | None:
    if result is None:
        return None
    if result.kind in _ERROR_KINDS:
        return "collect" if collection_states and result.kind is FailureKind.COLLECTION else "error"
    if result.outcome in (Outcome.PASSED, Outcome.XPASSED, Outcome.XFAILED):
        return "pass"  # as pytest judges it: an xfail that failed keeps the suite green
    return "skip" if result.outcome is Outcome.SKIPPED else "fail"


_TRANSITIONS = {
    ("fail", "pass"): Transition.FAIL_TO_PASS,
    ("collect", "pass"): Transition.ERROR_TO_PASS,
    ("pass", "pass"): Transition.PASS_TO_PASS,
    ("pass", "fail"): Transition.PASS_TO_FAIL,
    ("fail", "fail"): Transition.FAIL_TO_FAIL,
}


def _transition(base: TestResult | None, head: TestResult | None, collection_states: bool) -> Transition:
    states = (_state(base, collection_states), _state(head, collection_states))
    if states in _TRANSITIONS:
        return _TRANSITIONS[states]
    if "error" in states or "collect" in states:
        return Transition.ERROR
    return Transition.NOT_RUN

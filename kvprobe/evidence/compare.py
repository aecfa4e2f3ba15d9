"""Pure comparison: base x head x expectations -> rows, transitions, verdict.

Inputs are the raw documents a bundle carries (probe outputs, test-run records), so the
verifier can recompute exactly what the receipt states from the files alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from kvprobe.checks.results import failure_kinds, results_from_report, transitions
from kvprobe.model.records import FailureKind, Outcome, TestResult, Transition, Verdict
from kvprobe.names import SIDES

# Names what compare() computes; change it whenever its output for the same inputs changes,
# so a verifier can tell a bundle made by another comparison from a forged one.
ALGORITHM = "kvprobe.compare/2"
# Earlier comparisons and how their output differs from this one's for the same inputs. A
# bundle made by one verifies when this comparison, recomputed, gives the same block.
PREDECESSORS = {
    "kvprobe.compare/1": "counted a test that failed only through its subtests as one more "
    "'infrastructure' failure kind",
}
RAISED = "raised"  # reserved observation: the exception type a case raised, or False


def case_table(docs: Mapping[str, Mapping[str, Any] | None]) -> dict[str, dict[str, Any]]:
    """``{"probe/case": {"status", "error_type", "root_type", "observations"}}`` for one side."""
    table: dict[str, dict[str, Any]] = {}
    for name, doc in sorted(docs.items()):
        for case in (doc or {}).get("cases", []):
            error = case.get("error") or {}
            observations = dict(case["observations"])
            observations[RAISED] = error.get("type") or False
            table[f"{name}/{case['name']}"] = {
                "status": case["status"],
                "error_type": error.get("type"),
                "root_type": error.get("root_type"),
                "observations": observations,
            }
    return table


def observation_rows(expect: Mapping[str, Any], tables: Mapping[str, dict]) -> list[dict[str, Any]]:
    """One row per (case, observation) that is expected on a side or recorded on one."""
    keys: dict[str, set[str]] = {}
    for side in SIDES:
        for key, obs in expect.get(side, {}).items():
            keys.setdefault(key, set()).update(obs)
        for key, case in tables[side].items():
            keys.setdefault(key, set()).update(k for k in case["observations"] if k != RAISED)
    rows = []
    for key in sorted(keys):
        for name in sorted(keys[key]):
            row: dict[str, Any] = {"case": key, "observation": name}
            for side in SIDES:
                case = tables[side].get(key)
                observed = case["observations"] if case is not None else {}
                recorded = name in observed
                row[side] = observed[name] if recorded else None
                row[f"{side}_recorded"] = recorded
                expected = expect.get(side, {}).get(key, {})
                row[f"expected_{side}"] = expected.get(name)
                row[f"expected_{side}_declared"] = name in expected
                row[f"{side}_ok"] = (not row[f"expected_{side}_declared"]) or (
                    recorded and _same(row[side], expected[name])
                )
            row["changed"] = row["base_recorded"] != row["head_recorded"] or not _same(row["base"], row["head"])
            rows.append(row)
    return rows


def _same(a: Any, b: Any) -> bool:
    """Equality that keeps True apart from 1 (JSON bool vs int)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def test_rows(test_runs: Mapping[str, Mapping[str, Any]]) -> tuple[list[dict], dict[str, dict]]:
    """Per-test transitions and per-file summaries from the two sides' test-run records."""
    rows, summary = [], {}
    for path, sides in sorted(test_runs.items()):
        results = {side: _results(sides.get(side)) for side in SIDES}
        moves = transitions(results["base"], results["head"])
        by_key = {side: {r.key: r for r in results[side]} for side in SIDES}
        for key in sorted(moves):
            row: dict[str, Any] = {"file": path, "test": key, "transition": moves[key].value}
            for side in SIDES:
                result = by_key[side].get(key)
                row[side] = result.outcome.value if result else None
                row[f"{side}_kind"] = result.kind.value if result and result.kind else None
                row[f"{side}_exc_type"] = result.exc_type if result else None
            rows.append(row)
        summary[path] = {
            "transitions": dict(Counter(m.value for m in moves.values())),
            **{side: _side_summary(sides.get(side), results[side]) for side in SIDES},
        }
    return rows, summary


def _results(run: Mapping[str, Any] | None) -> list[TestResult]:
    if not run or run.get("report") is None:
        return []
    return results_from_report(run["report"])


def _side_summary(run: Mapping[str, Any] | None, results: list[TestResult]) -> dict[str, Any]:
    tests = [r for r in results if not r.subtest]
    subtests = [r for r in results if r.subtest]
    return {
        "problem": (run or {}).get("problem") or ("no test run" if not run else None),
        "exit_code": (run or {}).get("exit_code"),
        "tests": dict(Counter(r.outcome.value for r in tests)),
        "subtests": dict(Counter(r.outcome.value for r in subtests)),
        "failure_kinds": failure_kinds(results),
    }


def compare(
    *,
    expect: Mapping[str, Any],
    probe_docs: Mapping[str, Mapping[str, Any]],
    probe_problems: Mapping[str, Mapping[str, str]],
    test_runs: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    """The comparison block of a receipt, verdict included."""
    tables = {side: case_table(probe_docs.get(side, {})) for side in SIDES}
    rows = observation_rows(expect, tables)
    trows, tsummary = test_rows(test_runs)
    verdict, reasons = _verdict(expect, rows, trows, tsummary, probe_problems, tables)
    declared = [r for r in rows if r["expected_base_declared"] or r["expected_head_declared"]]
    return {
        "algorithm": ALGORITHM,
        "verdict": verdict.value,
        "reasons": reasons,
        "cases": {side: tables[side] for side in SIDES},
        "observations": rows,
        "tests": trows,
        "test_summary": tsummary,
        "counts": {
            "observations_expected": len(declared),
            "observations_matched": sum(1 for r in declared if r["base_ok"] and r["head_ok"]),
            "observations_changed": sum(1 for r in rows if r["changed"]),
            "tests": len(trows),
            "fail_to_pass": sum(1 for r in trows if r["transition"] == Transition.FAIL_TO_PASS.value),
        },
    }


def _verdict(
    expect: Mapping[str, Any],
    rows: list[dict[str, Any]],
    trows: list[dict[str, Any]],
    tsummary: dict[str, dict[str, Any]],
    probe_problems: Mapping[str, Mapping[str, str]],
    tables: Mapping[str, dict[str, Any]],
) -> tuple[Verdict, list[str]]:
    errors = [f"{side}: {msg}" for side in SIDES for msg in probe_problems.get(side, {}).values()]
    for path, summary in tsummary.items():
        for side in SIDES:
            if summary[side]["problem"]:
                errors.append(f"{side}: {path}: {summary[side]['problem']}")
    errors += [
        f"{r['file']}: {r['test']}: {r['transition']}"
        for r in trows
        if r["transition"] == Transition.ERROR.value and _infra(r)
    ]
    if errors:
        return Verdict.ERROR, errors
    if not any(tables[s] for s in SIDES) and not trows:
        return Verdict.ERROR, ["nothing ran: no probe case and no upstream test produced a result"]
    reasons = []
    for r in rows:
        for side in SIDES:
            if not r[f"{side}_ok"]:
                got = repr(r[side]) if r[f"{side}_recorded"] else _missing(tables[side].get(r["case"]))
                reasons.append(f"{side}: {r['case']}: {r['observation']} expected {r[f'expected_{side}']!r}, got {got}")
    reasons += _test_reasons(trows)
    if reasons:
        return Verdict.NOT_REPRODUCED, reasons
    has_probe_cases = any(tables[s] for s in SIDES)
    if has_probe_cases and not any(expect.get(s) for s in SIDES):
        return Verdict.NO_EXPECTATIONS, [
            "no expectations declared: the probe ran, nothing was "
            "checked (review its output, then --record-expectations)"
        ]
    if not has_probe_cases and not any(r["transition"] == "FAIL_TO_PASS" for r in trows):
        return Verdict.NOT_REPRODUCED, ["no upstream test went from fail to pass"]
    return Verdict.REPRODUCED, []


def _infra(row: dict) -> bool:
    kinds = {row["base_kind"], row["head_kind"]}
    return bool(kinds & {FailureKind.INFRASTRUCTURE.value, FailureKind.TIMEOUT.value})


def _test_reasons(trows: list[dict]) -> list[str]:
    """Head must pass every test; base must fail at least one (head tests on both sides)."""
    if not trows:
        return []
    reasons = [
        f"head: {r['file']}: {r['test']} {r['head'] or 'not run'}"
        for r in trows
        if r["head"] not in (Outcome.PASSED.value, Outcome.SKIPPED.value, Outcome.XFAILED.value)
    ]
    if not any(r["transition"] == Transition.FAIL_TO_PASS.value for r in trows):
        reasons.append("no upstream test went from fail on base to pass on head")
    return reasons


def _missing(case: dict | None) -> str:
    if case is None:
        return "no such case"
    if case["status"] == "raised":
        return f"nothing (case raised {case['error_type']})"
    return "nothing recorded"

"""Pure comparison: base x head x expectations -> rows, transitions, verdict.

Inputs are the raw documents a bundle carries (probe outputs, test-run records), so the
verifier can recompute exactly what the receipt states from the files alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from kvprobe.model.records import FailureKind, Outcome, TestResult, Transition, Verdict
from kvprobe.names import NOT_PRESENT, SIDES
from kvprobe.rules.pytest_results import (
    collection_errors,
    failure_kinds,
    failure_label,
    results_from_report,
    spread_collection_errors,
    transitions,
)

# Names what compare() computes; change it whenever its output for the same inputs changes,
# so a verifier can tell a bundle made by another comparison from a forged one.
ALGORITHM = "kvprobe.compare/5"
# Earlier comparisons and how their output differs from this one's for the same inputs. A
# bundle made by one is recomputed with its rules (compare/1 and /2: compare/2's test rules;
# all three read every probe case as observed) and verifies when that gives the same block.
PREDECESSORS = {
    "kvprobe.compare/1": "counted a test that failed only through its subtests as one more "
    "'infrastructure' failure kind",
    "kvprobe.compare/2": "reported a test module the base could not collect as one ERROR row and "
    "every head test as NOT_RUN, and had no FAIL_TO_PASS/PASS_TO_PASS expectations",
    "kvprobe.compare/3": "read every probe case as observed (a case that never reached its "
    "decision point counted as behaviour)",
    "kvprobe.compare/4": "counted a test that passed itself but had a failed subtest as passed (a "
    "PASS_TO_PASS where the base failed a subtest), did not count expected flips apart from "
    "controls, and had no `not_present` expectation (a case declared absent on a side was read as "
    "an observation named not_present, which no probe records, so that side was unknown)",
}
_COMPARE_2_TEST_RULES = ("kvprobe.compare/1", "kvprobe.compare/2")
# Comparisons that read every case as observed and whose receipts do not state the probes'
# configuration and absorbed calls (compare/4 introduced both).
_BEFORE_OBSERVATION = ("kvprobe.compare/1", "kvprobe.compare/2", "kvprobe.compare/3")
# Comparisons that took a test with a failed subtest as pytest reported it.
_SUBTESTS_AS_REPORTED = (*_BEFORE_OBSERVATION, "kvprobe.compare/4")


def states_probe_records(algorithm: str) -> bool:
    """Whether a receipt of ``algorithm`` must state evidence.configuration and .absorbed."""
    return algorithm not in _BEFORE_OBSERVATION


_PASSING = (Outcome.PASSED.value, Outcome.SKIPPED.value, Outcome.XFAILED.value)
# The SWE-bench set each transition belongs to: ERROR_TO_PASS is a fail-to-pass by exception.
_TO_PASS = {
    Transition.FAIL_TO_PASS.value: "FAIL_TO_PASS",
    Transition.ERROR_TO_PASS.value: "FAIL_TO_PASS",
    Transition.PASS_TO_PASS.value: "PASS_TO_PASS",
}
RAISED = "raised"  # reserved observation: the exception type a case raised, or False
OBSERVED = "observed"  # a case reached its decision point: what it recorded is behaviour
# NOT_PRESENT (names.py) is a reserved expectation (compare/5 on): the case's code path is absent on
# that side, its value the symbols the probe names as missing. A feature a PR adds is not-present on
# its base: declaring it checks the absence (the base must not have the code) instead of leaving
# that side unexpected.


def case_table(docs: Mapping[str, Mapping[str, Any] | None], *, observation: bool = True) -> dict[str, dict[str, Any]]:
    """``{"probe/case": {status, error_type, root_type, observations, observation, reason,
    missing, decision_point}}`` for one side.

    A case without ``observation`` (written before probes declared decision points) was
    observed. The reserved ``raised`` observation is set only for observed cases: an
    exception before the decision point is set-up drift, not behaviour. ``observation=False``
    is the table before compare/4: every case observed, none of those four fields.
    """
    table: dict[str, dict[str, Any]] = {}
    for name, doc in sorted(docs.items()):
        for case in (doc or {}).get("cases", []):
            error = case.get("error") or {}
            seen = case.get("observation", OBSERVED) if observation else OBSERVED
            observations = dict(case["observations"])
            if seen == OBSERVED:
                observations[RAISED] = error.get("type") or False
            entry = {
                "status": case["status"],
                "error_type": error.get("type"),
                "root_type": error.get("root_type"),
                "observations": observations,
            }
            if observation:
                entry.update(
                    observation=seen,
                    reason=case.get("reason"),
                    missing=list(case.get("missing") or []),
                    decision_point=case.get("decision_point"),
                )
            table[f"{name}/{case['name']}"] = entry
    return table


def probe_records(probe_docs: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, dict[str, list]]]:
    """``{"configuration"|"absorbed": {side: {probe: [...]}}}`` copied from the raw outputs.

    What each probe set away from its default and every call a mock accepted in place of the
    real collaborator: the limits of what its observations show. Documents written before
    probes recorded them give empty lists.
    """
    return {
        key: {
            side: {name: list(doc.get(key) or []) for name, doc in sorted(probe_docs.get(side, {}).items())}
            for side in SIDES
        }
        for key in ("configuration", "absorbed")
    }


def observation_rows(
    expect: Mapping[str, Any], tables: Mapping[str, dict], *, presence: bool = True
) -> list[dict[str, Any]]:
    """One row per (case, observation) that is expected on a side or recorded on one.

    A declared ``not_present`` row holds, on its side, the missing symbols of a not-present case
    (nothing for any other case); ``presence=False`` reads it as any other observation (compare/4).
    """
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
                if presence and name == NOT_PRESENT and name in expected:
                    absent = case is not None and case.get("observation") == "not-present"
                    row[side] = list(case["missing"]) if case is not None and absent else None
                    row[f"{side}_recorded"] = absent
                    row[f"{side}_ok"] = _absent_ok(case, expected[name])
                    continue
                row[f"{side}_ok"] = _ok(
                    row[f"expected_{side}_declared"], case, recorded and _same(row[side], expected.get(name))
                )
            row["changed"] = row["base_recorded"] != row["head_recorded"] or not _same(row["base"], row["head"])
            rows.append(row)
    return rows


def _ok(declared: bool, case: dict[str, Any] | None, matches: bool) -> bool | None:
    """True/False where an expectation was checked; None (unknown) where the case did not observe."""
    if not declared:
        return True
    if case is not None and case.get("observation", OBSERVED) != OBSERVED:  # older tables: observed
        return None
    return matches


def _absent_ok(case: dict[str, Any] | None, missing: Any) -> bool | None:
    """A case expected not-present: it is, naming exactly ``missing`` (True); it is present, or
    absent for other symbols, or not written (False); it did not get far enough to tell (None)."""
    if case is None:
        return False
    seen = case.get("observation", OBSERVED)
    if seen == "not-present":
        return _same(list(case["missing"]), missing)
    return False if seen == OBSERVED else None


def _same(a: Any, b: Any) -> bool:
    """Equality that keeps True apart from 1 (JSON bool vs int)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def test_rows(
    test_runs: Mapping[str, Mapping[str, Any]], *, legacy: bool = False, subtests_fail: bool = True
) -> tuple[list[dict], dict[str, dict]]:
    """Per-test transitions and per-file summaries from the two sides' test-run records.

    A module one side could not collect is stated per test the other side ran
    (``spread_collection_errors``); ``legacy`` keeps compare/2's rows (one ERROR row);
    ``subtests_fail=False`` keeps compare/4's reading of a test with a failed subtest.
    """
    rows, summary = [], {}
    for path, sides in sorted(test_runs.items()):
        ran = {side: _results(sides.get(side), subtests_fail) for side in SIDES}
        results = dict(ran)
        if not legacy:
            results = {
                "base": spread_collection_errors(ran["base"], ran["head"]),
                "head": spread_collection_errors(ran["head"], ran["base"]),
            }
        moves = transitions(results["base"], results["head"], collection_states=not legacy)
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
            **{side: _side_summary(sides.get(side), ran[side], legacy) for side in SIDES},
        }
    return rows, summary


def _results(run: Mapping[str, Any] | None, subtests_fail: bool) -> list[TestResult]:
    if not run or run.get("report") is None:
        return []
    return results_from_report(run["report"], failed_subtests_fail=subtests_fail)


def observation_kinds(rows: list[dict[str, Any]]) -> dict[str, int]:
    """The declared observations by what they check, each with how many held.

    ``flips``: expected on both sides, with different values (the fix's behaviour);
    ``controls``: expected on both sides with the same value (what must not change);
    ``one_sided``: expected on one side only (e.g. a symbol the base lacks);
    ``unchecked``: recorded with no expectation on either side (shown, never a tick).
    """
    kinds = ("flips", "controls", "one_sided")
    counts = {f"{k}_{n}": 0 for k in kinds for n in ("expected", "held")} | {"unchecked": 0}
    for r in rows:
        declared = (r["expected_base_declared"], r["expected_head_declared"])
        if not any(declared):
            counts["unchecked"] += 1
            continue
        kind = "one_sided"
        if all(declared):
            kind = "controls" if _same(r["expected_base"], r["expected_head"]) else "flips"
        counts[f"{kind}_expected"] += 1
        counts[f"{kind}_held"] += bool(r["base_ok"] and r["head_ok"])
    return counts


def _side_summary(run: Mapping[str, Any] | None, results: list[TestResult], legacy: bool) -> dict[str, Any]:
    tests = [r for r in results if not r.subtest]
    subtests = [r for r in results if r.subtest]
    extra = {} if legacy else {"collection_errors": collection_errors(results)}
    return {
        **extra,
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
    algorithm: str = ALGORITHM,
    repeats: Mapping[str, Mapping[str, Sequence[Mapping[str, Any] | None]]] | None = None,
) -> dict[str, Any]:
    """The comparison block of a receipt, verdict included.

    ``algorithm`` is ALGORITHM, or a predecessor when verify recomputes an older bundle
    (see PREDECESSORS for their rules; their blocks name the algorithm they were made by).
    ``repeats`` (``run --repeat N``, N > 1): per side and probe, the outputs of runs 2..N (None
    where that run had a problem, which the caller lists in ``probe_problems``). A case whose
    table entry differs between runs on a side is unstable: its rows are neither match nor
    mismatch, and an expectation on it gives could-not-observe. None: one run, no such keys.
    """
    legacy = algorithm in _COMPARE_2_TEST_RULES
    observing = algorithm not in _BEFORE_OBSERVATION
    tables = {side: case_table(probe_docs.get(side, {}), observation=observing) for side in SIDES}
    rows = observation_rows(expect, tables, presence=algorithm == ALGORITHM)
    unstable = unstable_cases(tables, repeats, observation=observing) if repeats is not None else None
    for r in rows:
        if unstable and any(r["case"] in unstable[side] for side in SIDES):
            r.update(base_ok=None, head_ok=None, unstable=True)
    trows, tsummary = test_rows(test_runs, legacy=legacy, subtests_fail=algorithm not in _SUBTESTS_AS_REPORTED)
    declared_tests = {} if legacy else {p: e for p, e in (expect.get("tests") or {}).items() if p in tsummary}
    verdict, reasons = _verdict(
        expect, rows, trows, tsummary, probe_problems, tables, declared_tests, legacy, unstable or {}
    )
    declared = [r for r in rows if r["expected_base_declared"] or r["expected_head_declared"]]
    counts = {
        "observations_expected": len(declared),
        "observations_matched": sum(1 for r in declared if r["base_ok"] and r["head_ok"]),
        "observations_changed": sum(1 for r in rows if r["changed"]),
        "tests": len(trows),
        "fail_to_pass": sum(1 for r in trows if r["transition"] == Transition.FAIL_TO_PASS.value),
    }
    if not legacy:
        counts["error_to_pass"] = sum(1 for r in trows if r["transition"] == Transition.ERROR_TO_PASS.value)
    if algorithm not in _SUBTESTS_AS_REPORTED:
        counts.update(observation_kinds(rows))
    extra: dict[str, Any] = {}
    if unstable is not None:  # the receipt records how many runs (its ``repeats``)
        counts["unstable_cases"] = sum(len(unstable[side]) for side in SIDES)
        extra = {"unstable": {side: unstable[side] for side in SIDES}}
    return extra | {
        "algorithm": algorithm,
        "verdict": verdict.value,
        "reasons": reasons,
        "cases": {side: tables[side] for side in SIDES},
        "observations": rows,
        "tests": trows,
        "test_summary": tsummary,
        "counts": counts,
    }


def _verdict(
    expect: Mapping[str, Any],
    rows: list[dict[str, Any]],
    trows: list[dict[str, Any]],
    tsummary: dict[str, dict[str, Any]],
    probe_problems: Mapping[str, Mapping[str, str]],
    tables: Mapping[str, dict[str, Any]],
    declared_tests: Mapping[str, Any],
    legacy: bool,
    unstable: Mapping[str, Mapping[str, str]],
) -> tuple[Verdict, list[str]]:
    """The verdict rules, in order (README, "How a verdict is reached"):

    1. error: a check could not be observed (probe or test-run problem, a test hit the
       timeout or an infrastructure error), or nothing ran at all;
       then could-not-observe: a case with expectations differed between repeats (``unstable``)
       or did not reach its decision point on a side;
    2. not-reproduced: a declared observation differs; a head test does not pass; a test
       file with declared sets has a test outside its FAIL_TO_PASS/PASS_TO_PASS sets (or a
       declared one missing) or another base failure kind than declared; test files without
       declared sets have no FAIL_TO_PASS (or ERROR_TO_PASS) at all;
    3. no-expectations: the probes ran with no observation declared, or only tests ran and
       no set was declared;
    4. reproduced.
    """
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
    declared_cases = {r["case"] for r in rows if r["expected_base_declared"] or r["expected_head_declared"]}
    shaky = [
        f"{side}: {key}: {why}"
        for side in SIDES
        for key, why in unstable.get(side, {}).items()
        if key in declared_cases
    ]
    rows = [r for r in rows if not r.get("unstable")]  # neither match nor mismatch
    unobserved = shaky + _unobserved(rows, tables)
    if unobserved:
        return Verdict.COULD_NOT_OBSERVE, unobserved
    reasons = []
    for r in rows:
        for side in SIDES:
            if not r[f"{side}_ok"]:
                case = tables[side].get(r["case"])
                got = repr(r[side]) if r[f"{side}_recorded"] else _missing(case, r["observation"])
                reasons.append(f"{side}: {r['case']}: {r['observation']} expected {r[f'expected_{side}']!r}, got {got}")
    reasons += _test_reasons(trows) if legacy else _test_reasons_v3(trows, tsummary, declared_tests)
    if reasons:
        return Verdict.NOT_REPRODUCED, reasons
    has_probe_cases = any(tables[s] for s in SIDES)
    declared_probe = any(expect.get(s) for s in SIDES)
    if has_probe_cases and not declared_probe:
        return Verdict.NO_EXPECTATIONS, [
            "no expectations declared: the probe ran, nothing was "
            "checked (review its output, then --record-expectations)"
        ]
    if legacy and not has_probe_cases and not any(r["transition"] == "FAIL_TO_PASS" for r in trows):
        return Verdict.NOT_REPRODUCED, ["no upstream test went from fail to pass"]
    if not legacy and not has_probe_cases and not declared_tests:
        return Verdict.NO_EXPECTATIONS, [
            "no FAIL_TO_PASS/PASS_TO_PASS sets declared: the upstream tests ran, nothing "
            "pinned which tests (review them, then --record-expectations)"
        ]
    return Verdict.REPRODUCED, []


def _unobserved(rows: list[dict[str, Any]], tables: Mapping[str, dict[str, Any]]) -> list[str]:
    """``side: probe/case: why`` for each case with expectations that did not reach its decision point."""
    found = {(side, r["case"]) for r in rows for side in SIDES if r[f"{side}_ok"] is None}
    return [
        f"{side}: {key}: {unobserved_text(tables[side][key])}"
        for side in SIDES
        for key in sorted(k for s, k in found if s == side)
    ]


def repeat_problems(failed: Mapping[str, Sequence[str | None]]) -> dict[str, str]:
    """``probe_problems`` entries for the repeats (runs 2..N) of each probe that had a problem."""
    return {
        f"{name}#{run}": f"{name} (run {run}): {problem}"
        for name, problems in failed.items()
        for run, problem in enumerate(problems, start=2)
        if problem is not None
    }


def unstable_cases(
    tables: Mapping[str, dict[str, Any]],
    repeats: Mapping[str, Mapping[str, Sequence[Mapping[str, Any] | None]]],
    *,
    observation: bool = True,
) -> dict[str, dict[str, str]]:
    """``{side: {probe/case: why}}`` for each case whose table entry differs between the first run
    and a repeat: a status, the observation state, or an observation (the first one named)."""
    return {side: unstable_in(tables[side], repeats.get(side, {}), observation=observation) for side in SIDES}


def unstable_in(
    table: Mapping[str, Any], repeats: Mapping[str, Sequence[Mapping[str, Any] | None]], *, observation: bool = True
) -> dict[str, str]:
    """``{probe/case: why}`` over one side's (or one sweep release's) case ``table`` of the first
    run and ``repeats``, per probe the outputs of runs 2..N (None: that run had a problem)."""
    found: dict[str, str] = {}
    for name, docs in sorted(repeats.items()):
        first = {k: v for k, v in table.items() if k.startswith(f"{name}/")}
        for run, doc in enumerate(docs, start=2):
            if doc is None:
                continue  # a problem: the verdict is error before stability matters
            again = case_table({name: doc}, observation=observation)
            for key in sorted(set(first) | set(again)):
                if key not in found:
                    why = _difference(first.get(key), again.get(key), run)
                    if why is not None:
                        found[key] = f"unstable across repeats: {why}"
    return dict(sorted(found.items()))


def _difference(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, run: int) -> str | None:
    """What differs between run 1's and run ``run``'s entries for one case (None: nothing)."""
    if a is None or b is None:
        return f"the case was {'recorded' if a is not None else 'absent'} in run 1, not in run {run}"
    for field_ in ("status", "observation"):
        if a.get(field_) != b.get(field_):
            return f"{field_} was {a.get(field_)!r} in run 1, {b.get(field_)!r} in run {run}"
    for name in sorted(set(a["observations"]) | set(b["observations"])):
        x, y = a["observations"].get(name, _ABSENT), b["observations"].get(name, _ABSENT)
        if x is _ABSENT or y is _ABSENT or not _same(x, y):
            shown = ["absent" if v is _ABSENT else repr(v) for v in (x, y)]
            return f"observation {name!r} was {shown[0]} in run 1, {shown[1]} in run {run}"
    return None


_ABSENT = object()


def unobserved_text(case: Mapping[str, Any]) -> str:
    """What kept a case from observing: the missing symbols, or the probe's reason."""
    if case["observation"] == "not-present":
        return f"not present in this release: {', '.join(case['missing'])}"
    return f"could not observe: {case['reason']}"


def _infra(row: dict) -> bool:
    kinds = {row["base_kind"], row["head_kind"]}
    return bool(kinds & {FailureKind.INFRASTRUCTURE.value, FailureKind.TIMEOUT.value})


def _test_reasons(trows: list[dict]) -> list[str]:
    """compare/2: head must pass every test; base must fail at least one."""
    if not trows:
        return []
    reasons = [f"head: {r['file']}: {r['test']} {r['head'] or 'not run'}" for r in trows if r["head"] not in _PASSING]
    if not any(r["transition"] == Transition.FAIL_TO_PASS.value for r in trows):
        reasons.append("no upstream test went from fail on base to pass on head")
    return reasons


def _test_reasons_v3(trows: list[dict], tsummary: dict, declared: Mapping[str, Any]) -> list[str]:
    """Head passes every test; per file, the declared sets hold, or else one test went to pass."""
    reasons = [_head_reason(r) for r in trows if r["head"] not in _PASSING]
    for path in tsummary:
        file_rows = {r["test"]: r for r in trows if r["file"] == path}
        if path in declared:
            reasons += _set_reasons(path, file_rows, declared[path])
        elif file_rows and not any(_TO_PASS.get(r["transition"]) == "FAIL_TO_PASS" for r in file_rows.values()):
            reasons.append(f"{path}: no upstream test went from fail (or a collection error) on base to pass on head")
    return reasons


def _head_reason(row: dict) -> str:
    if row["head"] is None:
        return f"head: {row['file']}: {row['test']} not run"
    if row["head_kind"] == FailureKind.COLLECTION.value:
        return f"head: {row['file']}: {row['test']} could not be collected ({row['head_exc_type'] or 'no exception'})"
    return f"head: {row['file']}: {row['test']} {row['head']}"


def _set_reasons(path: str, rows: Mapping[str, dict], sets: Mapping[str, Any]) -> list[str]:
    """Each test that moved out of (or into) a declared set, and each other base failure kind."""
    want = {t: "FAIL_TO_PASS" for t in sets.get("FAIL_TO_PASS", [])}
    want.update({t: "PASS_TO_PASS" for t in sets.get("PASS_TO_PASS", [])})
    reasons = []
    for test, group in want.items():
        row = rows.get(test)
        if row is None:
            reasons.append(f"{path}: {test}: expected {group}, not run on either side")
        elif _TO_PASS.get(row["transition"]) != group:
            reasons.append(f"{path}: {test}: expected {group}, got {row['transition']}")
    for test, row in rows.items():
        if test not in want and row["transition"] in _TO_PASS:
            reasons.append(f"{path}: {test}: {row['transition']}, in no declared set")
    for test, label in sets.get("base_failure_kind", {}).items():
        row = rows.get(test)
        got = failure_label(row["base_kind"], row["base_exc_type"]) if row else None
        if row is not None and got != label:
            reasons.append(f"{path}: {test}: base failure expected {label}, got {got or 'none'}")
    return reasons


def _missing(case: dict | None, observation: str = "") -> str:
    if case is None:
        return "no such case"
    if observation == NOT_PRESENT and case.get("observation", OBSERVED) == OBSERVED:
        return "present (the case reached its decision point)"
    if case["status"] == "raised":
        return f"nothing (case raised {case['error_type']})"
    return "nothing recorded"

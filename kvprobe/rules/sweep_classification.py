"""Pure classification of one release in a sweep: raw probe documents x the experiment's
[expect] tables -> each case and the release as affected, fixed, could-not-observe,
not-present or mixed.

It reads only what a sweep bundle carries (the raw documents, the probe problems the
receipt records, the bundled experiment's expectations), so `verify` recomputes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvprobe.model.receipt import ProbeRecord, RunProbeRecord
from kvprobe.model.records import SweepClass
from kvprobe.model.sweep_receipt import ReleaseRecord
from kvprobe.rules.compare import case_table, repeat_problems, unstable_in

# Names what classify() computes; change it whenever its output for the same inputs changes.
ALGORITHM = "kvprobe.sweep/1"

AFFECTED, FIXED, MIXED = SweepClass.AFFECTED, SweepClass.FIXED, SweepClass.MIXED
UNOBSERVED, NOT_PRESENT = SweepClass.UNOBSERVED, SweepClass.NOT_PRESENT
CONTROL, NEITHER = SweepClass.CONTROL, SweepClass.NEITHER  # case classes only
NOT_SERVED = SweepClass.NOT_SERVED  # a release no profile can import: nothing ran (receipt only)
OBSERVED_CLASSES = (AFFECTED, FIXED, MIXED)


def classify_case(
    case: Mapping[str, Any] | None, observations: Mapping[str, Any], base: Mapping[str, Any], head: Mapping[str, Any]
) -> dict[str, Any]:
    """One case on one release. ``case`` is its raw document entry (None: no such case);
    ``observations`` its recorded values with the reserved ``raised``."""
    if case is None:
        return {"class": UNOBSERVED, "reason": "the probe wrote no such case"}
    kind = case.get("observation", "observed")  # documents before the field: observed
    if kind == "not-present":
        return {"class": NOT_PRESENT, "missing": list(case.get("missing", []))}
    if kind != "observed":
        return {"class": UNOBSERVED, "reason": case.get("reason") or "decision point not reached"}
    as_base, as_head = _holds(observations, base), _holds(observations, head)
    if as_base and as_head:
        return {"class": CONTROL}
    if as_base or as_head:
        return {"class": AFFECTED if as_base else FIXED}
    return {"class": NEITHER, "differs": _differences(observations, base, head)}


def _holds(observations: Mapping[str, Any], expected: Mapping[str, Any]) -> bool:
    return all(name in observations and _same(observations[name], value) for name, value in expected.items())


def _same(a: Any, b: Any) -> bool:
    """Equality that keeps True apart from 1 (JSON bool vs int)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def _differences(observations: Mapping[str, Any], base: Mapping[str, Any], head: Mapping[str, Any]) -> list[str]:
    """Observations that match neither side's expectation, as 'name: got X'."""
    names = sorted(set(base) | set(head))
    return [
        f"{name}: got {observations.get(name, 'nothing')!r}"
        for name in names
        if not (name in base and _same(observations.get(name), base[name]))
        and not (name in head and _same(observations.get(name), head[name]))
    ]


def classify_release(
    expect: Mapping[str, Mapping[str, Any]],
    probe_docs: Mapping[str, Mapping[str, Any]],
    probe_problems: Mapping[str, str],
    repeats: Mapping[str, Sequence[Mapping[str, Any] | None]] | None = None,
) -> dict[str, Any]:
    """``{"algorithm", "overall", "reasons", "cases"}`` for one release, and ``unstable`` when
    its probes ran more than once.

    Only cases with expectations count. A release is affected (fixed) when every case whose
    base and head expectations differ behaves as base (head) and every control holds;
    could-not-observe when a probe failed, an expected case did not reach its decision
    point or differed between repeats; not-present when every discriminating case's code is
    missing; mixed otherwise.

    ``repeats`` (``sweep --repeat N``, N > 1): per probe, its outputs of runs 2..N (None where
    that run had a problem, which ``probe_problems`` names). A case whose entry differs between
    runs is unstable (``unstable`` names every such case, expected or not); an expected one is
    could-not-observe, never affected or fixed. None: one run, and no ``unstable`` key."""
    table = case_table(probe_docs)
    unstable = unstable_in(table, repeats) if repeats is not None else {}
    base, head = expect.get("base", {}), expect.get("head", {})
    keys = sorted(set(base) | set(head))
    cases = {}
    for key in keys:
        entry = table.get(key)
        raw = _raw_case(probe_docs, key) if entry is not None else None
        observations = entry["observations"] if entry is not None else {}
        cases[key] = classify_case(raw, observations, base.get(key, {}), head.get(key, {}))
        if key in unstable:
            cases[key] = {"class": UNOBSERVED, "reason": unstable[key]}
        if key.split("/", 1)[0] in probe_problems:
            cases[key] = {"class": UNOBSERVED, "reason": probe_problems[key.split("/", 1)[0]]}
    overall, reasons = _overall(cases, {k for k in keys if base.get(k, {}) != head.get(k, {})}, probe_problems)
    # a JSON document (verify compares it with the receipt's, types included): classes as plain strings
    cases = {k: {**c, "class": str(c["class"])} for k, c in cases.items()}
    found = {"algorithm": ALGORITHM, "overall": str(overall), "reasons": reasons, "cases": cases}
    return found if repeats is None else {**found, "unstable": unstable}


def _raw_case(probe_docs: Mapping[str, Mapping[str, Any]], key: str) -> Mapping[str, Any] | None:
    probe, name = key.split("/", 1)
    for case in (probe_docs.get(probe) or {}).get("cases", []):
        if case["name"] == name:
            return case
    return None


def _overall(
    cases: Mapping[str, Mapping[str, Any]], discriminating: set[str], probe_problems: Mapping[str, str]
) -> tuple[str, list[str]]:
    if probe_problems:
        return UNOBSERVED, [f"{name}: {problem}" for name, problem in sorted(probe_problems.items())]
    unobserved = [f"{k}: {c['reason']}" for k, c in cases.items() if c["class"] == UNOBSERVED]
    if unobserved:
        return UNOBSERVED, unobserved
    if not discriminating:
        return UNOBSERVED, ["no case has different base and head expectations: nothing tells the sides apart"]
    present = [k for k in discriminating if cases[k]["class"] != NOT_PRESENT]
    if not present:
        missing = sorted({m for k in discriminating for m in cases[k].get("missing", [])})
        return NOT_PRESENT, [f"not present in this release: {', '.join(missing) or 'the decision points'}"]
    classes = {cases[k]["class"] for k in present}
    neither = [
        f"{k}: behaves as neither side ({'; '.join(c['differs'])})" for k, c in cases.items() if c["class"] == NEITHER
    ]
    if neither or classes - {AFFECTED, FIXED}:
        return MIXED, neither or [f"{k}: {cases[k]['class']}" for k in sorted(present)]
    if len(classes) == 2:
        return MIXED, [f"{k}: {cases[k]['class']}" for k in sorted(present)]
    return classes.pop(), []


def summary(releases: Sequence[ReleaseRecord]) -> dict[str, list[str]]:
    """Versions per overall class, in the receipt's (ascending) order."""
    found: dict[str, list[str]] = {}
    for release in releases:
        found.setdefault(release.classification.overall, []).append(release.version)
    return found


def release_repeats(probes: Sequence[RunProbeRecord], read: Any) -> dict[str, list[Mapping[str, Any] | None]] | None:
    """Per probe of a release, the documents of runs 2..N its receipt entry cites (``read(path)``
    gives one); None for a release of a sweep that ran its probes once."""
    if not any(p.repeats for p in probes):
        return None
    return {p.name: [read(r.raw.path) if r.raw else None for r in p.repeats or ()] for p in probes}


def release_problems(problem: str | None, probes: Sequence[ProbeRecord]) -> dict[str, str]:
    """Why (part of) a release could not run, from its receipt entry: the wheel's ``problem``
    and each probe that left no valid document, in any of its runs (``name#run`` for runs
    2..N of ``sweep --repeat N``)."""
    found = {p.name: p.problem or "no output" for p in probes if p.problem is not None or p.raw is None}
    for p in probes:
        again = (p.repeats or ()) if isinstance(p, RunProbeRecord) else ()
        found |= repeat_problems({p.name: [None if r.raw is not None else r.problem or "no output" for r in again]})
    if problem:
        found["(release)"] = problem
    return found

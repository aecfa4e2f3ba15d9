"""``kvprobe run ID --record-expectations``: what a reviewed run observed -> ``[expect]`` tables.

Two kinds of expectations are recorded: the probes' observations per side and case
(``[expect.base."probe/case"]``, ``[expect.head."probe/case"]``), and per upstream test file
the SWE-bench sets with each FAIL_TO_PASS test's base failure kind (``[expect.tests."path"]``).
What this run observed replaces what was there; test files it did not run keep their sets.

The rewrite goes through tomlkit, so every other table keeps its text and its comments (a
comment below an ``[expect]`` table, up to the next header, belongs to that table and goes
with the old values); it is checked before it is written (the new text must hold exactly the same non-expectation
data, read back exactly the recorded values, and load as an experiment), then temp file +
``os.replace``.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.items import Comment, Table

from kvprobe.errors import CheckRunError, ExperimentError, UsageError
from kvprobe.experiments import tomltext
from kvprobe.experiments.experiment import load_file
from kvprobe.files import write_atomic
from kvprobe.model.receipt import Receipt
from kvprobe.model.records import Experiment, Verdict
from kvprobe.names import NOT_PRESENT, SIDES
from kvprobe.rules.pytest_results import failure_label

_CASE_KEY_RE = re.compile(r"[a-z][a-z0-9_]*/[a-z0-9_.]+")
_NAME_RE = re.compile(r"[A-Za-z0-9_.]+")
_PASSING = ("passed", "skipped", "xfailed")
_SETS = {"FAIL_TO_PASS": "FAIL_TO_PASS", "ERROR_TO_PASS": "FAIL_TO_PASS", "PASS_TO_PASS": "PASS_TO_PASS"}


@dataclass(frozen=True)
class Recording:
    """What would be written: per side, per ``probe/case``, observation -> value; per test
    file, its FAIL_TO_PASS / PASS_TO_PASS sets and base failure kinds."""

    experiment_id: str
    path: Path
    file_sha256: str
    run_id: str
    values: Mapping[str, Mapping[str, Mapping[str, Any]]]
    skipped: tuple[str, ...] = field(default=())
    tests: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def cases(self) -> list[str]:
        return sorted({key for side in SIDES for key in self.values.get(side, {})})

    @property
    def differs(self) -> bool:
        """True if any recorded observation tells base from head."""
        return any(
            not _same(self.values.get("base", {}).get(case), self.values.get("head", {}).get(case))
            for case in self.cases
        )


def plan(exp: Experiment, receipt: Receipt) -> Recording:
    """The expectations a finished run observed.

    Raises CheckRunError (exit 3) when the run ended in error (nothing honest to record)
    and UsageError when the probe still declares the template's mocks or has its placeholder
    case, a head test does not pass, a test file has no test that went to pass, or nothing
    was observed.
    """
    comparison = receipt.comparison
    if receipt.verdict is Verdict.ERROR:
        reasons = "; ".join(comparison.reasons[:3])
        raise CheckRunError(f"not recording expectations: the run ended in error ({reasons})")
    _refuse_template(receipt)
    values: dict[str, dict[str, dict[str, Any]]] = {}
    skipped: list[str] = []
    for side in SIDES:
        for key, case in sorted(comparison.cases[side].items()):
            if _not_observed(side, key, case, skipped):
                continue
            shaky = comparison.other.get("unstable", {}).get(side, {})  # run --repeat
            if key in shaky:
                skipped.append(f"{side}: {key}: {shaky[key]}: not recorded")
                continue
            if case.get("observation") == "not-present":
                # The release lacks the code path: expect exactly that absence (compare's not_present).
                kept = _recordable(side, key, {NOT_PRESENT: list(case["missing"])}, skipped)
            else:
                kept = _recordable(side, key, case["observations"], skipped)
            if kept:
                values.setdefault(side, {})[key] = kept
    tests = observed_test_sets(comparison.tests)
    if not values and not tests:
        raise UsageError(f"{exp.id}: no probe case recorded an observation and no upstream test ran: nothing to record")
    return Recording(
        exp.id, exp.directory / "experiment.toml", exp.file_sha256, receipt.run_id, values, tuple(skipped), tests
    )


def observed_test_sets(rows: list[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per test file: FAIL_TO_PASS (ERROR_TO_PASS included), PASS_TO_PASS, base failure kinds.

    Raises UsageError when a head test does not pass or no test of a file went to pass:
    such sets could never be reproduced, or would pin nothing about the fix.
    """
    by_file: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_file.setdefault(row["file"], []).append(row)
    sets: dict[str, dict[str, Any]] = {}
    for file, file_rows in sorted(by_file.items()):
        failing = [r["test"] for r in file_rows if r["head"] not in _PASSING]
        if failing:
            raise UsageError(
                f"not recording {file}: head does not pass {', '.join(failing[:5])}"
                + (f" and {len(failing) - 5} more" if len(failing) > 5 else "")
            )
        grouped: dict[str, list[str]] = {"FAIL_TO_PASS": [], "PASS_TO_PASS": []}
        kinds: dict[str, str] = {}
        for r in file_rows:
            group = _SETS.get(r["transition"])
            if group:
                grouped[group].append(r["test"])
            label = failure_label(r["base_kind"], r["base_exc_type"])
            if group == "FAIL_TO_PASS" and label:
                kinds[r["test"]] = label
        if not grouped["FAIL_TO_PASS"]:
            raise UsageError(f"not recording {file}: no test went from fail (or a collection error) to pass")
        sets[file] = {**grouped, **({"base_failure_kind": kinds} if kinds else {})}
    return sets


def _refuse_template(receipt: Receipt) -> None:
    from kvprobe.experiments.scaffold import TEMPLATE_CASE, TEMPLATE_MOCKS

    for probe, mocks in receipt.evidence.mocks.items():
        if set(TEMPLATE_MOCKS) & set(mocks):
            raise UsageError(
                f"probe {probe} still declares the template's mocks {mocks!r}: write the probe "
                "(and declare what it really mocks) before recording its observations as expectations"
            )
    # Recorded, the placeholder would be an expectation that holds whatever the code does.
    kept = sorted({k for side in SIDES for k in receipt.comparison.cases[side] if k.endswith("/" + TEMPLATE_CASE)})
    if kept:
        raise UsageError(
            f"{', '.join(kept)} is the template's placeholder case (where the package was imported "
            "from, not the fix): delete it from the probe before recording expectations"
        )


def _not_observed(side: str, key: str, case: Mapping[str, Any], skipped: list[str]) -> bool:
    """A case that never reached its decision point saw set-up, not behaviour: never an expectation
    (a not-present case is recorded as absent instead, by ``plan``)."""
    seen = case.get("observation", "observed")  # receipts before compare/3: every case observed
    if seen in ("observed", "not-present"):
        return False
    skipped.append(f"{side}: {key}: unobserved ({case['reason']}): not recorded")
    return True


def _recordable(side: str, key: str, observations: Mapping[str, Any], skipped: list[str]) -> dict[str, Any]:
    """The observations TOML can hold exactly; the rest are listed in ``skipped`` with why."""
    if not _CASE_KEY_RE.fullmatch(key):
        skipped.append(f"{side}: {key}: case name cannot be an expectation key ([a-z0-9_.])")
        return {}
    kept = {}
    for name, value in observations.items():
        if value is None:
            skipped.append(f"{side}: {key}: {name} is None (TOML has no null)")
            continue
        if not _NAME_RE.fullmatch(name):
            skipped.append(f"{side}: {key}: {name!r} is not an observation name")
            continue
        try:
            tomltext.value(value)
        except ValueError as exc:
            skipped.append(f"{side}: {key}: {name}: {exc}")
            continue
        kept[name] = value
    return kept


# --- rewriting ---------------------------------------------------------------------------


def rewrite(text: str, rec: Recording) -> str:
    """``text`` with the expectations ``rec`` observed in place of the old ones (tomlkit keeps
    every comment and table outside ``[expect]``; comments inside it go with the old values)."""
    doc = tomlkit.parse(text)
    old = doc.get("expect")
    kept_tests = dict(old.get("tests", {})) if old is not None else {}
    kept_sides = {s: dict(old.get(s, {})) for s in SIDES} if old is not None and not rec.values else {}
    if old is not None:
        del doc["expect"]
    expect = tomlkit.table(is_super_table=True)
    note = tomlkit.comment(
        f"recorded by `kvprobe run {rec.experiment_id} --record-expectations` from run {rec.run_id}; "
        "review before committing"
    )
    _add_sides(expect, rec.values or kept_sides, note)
    tests = {**{f: _plain(v) for f, v in kept_tests.items() if f not in rec.tests}, **rec.tests}
    if tests:
        expect.add("tests", _tests_table(tests, None if rec.values else note))
    if expect:
        doc.add("expect", expect)
    return tomlkit.dumps(doc)


def _add_sides(expect: Table, values: Mapping[str, Mapping[str, Mapping[str, Any]]], note: Comment) -> None:
    for side in SIDES:
        cases = values.get(side)
        if not cases:
            continue
        side_table = tomlkit.table(is_super_table=True)
        for key, observed in cases.items():
            table = tomlkit.table()
            if note is not None and not expect and not side_table:
                table.add(note)
            for name, value in observed.items():
                table.add(name, _plain(value))
            side_table.add(key, table)
        expect.add(side, side_table)


def _tests_table(tests: Mapping[str, Mapping[str, Any]], note: Comment | None) -> Table:
    table = tomlkit.table(is_super_table=True)
    for file, sets in sorted(tests.items()):
        body = tomlkit.table()
        if note is not None and not table:
            body.add(note)
        for name in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            items = tomlkit.array()
            items.extend(sets[name])
            items.multiline(bool(sets[name]))
            body.add(name, items)
        if sets.get("base_failure_kind"):
            kinds = tomlkit.table()
            for test, label in sets["base_failure_kind"].items():
                kinds.add(test, label)
            body.add("base_failure_kind", kinds)
        table.add(file, body)
    return table


def _plain(value: Any) -> Any:
    """A tomlkit item as plain Python (kept tables are re-added, not moved)."""
    return value.unwrap() if hasattr(value, "unwrap") else value


# --- writing -----------------------------------------------------------------------------


def write(rec: Recording) -> Path:
    """Replace the expectations ``rec`` observed, atomically.

    Raises UsageError if the file changed since the run, or if the rewrite would change
    anything but the expectations (nothing is written then).
    """
    raw = rec.path.read_bytes()
    if hashlib.sha256(raw).hexdigest() != rec.file_sha256:
        raise UsageError(f"{rec.path} changed since the run started; run again, then record")
    text = raw.decode("utf-8")
    new_text = rewrite(text, rec)
    _check_rewrite(rec, text, new_text)
    _replace_file(rec.path, new_text.encode("utf-8"))
    return rec.path


def _check_rewrite(rec: Recording, old_text: str, new_text: str) -> None:
    old = tomllib.loads(old_text)
    try:
        new = tomllib.loads(new_text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{rec.path}: the rewrite is not valid TOML ({exc}); nothing written") from exc
    old_expect = old.pop("expect", {})
    recorded = new.pop("expect", {})
    sides = {s: v for s, v in rec.values.items() if v} or {s: old_expect[s] for s in SIDES if s in old_expect}
    tests = {**{f: v for f, v in old_expect.get("tests", {}).items() if f not in rec.tests}, **rec.tests}
    wanted = {**sides, **({"tests": tests} if tests else {})}
    if old != new or not _same(recorded, wanted):
        raise UsageError(
            f"{rec.path}: rewriting the [expect] tables would change other data or "
            "not read back exactly; nothing written"
        )


def _replace_file(path: Path, data: bytes) -> None:
    """Temp file beside ``path``, loaded as an experiment, then renamed over it."""
    write_atomic(path, data, mode=path.stat().st_mode & 0o7777, check=lambda tmp: _loads_as_experiment(tmp, path))


def _loads_as_experiment(tmp: Path, path: Path) -> None:
    try:
        load_file(tmp)
    except ExperimentError as exc:
        raise UsageError(f"{path}: the recorded expectations do not load: {exc.message}; nothing written") from exc


def _same(a: Any, b: Any) -> bool:
    """Deep equality that keeps bool apart from int and int apart from float."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b

"""Step 4 of a run receipt: it agrees with the raw outputs, the manifest and the bundled experiment.

The comparison and verdict are recomputed with :func:`kvprobe.rules.compare.compare` from the raw
outputs and the receipt's expectations, and must equal what the receipt states: re-hashing
forged files passes step 3 but not this step.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from kvprobe import __version__
from kvprobe.defects import (
    BadPin,
    BundleDefect,
    CitationMisplaced,
    ComparisonAlgorithmUnknown,
    ComparisonMismatch,
    ExpectationsMismatch,
    ExperimentMismatch,
    ForgedVerdict,
    PinMismatch,
    RawInvalid,
    ReadmeMismatch,
    RecomputeFailed,
    RecordMismatch,
    RunIdMismatch,
)
from kvprobe.errors import KvprobeError
from kvprobe.evidence.bundle_readme import render_readme
from kvprobe.evidence.reader import Bundle, read_bytes
from kvprobe.model.receipt import FileRef, ProbeRepeat, Receipt, RunProbeRecord, TestRecord
from kvprobe.model.records import GitPin, ModelPin, WheelPin
from kvprobe.names import PROBES_DIR, README, RECEIPT, SIDES
from kvprobe.rules import compare
from kvprobe.rules.run_limits import run_limits
from kvprobe.verify.consistency import (
    Cited,
    citation_defects,
    duplicates,
    experiment_digest_defects,
    experiment_view,
    json_diff,
    probe_record,
    short,
    summary,
)
from kvprobe.verify.result import StepResult, step_result


def step_consistency(bundle: Bundle, receipt: Receipt) -> StepResult:
    defects = citation_defects(citations(receipt), bundle.listed()) + placement_defects(receipt)
    defects += record_defects(bundle, receipt)
    defects += recompute_defects(bundle, receipt)
    defects += pin_defects(receipt) + run_id_defects(receipt) + limits_defects(receipt)
    readme, notes = readme_defects(bundle, receipt)
    defects += readme
    if bundle.experiment is not None:
        defects += experiment_defects(bundle, receipt)
    else:
        notes.append("experiment checks not run: the bundled experiment.toml is unusable (step 2)")
    return step_result(4, defects, f"receipt {receipt.verdict.value!r} recomputed from raw outputs", notes)


# --- citations ---------------------------------------------------------------------------


def citations(receipt: Receipt) -> Cited:
    """(where in the receipt, the file) for every file the receipt cites."""
    exp = receipt.experiment
    found: Cited = [("experiment.file", FileRef(exp.file, exp.sha256))]
    for side in SIDES:
        block = receipt.sides[side]
        for i, probe in enumerate(block.probes):
            found.append((f"sides.{side}.probes[{i}].source", probe.source))
            if probe.raw:
                found.append((f"sides.{side}.probes[{i}].raw", probe.raw))
            for k, again in enumerate(probe.repeats or ()):
                if again.raw:
                    found.append((f"sides.{side}.probes[{i}].repeats[{k}].raw", again.raw))
        for i, test in enumerate(block.tests):
            found.append((f"sides.{side}.tests[{i}].raw", test.raw))
            if test.junit:
                found.append((f"sides.{side}.tests[{i}].junit", test.junit))
    return found


# (side, kind "probe" | "test", raw path, the probe's name or the test's path, the record citing it)
Output = tuple[str, str, str, str, RunProbeRecord | ProbeRepeat | TestRecord]


def cited_outputs(receipt: Receipt) -> list[Output]:
    """Every raw JSON the receipt cites: each side's probes, their runs 2..N (``run --repeat``),
    then its tests."""
    found: list[Output] = []
    for side in SIDES:
        block = receipt.sides[side]
        found += [(side, "probe", p.raw.path, p.name, p) for p in block.probes if p.raw]
        found += [(side, "probe", r.raw.path, p.name, r) for p in block.probes for r in p.repeats or () if r.raw]
        found += [(side, "test", t.raw.path, t.path, t) for t in block.tests]
    return found


def placement_defects(receipt: Receipt) -> list[BundleDefect]:
    """Raw outputs sit under raw/<their side>/, probe sources under probes/<experiment id>/."""
    exp_id, exp_file = receipt.experiment.id, receipt.experiment.file
    found: list[BundleDefect] = []
    if exp_file != f"{PROBES_DIR}/{exp_id}/experiment.toml":
        found.append(CitationMisplaced(exp_file, f"expected probes/{exp_id}/experiment.toml"))
    for side in SIDES:
        block = receipt.sides[side]
        found += duplicates([p.name for p in block.probes], f"sides.{side}.probes")
        found += duplicates([t.path for t in block.tests], f"sides.{side}.tests")
        for probe in block.probes:
            found += _probe_placement(side, exp_id, probe)
            found += repeat_placement(f"raw/{side}", side, probe, 1 if receipt.repeats is None else receipt.repeats)
        for test in block.tests:
            found += _test_placement(side, test)
    found += _sides_share_probes(receipt)
    return found


def repeat_placement(raw: str, side: str, probe: RunProbeRecord, repeats: int) -> list[BundleDefect]:
    """A receipt of ``run --repeat N`` (``sweep --repeat N``) records runs 2..N of every probe,
    each at its own path under ``raw`` (raw/<side> or raw/<release>); one of a single run records none."""
    name, again = probe.name, probe.repeats or ()
    if len(again) != repeats - 1:
        return [
            RecordMismatch(
                RECEIPT,
                f"{side} probe {name!r}: the receipt records {repeats} run(s), this probe {len(again) + 1}",
            )
        ]
    found: list[BundleDefect] = []
    for run, rec in enumerate(again, start=2):
        want = f"{raw}/probes/{name}.repeat-{run}.json"
        if rec.raw and rec.raw.path != want:
            found.append(CitationMisplaced(rec.raw.path, f"{side} probe {name!r} run {run}: expected {want}"))
        if rec.raw is None and not (isinstance(rec.problem, str) and rec.problem):
            found.append(RecordMismatch(RECEIPT, f"{side} probe {name!r} run {run}: no output and no problem"))
    return found


def _probe_placement(side: str, exp_id: str, probe: RunProbeRecord) -> list[BundleDefect]:
    found: list[BundleDefect] = []
    name, source = probe.name, probe.source.path
    want = f"raw/{side}/probes/{name}.json"
    if probe.raw and probe.raw.path != want:
        found.append(CitationMisplaced(probe.raw.path, f"{side} probe {name!r}: expected {want}"))
    path = PurePosixPath(source)
    if not source.startswith(f"{PROBES_DIR}/{exp_id}/") or path.stem != name or path.suffix != ".py":
        found.append(CitationMisplaced(source, f"{side} probe {name!r}: expected probes/{exp_id}/.../{name}.py"))
    return found


def _test_placement(side: str, test: TestRecord) -> list[BundleDefect]:
    want = f"raw/{side}/tests/{test.path.replace('/', '__')}.json"
    found: list[BundleDefect] = []
    if test.raw.path != want:
        found.append(CitationMisplaced(test.raw.path, f"{side} test {test.path!r}: expected {want}"))
    junit = test.junit
    if junit and not junit.path.startswith(f"raw/{side}/tests/"):
        found.append(CitationMisplaced(junit.path, f"{side} test {test.path!r}: junit outside raw/{side}/tests/"))
    return found


def _sides_share_probes(receipt: Receipt) -> list[BundleDefect]:
    """Both sides ran the same probe sources (the same bytes)."""
    sources = {side: {p.name: p.source for p in receipt.sides[side].probes} for side in SIDES}
    if sources["base"] != sources["head"]:
        return [RecordMismatch(RECEIPT, "base and head cite different probe sets or probe sources")]
    return []


# --- records vs raw outputs --------------------------------------------------------------


def record_defects(bundle: Bundle, receipt: Receipt) -> list[BundleDefect]:
    found: list[BundleDefect] = []
    for side in SIDES:
        for i, probe in enumerate(receipt.sides[side].probes):
            if probe.raw is None and not (isinstance(probe.problem, str) and probe.problem):
                found.append(
                    RecordMismatch(
                        RECEIPT, f"sides.{side}.probes[{i}] {probe.name!r}: no output and no problem recorded"
                    )
                )
    for side, _kind, rel, name, record in cited_outputs(receipt):
        doc = bundle.raw_docs.get(rel)
        if doc is None:
            continue
        if isinstance(record, TestRecord):
            found += _test_record(rel, doc, side, record)
        else:
            found += probe_record(rel, doc, name, record.problem)
    return found


def _test_record(rel: str, doc: dict[str, Any], side: str, record: TestRecord) -> list[BundleDefect]:
    found: list[BundleDefect] = []
    if doc["side"] != side or doc["path"] != record.path:
        found.append(
            RawInvalid(rel, f"records side {doc['side']!r}, test {doc['path']!r}; cited as {side} {record.path!r}")
        )
    for key, stated in (("exit_code", record.exit_code), ("overlay", record.overlay), ("problem", record.problem)):
        if doc[key] != stated:
            found.append(RecordMismatch(rel, f"{key}: raw {doc[key]!r}, receipt {stated!r}"))
    return found


# --- recompute ---------------------------------------------------------------------------


def recompute_inputs(bundle: Bundle, receipt: Receipt) -> tuple[dict, dict, dict, dict | None] | None:
    """compare() inputs from the raw outputs (the repeats' too: None for one run); None when one
    of them is unusable."""
    docs: dict[str, dict] = {s: {} for s in SIDES}
    problems: dict[str, dict] = {s: {} for s in SIDES}
    runs: dict[str, dict] = {}
    repeats: dict[str, dict] = {s: {} for s in SIDES}
    for side in SIDES:
        block = receipt.sides[side]
        for probe in block.probes:
            if probe.raw is None:
                problems[side][probe.name] = probe.problem
            elif probe.raw.path in bundle.raw_docs:
                docs[side][probe.name] = bundle.raw_docs[probe.raw.path]
            else:
                return None
        for probe in block.probes:  # after every first run's problem, as the run lists them
            again = probe.repeats or ()
            if any(r.raw is not None and r.raw.path not in bundle.raw_docs for r in again):
                return None
            repeats[side][probe.name] = [bundle.raw_docs[r.raw.path] if r.raw else None for r in again]
            failed = [None if r.raw is not None else r.problem for r in again]
            problems[side] |= compare.repeat_problems({probe.name: failed})
        for test in block.tests:
            if test.raw.path not in bundle.raw_docs:
                return None
            runs.setdefault(test.path, {})[side] = bundle.raw_docs[test.raw.path]
    return docs, problems, runs, repeats if receipt.repeats else None


def recompute_defects(bundle: Bundle, receipt: Receipt) -> list[BundleDefect]:
    made_by = receipt.comparison.algorithm
    if made_by != compare.ALGORITHM and made_by not in compare.PREDECESSORS:
        return [
            ComparisonAlgorithmUnknown(
                RECEIPT,
                f"the comparison was made by {made_by!r} "
                f"(kvprobe {receipt.tool.version}); this kvprobe "
                f"computes {compare.ALGORITHM!r}: verify with a kvprobe "
                "that has that comparison",
            )
        ]
    inputs = recompute_inputs(bundle, receipt)
    if inputs is None:
        return [RecomputeFailed(RECEIPT, "a cited raw output is unusable (step 2): comparison not recomputed")]
    docs, problems, runs, repeats = inputs
    try:
        comp = compare.compare(
            expect=dict(receipt.expectations),
            probe_docs=docs,
            probe_problems=problems,
            test_runs=runs,
            algorithm=made_by,
            repeats=repeats,
        )
    except (KeyError, TypeError, ValueError, AttributeError, KvprobeError) as exc:
        return [RecomputeFailed(RECEIPT, f"raw outputs cannot be compared: {type(exc).__name__}: {exc}")]
    found: list[BundleDefect] = []
    stated = receipt.comparison.to_json()
    for where, verdict in (("verdict", receipt.verdict), ("comparison.verdict", receipt.comparison.verdict)):
        if verdict.value != comp["verdict"]:
            found.append(
                ForgedVerdict(
                    RECEIPT,
                    f"{where} is {verdict.value!r}, but the raw outputs and expectations give {comp['verdict']!r}",
                )
            )
    diffs = json_diff(
        {k: v for k, v in stated.items() if k != "verdict"},
        {k: v for k, v in comp.items() if k != "verdict"},
        "comparison",
    )
    if diffs and made_by != compare.ALGORITHM:
        found.append(
            ComparisonAlgorithmUnknown(
                RECEIPT,
                f"the comparison was made by {made_by!r}, which "
                f"{compare.PREDECESSORS[made_by]}; recomputed by its rules "
                f"it differs: {summary(diffs)}",
            )
        )
    elif diffs:
        found.append(
            ComparisonMismatch(
                RECEIPT,
                f"{len(diffs)} differences from the comparison recomputed from the raw outputs: {summary(diffs)}",
            )
        )
    found += _mocks_defects(receipt, docs)
    found += _probe_record_defects(receipt, docs, made_by)
    return found


def _probe_record_defects(receipt: Receipt, docs: dict[str, dict], made_by: str) -> list[BundleDefect]:
    """evidence.configuration and evidence.absorbed are the raw outputs'. Receipts of the
    comparisons before compare/4 were written without them; one of compare/4 or later must state them."""
    found: list[BundleDefect] = []
    stated = {"configuration": receipt.evidence.configuration, "absorbed": receipt.evidence.absorbed}
    for key, derived in compare.probe_records(docs).items():
        if stated[key] is None and not compare.states_probe_records(made_by):
            continue
        if stated[key] is None:
            found.append(RecordMismatch(RECEIPT, f"evidence.{key} is missing: {made_by} receipts state it"))
            continue
        diffs = json_diff(stated[key], derived, f"evidence.{key}")
        if diffs:
            found.append(RecordMismatch(RECEIPT, f"evidence.{key} differs from the raw outputs: {summary(diffs)}"))
    return found


def _mocks_defects(receipt: Receipt, docs: dict[str, dict]) -> list[BundleDefect]:
    mocks: dict[str, Any] = {}
    for side in SIDES:
        for name, doc in docs[side].items():
            mocks.setdefault(name, doc["mocks"])
    diffs = json_diff(receipt.evidence.mocks, mocks, "evidence.mocks")
    return [RecordMismatch(RECEIPT, f"evidence.mocks differs from the raw outputs: {summary(diffs)}")] if diffs else []


# --- the bundled experiment ---------------------------------------------------------------


def experiment_defects(bundle: Bundle, receipt: Receipt) -> list[BundleDefect]:
    data, rel = bundle.experiment, receipt.experiment.file
    assert data is not None, "called only when step 2 read the experiment"
    found = experiment_digest_defects(bundle, FileRef(rel, receipt.experiment.sha256))
    expect = {side: data.get("expect", {}).get(side, {}) for side in SIDES}
    if data.get("expect", {}).get("tests"):
        expect["tests"] = data["expect"]["tests"]
    diffs = json_diff(receipt.expectations, expect, "expectations")
    if diffs:
        found.append(ExpectationsMismatch(rel, f"[expect] differs from receipt.expectations: {summary(diffs)}"))
    diffs = json_diff(_receipt_view(receipt), experiment_view(data, receipt.pin_set.name))
    if diffs:
        found.append(ExperimentMismatch(rel, f"the receipt disagrees with the bundled experiment: {summary(diffs)}"))
    found += spec_pin_defects(rel, data, receipt)
    return found


def _receipt_view(receipt: Receipt) -> dict[str, Any]:
    stated = receipt.experiment.to_json()
    exp = {k: v for k, v in stated.items() if k not in ("sha256", "source")}  # not in the file
    ev = receipt.evidence
    sides = {
        side: {
            "probes": [[p.name, p.source.path] for p in receipt.sides[side].probes],
            "tests": [t.path for t in receipt.sides[side].tests],
        }
        for side in SIDES
    }
    return {
        "experiment": exp,
        "evidence": {"layer": ev.layer.value, "shows": ev.shows, "does_not_show": list(ev.does_not_show)},
        "sides": sides,
    }


def limits_defects(receipt: Receipt) -> list[BundleDefect]:
    """evidence.limits are the words kvprobe writes from the receipt's host, pin set and env
    (rules/run_limits): the exports quote them as kvprobe's caveats, so none may be dropped,
    reworded or added."""
    ps, env = receipt.pin_set, receipt.env
    tests_from = ps.tests_from or {}
    commit = tests_from.get("commit") if isinstance(tests_from.get("commit"), str) else None
    derived = run_limits(receipt.host, ps.kind, commit, env.torch, env.torch_index)
    diffs = json_diff(list(receipt.evidence.limits), derived, "evidence.limits")
    if diffs:
        return [RecordMismatch(RECEIPT, f"evidence.limits are not what kvprobe writes for this run: {summary(diffs)}")]
    return []


# --- README.md ---------------------------------------------------------------------------

_MAX_README_BYTES = 1 << 20


def readme_defects(bundle: Bundle, receipt: Receipt) -> tuple[list[BundleDefect], list[str]]:
    """README.md, when present, is byte for byte the summary this kvprobe renders from the
    receipt: a reviewer reads it first, and nothing else ties its claims to the evidence. The
    receipt's ``tool.version`` is its own claim, so it never exempts a README from the check (a
    sweep's is held the same way); one rendered by another kvprobe is refused, naming it."""
    if README not in bundle.listed():
        return [], []
    found: list[BundleDefect] = []
    data = read_bytes(bundle, README, _MAX_README_BYTES, found)
    if data is None:
        return [ReadmeMismatch(README, d.detail) for d in found], []
    try:
        rendered = render_readme(receipt).encode("utf-8")
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        # the schema leaves the comparison's tables open: one the renderer cannot read is a
        # defect (step 4's recompute names what is wrong with it), never a crash
        why = f"cannot be rendered from receipt.json to compare ({type(exc).__name__}: {exc})"
        return [ReadmeMismatch(README, why)], []
    if data != rendered:
        made_by = receipt.tool.version
        other = f", or rendered by kvprobe {made_by}: verify it with that kvprobe" if made_by != __version__ else ""
        why = f"not the summary kvprobe renders from receipt.json (edited after the run{other})"
        return [ReadmeMismatch(README, why)], []
    return [], []


# --- pins and run id ---------------------------------------------------------------------


def pin_identity(kind: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The identity a well-formed pin of ``kind`` has; raises KeyError/TypeError/ValueError."""
    if kind == "git":
        return GitPin(spec["commit"]).identity()
    if kind == "wheel":
        return WheelPin(
            spec["package"], spec["version"], spec.get("file") or spec["filename"], spec["sha256"]
        ).identity()
    if kind == "synthetic" and isinstance(spec["switches"], dict):
        return ModelPin(spec["switches"]).identity()
    raise ValueError(f"unknown pin kind {kind!r}")


def pin_defects(receipt: Receipt) -> list[BundleDefect]:
    """Each side's pin is well formed for the pin set's kind, and its source is that pin."""
    kind = receipt.pin_set.kind.value
    found: list[BundleDefect] = []
    for side in SIDES:
        pin, source = receipt.sides[side].pin, receipt.sides[side].source
        try:
            well_formed = pin_identity(kind, pin) == pin
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            well_formed, why = False, f"{type(exc).__name__}: {exc}"
        else:
            why = f"not exactly a {kind} pin identity: {short(pin)}"
        if not well_formed:
            found.append(BadPin(RECEIPT, f"sides.{side}.pin: {why}"))
        elif not _source_matches(kind, pin, source):
            found.append(PinMismatch(RECEIPT, f"sides.{side}.source {short(source)} is not pin {short(pin)}"))
    return found


def _source_matches(kind: str, pin: Mapping[str, Any], source: Any) -> bool:
    if not isinstance(source, dict):
        return False
    if kind == "git":
        return source.get("commit") == pin["commit"]
    if kind == "wheel":
        return all(source.get(k) == pin[k] for k in ("package", "version", "filename", "sha256"))
    return source == pin


def spec_pin_defects(rel: str, data: dict[str, Any], receipt: Receipt) -> list[BundleDefect]:
    """The receipt's pin set is the bundled experiment's pin set of that name."""
    ps = receipt.pin_set
    spec = data["pins"].get(ps.name)
    if spec is None:
        return [PinMismatch(rel, f"the experiment has no pin set {ps.name!r}")]
    stated = {
        "kind": ps.kind.value,
        "pr": ps.pr,
        "python_path": list(ps.python_path),
        **({"tests_commit": ps.tests_from.get("commit")} if ps.tests_from is not None else {}),
        **{side: receipt.sides[side].pin for side in SIDES},
    }
    try:
        declared = {
            "kind": spec["kind"],
            "pr": spec.get("pr"),
            "python_path": list(spec.get("python_path", ["."])),
            **({"tests_commit": spec["tests_commit"]} if "tests_commit" in spec else {}),
            **{side: pin_identity(spec["kind"], spec[side]) for side in SIDES},
        }
    except (KeyError, TypeError, ValueError) as exc:
        return [BadPin(rel, f"pins.{ps.name}: {type(exc).__name__}: {exc}")]
    diffs = json_diff(stated, declared, f"pins.{ps.name}")
    return [PinMismatch(rel, f"the receipt's pins differ from the experiment's: {summary(diffs)}")] if diffs else []


def run_id_defects(receipt: Receipt) -> list[BundleDefect]:
    exp_id, pin_set, created = receipt.experiment.id, receipt.pin_set.name, receipt.created_utc
    stamp = created.replace("-", "").replace(":", "")
    want = re.escape(f"{exp_id}-{pin_set}-{stamp}-") + "[0-9a-f]{6}"
    if not re.fullmatch(want, receipt.run_id):
        return [
            RunIdMismatch(
                RECEIPT,
                f"run_id {receipt.run_id!r} does not name experiment "
                f"{exp_id!r}, pin set {pin_set!r} "
                f"and created_utc {created!r}",
            )
        ]
    return []

"""Step 4: the receipt agrees with the raw outputs, the manifest and the bundled experiment.

The comparison and verdict are recomputed with :func:`kvprobe.evidence.compare.compare` from the raw
outputs and the receipt's expectations, and must equal what the receipt states: re-hashing
forged files passes step 3 but not this step.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from kvprobe import __version__
from kvprobe.defects import (
    BadPin,
    BundleDefect,
    CitationDigestMismatch,
    CitationMisplaced,
    CitationNotInManifest,
    ComparisonAlgorithmUnknown,
    ComparisonMismatch,
    ExpectationsMismatch,
    ExperimentDigestMismatch,
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
from kvprobe.evidence import compare, gate2, gate4, gate_probes, markers, sweep
from kvprobe.evidence.bundle_readme import render_readme
from kvprobe.evidence.gate_status import RECORDED_EXIT_CODE, Check, Status, combine
from kvprobe.evidence.reader import Bundle, cited_raw, read_bytes
from kvprobe.evidence.sweep_listing import version_key
from kvprobe.evidence.sweep_view import TIMELINE
from kvprobe.model.receipt import Receipt
from kvprobe.model.records import GitPin, ModelPin, WheelPin
from kvprobe.model.sweep_receipt import ReleaseRecord, SweepReceipt
from kvprobe.names import PROBES_DIR, README, RECEIPT, SIDES
from kvprobe.sources.wheel import names_release
from kvprobe.verify.result import StepResult, step_result
from kvprobe.verify.sweep_set import range_defects, release_set_defects, rendered_defects

_MAX_DIFFS = 8


def step_consistency(bundle: Bundle) -> StepResult:
    receipt = bundle.accepted_receipt
    defects = citation_defects(citations(receipt), bundle.listed()) + placement_defects(receipt)
    defects += record_defects(bundle)
    defects += recompute_defects(bundle)
    defects += pin_defects(receipt) + run_id_defects(receipt)
    readme, notes = readme_defects(bundle)
    defects += readme
    if bundle.experiment is not None:
        defects += experiment_defects(bundle)
    else:
        notes.append("experiment checks not run: the bundled experiment.toml is unusable (step 2)")
    return step_result(4, defects, f"receipt {receipt['verdict']!r} recomputed from raw outputs", notes)


# --- diffs -------------------------------------------------------------------------------


def json_diff(a: Any, b: Any, where: str = "", out: list[str] | None = None) -> list[str]:
    """Differences as 'path: receipt X, recomputed Y' (True and 1 are different)."""
    out = [] if out is None else out
    if len(out) >= 100:
        return out
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            sub = f"{where}.{key}" if where else str(key)
            if key not in b:
                out.append(f"{sub}: only in the receipt")
            elif key not in a:
                out.append(f"{sub}: missing from the receipt")
            else:
                json_diff(a[key], b[key], sub, out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{where}: {len(a)} items in the receipt, {len(b)} recomputed")
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            json_diff(x, y, f"{where}[{_label(i, x)}]", out)
    elif type(a) is not type(b) or a != b:
        out.append(f"{where}: receipt {_short(a)}, recomputed {_short(b)}")
    return out


def _label(index: int, item: Any) -> str:
    """A comparison row's identity beside its index, so a diff names the case it is about."""
    if isinstance(item, dict):
        name = [str(item[k]) for k in ("case", "observation", "file", "test") if isinstance(item.get(k), str)]
        if name:
            return f"{index} {' '.join(name)}"
    return str(index)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _summary(diffs: list[str]) -> str:
    more = f" (+{len(diffs) - _MAX_DIFFS} more)" if len(diffs) > _MAX_DIFFS else ""
    return "; ".join(diffs[:_MAX_DIFFS]) + more


# --- citations ---------------------------------------------------------------------------


def citations(receipt: dict[str, Any]) -> list[tuple[str, dict[str, str]]]:
    """(where in the receipt, {path, sha256}) for every file the receipt cites."""
    exp = receipt["experiment"]
    found = [("experiment.file", {"path": exp["file"], "sha256": exp["sha256"]})]
    for side in SIDES:
        block = receipt["sides"][side]
        for i, probe in enumerate(block["probes"]):
            found.append((f"sides.{side}.probes[{i}].source", probe["source"]))
            if probe["raw"]:
                found.append((f"sides.{side}.probes[{i}].raw", probe["raw"]))
            for k, again in enumerate(probe.get("repeats") or []):
                if again["raw"]:
                    found.append((f"sides.{side}.probes[{i}].repeats[{k}].raw", again["raw"]))
        for i, test in enumerate(block["tests"]):
            found.append((f"sides.{side}.tests[{i}].raw", test["raw"]))
            if test.get("junit"):
                found.append((f"sides.{side}.tests[{i}].junit", test["junit"]))
    return found


def citation_defects(cited: list[tuple[str, dict[str, str]]], listed: dict[str, dict[str, Any]]) -> list[BundleDefect]:
    """Each cited file is in the manifest with the digest the receipt records."""
    found: list[BundleDefect] = []
    for where, ref in cited:
        entry = listed.get(ref["path"])
        if entry is None:
            found.append(
                CitationNotInManifest(ref["path"], f"receipt {where} cites it; manifest.json does not list it")
            )
        elif entry["sha256"] != ref["sha256"]:
            found.append(
                CitationDigestMismatch(
                    ref["path"],
                    f"receipt {where} records sha256 {ref['sha256']}, manifest.json lists {entry['sha256']}",
                )
            )
    return found


def placement_defects(receipt: dict[str, Any]) -> list[BundleDefect]:
    """Raw outputs sit under raw/<their side>/, probe sources under probes/<experiment id>/."""
    exp_id = receipt["experiment"]["id"]
    found: list[BundleDefect] = []
    if receipt["experiment"]["file"] != f"{PROBES_DIR}/{exp_id}/experiment.toml":
        found.append(CitationMisplaced(receipt["experiment"]["file"], f"expected probes/{exp_id}/experiment.toml"))
    for side in SIDES:
        block = receipt["sides"][side]
        found += _duplicates([p["name"] for p in block["probes"]], f"sides.{side}.probes")
        found += _duplicates([t["path"] for t in block["tests"]], f"sides.{side}.tests")
        for probe in block["probes"]:
            found += _probe_placement(side, exp_id, probe)
            found += _repeat_placement(side, probe, receipt.get("repeats", 1))
        for test in block["tests"]:
            found += _test_placement(side, test)
    found += _sides_share_probes(receipt)
    return found


def _repeat_placement(side: str, probe: dict[str, Any], repeats: int) -> list[BundleDefect]:
    """A receipt of ``run --repeat N`` records runs 2..N of every probe, each at its own path;
    one of a single run records none."""
    name, again = probe["name"], probe.get("repeats") or []
    if len(again) != repeats - 1:
        return [
            RecordMismatch(
                RECEIPT,
                f"{side} probe {name!r}: the receipt records {repeats} run(s), this probe {len(again) + 1}",
            )
        ]
    found: list[BundleDefect] = []
    for run, rec in enumerate(again, start=2):
        want = f"raw/{side}/probes/{name}.repeat-{run}.json"
        if rec["raw"] and rec["raw"]["path"] != want:
            found.append(CitationMisplaced(rec["raw"]["path"], f"{side} probe {name!r} run {run}: expected {want}"))
        if rec["raw"] is None and not (isinstance(rec["problem"], str) and rec["problem"]):
            found.append(RecordMismatch(RECEIPT, f"{side} probe {name!r} run {run}: no output and no problem"))
    return found


def _duplicates(names: list[str], where: str) -> list[BundleDefect]:
    return [
        RecordMismatch(RECEIPT, f"{where}: {name!r} recorded twice")
        for name in sorted(set(names))
        if names.count(name) > 1
    ]


def _probe_placement(side: str, exp_id: str, probe: dict[str, Any]) -> list[BundleDefect]:
    found: list[BundleDefect] = []
    name, source = probe["name"], probe["source"]["path"]
    want = f"raw/{side}/probes/{name}.json"
    if probe["raw"] and probe["raw"]["path"] != want:
        found.append(CitationMisplaced(probe["raw"]["path"], f"{side} probe {name!r}: expected {want}"))
    path = PurePosixPath(source)
    if not source.startswith(f"{PROBES_DIR}/{exp_id}/") or path.stem != name or path.suffix != ".py":
        found.append(CitationMisplaced(source, f"{side} probe {name!r}: expected probes/{exp_id}/.../{name}.py"))
    return found


def _test_placement(side: str, test: dict[str, Any]) -> list[BundleDefect]:
    want = f"raw/{side}/tests/{test['path'].replace('/', '__')}.json"
    found: list[BundleDefect] = []
    if test["raw"]["path"] != want:
        found.append(CitationMisplaced(test["raw"]["path"], f"{side} test {test['path']!r}: expected {want}"))
    junit = test.get("junit")
    if junit and not junit["path"].startswith(f"raw/{side}/tests/"):
        found.append(CitationMisplaced(junit["path"], f"{side} test {test['path']!r}: junit outside raw/{side}/tests/"))
    return found


def _sides_share_probes(receipt: dict[str, Any]) -> list[BundleDefect]:
    """Both sides ran the same probe sources (the same bytes)."""
    sources = {side: {p["name"]: p["source"] for p in receipt["sides"][side]["probes"]} for side in SIDES}
    if sources["base"] != sources["head"]:
        return [RecordMismatch(RECEIPT, "base and head cite different probe sets or probe sources")]
    return []


# --- records vs raw outputs --------------------------------------------------------------


def record_defects(bundle: Bundle) -> list[BundleDefect]:
    found: list[BundleDefect] = []
    for side in SIDES:
        for i, probe in enumerate(bundle.accepted_receipt["sides"][side]["probes"]):
            if probe["raw"] is None and not (isinstance(probe["problem"], str) and probe["problem"]):
                found.append(
                    RecordMismatch(
                        RECEIPT, f"sides.{side}.probes[{i}] {probe['name']!r}: no output and no problem recorded"
                    )
                )
    for side, kind, rel, record in cited_raw(bundle.accepted_receipt):
        doc = bundle.raw_docs.get(rel)
        if doc is not None:
            found += _probe_record(rel, doc, record) if kind == "probe" else _test_record(rel, doc, side, record)
    return found


def _probe_record(rel: str, doc: dict[str, Any], record: dict[str, Any]) -> list[BundleDefect]:
    from kvprobe.checks.probes import check_output
    from kvprobe.errors import SchemaError

    found: list[BundleDefect] = []
    if record["problem"] is not None:
        found.append(
            RecordMismatch(rel, f"receipt records problem {record['problem']!r} for a probe whose output it cites")
        )
    try:
        check_output(doc, record["name"])
    except SchemaError as exc:
        found.append(RawInvalid(rel, exc.message))
    return found


def _test_record(rel: str, doc: dict[str, Any], side: str, record: dict[str, Any]) -> list[BundleDefect]:
    found: list[BundleDefect] = []
    if doc["side"] != side or doc["path"] != record["path"]:
        found.append(
            RawInvalid(rel, f"records side {doc['side']!r}, test {doc['path']!r}; cited as {side} {record['path']!r}")
        )
    for key in ("exit_code", "overlay", "problem"):
        if doc[key] != record[key]:
            found.append(RecordMismatch(rel, f"{key}: raw {doc[key]!r}, receipt {record[key]!r}"))
    return found


# --- recompute ---------------------------------------------------------------------------


def recompute_inputs(bundle: Bundle) -> tuple[dict, dict, dict, dict | None] | None:
    """compare() inputs from the raw outputs (the repeats' too: None for one run); None when one
    of them is unusable."""
    docs: dict[str, dict] = {s: {} for s in SIDES}
    problems: dict[str, dict] = {s: {} for s in SIDES}
    runs: dict[str, dict] = {}
    repeats: dict[str, dict] = {s: {} for s in SIDES}
    for side in SIDES:
        block = bundle.accepted_receipt["sides"][side]
        for probe in block["probes"]:
            if probe["raw"] is None:
                problems[side][probe["name"]] = probe["problem"]
            elif probe["raw"]["path"] in bundle.raw_docs:
                docs[side][probe["name"]] = bundle.raw_docs[probe["raw"]["path"]]
            else:
                return None
        for probe in block["probes"]:  # after every first run's problem, as the run lists them
            again = probe.get("repeats") or []
            if any(r["raw"] is not None and r["raw"]["path"] not in bundle.raw_docs for r in again):
                return None
            repeats[side][probe["name"]] = [bundle.raw_docs[r["raw"]["path"]] if r["raw"] else None for r in again]
            failed = [None if r["raw"] is not None else r["problem"] for r in again]
            problems[side] |= compare.repeat_problems({probe["name"]: failed})
        for test in block["tests"]:
            if test["raw"]["path"] not in bundle.raw_docs:
                return None
            runs.setdefault(test["path"], {})[side] = bundle.raw_docs[test["raw"]["path"]]
    return docs, problems, runs, repeats if bundle.accepted_receipt.get("repeats") else None


def recompute_defects(bundle: Bundle) -> list[BundleDefect]:
    receipt = bundle.accepted_receipt
    made_by = receipt["comparison"].get("algorithm", "kvprobe.compare/1")
    if made_by != compare.ALGORITHM and made_by not in compare.PREDECESSORS:
        return [
            ComparisonAlgorithmUnknown(
                RECEIPT,
                f"the comparison was made by {made_by!r} "
                f"(kvprobe {receipt['tool']['version']}); this kvprobe "
                f"computes {compare.ALGORITHM!r}: verify with a kvprobe "
                "that has that comparison",
            )
        ]
    inputs = recompute_inputs(bundle)
    if inputs is None:
        return [RecomputeFailed(RECEIPT, "a cited raw output is unusable (step 2): comparison not recomputed")]
    docs, problems, runs, repeats = inputs
    try:
        comp = compare.compare(
            expect=receipt["expectations"],
            probe_docs=docs,
            probe_problems=problems,
            test_runs=runs,
            algorithm=made_by,
            repeats=repeats,
        )
    except (KeyError, TypeError, ValueError, AttributeError, KvprobeError) as exc:
        return [RecomputeFailed(RECEIPT, f"raw outputs cannot be compared: {type(exc).__name__}: {exc}")]
    found: list[BundleDefect] = []
    for where, stated in (("verdict", receipt["verdict"]), ("comparison.verdict", receipt["comparison"]["verdict"])):
        if stated != comp["verdict"]:
            found.append(
                ForgedVerdict(
                    RECEIPT, f"{where} is {stated!r}, but the raw outputs and expectations give {comp['verdict']!r}"
                )
            )
    diffs = json_diff(
        {k: v for k, v in receipt["comparison"].items() if k != "verdict"},
        {k: v for k, v in comp.items() if k != "verdict"},
        "comparison",
    )
    if diffs and made_by != compare.ALGORITHM:
        found.append(
            ComparisonAlgorithmUnknown(
                RECEIPT,
                f"the comparison was made by {made_by!r}, which "
                f"{compare.PREDECESSORS[made_by]}; recomputed by its rules "
                f"it differs: {_summary(diffs)}",
            )
        )
    elif diffs:
        found.append(
            ComparisonMismatch(
                RECEIPT,
                f"{len(diffs)} differences from the comparison recomputed from the raw outputs: {_summary(diffs)}",
            )
        )
    found += _mocks_defects(receipt, docs)
    found += _probe_record_defects(receipt, docs, made_by)
    return found


def _probe_record_defects(receipt: dict[str, Any], docs: dict[str, dict], made_by: str) -> list[BundleDefect]:
    """evidence.configuration and evidence.absorbed are the raw outputs'. Receipts of the
    comparisons before compare/4 were written without them; one of compare/4 or later must state them."""
    found: list[BundleDefect] = []
    for key, derived in compare.probe_records(docs).items():
        if key not in receipt["evidence"] and not compare.states_probe_records(made_by):
            continue
        if key not in receipt["evidence"]:
            found.append(RecordMismatch(RECEIPT, f"evidence.{key} is missing: {made_by} receipts state it"))
            continue
        diffs = json_diff(receipt["evidence"][key], derived, f"evidence.{key}")
        if diffs:
            found.append(RecordMismatch(RECEIPT, f"evidence.{key} differs from the raw outputs: {_summary(diffs)}"))
    return found


def _mocks_defects(receipt: dict[str, Any], docs: dict[str, dict]) -> list[BundleDefect]:
    mocks: dict[str, Any] = {}
    for side in SIDES:
        for name, doc in docs[side].items():
            mocks.setdefault(name, doc["mocks"])
    diffs = json_diff(receipt["evidence"]["mocks"], mocks, "evidence.mocks")
    return [RecordMismatch(RECEIPT, f"evidence.mocks differs from the raw outputs: {_summary(diffs)}")] if diffs else []


# --- the bundled experiment ---------------------------------------------------------------


def _experiment_digest_defects(bundle: Bundle) -> list[BundleDefect]:
    """The bundled experiment.toml has the sha256 the receipt states."""
    receipt, data_bytes = bundle.accepted_receipt, bundle.experiment_bytes
    assert data_bytes is not None, "called only when step 2 read the experiment"
    digest = hashlib.sha256(data_bytes).hexdigest()
    if digest == receipt["experiment"]["sha256"]:
        return []
    detail = f"sha256 {digest}, receipt.experiment.sha256 {receipt['experiment']['sha256']}"
    return [ExperimentDigestMismatch(receipt["experiment"]["file"], detail)]


def experiment_defects(bundle: Bundle) -> list[BundleDefect]:
    receipt, data, rel = bundle.accepted_receipt, bundle.experiment, bundle.accepted_receipt["experiment"]["file"]
    assert data is not None, "called only when step 2 read the experiment"
    found = _experiment_digest_defects(bundle)
    expect = {side: data.get("expect", {}).get(side, {}) for side in SIDES}
    if data.get("expect", {}).get("tests"):
        expect["tests"] = data["expect"]["tests"]
    diffs = json_diff(receipt["expectations"], expect, "expectations")
    if diffs:
        found.append(ExpectationsMismatch(rel, f"[expect] differs from receipt.expectations: {_summary(diffs)}"))
    diffs = json_diff(_receipt_view(receipt), _experiment_view(data, receipt["pin_set"]["name"]))
    if diffs:
        found.append(ExperimentMismatch(rel, f"the receipt disagrees with the bundled experiment: {_summary(diffs)}"))
    found += spec_pin_defects(rel, data, receipt)
    return found


def _receipt_view(receipt: dict[str, Any]) -> dict[str, Any]:
    exp = {k: v for k, v in receipt["experiment"].items() if k not in ("sha256", "source")}  # not in the file
    ev = receipt["evidence"]
    sides = {
        side: {
            "probes": [[p["name"], p["source"]["path"]] for p in receipt["sides"][side]["probes"]],
            "tests": [t["path"] for t in receipt["sides"][side]["tests"]],
        }
        for side in SIDES
    }
    return {
        "experiment": exp,
        "evidence": {"layer": ev["layer"], "shows": ev["shows"], "does_not_show": ev["does_not_show"]},
        "sides": sides,
    }


def _vulnerability_view(table: Any) -> dict[str, Any]:
    """The receipt's ``vulnerability`` as the bundled [vulnerability] table implies it (none
    without one: bundles from before kvprobe recorded it)."""
    if not isinstance(table, dict):
        return {}
    return {
        "vulnerability": {
            "id": table.get("id"),
            "aliases": list(table.get("aliases", [])),
            "fix_kind": table.get("fix_kind"),
        }
    }


def _experiment_view(data: dict[str, Any], pin_set: str) -> dict[str, Any]:
    exp_id = data["id"]
    fix = data["fix"]
    probes = [
        [PurePosixPath(p["path"]).stem, f"{PROBES_DIR}/{exp_id}/{p['path']}"] for p in data["checks"].get("probes", [])
    ]
    spec = data["pins"].get(pin_set, {})
    tests = [
        t["path"]
        for t in data["checks"].get("tests", [])
        if (spec.get("kind") == "git" or "tests_commit" in spec) and ("pins" not in t or pin_set in t["pins"])
    ]
    return {
        "experiment": {
            "id": exp_id,
            "title": data["title"],
            "layer": data["layer"],
            "file": f"{PROBES_DIR}/{exp_id}/experiment.toml",
            "upstream": data.get("upstream"),
            "profile": data["profile"],
            "fix": {"prs": list(fix.get("prs", [])), "release": fix.get("release"), "summary": fix["summary"]},
            **_vulnerability_view(data.get("vulnerability")),
        },
        "evidence": {
            "layer": data["layer"],
            "shows": data["scope"]["shows"],
            "does_not_show": list(data["scope"]["does_not_show"]),
        },
        "sides": {side: {"probes": probes, "tests": tests} for side in SIDES},
    }


# --- README.md ---------------------------------------------------------------------------

_MAX_README_BYTES = 1 << 20


def readme_defects(bundle: Bundle) -> tuple[list[BundleDefect], list[str]]:
    """README.md, when present, is byte for byte the summary this kvprobe renders from the
    receipt: a reviewer reads it first, and nothing else ties its claims to the evidence. A
    bundle from another kvprobe version may render differently: then it is said to be unchecked."""
    if README not in bundle.listed():
        return [], []
    made_by = bundle.accepted_receipt["tool"]["version"]
    if made_by != __version__:
        return [], [f"README.md not checked: made by kvprobe {made_by}, whose rendering this kvprobe does not have"]
    found: list[BundleDefect] = []
    data = read_bytes(bundle, README, _MAX_README_BYTES, found)
    if data is None:
        return [ReadmeMismatch(README, d.detail) for d in found], []
    if data != render_readme(Receipt.from_json(bundle.accepted_receipt)).encode("utf-8"):
        return [ReadmeMismatch(README, "not the summary kvprobe renders from receipt.json (edited after the run)")], []
    return [], []


# --- pins and run id ---------------------------------------------------------------------


def pin_identity(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
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


def pin_defects(receipt: dict[str, Any]) -> list[BundleDefect]:
    """Each side's pin is well formed for the pin set's kind, and its source is that pin."""
    kind = receipt["pin_set"]["kind"]
    found: list[BundleDefect] = []
    for side in SIDES:
        pin, source = receipt["sides"][side]["pin"], receipt["sides"][side]["source"]
        try:
            well_formed = pin_identity(kind, pin) == pin
        except (KeyError, TypeError, ValueError) as exc:
            well_formed, why = False, f"{type(exc).__name__}: {exc}"
        else:
            why = f"not exactly a {kind} pin identity: {_short(pin)}"
        if not well_formed:
            found.append(BadPin(RECEIPT, f"sides.{side}.pin: {why}"))
        elif not _source_matches(kind, pin, source):
            found.append(PinMismatch(RECEIPT, f"sides.{side}.source {_short(source)} is not pin {_short(pin)}"))
    return found


def _source_matches(kind: str, pin: dict[str, Any], source: Any) -> bool:
    if not isinstance(source, dict):
        return False
    if kind == "git":
        return source.get("commit") == pin["commit"]
    if kind == "wheel":
        return all(source.get(k) == pin[k] for k in ("package", "version", "filename", "sha256"))
    return source == pin


def spec_pin_defects(rel: str, data: dict[str, Any], receipt: dict[str, Any]) -> list[BundleDefect]:
    """The receipt's pin set is the bundled experiment's pin set of that name."""
    ps = receipt["pin_set"]
    spec = data["pins"].get(ps["name"])
    if spec is None:
        return [PinMismatch(rel, f"the experiment has no pin set {ps['name']!r}")]
    stated = {
        "kind": ps["kind"],
        "pr": ps["pr"],
        "python_path": ps["python_path"],
        **({"tests_commit": ps["tests_from"].get("commit")} if "tests_from" in ps else {}),
        **{side: receipt["sides"][side]["pin"] for side in SIDES},
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
        return [BadPin(rel, f"pins.{ps['name']}: {type(exc).__name__}: {exc}")]
    diffs = json_diff(stated, declared, f"pins.{ps['name']}")
    return [PinMismatch(rel, f"the receipt's pins differ from the experiment's: {_summary(diffs)}")] if diffs else []


def run_id_defects(receipt: dict[str, Any]) -> list[BundleDefect]:
    stamp = receipt["created_utc"].replace("-", "").replace(":", "")
    want = re.escape(f"{receipt['experiment']['id']}-{receipt['pin_set']['name']}-{stamp}-") + "[0-9a-f]{6}"
    if not re.fullmatch(want, receipt["run_id"]):
        return [
            RunIdMismatch(
                RECEIPT,
                f"run_id {receipt['run_id']!r} does not name experiment "
                f"{receipt['experiment']['id']!r}, pin set {receipt['pin_set']['name']!r} "
                f"and created_utc {receipt['created_utc']!r}",
            )
        ]
    return []


# --- gates receipts (layer deployment) -----------------------------------------------------


def gates_citations(node: Any, where: str = "") -> list[tuple[str, dict[str, str]]]:
    """Every ``{"path", "sha256"}`` object anywhere in a gates receipt (files it cites)."""
    found: list[tuple[str, dict[str, str]]] = []
    if isinstance(node, dict):
        if (
            set(node) >= {"path", "sha256"}
            and isinstance(node.get("path"), str)
            and isinstance(node.get("sha256"), str)
            and not node["path"].startswith("/")
        ):
            found.append((where or "(top)", {"path": node["path"], "sha256": node["sha256"]}))
        for key, value in node.items():
            found += gates_citations(value, f"{where}.{key}" if where else key)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += gates_citations(value, f"{where}[{i}]")
    return found


def step_gates_consistency(bundle: Bundle) -> StepResult:
    """Cited files are the manifest's; each behavioural gate's probe checks (gate 2; gates 3 and 4
    from /4) are recomputed from the raw outputs and the bundled experiments' expectations; each
    gate and the overall result follow from the checks."""
    receipt = bundle.accepted_receipt
    defects = citation_defects(gates_citations(receipt), bundle.listed())
    defects += gates_probe_defects(bundle) + behaviour_basis_defects(bundle)
    probe_checks: dict[int, list[Check]] = {}
    for stated in behaviour_bases(receipt):
        recomputed, found = recompute_probe_gate(bundle, stated)
        defects += found
        if recomputed is not None:
            probe_checks[stated.gate] = recomputed
    gate4_checks, found = recompute_gate4(receipt)
    defects += found + marker_check_defects(receipt) + deciding_defects(receipt)
    gates = []
    for gate in receipt["gates"]:
        number = gate["number"]
        checks = [(Status(c["status"]), c["decides"]) for c in gate["checks"]]
        if number == 4 and gate4_checks is not None:
            found, checks = gate4_check_defects(gate["checks"], gate4_checks)  # one per stated check
            defects += found
        if number in probe_checks:
            found, checks = probe_check_defects(number, gate["checks"], checks, probe_checks[number])
            defects += found
        status = combine(s for s, decides in checks if decides)
        if status.value != gate["status"]:
            basis = "its deciding checks give"
            if number in probe_checks:
                basis = "its checks, the probe checks recomputed from the raw outputs, give"
                if number == 2:
                    basis = "the raw outputs give"
            if number == 4 and gate4_checks is not None:
                basis = "its checks, the probes and deferred release recomputed, give"
            defects.append(ForgedVerdict(RECEIPT, f"gate {number} states {gate['status']!r}; {basis} {status.value!r}"))
        gates.append(status)
    overall = combine(gates)
    if overall.value != receipt["overall"] or RECORDED_EXIT_CODE[overall] != receipt["exit_code"]:
        defects.append(
            ForgedVerdict(
                RECEIPT,
                f"overall states {receipt['overall']!r} (exit "
                f"{receipt['exit_code']}); the gates give {overall.value!r}",
            )
        )
    notes = []
    if "behaviour" not in receipt:
        notes.append(
            f"a {receipt['schema']} receipt: gates 3 and 4 were decided by code markers and settings, not by "
            "probes (only gate 2 is behavioural before kvprobe.gates-receipt/4)"
        )
    return step_result(
        4, defects, f"gates receipt {receipt['overall']!r} recomputed from its checks and raw outputs", notes
    )


def recompute_gate4(receipt: dict[str, Any]) -> tuple[list[Check] | None, list[BundleDefect]]:
    """Gate 4's deferred-release checks from the receipt's ``gate4`` record (each worker's
    setting and backend, the release's facts), by :mod:`kvprobe.evidence.gate4`; None for
    receipts before /3, which record no such basis."""
    if "gate4" not in receipt:
        return None, []
    algorithm = receipt["gate4"]["algorithm"]
    if algorithm != gate4.ALGORITHM:
        why = f"gate 4 was decided by {algorithm!r}; this kvprobe computes {gate4.ALGORITHM!r}"
        return None, [ComparisonAlgorithmUnknown(RECEIPT, why)]
    try:
        checks = gate4.checks_from_basis(receipt["gate4"])
    except (KeyError, TypeError, ValueError) as exc:
        return None, [RecomputeFailed(RECEIPT, f"gate 4's basis cannot be read: {type(exc).__name__}: {exc}")]
    return checks, gate4_basis_defects(receipt)


def marker_check_defects(receipt: dict[str, Any]) -> list[BundleDefect]:
    """Each fix-marker check of gates 3 and 4 ("#PR in code") has the status its marker record
    gives (unknown without one), and a fix called absent because the release predates it is so
    by the target's version."""
    target = receipt["target"]
    records = {} if target is None else {(m["gate"], m["pr"]): m for m in target["markers"]}
    version = None if target is None else target["identity"].get("version")
    found: list[BundleDefect] = []
    for gate in receipt["gates"]:
        for check in gate["checks"]:
            pr = re.fullmatch(r"#(\d+) in code", check["name"])
            if gate["number"] not in (3, 4) or pr is None:
                continue
            name, record = check["name"], records.get((gate["number"], int(pr[1])))
            # no record (no target code, or none for this PR): nothing was found, so unknown
            want = markers.STATUS[record["presence"]] if record else Status.UNKNOWN
            if check["status"] != want.value:
                found.append(
                    ForgedVerdict(
                        RECEIPT,
                        f"gate {gate['number']} check {name!r} states {check['status']!r}; "
                        f"its marker record gives {want.value!r}",
                    )
                )
    for record in records.values():
        if markers.NOT_IN_RELEASE in record["evidence"] and not markers.older_than(version, record["first_release"]):
            found.append(
                RecordMismatch(
                    RECEIPT,
                    f"marker #{record['pr']} is absent as 'not in this release', but the target's version "
                    f"{version!r} is not before {record['first_release']}",
                )
            )
    return found


def gate4_basis_defects(receipt: dict[str, Any]) -> list[BundleDefect]:
    """The basis agrees with the rest of the receipt: release facts only with a target, and the
    same as the target's settings; every environment source is an input the receipt lists."""
    basis = receipt["gate4"]
    release, target = basis["release"], receipt["target"]
    found: list[BundleDefect] = []
    if (release is None) != (target is None or target.get("settings") is None):
        found.append(RecordMismatch(RECEIPT, "gate 4's basis states release facts, but the receipt has no target code"))
    elif release is not None:
        settings = target["settings"]
        stated = (release["default"], release["backends"] if release["capability_flag"] else None)
        recorded = (settings.get("deferred_default"), settings.get("deferred_backends"))
        if stated != recorded or release.get("declared") != settings.get("deferred_declared", release.get("declared")):
            found.append(
                RecordMismatch(RECEIPT, f"gate 4's release facts {stated} are not the target's settings {recorded}")
            )
    names = {i["name"] for kind in ("logs", "server_args", "env") for i in receipt["inputs"].get(kind, [])}
    for role, workers in basis["workers"].items():
        for worker in workers:
            source = worker["env_source"]
            if source is not None and not any(source.startswith((f"{n}:", f"{n} ")) for n in names):
                found.append(RecordMismatch(RECEIPT, f"gate 4's {role} setting cites {source!r}, not an input"))
    return found


def gate4_check_defects(
    stated: list[dict[str, Any]], recomputed: list[Check]
) -> tuple[list[BundleDefect], list[tuple[Status, bool]]]:
    """The receipt's deferred-release checks are exactly the recomputed ones (one per role);
    returns the defects and the gate's checks with the recomputed ones in their place."""
    want = {c.name: c for c in recomputed}
    defects: list[BundleDefect] = []
    names = [c["name"] for c in stated if c["name"] in want]
    if sorted(names) != sorted(want):
        defects.append(
            ForgedVerdict(
                RECEIPT, f"gate 4 states deferred-release checks {sorted(names)}; its basis gives {sorted(want)}"
            )
        )
    checks = []
    for c in stated:
        if c["name"] not in want:
            checks.append((Status(c["status"]), c["decides"]))
            continue
        check = want[c["name"]]
        checks.append((check.status, check.decides))
        if c["status"] != check.status.value:
            defects.append(
                ForgedVerdict(
                    RECEIPT,
                    f"gate 4 check {c['name']!r} states {c['status']!r}; "
                    f"its recorded basis gives {check.status.value!r}",
                )
            )
        elif diffs := json_diff(c, check.record().to_json(), f"gates[4].checks[{c['name']}]"):
            defects.append(
                ComparisonMismatch(RECEIPT, f"gate 4's checks differ from those recomputed: {_summary(diffs)}")
            )
    return defects, checks


@dataclass(frozen=True)
class StatedBasis:
    """One behavioural gate's basis as a receipt records it: the rule and the experiments' files."""

    gate: int
    algorithm: str
    experiments: list[tuple[str, str]]  # (experiment id, bundled experiment.toml)


def behaviour_bases(receipt: dict[str, Any]) -> list[StatedBasis]:
    """Each behavioural gate's basis. /4 receipts record one per gate (``behaviour``); /2 and /3
    record gate 2's alone (``gate2``); a /1 receipt cites none: kvprobe wrote gate 2's to
    probes/<id>/experiment.toml of every gate-2 experiment whenever an SGLang was given, so a /1
    receipt is held to those files."""
    if "behaviour" in receipt:
        return [
            StatedBasis(b["gate"], b["algorithm"], [(e["id"], e["file"]["path"]) for e in b["experiments"]])
            for b in receipt["behaviour"]
        ]
    if "gate2" in receipt:
        pairs = [(e["id"], e["file"]["path"]) for e in receipt["gate2"]["experiments"]]
        return [StatedBasis(2, receipt["gate2"]["algorithm"], pairs)]
    ids = gate2.EXPERIMENTS if receipt["target"] is not None else ()
    return [StatedBasis(2, gate2.ALGORITHM, [(exp_id, f"{PROBES_DIR}/{exp_id}/experiment.toml") for exp_id in ids])]


def behaviour_experiments(receipt: dict[str, Any]) -> list[tuple[str, str]]:
    """(experiment id, bundled experiment.toml) of every behavioural gate's experiments."""
    return [pair for basis in behaviour_bases(receipt) for pair in basis.experiments]


def _probe_gate(probe: dict[str, Any]) -> int:
    """The gate a probe ran for: before /4 only gate 2 ran probes."""
    return int(probe.get("gate", 2))


def behaviour_basis_defects(bundle: Bundle) -> list[BundleDefect]:
    """A /4 receipt records gates 2, 3 and 4's bases, each by its gate's rule; each gate ran all its
    experiments when an SGLang was given (none without one), each from its bundled experiment file,
    with the probes that file declares and no others."""
    receipt = bundle.accepted_receipt
    bases = behaviour_bases(receipt)
    found: list[BundleDefect] = []
    gates = [b.gate for b in bases]
    want_gates = list(gate_probes.BEHAVIOURAL) if "behaviour" in receipt else [2]
    if gates != want_gates:
        found.append(
            RecordMismatch(RECEIPT, f"the receipt records probe bases for gates {gates}; it must for {want_gates}")
        )
    listed = bundle.listed()
    ran: dict[int, set[str]] = {}
    for basis in bases:
        rule = gate_probes.RULES.get(basis.gate)
        if rule is None:
            continue
        want = list(rule.experiments) if receipt["target"] is not None else []
        if [exp_id for exp_id, _rel in basis.experiments] != want:
            found.append(
                RecordMismatch(
                    RECEIPT,
                    f"gate {basis.gate} cites experiments {[e for e, _r in basis.experiments]}; with this target "
                    f"it runs {want}",
                )
            )
        for exp_id, rel in basis.experiments:
            if rel != f"{PROBES_DIR}/{exp_id}/experiment.toml":
                found.append(
                    CitationMisplaced(
                        rel, f"gate {basis.gate} experiment {exp_id!r}: expected probes/{exp_id}/experiment.toml"
                    )
                )
            elif "gate2" not in receipt and "behaviour" not in receipt and rel not in listed:
                found.append(CitationNotInManifest(rel, f"gate 2 ran {exp_id!r}; manifest.json does not list its file"))
        ran[basis.gate] = {exp_id for exp_id, _rel in basis.experiments}
        for exp_id, rel in basis.experiments:
            data = bundle.experiment_docs.get(rel)
            if data is not None:
                found += _probe_set(basis.gate, exp_id, rel, data, receipt["probes"])
    for i, probe in enumerate(receipt["probes"]):
        gate = _probe_gate(probe)
        if probe["experiment"] not in ran.get(gate, set()):
            found.append(
                RecordMismatch(RECEIPT, f"probes[{i}]: experiment {probe['experiment']!r} is not one gate {gate} ran")
            )
    return found


def _probe_set(
    gate: int, exp_id: str, rel: str, data: dict[str, Any], probes: list[dict[str, Any]]
) -> list[BundleDefect]:
    found: list[BundleDefect] = []
    if data["id"] != exp_id:
        found.append(ExperimentMismatch(rel, f"the file is experiment {data['id']!r}, cited as {exp_id!r}"))
    declared = [
        (PurePosixPath(p["path"]).stem, f"{PROBES_DIR}/{exp_id}/{p['path']}") for p in data["checks"].get("probes", [])
    ]
    recorded = [
        (p["name"], p["source"]["path"]) for p in probes if p["experiment"] == exp_id and _probe_gate(p) == gate
    ]
    if recorded != declared:
        found.append(
            RecordMismatch(
                RECEIPT, f"gate {gate} probes of {exp_id!r} are {recorded}; its experiment declares {declared}"
            )
        )
    return found


def recompute_probe_gate(bundle: Bundle, basis: StatedBasis) -> tuple[list[Check] | None, list[BundleDefect]]:
    """A behavioural gate's probe checks from the raw outputs and each bundled experiment's head
    expectations, by the rule the basis names (:mod:`kvprobe.evidence.gate_probes`); None (with
    why) when they cannot be recomputed."""
    receipt = bundle.accepted_receipt
    rule = gate_probes.rule_for(basis.algorithm)
    if rule is None or rule.gate != basis.gate:
        current = gate_probes.RULES[basis.gate].algorithm if basis.gate in gate_probes.RULES else None
        why = f"gate {basis.gate} was decided by {basis.algorithm!r}; this kvprobe computes {current!r}"
        return None, [ComparisonAlgorithmUnknown(RECEIPT, why)]
    if receipt["target"] is None:
        return [gate_probes.NO_TARGET], []
    checks: list[Check] = []
    for exp_id, rel in basis.experiments:
        data = bundle.experiment_docs.get(rel)
        if data is None:
            return None, [RecomputeFailed(rel, f"unusable or missing (step 2): gate {basis.gate} not recomputed")]
        docs: dict[str, Any] = {}
        problems: list[str] = []
        for probe in (p for p in receipt["probes"] if p["experiment"] == exp_id and _probe_gate(p) == basis.gate):
            if probe["raw"] is None:
                problems.append(str(probe["problem"]))
            elif probe["raw"]["path"] in bundle.raw_docs:
                docs[probe["name"]] = bundle.raw_docs[probe["raw"]["path"]]
            else:
                why = f"unusable (step 2): gate {basis.gate} not recomputed"
                return None, [RecomputeFailed(probe["raw"]["path"], why)]
        try:
            head = data.get("expect", {}).get("head", {})
            checks += gate_probes.experiment_checks(rule, exp_id, data["fix"]["prs"], head, docs, problems)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            why = f"gate {basis.gate}'s raw outputs cannot be read: {type(exc).__name__}: {exc}"
            return None, [RecomputeFailed(RECEIPT, why)]
    return checks, []


def probe_check_defects(
    number: int, stated: list[dict[str, Any]], checks: list[tuple[Status, bool]], recomputed: list[Check]
) -> tuple[list[BundleDefect], list[tuple[Status, bool]]]:
    """The receipt's probe checks of gate ``number`` are exactly the recomputed ones: a status that
    differs is a forged verdict; any other difference (a check's name, detail, count or whether
    it decides) a mismatch. Gate 2's checks are all probe checks; gates 3 and 4's are those the
    rule owns (named after its experiments). Returns the defects and the gate's checks (``checks``,
    one per stated check) with the recomputed probe checks in place of the stated ones."""
    rule = gate_probes.RULES[number]
    own = [c for c in stated if number == 2 or rule.owns(c["name"])]
    rest = [checks[i] for i, c in enumerate(stated) if not (number == 2 or rule.owns(c["name"]))]
    merged = [(c.status, c.decides) for c in recomputed] + rest
    want = [c.record().to_json() for c in recomputed]
    stated_status = [(c["name"], c["status"]) for c in own]
    want_status = [(c["name"], c["status"]) for c in want]
    if stated_status != want_status:
        wrong = [f"{n!r} states {s!r}" for n, s in stated_status if (n, s) not in want_status]
        missing = [f"{n!r} {s}" for n, s in want_status if (n, s) not in stated_status]
        return [
            ForgedVerdict(
                RECEIPT,
                f"gate {number}'s probe checks are not those its raw outputs and expectations give "
                f"({_summary(wrong)}); recomputed: {_summary(missing)}",
            )
        ], merged
    diffs = json_diff(own, want, f"gates[{number}].checks")
    found: list[BundleDefect] = []
    if diffs:
        found.append(
            ComparisonMismatch(RECEIPT, f"gate {number}'s probe checks differ from those recomputed: {_summary(diffs)}")
        )
    return found, merged


def deciding_defects(receipt: dict[str, Any]) -> list[BundleDefect]:
    """From /4 on, a fix marker ("#PR in code") never decides gates 3 and 4 (the probes do), and
    gate 3's read-integrity defence always does: a receipt that moves either is refused."""
    if "behaviour" not in receipt:
        return []
    found: list[BundleDefect] = []
    for gate in receipt["gates"]:
        if gate["number"] not in (3, 4):
            continue
        for check in gate["checks"]:
            marker = re.fullmatch(r"#\d+ in code", check["name"]) is not None
            if marker and check["decides"]:
                found.append(
                    RecordMismatch(RECEIPT, f"gate {gate['number']} check {check['name']!r} decides; markers do not")
                )
            if gate["number"] == 3 and check["name"] == "read-integrity defence" and not check["decides"]:
                found.append(RecordMismatch(RECEIPT, "gate 3's read-integrity defence is stated as not deciding"))
    return found


def gates_probe_defects(bundle: Bundle) -> list[BundleDefect]:
    """The behavioural gates' probe records agree with the raw outputs they cite: where each sits
    (raw/gate<N>/<experiment>/<probe>.json), a problem only without an output, and the
    configuration the probe set and the calls its mocks absorbed exactly the output's (absent
    only where the output records none: receipts written before probes recorded them)."""
    found: list[BundleDefect] = []
    for i, probe in enumerate(bundle.accepted_receipt["probes"]):
        where = f"probes[{i}] {probe['experiment']}/{probe['name']}"
        want = f"raw/gate{_probe_gate(probe)}/{probe['experiment']}/{probe['name']}.json"
        if probe["raw"] is None:
            if not (isinstance(probe["problem"], str) and probe["problem"]):
                found.append(RecordMismatch(RECEIPT, f"{where}: no output and no problem recorded"))
            doc: dict[str, Any] = {}
        elif probe["raw"]["path"] != want:
            found.append(CitationMisplaced(probe["raw"]["path"], f"{where}: expected {want}"))
            continue
        elif probe["raw"]["path"] not in bundle.raw_docs:
            continue  # unusable, reported by step 2
        else:
            doc = bundle.raw_docs[probe["raw"]["path"]]
            found += _probe_record(probe["raw"]["path"], doc, probe)
        for key in ("configuration", "absorbed"):
            derived = list(doc.get(key) or [])
            if key not in probe and not derived:
                continue
            if key not in probe:
                found.append(
                    RecordMismatch(RECEIPT, f"{where}: {key} is missing; its raw output records {len(derived)}")
                )
                continue
            diffs = json_diff(probe[key], derived, f"probes[{i}].{key}")
            if diffs:
                found.append(RecordMismatch(RECEIPT, f"{where}: {key} differs from the raw output: {_summary(diffs)}"))
    return found


# --- sweep receipts (one experiment on many releases) ----------------------------------------


def step_sweep_consistency(bundle: Bundle) -> StepResult:
    """Cited files are the manifest's and where they belong; each release's classification and
    the summary are recomputed from the raw outputs and the bundled experiment's [expect]; the
    release set is the listing's range (verify/sweep_set), the observed range follows from the
    releases, and README.md and timeline.svg are what kvprobe renders from the receipt."""
    receipt = bundle.accepted_receipt
    typed = SweepReceipt.from_json(receipt)  # step 2 held it to the sweep receipt schema
    exp = typed.experiment
    notes: list[str] = []
    cited = [("experiment.file", {"path": exp.file, "sha256": exp.sha256}), *gates_citations(receipt["releases"])]
    defects = citation_defects(cited, bundle.listed()) + sweep_placement_defects(typed)
    defects += release_set_defects(receipt, notes)
    if typed.algorithm != sweep.ALGORITHM:
        defects.append(
            ComparisonAlgorithmUnknown(
                RECEIPT, f"classified by {typed.algorithm!r}; this kvprobe computes {sweep.ALGORITHM!r}"
            )
        )
    else:
        defects += sweep_recompute_defects(bundle)
    defects += range_defects(receipt) + rendered_defects(bundle)
    if bundle.experiment is not None:
        defects += sweep_experiment_defects(bundle, typed)
    return step_result(
        4,
        defects,
        f"{len(typed.releases)} release classifications recomputed from raw outputs; the release set checked "
        f"against the listing ({len(typed.listing.selected)} in the range); README.md and {TIMELINE} re-rendered",
        notes,
    )


def sweep_placement_defects(receipt: SweepReceipt) -> list[BundleDefect]:
    """Raw outputs sit under raw/<their release>/probes/, sources under probes/<experiment id>/."""
    exp_id, exp_file = receipt.experiment.id, receipt.experiment.file
    found = _duplicates([r.version for r in receipt.releases], "releases")
    if exp_file != f"{PROBES_DIR}/{exp_id}/experiment.toml":
        found.append(CitationMisplaced(exp_file, f"expected probes/{exp_id}/experiment.toml"))
    for release in receipt.releases:
        for probe in release.probes:
            if not probe.source.path.startswith(f"{PROBES_DIR}/{exp_id}/"):
                found.append(CitationMisplaced(probe.source.path, f"expected under probes/{exp_id}/"))
            expected = f"raw/{release.version}/probes/{probe.name}.json"
            if probe.raw is not None and probe.raw.path != expected:
                found.append(CitationMisplaced(probe.raw.path, f"release {release.version}: expected {expected}"))
    return found


def sweep_recompute_defects(bundle: Bundle) -> list[BundleDefect]:
    receipt = bundle.accepted_receipt
    found: list[BundleDefect] = []
    for release in receipt["releases"]:
        docs = {}
        for probe in release["probes"]:
            if probe["raw"] is not None and probe["raw"]["path"] not in bundle.raw_docs:
                return [RecomputeFailed(RECEIPT, f"{probe['raw']['path']} is unusable (step 2): not recomputed")]
            if probe["raw"] is not None:
                docs[probe["name"]] = bundle.raw_docs[probe["raw"]["path"]]
        try:
            typed = ReleaseRecord.from_json(release)
            got = sweep.classify_release(
                receipt["expectations"], docs, sweep.release_problems(typed.problem, typed.probes)
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            return [RecomputeFailed(RECEIPT, f"raw outputs cannot be classified: {type(exc).__name__}: {exc}")]
        stated = release["classification"]
        if stated["overall"] != got["overall"]:
            found.append(
                ForgedVerdict(
                    RECEIPT,
                    f"release {release['version']} is stated {stated['overall']!r}; its raw outputs give "
                    f"{got['overall']!r}",
                )
            )
        diffs = json_diff(stated, got, f"releases[{release['version']}].classification")
        if diffs:
            found.append(ComparisonMismatch(RECEIPT, f"{len(diffs)} differences recomputed: {_summary(diffs)}"))
    diffs = json_diff(receipt["summary"], sweep.summary(SweepReceipt.from_json(receipt).releases), "summary")
    if diffs:
        found.append(ForgedVerdict(RECEIPT, f"the summary does not follow from the releases: {_summary(diffs)}"))
    return found


def sweep_experiment_defects(bundle: Bundle, receipt: SweepReceipt) -> list[BundleDefect]:
    """The bundled experiment.toml is the one the receipt names, with the same [expect]."""
    data, rel = bundle.experiment, receipt.experiment.file
    assert data is not None, "called only when step 2 read the experiment"
    found = _experiment_digest_defects(bundle)
    expect = {side: data.get("expect", {}).get(side, {}) for side in SIDES}
    diffs = json_diff(receipt.expectations, expect, "expectations")
    if diffs:
        found.append(ExpectationsMismatch(rel, f"[expect] differs from receipt.expectations: {_summary(diffs)}"))
    # the facts an export quotes (title, fix, vulnerability) are the bundled file's, as for a run
    stated = {k: v for k, v in receipt.experiment.to_json().items() if k != "sha256"}
    declared = {k: v for k, v in _experiment_view(data, "")["experiment"].items() if k not in ("layer", "profile")}
    diffs = json_diff(stated, declared, "experiment")
    if diffs:
        found.append(ExperimentMismatch(rel, f"the receipt disagrees with the bundled experiment: {_summary(diffs)}"))
    if data["profile"] != receipt.profile.name:
        found.append(
            ExperimentMismatch(
                rel, f"profile {receipt.profile.name!r} is not the bundled experiment's ({data['profile']!r})"
            )
        )
    return found + sweep_wheel_defects(receipt, data)


def sweep_wheel_defects(receipt: SweepReceipt, data: dict[str, Any]) -> list[BundleDefect]:
    """Each release's wheel is a wheel of the package the experiment's wheel pins name, at that
    release: `verify --rerun` asks the index for exactly it, so a bundle must not choose what pip
    resolves (a path, another package, an sdist)."""
    pins = [p for p in (data.get("pins") or {}).values() if isinstance(p, dict) and p.get("kind") == "wheel"]
    packages = {side["package"] for p in pins for side in (p.get("base"), p.get("head")) if isinstance(side, dict)}
    found: list[BundleDefect] = []
    for release in receipt.releases:
        wheel, version = release.wheel, release.version
        if wheel is None:
            continue
        if (
            wheel.package not in packages
            or wheel.version != version
            or not names_release(wheel.file, wheel.package, version)
        ):
            found.append(
                PinMismatch(
                    RECEIPT,
                    f"release {version}: wheel {wheel.package!r} {wheel.version!r} file {wheel.file!r} is "
                    f"not a wheel of {' or '.join(sorted(map(repr, packages))) or 'a package the experiment pins'} "
                    f"at {version}",
                )
            )
    return found + _pinned_release_defects(receipt, pins)


def _pinned_release_defects(receipt: SweepReceipt, pins: list[dict[str, Any]]) -> list[BundleDefect]:
    """A release the bundled experiment pins by sha256 is that wheel in the listing and the
    release alike: two releases' digests swapped shows here without asking the index."""
    pinned = {}
    for pin in pins:
        for side in (pin.get("base"), pin.get("head")):
            if isinstance(side, dict) and isinstance(side.get("version"), str):
                pinned[version_key(side["version"])] = (side.get("file"), side.get("sha256"))
    recorded = [(e.version, e.file, e.sha256) for e in receipt.listing.selected if e.file is not None]
    recorded += [(r.version, r.wheel.file, r.wheel.sha256) for r in receipt.releases if r.wheel is not None]
    found: list[BundleDefect] = []
    for version, file, digest in recorded:
        want = pinned.get(version_key(version))
        if want is not None and want != (file, digest):
            found.append(
                PinMismatch(
                    RECEIPT,
                    f"release {version}: {file} sha256 {digest} is not the wheel the bundled experiment pins for "
                    f"{version} ({want[0]} sha256 {want[1]})",
                )
            )
    return found

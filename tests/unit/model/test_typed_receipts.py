"""Typed all the way: one entry (``model.load``) turns an accepted receipt into its model, every
reader past it reads attributes, and statuses, verdicts, outcomes and sweep classes are enums
the CLI's exit codes are keyed by."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from kvprobe import schema
from kvprobe.errors import SchemaError
from kvprobe.files import json_bytes
from kvprobe.model import gates_receipt, receipt, sweep_receipt
from kvprobe.model.load import READS, load
from kvprobe.model.records import GateStatus, SweepClass, Verdict
from kvprobe.verify.result import VerifyOutcome
from tests import sources

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "kvprobe"
COMMITTED = sorted((ROOT / "bundles").glob("*/receipt.json"))

# --- model.load ----------------------------------------------------------------------------


def test_there_are_committed_receipts_of_each_kind_the_bundles_hold():
    kinds = {type(load(json.loads(p.read_bytes()))) for p in COMMITTED}
    assert kinds == {receipt.Receipt, sweep_receipt.SweepReceipt}


@pytest.mark.parametrize("path", COMMITTED, ids=[p.parent.name for p in COMMITTED])
def test_every_committed_receipt_loads_to_its_model_and_writes_back_the_same_bytes(path):
    data = path.read_bytes()
    typed = load(json.loads(data))
    assert isinstance(typed, READS[typed.schema])
    assert json_bytes(typed.to_json()) == data


def test_load_reads_every_receipt_version_verify_accepts_and_nothing_else():
    """Each receipt schema id kvprobe.schema knows has a model; a retired or unknown id is refused."""
    known = {v for v in schema.KNOWN if "receipt/" in v}
    assert set(READS) == known
    for version in ("kvprobe.sweep-receipt/1", "kvprobe.receipt/2", None):
        with pytest.raises(SchemaError, match="not one this kvprobe reads"):
            load({"schema": version})


def test_statuses_and_classes_are_read_as_enums():
    run = load(json.loads(next(p for p in COMMITTED if "-sweep-" not in str(p)).read_bytes()))
    sweep = load(json.loads(next(p for p in COMMITTED if "-sweep-" in str(p)).read_bytes()))
    assert isinstance(run, receipt.Receipt) and isinstance(run.verdict, Verdict)
    assert isinstance(sweep, sweep_receipt.SweepReceipt)
    assert all(isinstance(r.classification.overall, SweepClass) for r in sweep.releases)


def test_enums_write_the_same_json_as_the_strings_they_replace():
    """StrEnum: a receipt, a --json document or an f-string holds the value, never 'Verdict.X'."""
    doc = {"v": Verdict.NOT_REPRODUCED, "g": GateStatus.UNKNOWN, "s": SweepClass.UNOBSERVED}
    assert json.dumps(doc) == '{"v": "not-reproduced", "g": "unknown", "s": "could-not-observe"}'
    assert f"{VerifyOutcome.SELF_CONSISTENT}" == "self-consistent"


# --- the CLI's exit tables -----------------------------------------------------------------


def test_every_verdict_status_and_outcome_has_its_exit_code():
    from kvprobe.cli import base

    assert {v: base.verdict_exit(v) for v in Verdict} == {
        Verdict.REPRODUCED: 0,
        Verdict.NOT_REPRODUCED: 1,
        Verdict.NO_EXPECTATIONS: 1,
        Verdict.COULD_NOT_OBSERVE: 3,
        Verdict.ERROR: 3,
    }
    deciding = [s for s in GateStatus if s is not GateStatus.INFO]  # info never decides a gate
    assert {s: base.gates_exit(s) for s in deciding} == {
        GateStatus.PASS: 0,
        GateStatus.FAIL: 1,
        GateStatus.UNKNOWN: 3,
    }
    assert {o: base.verify_exit(o) for o in VerifyOutcome} == {
        VerifyOutcome.VERIFIED: 0,
        VerifyOutcome.SELF_CONSISTENT: 0,
        VerifyOutcome.FAILED: 1,
        VerifyOutcome.COULD_NOT_RERUN: 3,
    }
    assert base.sweep_exit({"affected": ["1"], "fixed": ["2"]}) == 0
    assert base.sweep_exit({"affected": ["1"], "not-present": ["0"]}) == 3
    assert base.sweep_exit({"fixed": ["2"], "could-not-observe": ["3"]}) == 3
    # a selected release the profile does not serve was never observed: not "every release observed"
    assert base.sweep_exit({"affected": ["1"], "fixed": ["2"]}, ["0.9"]) == 3


# --- no reader indexes a receipt as a dict -------------------------------------------------

# Reads by a receipt key of documents that are not the receipt, or of a part the model keeps as
# a mapping: (module, function, key) -> what is read. Nothing else is exempt, and no module is.
NOT_A_RECEIPT_READ = {
    # a raw test-run document (raw/<side>/tests/...), held to the receipt's TestRecord
    ("kvprobe/verify/run_consistency.py", "_test_record", "side"),
    # the comparison rules.compare recomputes from the raw outputs (a dict), not the stated one
    ("kvprobe/verify/run_consistency.py", "recompute_defects", "verdict"),
    # the classification rules.sweep_classification recomputes (a dict), not the stated one
    ("kvprobe/verify/sweep_consistency.py", "sweep_recompute_defects", "overall"),
    # the bundled experiment.toml's view (consistency.experiment_view), not the receipt's experiment
    ("kvprobe/verify/sweep_consistency.py", "sweep_experiment_defects", "experiment"),
    # a cached sweep unit's key facts (unit_cache.key_facts), which name the experiment
    ("kvprobe/run/unit_cache.py", "entry_name", "experiment"),
}

# Keys of records kvprobe builds and reads before a receipt exists, which the receipt copies:
# a side's check results (run.side, run.runner: raw, junit, problem, repeats, pin, source,
# execution, tests_from, overlay, exit_code), the env build record and profile (env.venv:
# key, torch, torch_index, installer, lock_*, packages, serves, serves_why), a pytest report's tool, a
# wheel's materialized identity (fetched_via), the fork server's request (env), a server log's
# settings (mode, key, source, env) and rules.compare's observation
# rows and unstable table (unstable: run --repeat; a run receipt keeps both as the comparison's
# free-form rows and ``other``, a sweep its Classification.unstable). Reading these by key is
# reading those records, not a receipt.
SHARED_WITH_RECORDS = {
    "raw", "junit", "problem", "repeats", "pin", "source", "execution", "tests_from", "overlay", "exit_code",
    "key", "torch", "torch_index", "installer", "lock_name", "lock_sha256", "packages", "serves", "serves_why",
    "tool", "fetched_via", "env", "mode", "unstable",
}  # fmt: skip


def _receipt_keys() -> set[str]:
    """Field names of the receipt models that no other document kvprobe reads names: not the
    keys of its other schemas (experiment, probe output, manifest, ...), not SHARED_WITH_RECORDS."""
    fields: set[str] = set()
    for module in (receipt, sweep_receipt, gates_receipt):
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, receipt.Part) and dataclasses.is_dataclass(value):
                fields |= {f.name for f in dataclasses.fields(value)}
    others: set[str] = set()

    def collect(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "properties" and isinstance(value, dict):
                    others.update(value)
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    for path in (ROOT / "schemas").rglob("*.json"):
        if "receipt" not in path.name:
            collect(json.loads(path.read_text()))
    return fields - others - SHARED_WITH_RECORDS


def receipt_reads(root: Path) -> list[str]:
    """``path:line: code`` of every ``x["key"]`` or ``x.get("key")`` with a receipt key under
    ``root``'s kvprobe/, outside model/ and NOT_A_RECEIPT_READ; reads inside a ``from_json`` (a
    typed record reading its own document) are the typed entry, not a dict read."""
    keys = _receipt_keys()
    found: list[str] = []

    class Reads(ast.NodeVisitor):
        def __init__(self, rel: str) -> None:
            self.rel, self.functions = rel, [""]

        def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
            self.functions.append(node.name)
            self.generic_visit(node)
            self.functions.pop()

        def _key(self, node: ast.AST | None, where: ast.AST) -> None:
            if (
                isinstance(node, ast.Constant)
                and node.value in keys
                and self.functions[-1] != "from_json"
                and (self.rel, self.functions[-1], node.value) not in NOT_A_RECEIPT_READ
            ):
                found.append(f"{self.rel}:{where.lineno}: {ast.unparse(where)[:80]}")

        def visit_Subscript(self, node: ast.Subscript) -> None:
            if isinstance(node.ctx, ast.Load):
                self._key(node.slice, node)
            self.generic_visit(node)

        def visit_Call(self, node: ast.Call) -> None:
            if isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
                self._key(node.args[0], node)
            self.generic_visit(node)

    for path in sorted((root / "kvprobe").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("kvprobe/model/"):
            continue
        Reads(rel).visit(sources.parse(path))
    return found


def test_the_receipt_keys_are_the_ones_only_receipts_have():
    keys = _receipt_keys()
    assert {"comparison", "verdict", "sides", "pin_set", "releases", "listing", "classification", "overall"} <= keys
    assert {"gates", "inputs", "target", "run_id", "created_utc", "unserved", "observed", "test_summary"} <= keys
    assert not keys & {"schema", "name", "path", "sha256", "cases", "observations", "layer", "profile"}


def test_the_check_finds_dict_reads_of_a_receipt(tmp_path):
    """What the readers did before they were typed, under any variable name."""
    module = tmp_path / "kvprobe" / "exports" / "old.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "def f(r, doc, view):\n"
        "    a = r['comparison']['counts']\n"
        "    b = doc.get('listing')\n"
        "    c = view.receipt['verdict']\n"
        "    return [x['classification']['overall'] for x in r['releases']]\n"
    )
    (tmp_path / "kvprobe" / "model").mkdir()
    (tmp_path / "kvprobe" / "model" / "m.py").write_text("def g(d):\n    return d['verdict']\n")
    found = receipt_reads(tmp_path)
    assert [line.split(":")[1] for line in found] == ["2", "2", "3", "4", "5", "5", "5"]


def test_an_exemption_covers_its_one_function_and_key_only(tmp_path):
    module = tmp_path / "kvprobe" / "verify" / "run_consistency.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "def recompute_defects(comparison, receipt):\n"
        "    return comparison['verdict'], receipt['overall']\n"
        "def other(comparison):\n"
        "    return comparison['verdict']\n"
    )
    found = receipt_reads(tmp_path)
    assert [line.split(":")[1] for line in found] == ["2", "4"]


@pytest.mark.parametrize("path,function,key", sorted(NOT_A_RECEIPT_READ))
def test_each_exemption_names_a_read_that_is_there(path, function, key):
    """No stale exemption: the function exists and reads that key."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    (fn,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function]
    keys = {n.slice.value for n in ast.walk(fn) if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant)}
    assert key in keys


def test_no_module_outside_the_model_reads_a_receipt_as_a_dict():
    assert receipt_reads(ROOT) == []


def test_a_rerun_names_a_changed_class_by_its_value_not_the_enums_repr():
    from kvprobe.model.sweep_receipt import Classification
    from kvprobe.run.rerun_sweep import diff_sweeps

    sweep = load(json.loads(next(p for p in COMMITTED if "-sweep-" in str(p)).read_bytes()))
    assert isinstance(sweep, sweep_receipt.SweepReceipt)
    release = sweep.releases[-1]
    mixed = Classification(release.classification.algorithm, SweepClass.MIXED, (), release.classification.cases)
    rerun = dataclasses.replace(
        sweep, releases=(*sweep.releases[:-1], dataclasses.replace(release, classification=mixed))
    )
    docs = {r.version: {} for r in sweep.releases}
    found = [d.detail for d in diff_sweeps(sweep, rerun, [release.version], docs, docs)]
    assert f"release {release.version}: published '{release.classification.overall}', rerun 'mixed'" in found

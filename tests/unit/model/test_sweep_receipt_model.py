"""The typed sweep receipt (model/sweep_receipt) reads and writes every sweep receipt kvprobe
wrote, byte for byte, and reads only what the schema accepted: its fields are the schema's
keys, so a receipt with a key missing or added is refused by verify's step 2, never by the model."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from kvprobe import resources
from kvprobe.defects import SchemaViolation
from kvprobe.files import json_bytes, write_json
from kvprobe.model import sweep_receipt as model
from kvprobe.model.receipt import (
    CheckMode,
    EnvRecord,
    FileRef,
    InstallerRecord,
    ProbeRepeat,
    RunProbeRecord,
    ScopeRecord,
    Tool,
)
from kvprobe.model.records import Fix, Vulnerability
from kvprobe.names import SWEEP_RECEIPT_SCHEMA
from kvprobe.verify.steps import VerifyOptions, verify_dir

ROOT = Path(__file__).resolve().parents[3]
SWEEPS = sorted(
    p
    for p in (ROOT / "bundles").glob("*-sweep-*/receipt.json")
    if json.loads(p.read_bytes())["schema"] == SWEEP_RECEIPT_SCHEMA
)


def test_there_are_committed_sweep_receipts_to_read():
    assert len(SWEEPS) >= 2


@pytest.mark.parametrize("path", SWEEPS, ids=[p.parent.name for p in SWEEPS])
def test_a_committed_sweep_receipt_round_trips_to_the_same_bytes(path):
    data = path.read_bytes()
    receipt = model.SweepReceipt.from_json(json.loads(data))
    assert json_bytes(receipt.to_json()) == data
    assert isinstance(receipt.env, EnvRecord) and isinstance(receipt.experiment.fix, Fix)
    assert all(isinstance(p.source, FileRef) for r in receipt.releases for p in r.probes)
    assert {r.classification.overall for r in receipt.releases} == set(receipt.summary)


def test_an_env_no_unit_reported_is_written_as_the_empty_object_it_was_read_from():
    doc = json.loads(SWEEPS[0].read_bytes())
    doc["env"] = {}
    receipt = model.SweepReceipt.from_json(doc)
    assert receipt.env is None and receipt.to_json() == doc


def _schema() -> dict[str, Any]:
    return json.loads((resources.schemas_dir() / "sweep-receipt.schema.json").read_text())


def _parts() -> list[tuple[type, dict[str, Any]]]:
    """Each class of the model and the schema object it is written as."""
    root = _schema()
    props, release = root["properties"], root["$defs"]["release"]
    execution = release["properties"]["execution"]
    return [
        (model.SweepReceipt, root),
        (Tool, props["tool"]),
        (model.SweepExperimentRef, props["experiment"]),
        (Fix, props["experiment"]["properties"]["fix"]),
        (Vulnerability, props["experiment"]["properties"]["vulnerability"]),
        (model.ProfileRef, props["profile"]),
        (model.Listing, props["listing"]),
        (model.ListedRelease, props["listing"]["properties"]["selected"]["items"]),
        (model.ObservedRange, props["observed"]),
        (EnvRecord, props["env"]["oneOf"][1]),
        (InstallerRecord, root["$defs"]["installer"]),
        (ScopeRecord, props["evidence"]),
        (model.ReleaseRecord, release),
        (model.WheelRecord, release["properties"]["wheel"]),
        (RunProbeRecord, release["properties"]["probes"]["items"]),
        (ProbeRepeat, release["properties"]["probes"]["items"]["properties"]["repeats"]["items"]),
        (FileRef, root["$defs"]["fileref"]),
        (model.Classification, release["properties"]["classification"]),
        (model.ReleaseExecution, execution),
        (CheckMode, execution["properties"]["probes"]["items"]),
        (model.ReusedUnit, release["properties"]["reused"]),
    ]


@pytest.mark.parametrize("part,node", _parts(), ids=[p.__name__ for p, _ in _parts()])
def test_the_model_reads_exactly_the_keys_the_schema_lets_a_receipt_have(part, node):
    """A required key is a field the model always reads and writes; a key the schema lets a
    receipt leave out is an OPTIONAL field; no other key exists. So from_json never meets a
    missing key on a receipt step 2 accepted, and never drops one."""
    fields = dataclasses.fields(part)
    assert node.get("additionalProperties") is False
    assert set(node["properties"]) == {f.name for f in fields}
    assert set(node["required"]) == {f.name for f in fields if not f.metadata.get("optional")}


@pytest.mark.parametrize(
    "edit,found",
    [
        (lambda r: r["releases"][0].pop("problem"), "'problem' is a required property"),
        (lambda r: r["releases"][0].update(added="x"), "'added' was unexpected"),
        (lambda r: r["experiment"]["fix"].pop("summary"), "'summary' is a required property"),
        (lambda r: r.update(env={"key": "half an env"}), "env"),
    ],
    ids=["release-missing-problem", "release-added-key", "fix-missing-summary", "env-half-a-record"],
)
def test_a_receipt_with_a_key_missing_or_added_is_refused_at_step_2_before_any_typed_read(tmp_path, edit, found):
    bundle = tmp_path / "sweep"
    shutil.copytree(SWEEPS[0].parent, bundle)
    receipt = json.loads((bundle / "receipt.json").read_bytes())
    edit(receipt)
    write_json(bundle / "receipt.json", receipt)
    report = verify_dir(bundle, VerifyOptions())
    documents, consistency = report.steps[1], report.steps[3]
    assert documents.status == "fail"
    assert any(isinstance(d, SchemaViolation) and found in d.message for d in documents.defects)
    assert consistency.status == "skipped"  # step 4 (and the typed readers) never saw it


def test_a_sweep_receipt_of_a_retired_version_is_refused_with_why(tmp_path):
    """kvprobe.sweep-receipt/1 recorded no release listing: its release set cannot be checked,
    so it is refused at step 2 with the reason and what to do, not verified on faith."""
    bundle = tmp_path / "sweep"
    shutil.copytree(SWEEPS[0].parent, bundle)
    receipt = json.loads((bundle / "receipt.json").read_bytes())
    receipt["schema"] = "kvprobe.sweep-receipt/1"
    write_json(bundle / "receipt.json", receipt)
    report = verify_dir(bundle, VerifyOptions())
    (defect,) = report.steps[1].defects
    assert defect.code == "schema-unknown-version"
    assert "records no release listing" in defect.detail and "sweep again" in defect.detail
    assert report.outcome == "failed"

"""`kvprobe sweep`: release selection, the pure classification, OSV ranges, the timeline."""

from __future__ import annotations

import hashlib
import json
import xml.etree.ElementTree as ET

import pytest
from packaging.version import Version

from kvprobe import schema
from kvprobe.errors import UsageError
from kvprobe.evidence import sweep_view
from kvprobe.evidence.sweep_view import COLOURS
from kvprobe.exports import sweep_exports
from kvprobe.exports.bundle_view import BundleView
from kvprobe.exports.render import ExportOptions, render
from kvprobe.model.receipt import FileRef, ProbeRecord
from kvprobe.model.sweep_receipt import Listing, ProfileRef, ReleaseRecord, SweepReceipt
from kvprobe.names import SWEEP_RECEIPT_SCHEMA
from kvprobe.rules.sweep_classification import classify_release, release_problems, summary
from kvprobe.rules.sweep_listing import observed_range as typed_observed_range
from kvprobe.sources.releases import select, serves

INDEX = ["0.5.12", "0.5.13", "0.5.13.post1", "0.5.14", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"]

EXPECT = {
    "base": {"p/door": {"enqueued": True, "retired": False}, "p/valid": {"enqueued": True}},
    "head": {"p/door": {"enqueued": False, "retired": True}, "p/valid": {"enqueued": True}},
}


def case(name, observation="observed", **observations):
    doc = {"name": name, "status": "ok", "error": None, "observations": observations, "observation": observation}
    if observation == "not-present":
        doc["missing"] = ["Queue.add(is_rebootstrap=)"]
    if observation == "unobserved":
        doc["reason"] = "raised before the decision point"
    return doc


def docs(*cases):
    return {"p": {"probe": "p", "cases": list(cases)}}


# --- selection ---------------------------------------------------------------------------


def test_a_range_selects_every_release_from_its_first_through_its_last():
    assert select("0.5.13..0.5.20", INDEX) == ["0.5.13", "0.5.13.post1", "0.5.14", "0.5.19", "0.5.20"]


def test_lists_ranges_and_specifiers_add_up_and_come_back_ascending():
    assert select("0.5.23,0.5.19", INDEX) == ["0.5.19", "0.5.23"]
    assert select(">=0.5.21", INDEX) == ["0.5.21", "0.5.22", "0.5.23"]
    assert select(">=0.5.20,<0.5.22,0.5.12", INDEX) == ["0.5.12", "0.5.20", "0.5.21"]


@pytest.mark.parametrize("spec", ["", "0.5.99", "banana", "0.5.13..x", ">=zz"])
def test_a_bad_spec_or_a_release_not_on_the_index_is_a_usage_error(spec):
    with pytest.raises(UsageError):
        select(spec, INDEX)


def test_a_reversed_range_is_named_as_one_not_an_empty_selection():
    """``0.5.20..0.5.19`` selected nothing and the sweep said no release was served (#28)."""
    with pytest.raises(UsageError, match=r"0\.5\.20\.\.0\.5\.19 is a reversed range.*0\.5\.19\.\.0\.5\.20"):
        select("0.5.20..0.5.19", INDEX)


def test_a_profile_serves_only_the_releases_its_specifier_admits():
    assert [v for v in INDEX if serves(">=0.5.13", v)] == INDEX[1:]
    assert serves(None, "0.1.0")


# --- classification ----------------------------------------------------------------------


def test_a_release_behaving_as_base_is_affected_and_as_head_fixed():
    affected = classify_release(
        EXPECT, docs(case("door", enqueued=True, retired=False), case("valid", enqueued=True)), {}
    )
    fixed = classify_release(EXPECT, docs(case("door", enqueued=False, retired=True), case("valid", enqueued=True)), {})
    assert (affected["overall"], affected["cases"]["p/door"]["class"]) == ("affected", "affected")
    assert (fixed["overall"], fixed["cases"]["p/valid"]["class"]) == ("fixed", "control")


def test_a_case_that_did_not_reach_its_decision_point_makes_the_release_unobserved():
    got = classify_release(EXPECT, docs(case("door", "unobserved"), case("valid", enqueued=True)), {})
    assert got["overall"] == "could-not-observe"
    assert got["reasons"] == ["p/door: raised before the decision point"]


def test_a_missing_control_does_not_hide_the_release_but_a_missing_door_is_not_present():
    control_missing = classify_release(
        EXPECT, docs(case("door", enqueued=False, retired=True), case("valid", "not-present")), {}
    )
    door_missing = classify_release(EXPECT, docs(case("door", "not-present"), case("valid", enqueued=True)), {})
    assert control_missing["overall"] == "fixed"
    assert door_missing["overall"] == "not-present"
    assert "Queue.add(is_rebootstrap=)" in door_missing["reasons"][0]


def test_a_release_that_behaves_as_neither_side_is_mixed_and_says_how():
    got = classify_release(EXPECT, docs(case("door", enqueued=True, retired=True), case("valid", enqueued=True)), {})
    assert got["overall"] == "mixed"
    assert "p/door" in got["reasons"][0]


def test_a_failed_probe_or_wheel_is_could_not_observe_with_its_reason():
    probe = ProbeRecord("p", FileRef("probes/x/p.py", "0" * 64), None, 1, "probe p exited 1")
    got = classify_release(EXPECT, {}, release_problems(None, (probe,)))
    assert (got["overall"], got["reasons"]) == ("could-not-observe", ["p: probe p exited 1"])


def test_bools_are_not_numbers_when_matching_expectations():
    got = classify_release(EXPECT, docs(case("door", enqueued=1, retired=0), case("valid", enqueued=True)), {})
    assert got["overall"] == "mixed"


def observed_range(doc):
    """The observed range of a receipt document (its releases, listing, profile and spec)."""
    releases = tuple(ReleaseRecord.from_json(r) for r in doc["releases"])
    listing, profile = Listing.from_json(doc["listing"]), ProfileRef.from_json(doc["profile"])
    return typed_observed_range(releases, listing, profile, doc["spec"]).to_json()


def timeline_svg(doc):
    return sweep_view.timeline_svg(SweepReceipt.from_json(doc))


# --- exports -----------------------------------------------------------------------------


def release(version, overall):
    return {
        "version": version,
        "wheel": {
            "package": "sglang",
            "version": version,
            "file": f"sglang-{version}.whl",
            "sha256": "a" * 64,
            "fetched_via": "cache",
        },
        "problem": None,
        "probes": [],
        "classification": {"algorithm": "kvprobe.sweep/1", "overall": overall, "reasons": [], "cases": {}},
        "duration_s": 1.0,
    }


def listing(releases, unserved=(), older=("0.5.12",)):
    """A sweep's listing: ``older`` below the range, the releases, the unserved ones."""
    ran = [(r["version"], None) for r in releases]
    not_run = [(v, "older than the profile's floor: profile sglang-cpu serves >=0.5.13") for v in unserved]
    selected = sorted(ran + not_run, key=lambda row: Version(row[0]))
    return {
        "package": "sglang",
        "index": "https://pypi.org/simple",
        "read_utc": "2026-12-01T00:00:00Z",
        # ``older`` only where it is below the range: the listing's order makes neighbours
        "versions": sorted(
            {*(o for o in older if not selected or Version(o) < Version(selected[0][0])), *(v for v, _ in selected)},
            key=Version,
        ),
        "selected": [
            {"version": v, "file": f"sglang-{v}-py3-none-any.whl", "sha256": None, "problem": None, "not_run": why}
            for v, why in selected
        ],
    }


def receipt(classes, spec="0.5.13..0.5.23", unserved=()):
    releases = [release(v, c) for v, c in classes]
    doc = {
        "schema": SWEEP_RECEIPT_SCHEMA,
        "tool": {"name": "kvprobe", "version": "0"},
        "run_id": "experiment-b-sweep-x",
        "created_utc": "2026-12-01T00:00:00Z",
        "experiment": {
            "id": "experiment-b",
            "title": "t",
            "file": "probes/experiment-b/experiment.toml",
            "sha256": "b" * 64,
            "upstream": "https://github.com/sgl-project/sglang",
            "fix": {"prs": [36988], "release": "0.5.20", "summary": "s"},
            "vulnerability": {"id": "KVPROBE-2026-0001", "aliases": [], "fix_kind": "security"},
        },
        "profile": {"name": "sglang-cpu", "serves": ">=0.5.13"},
        "spec": spec,
        "listing": listing(releases, unserved),
        "algorithm": "kvprobe.sweep/1",
        "env": {},
        "host": {},
        "settings": {},
        "expectations": EXPECT,
        "releases": releases,
        "unserved": list(unserved),
        "summary": summary([ReleaseRecord.from_json(r) for r in releases]),
        "observed": {},
        "evidence": {"shows": "s", "does_not_show": [], "limits": []},
        "timings": {},
    }
    for entry in doc["listing"]["selected"]:
        entry["sha256"] = hashlib.sha256(entry["version"].encode()).hexdigest()
    doc["observed"] = observed_range(doc)
    return doc


def view(r):
    schema.validate(r, SWEEP_RECEIPT_SCHEMA, source="test")
    return BundleView(SweepReceipt.from_json(r), {"files": [{"path": "receipt.json", "sha256": "c" * 64}]}, "d" * 64)


def test_osv_fixed_event_only_where_the_next_release_on_the_index_was_observed_fixed():
    r = receipt([("0.5.18", "affected"), ("0.5.19", "affected"), ("0.5.20", "fixed"), ("0.5.21", "fixed")])
    assert sweep_exports.osv_ranges(SweepReceipt.from_json(r)) == [
        {"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "0.5.20"}]}
    ]  # nothing older observed unaffected: the start is unknown (tests/unit/exports/test_export_formats.py)


def test_osv_never_folds_an_unobserved_release_into_a_range():
    r = receipt([("0.5.18", "affected"), ("0.5.19", "could-not-observe"), ("0.5.20", "fixed")], unserved=["0.5.12"])
    assert sweep_exports.osv_ranges(SweepReceipt.from_json(r)) == [
        {"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"last_affected": "0.5.18"}]}
    ]
    opts = ExportOptions(issued="2026-12-01T00:00:00Z", osv_id="GHSA-xxxx-xxxx-xxxx")
    doc = json.loads(render(view(r), "osv", opts))
    affected = doc["affected"][0]
    assert affected["versions"] == ["0.5.18"]
    assert affected["database_specific"]["kvprobe_not_observed"] == {"0.5.19": "could-not-observe: "}
    assert affected["database_specific"]["kvprobe_not_served"] == ["0.5.12"]


def listed_too(r, *versions):
    """The index also lists ``versions`` (a list spec skipped them): they sit between releases."""
    r["listing"]["versions"] = sorted({*r["listing"]["versions"], *versions}, key=Version)
    r["observed"] = observed_range(r)
    return r


def test_osv_of_a_list_of_releases_claims_no_fixed_event():
    r = receipt([("0.5.19", "affected"), ("0.5.23", "fixed")], spec="0.5.19,0.5.23")
    listed_too(r, "0.5.20", "0.5.21", "0.5.22")
    assert sweep_exports.osv_ranges(SweepReceipt.from_json(r))[0]["events"] == [
        {"introduced": "0"},
        {"last_affected": "0.5.19"},
    ]


def test_osv_is_refused_for_a_fix_that_is_not_the_security_fix():
    r = receipt([("0.5.19", "affected")])
    r["experiment"]["vulnerability"]["fix_kind"] = "performance"
    with pytest.raises(UsageError):
        render(view(r), "osv", ExportOptions(issued="2026-12-01T00:00:00Z"))


def test_openvex_states_one_statement_per_observed_release():
    r = receipt([("0.5.18", "not-present"), ("0.5.19", "affected"), ("0.5.20", "fixed"), ("0.5.21", "mixed")])
    doc = json.loads(render(view(r), "openvex", ExportOptions(author="a <a@b>", issued="2026-12-01T00:00:00Z")))
    stated = [(s["products"][0]["@id"], s["status"]) for s in doc["statements"]]
    assert stated == [
        ("pkg:pypi/sglang@0.5.19", "affected"),
        ("pkg:pypi/sglang@0.5.20", "fixed"),
        ("pkg:pypi/sglang@0.5.21", "under_investigation"),
    ]


def test_the_timeline_has_one_box_per_release_in_its_classification_colour():
    r = receipt([("0.5.19", "affected"), ("0.5.20", "fixed")], unserved=["0.5.12"])
    root = ET.fromstring(timeline_svg(r))
    boxes = [
        e
        for e in root.iter("{http://www.w3.org/2000/svg}rect")
        if e.find("{http://www.w3.org/2000/svg}title") is not None
    ]
    titles = [(b.find("{http://www.w3.org/2000/svg}title").text, b.get("fill")) for b in boxes]
    assert titles == [
        ("0.5.12: not-served", COLOURS["not-served"][0]),
        ("0.5.19: affected", COLOURS["affected"][0]),
        ("0.5.20: fixed (first fixed release)", COLOURS["fixed"][0]),
    ]


# --- a feature added in head: the base expects the cases not-present ------------------------
FEATURE = {
    "base": {"p/check": {"not_present": ["m.Feature(option=)"]}, "p/off": {"not_present": ["m.Feature(option=)"]}},
    "head": {"p/check": {"aborted": True}, "p/off": {"aborted": False}},
}


def test_a_release_without_the_feature_is_not_present_not_affected():
    absent = case("check", "not-present"), case("off", "not-present")
    got = classify_release(FEATURE, docs(*absent), {})
    assert got["overall"] == "not-present"
    assert {c["class"] for c in got["cases"].values()} == {"not-present"}


def test_a_release_with_the_feature_behaves_as_head_and_an_absence_never_holds_of_observed_code():
    got = classify_release(FEATURE, docs(case("check", aborted=True), case("off", aborted=False)), {})
    # An observed case never holds as "expected not present": each is fixed (as head), not control.
    assert got["overall"] == "fixed" and {c["class"] for c in got["cases"].values()} == {"fixed"}
    got = classify_release(FEATURE, docs(case("check", aborted=False), case("off", aborted=False)), {})
    assert got["overall"] == "mixed" and got["cases"]["p/check"]["class"] == "neither"


def test_osv_never_folds_a_release_observed_unaffected_into_a_range():
    """The first range starts after the last release observed unaffected, not at "0", when an
    unobserved release stands between it and the oldest affected one."""
    r = receipt(
        [("0.5.17", "not-present"), ("0.5.18", "could-not-observe"), ("0.5.19", "affected"), ("0.5.20", "fixed")]
    )
    events = sweep_exports.osv_ranges(SweepReceipt.from_json(r))[0]["events"]
    assert events == [{"introduced": "0.5.18"}, {"fixed": "0.5.20"}]
    text = sweep_exports.introduced_text(sweep_exports.observations(SweepReceipt.from_json(r)), [{"events": events}])
    assert text.startswith("unknown, from 0.5.18: 0.5.17 was observed not-present") and "not observed" in text


def test_osv_range_takes_in_a_listed_release_the_sweep_skipped():
    r = receipt([("0.5.17", "not-present"), ("0.5.19", "affected")], spec="0.5.17,0.5.19")
    listed_too(r, "0.5.18")
    assert sweep_exports.osv_ranges(SweepReceipt.from_json(r))[0]["events"][0] == {"introduced": "0.5.18"}


def test_openvex_advises_only_a_later_release_observed_fixed():
    r = receipt([("0.5.18", "fixed"), ("0.5.19", "affected"), ("0.5.20", "fixed")])
    doc = json.loads(render(view(r), "openvex", ExportOptions(author="a <a@b>", issued="2026-12-01T00:00:00Z")))
    (affected,) = [s for s in doc["statements"] if s["status"] == "affected"]
    assert affected["action_statement"] == "Upgrade sglang to a later release kvprobe observed fixed (0.5.20)"

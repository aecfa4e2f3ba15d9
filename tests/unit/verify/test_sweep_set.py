"""A sweep's release set as evidence: the pure rules (why a release was not run, the observed
range) and step 4's checks of the listing, the releases and the rendered timeline."""

from __future__ import annotations

import hashlib
import xml.etree.ElementTree as ET

import pytest

from kvprobe.evidence import sweep_view
from kvprobe.model.sweep_receipt import SweepReceipt
from kvprobe.rules.sweep_listing import unserved_reason
from kvprobe.verify.sweep_set import range_defects, release_set_defects

SVG = "{http://www.w3.org/2000/svg}"
FLOOR = "older than the profile's floor: profile sglang-cpu serves >=0.5.13"


def entry(version, not_run=None, digest=None):
    return {
        "version": version,
        "file": f"sglang-{version}-py3-none-any.whl",
        "sha256": digest or hashlib.sha256(version.encode()).hexdigest(),
        "problem": None,
        "not_run": not_run,
    }


def release(version, overall):
    listed = entry(version)
    wheel = {"package": "sglang", "version": version, "file": listed["file"], "sha256": listed["sha256"]}
    return {
        "version": version,
        "wheel": {**wheel, "fetched_via": "cache"},
        "problem": None,
        "probes": [],
        "classification": {"algorithm": "kvprobe.sweep/1", "overall": overall, "reasons": [], "cases": {}},
        "duration_s": 1.0,
    }


def sweep(classes, spec="0.5.11..0.5.21", index=("0.5.10", "0.5.11", "0.5.12")):
    """A receipt of releases ``classes`` ([(version, class)]), 0.5.11 and 0.5.12 unserved."""
    releases = [release(v, c) for v, c in classes]
    unserved = [v for v in index if v != "0.5.10"]
    doc = {
        "schema": "kvprobe.sweep-receipt/2",
        "tool": {"name": "kvprobe", "version": "0"},
        "run_id": "experiment-b-sweep-x",
        "created_utc": "2026-12-01T00:00:00Z",
        "experiment": {
            "id": "experiment-b",
            "title": "t",
            "file": "probes/experiment-b/experiment.toml",
            "sha256": "0" * 64,
            "upstream": None,
            "fix": {"prs": [1], "release": None, "summary": "s"},
        },
        "env": {},
        "host": {},
        "settings": {},
        "expectations": {},
        "timings": {},
        "profile": {"name": "sglang-cpu", "serves": ">=0.5.13"},
        "spec": spec,
        "listing": {
            "package": "sglang",
            "index": "https://pypi.org/simple",
            "read_utc": "2026-12-01T00:00:00Z",
            "versions": [*index, *(v for v, _ in classes)],
            "selected": [*(entry(v, FLOOR) for v in unserved), *(entry(v) for v, _ in classes)],
        },
        "algorithm": "kvprobe.sweep/1",
        "releases": releases,
        "unserved": unserved,
        "summary": {},
        "evidence": {"shows": "s", "does_not_show": [], "limits": []},
    }
    doc["observed"] = {"algorithm": "", "oldest": None, "introduced": None, "first_fixed": None}
    doc["observed"] |= {"not_observed": [], "not_observed_reason": None}
    doc["observed"] = observed_range(doc)
    return doc


def typed(doc):
    """``doc`` typed as verify reads it."""
    return SweepReceipt.from_json(doc)


def observed_range(doc):
    """The observed range of a receipt document, as a receipt records it."""
    return sweep_view.recomputed_range(SweepReceipt.from_json(doc)).to_json()


def timeline_svg(doc):
    return sweep_view.timeline_svg(SweepReceipt.from_json(doc))


def render_readme(doc):
    return sweep_view.render_readme(SweepReceipt.from_json(doc))


B = [("0.5.13", "not-present"), ("0.5.19", "affected"), ("0.5.20", "affected"), ("0.5.21", "fixed")]


def codes(found):
    return [(d.code, d.detail) for d in found]


def test_a_release_below_the_profiles_floor_is_not_run_for_that_reason():
    assert unserved_reason("sglang-cpu", ">=0.5.13", "0.5.12") == FLOOR
    assert unserved_reason("sglang-cpu", ">=0.5.13", "0.5.13") is None
    assert unserved_reason("p", ">=0.5.13,!=0.5.15", "0.5.15") == "outside what profile p serves (>=0.5.13,!=0.5.15)"
    assert unserved_reason("p", None, "0.1") is None


def test_introduced_is_observed_only_where_a_not_present_release_precedes_the_first_affected():
    r = sweep(B)
    assert observed_range(r) == {
        "algorithm": "kvprobe.sweep-range/1",
        "oldest": "0.5.13",
        "introduced": "0.5.19",
        "first_fixed": "0.5.21",
        "not_observed": ["0.5.10", "0.5.11", "0.5.12"],
        "not_observed_reason": FLOOR,
    }
    unknown = sweep(B[1:])
    assert (observed_range(unknown)["introduced"], observed_range(unknown)["oldest"]) == (None, "0.5.19")


def test_the_observed_range_does_not_depend_on_the_order_releases_are_stored_in():
    r = sweep(B)
    shuffled = {**r, "releases": list(reversed(r["releases"]))}
    assert observed_range(shuffled) == observed_range(r)


def test_a_genuine_release_set_has_no_defects():
    r = sweep(B)
    assert release_set_defects(typed(r), []) == [] and range_defects(typed(r)) == []


@pytest.mark.parametrize(
    ("forge", "code", "words"),
    [
        # Order: the fixed release stored before the affected ones
        (lambda r: r["releases"].insert(1, r["releases"].pop(3)), "release-set", "out of order"),
        # Identity: 0.5.20.0 (== 0.5.20) as another release, with its listing entry
        (
            lambda r: (
                r["releases"].insert(3, {**release("0.5.20.0", "affected")}),
                r["listing"]["selected"].insert(5, entry("0.5.20.0")),
                r["listing"]["versions"].insert(5, "0.5.20.0"),
            ),
            "listing-mismatch",
            "twin",
        ),
        # Completeness: 0.5.20 deleted from the releases (the listing still has it)
        (lambda r: r["releases"].pop(2), "release-set", "incomplete"),
        # Completeness: 0.5.20 moved to unserved although the profile serves it
        (
            lambda r: (
                r["releases"].pop(2),
                r["unserved"].append("0.5.20"),
                r["listing"]["selected"][4].update(not_run=FLOOR),
            ),
            "release-set",
            "served by the profile",
        ),
        # Completeness: the spec rewritten while the listing says otherwise
        (lambda r: r.update(spec="0.5.10..0.5.21"), "listing-mismatch", "selects"),
        # Identity: two releases' wheel sha256 swapped (release and listing alike)
        (
            lambda r: [
                e.update(sha256=hashlib.sha256(b"0.5.19").hexdigest())
                for e in (r["listing"]["selected"][4], r["releases"][2]["wheel"])
            ],
            "pin-mismatch",
            "two releases",
        ),
        # Identity: a wheel file name of another release
        (
            lambda r: [
                e.update(file="sglang-0.5.19-py3-none-any.whl")
                for e in (r["listing"]["selected"][4], r["releases"][2]["wheel"])
            ],
            "pin-mismatch",
            "is not a wheel of sglang 0.5.20",
        ),
        # a release's wheel is not the one its listing recorded
        (lambda r: r["releases"][2]["wheel"].update(sha256="f" * 64), "pin-mismatch", "not the one the listing"),
        # the profile's floor moved to hide releases
        (lambda r: r["profile"].update(serves=">=0.5.20"), "release-set", "serves '>=0.5.13' in this kvprobe"),
        # why the profile does not serve the older ones, rewritten (receipts before it state none)
        (lambda r: r["profile"].update(serves_why="forged"), "release-set", "says why it serves only >=0.5.13"),
    ],
)
def test_each_forged_release_set_is_a_defect(forge, code, words):
    r = sweep(B)
    forge(r)
    found = codes(release_set_defects(typed(r), []))
    assert any(c == code and words in detail for c, detail in found), found


def test_a_forged_introduced_or_fixed_boundary_is_a_defect():
    r = sweep(B)
    r["observed"].update(introduced=None, first_fixed="0.5.20")
    (found,) = codes(range_defects(typed(r)))
    assert found[0] == "range-mismatch" and "first_fixed" in found[1] and "introduced" in found[1]


def test_the_timeline_puts_the_oldest_release_left_whatever_the_receipt_order_and_marks_the_first_fixed():
    r = sweep(B)
    r["releases"].reverse()
    root = ET.fromstring(timeline_svg(r))
    titles = [t.text for e in root.iter(f"{SVG}rect") if (t := e.find(f"{SVG}title")) is not None]
    assert titles == [
        "0.5.11: not-served",
        "0.5.12: not-served",
        "0.5.13: not-present",
        "0.5.19: affected",
        "0.5.20: affected",
        "0.5.21: fixed (first fixed release)",
    ]
    assert not [e for e in root.iter() if e.tag.split("}")[-1] in ("script", "foreignObject")]


def test_readme_says_the_oldest_release_observed_and_why_older_ones_were_not():
    text = render_readme({**sweep(B), "summary": {"affected": ["0.5.20", "0.5.19"]}})
    assert "oldest release observed: 0.5.13; not observed: 0.5.10, 0.5.11, 0.5.12 (older than the profile" in text
    assert "Introduced (observed): 0.5.19" in text and "First fixed release: 0.5.21." in text
    assert "- affected: 0.5.19, 0.5.20" in text


def test_releases_outside_the_spec_are_not_observed_for_the_spec_and_the_profiles_floor_both():
    r = sweep(B, spec="0.5.13..0.5.21")
    r["listing"]["selected"] = [e for e in r["listing"]["selected"] if e["not_run"] is None]
    r["unserved"] = []
    assert release_set_defects(typed(r), []) == []
    assert observed_range(r)["not_observed_reason"] == f"outside --releases 0.5.13..0.5.21; {FLOOR}"


def test_a_release_not_served_says_why_the_profile_cannot_import_it():
    """The profile's serves_why goes into every not-run reason (listing, observed range), and a
    receipt that states it verifies against the installed profile's; one without it, as before."""
    from kvprobe.env.venv import load_profile

    why = load_profile("sglang-cpu").serves_why
    assert why and "sgl_kernel" in why
    assert unserved_reason("sglang-cpu", ">=0.5.13", "0.5.5", why) == f"{FLOOR}: {why}"
    assert unserved_reason("sglang-cpu", ">=0.5.13", "0.5.13", why) is None
    r = sweep(B)
    r["profile"]["serves_why"] = why
    for listed in r["listing"]["selected"]:
        if listed["not_run"]:
            listed["not_run"] = f"{FLOOR}: {why}"
    r["observed"] = observed_range(r)
    assert r["observed"]["not_observed_reason"] == f"{FLOOR}: {why}"
    assert release_set_defects(typed(r), []) == []
    # the listing keeping the reason without the why is a receipt that does not add up
    r["listing"]["selected"][0]["not_run"] = FLOOR
    assert any("the listing says not run" in detail for _, detail in codes(release_set_defects(typed(r), [])))

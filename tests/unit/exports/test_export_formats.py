"""OpenVEX naming, authorship and timestamps; in-toto checked with the official bindings;
formats are assertions in kvprobe's schema checks (jsonschema's format checker)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace

import pytest
from click.testing import CliRunner
from google.protobuf import json_format
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement

from kvprobe import resources, schema
from kvprobe.cli import main
from kvprobe.errors import UsageError
from kvprobe.exports import intoto, render
from kvprobe.exports import sweep_exports as sweep
from kvprobe.exports.bundle_view import BundleView
from kvprobe.model.sweep_receipt import SweepReceipt
from kvprobe.verify.pack import pack
from tests import forge
from tests.unit.evidence import test_sweep
from tests.unit.exports.test_report import COMMITS, make_receipt, vex, view_of


def official(text: str) -> Statement:
    """Parse with the in-toto-attestation bindings (unknown fields refused) and validate."""
    statement = Statement.copy_from_pb(json_format.Parse(text, statement_pb2.Statement()))
    statement.validate()
    return statement


def receipt_with(**vulnerability):
    receipt = make_receipt()
    receipt["experiment"]["vulnerability"] = {"id": "KVPROBE-2026-0001", "aliases": [], "fix_kind": "security"}
    receipt["experiment"]["vulnerability"].update(vulnerability)
    schema.validate(receipt, "kvprobe.receipt/1", source="test receipt")
    return receipt


def verified_bundle(root, fix_kind="security"):
    """A bundle `report` accepts (it verifies, tests/forge.py) whose experiment states ``fix_kind``."""
    bundle = forge.build(root)
    rel = f"probes/{forge.EXP_ID}/experiment.toml"
    toml = bundle / rel
    toml.write_bytes(toml.read_bytes().replace(b'fix_kind = "security"', f'fix_kind = "{fix_kind}"'.encode(), 1))

    def change(receipt):
        receipt["experiment"]["vulnerability"]["fix_kind"] = fix_kind
        receipt["experiment"]["sha256"] = forge.sha(toml.read_bytes())

    forge.edit_receipt(bundle, change)
    forge.recite(bundle, rel)
    return bundle


def report(bundle, *args, env=None):
    """`kvprobe report`. The forged bundles here are of experiments kvprobe does not ship and
    nothing anchors them, so an advisory format is asked for with --allow-unanchored (its
    refusal without it is tests/attacks/test_attack_report.py's)."""
    advisory = any(a in ("openvex", "osv") for a in args) and "--expect-manifest-sha256" not in args
    extra = ["--allow-unanchored"] if advisory else []
    return CliRunner().invoke(main, ["report", str(bundle), *args, *extra], env=env, catch_exceptions=False)


# --------------------------------------------------------------------- formats checked


def test_openvex_timestamp_that_is_no_date_time_fails_validation():
    doc = vex(view_of(make_receipt()))
    assert schema.errors(doc, "openvex/0.2.0") == []
    doc["timestamp"] = "yesterday at noon"
    assert schema.errors(doc, "openvex/0.2.0") == ["timestamp: 'yesterday at noon' is not a 'date-time'"]
    doc["timestamp"], doc["@id"] = "2026-01-01T00:00:00Z", "not an iri"
    assert schema.errors(doc, "openvex/0.2.0") == ["@id: 'not an iri' is not a 'iri'"]


@pytest.mark.parametrize(
    ("value", "iri", "uri"),
    [
        ("https://example.org/vex/1", True, True),
        ("pkg:pypi/sglang@0.5.21", True, True),
        ("https://例え.jp/ü", True, False),
        ("https://example.org/a b", False, False),
        ("no-scheme/path", False, False),
        ("https://example.org/<script>", False, False),
        ("https://example.org/\x1b[31m", False, False),
    ],
)
def test_iri_and_uri_formats_are_checked(value, iri, uri):
    checker = schema._format_checker()
    assert checker.conforms(value, "iri") is iri
    assert checker.conforms(value, "uri") is uri


# ----------------------------------------------------------------- vulnerability names


def test_openvex_names_exactly_the_declared_id_and_aliases():
    receipt = receipt_with(id="CVE-2026-12345", aliases=["GHSA-8r8j-xvfj-36f9", "KVPROBE-2026-0001"])
    doc = vex(view_of(receipt))
    for statement in doc["statements"]:
        assert statement["vulnerability"]["name"] == "CVE-2026-12345"
        assert statement["vulnerability"]["aliases"] == ["GHSA-8r8j-xvfj-36f9", "KVPROBE-2026-0001"]
    assert not any("SGLANG-PD-KV" in json.dumps(s) for s in doc["statements"])


@pytest.mark.parametrize("kind", ["performance", "hardening", "correctness"])
def test_a_fix_that_is_not_a_security_fix_is_not_exported(tmp_path, kind):
    with pytest.raises(UsageError, match=f"tests a {kind} fix, not the security fix of KVPROBE-2026-0001:"):
        vex(view_of(receipt_with(fix_kind=kind)))
    verified_bundle(tmp_path / "b", kind)
    out = tmp_path / "vex.json"
    result = report(tmp_path / "b", "--format", "openvex", "--author", "x", "-o", str(out))
    assert result.exit_code == 2
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_a_receipt_without_a_vulnerability_is_not_exported():
    receipt = make_receipt()
    del receipt["experiment"]["vulnerability"]
    with pytest.raises(UsageError, match=r"records no vulnerability id .*\[vulnerability\] table"):
        vex(view_of(receipt))


def test_receipt_schema_refuses_an_unnamespaced_id():
    receipt = make_receipt()
    receipt["experiment"]["vulnerability"]["id"] = "SGLANG-PD-KV-123"
    [error] = schema.errors(receipt, "kvprobe.receipt/1")
    assert error.startswith("experiment.vulnerability.id: 'SGLANG-PD-KV-123' does not match")


# --------------------------------------------------------------- authorship and time


def test_openvex_needs_an_author_and_records_the_role(tmp_path):
    verified_bundle(tmp_path / "b")
    missing = report(tmp_path / "b", "--format", "openvex")
    assert missing.exit_code == 2 and "--format openvex needs --author" in missing.stderr
    result = report(
        tmp_path / "b",
        "--format",
        "openvex",
        "--author",
        "Security Team <sec@example.com>",
        "--author-role",
        "Document Creator",
        env={"SOURCE_DATE_EPOCH": "1767225600"},
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["author"], doc["role"]) == ("Security Team <sec@example.com>", "Document Creator")
    assert doc["timestamp"] == "2026-01-01T00:00:00Z"  # issued: SOURCE_DATE_EPOCH
    assert {s["timestamp"] for s in doc["statements"]} == {"2026-01-01T00:00:00Z"}  # the run's created_utc


def test_author_is_taken_by_every_format_and_a_bad_epoch_is_refused(tmp_path):
    """A loop over formats with one --author works: markdown names the author, intoto ignores it."""
    verified_bundle(tmp_path / "b")
    for fmt in ("markdown", "openvex", "intoto"):
        result = report(tmp_path / "b", "--format", fmt, "--author", "Sec <s@x>")
        assert result.exit_code == 0, (fmt, result.output)
    assert "**Reported by:** Sec &#60;s@x&#62;" in report(tmp_path / "b", "--author", "Sec <s@x>").stdout
    role_alone = report(tmp_path / "b", "--format", "openvex", "--author-role", "vendor")
    assert role_alone.exit_code == 2 and "--author-role goes with --author" in role_alone.stderr
    bad = report(tmp_path / "b", "--format", "openvex", "--author", "x", env={"SOURCE_DATE_EPOCH": "yesterday"})
    assert bad.exit_code == 2 and "SOURCE_DATE_EPOCH" in bad.stderr


def test_openvex_issue_time_defaults_to_now_and_is_a_date_time(tmp_path):
    verified_bundle(tmp_path / "b")
    result = report(tmp_path / "b", "--format", "openvex", "--author", "x")
    doc = json.loads(result.stdout)
    assert doc["timestamp"] > "2026-01-01T00:00:00Z"
    assert schema.errors(doc, "openvex/0.2.0") == []


# ----------------------------------------------------------------------------- in-toto


@pytest.mark.parametrize("pins", ["wheels", "commits"])
def test_intoto_statement_passes_the_official_bindings(pins):
    view = view_of(make_receipt(COMMITS) if pins == "commits" else make_receipt())
    statement = official(json.dumps(intoto.intoto(view)))
    assert statement.pb.predicate_type == intoto.PREDICATE_TYPE
    assert {s.name for s in statement.pb.subject} >= {"receipt.json", "manifest.json"}


def test_intoto_subject_archive_is_the_packed_bundle(tmp_path, bundle):
    packed = pack(bundle, tmp_path / "b.tar.gz")
    result = report(bundle, "--format", "intoto", "--subject-archive", str(packed.archive))
    assert result.exit_code == 0, result.output
    statement = official(result.stdout)
    subjects = {s.name: dict(s.digest) for s in statement.pb.subject}
    assert subjects["b.tar.gz"] == {"sha256": packed.sha256}
    assert subjects["manifest.json"] == {"sha256": packed.manifest_sha256}


def test_intoto_subject_archive_of_another_bundle_is_refused(tmp_path, bundle):
    other = forge.build(tmp_path / "other")
    forge.edit_receipt(other, lambda r: r["host"].update(system="Linux, another run"))
    packed = pack(other, tmp_path / "other.tar.gz")
    result = report(bundle, "--format", "intoto", "--subject-archive", str(packed.archive))
    assert result.exit_code == 2 and "it is another bundle" in result.stderr
    not_tar = tmp_path / "x.tar.gz"
    not_tar.write_bytes(b"plain")
    result = report(bundle, "--format", "intoto", "--subject-archive", str(not_tar))
    assert result.exit_code == 2 and "x.tar.gz: not a readable .tar.gz" in result.stderr
    wrong = report(bundle, "--format", "markdown", "--subject-archive", str(packed.archive))
    assert wrong.exit_code == 2 and "goes with --format intoto" in wrong.stderr


# ------------------------------------------------------------- vendored schemas (#25)


def test_vendored_schemas_are_the_files_their_readme_cites():
    """schemas/vendor/README.md records each upstream file's sha256: the copies are those bytes."""
    vendor = resources.schemas_dir() / "vendor"
    readme = (vendor / "README.md").read_text(encoding="utf-8")
    for name in ("osv-schema.json", "openvex-0.2.0.schema.json"):
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{name}`"))
        cited = re.findall(r"sha256 `([0-9a-f]{64})`", row)
        assert cited == [hashlib.sha256((vendor / name).read_bytes()).hexdigest()], name
    assert "4961d8e1" not in readme.split("The copy of the OpenVEX schema carried here before")[0]
    osv_schema = json.loads((vendor / "osv-schema.json").read_text())
    assert "ASB-A|PUB-A" in osv_schema["$defs"]["prefix"]["pattern"]  # 1.7.x: ids need a known prefix


# ------------------------------------------------------------------- OSV records (#22)

OSV_OPTS = render.ExportOptions(issued="2026-12-01T00:00:00Z")


def sweep_receipt(classes, *, spec="0.5.10..0.5.23", unserved=(), vulnerability=None):
    """A sweep receipt (through the sweep unit tests' builder) with ``classes`` in the order given."""
    r = test_sweep.receipt(classes, spec=spec, unserved=unserved)
    if vulnerability:
        r["experiment"]["vulnerability"].update(vulnerability)
    return r


def osv_of(r, **opts):
    return json.loads(render.render(test_sweep.view(r), "osv", replace(OSV_OPTS, **opts)))


def events(r):
    return [x["events"] for x in sweep.osv_ranges(SweepReceipt.from_json(r))]


def test_introduced_is_the_observed_boundary_after_a_release_where_the_code_is_not_present():
    r = sweep_receipt([("0.5.10", "not-present"), ("0.5.11", "affected"), ("0.5.12", "affected"), ("0.5.13", "fixed")])
    assert events(r) == [[{"introduced": "0.5.11"}, {"fixed": "0.5.13"}]]
    doc = osv_of(r, osv_id="GHSA-xxxx-xxxx-xxxx")
    assert schema.errors(doc, "osv") == []
    assert doc["affected"][0]["database_specific"]["kvprobe_introduced"].startswith("observed: 0.5.10")


def test_introduced_is_0_where_no_older_release_was_observed_unaffected_never_the_profile_floor():
    """The profile serves >=0.5.13 (test_sweep's receipt names a profile floor): a sweep whose
    oldest release is affected cannot tell where the bug came in."""
    r = sweep_receipt([("0.5.13", "affected"), ("0.5.14", "affected"), ("0.5.15", "fixed")], spec="0.5.13..0.5.15")
    r["profile"]["serves"] = ">=0.5.13"
    assert events(r) == [[{"introduced": "0"}, {"fixed": "0.5.15"}]]
    specific = osv_of(r, osv_id="GHSA-xxxx-xxxx-xxxx")["affected"][0]["database_specific"]
    assert specific["kvprobe_introduced"].startswith('unknown ("0")')
    assert specific["kvprobe_not_observed_before"]["older"] == (
        "every release older than 0.5.13: not observed (outside --releases 0.5.13..0.5.15; older than the "
        "profile's floor: profile sglang-cpu serves >=0.5.13)"
    )
    # a release that could not be observed is no boundary either
    r = sweep_receipt([("0.5.10", "could-not-observe"), ("0.5.11", "affected"), ("0.5.12", "fixed")])
    assert events(r) == [[{"introduced": "0"}, {"fixed": "0.5.12"}]]
    assert osv_of(r, osv_id="GHSA-xxxx-xxxx-xxxx")["affected"][0]["database_specific"]["kvprobe_not_observed_before"][
        "listed_not_observed"
    ] == ["0.5.10"]


def test_releases_selected_but_not_served_are_not_observed_never_not_swept():
    """A range reaching below the profile's floor selected those releases: the record says
    why they were not observed (the receipt's recomputed reason), not that they were not swept."""
    r = sweep_receipt(
        [("0.5.13", "affected"), ("0.5.14", "affected"), ("0.5.15", "fixed")],
        spec="0.5.10..0.5.15",
        unserved=["0.5.10", "0.5.11", "0.5.12"],
    )
    assert events(r) == [[{"introduced": "0"}, {"fixed": "0.5.15"}]]
    specific = osv_of(r, osv_id="GHSA-xxxx-xxxx-xxxx")["affected"][0]["database_specific"]
    floor = "older than the profile's floor: profile sglang-cpu serves >=0.5.13"
    assert (
        specific["kvprobe_not_observed_before"]["older"] == f"every release older than 0.5.13: not observed ({floor})"
    )
    assert specific["kvprobe_introduced"].endswith(f"releases older than 0.5.13 were not observed ({floor})")
    assert "not swept" not in json.dumps(specific)
    assert specific["kvprobe_not_served"] == ["0.5.10", "0.5.11", "0.5.12"]
    r["profile"]["serves_why"] = "they need sgl_kernel"
    text = render.render(test_sweep.view(r), "markdown", OSV_OPTS)
    assert "does not serve: 0.5.10, 0.5.11, 0.5.12. Why: they need sgl_kernel." in text


def test_an_unknown_start_never_reaches_back_over_a_release_observed_unaffected():
    """0.5.17 observed not-present, 0.5.18 not swept, 0.5.19 affected: the start is unknown, but
    "0" would claim 0.5.17 affected against its own observation; the range starts right after it."""
    r = sweep_receipt(
        [("0.5.17", "not-present"), ("0.5.19", "affected"), ("0.5.20", "fixed")], spec="0.5.17,0.5.19..0.5.20"
    )
    test_sweep.listed_too(r, "0.5.18")
    assert events(r) == [[{"introduced": "0.5.18"}, {"fixed": "0.5.20"}]]
    doc = osv_of(r, osv_id="GHSA-xxxx-xxxx-xxxx")
    assert schema.errors(doc, "osv") == []
    assert doc["affected"][0]["database_specific"]["kvprobe_introduced"].startswith(
        "unknown, from 0.5.18: 0.5.17 was observed not-present, 0.5.19 is the oldest release observed affected"
    )
    # the same with the gap observed as could-not-observe: still never before 0.5.18
    r = sweep_receipt([("0.5.17", "not-present"), ("0.5.18", "could-not-observe"), ("0.5.19", "affected")])
    assert events(r) == [[{"introduced": "0.5.18"}]]


def test_ranges_follow_version_order_whatever_the_receipt_order():
    """#22 "Order": releases listed out of order give the ranges of the sorted sweep."""
    ordered = [("0.5.18", "not-present"), ("0.5.19", "affected"), ("0.5.20", "fixed"), ("0.5.21", "fixed")]
    shuffled = [ordered[2], ordered[3], ordered[1], ordered[0]]
    assert (
        events(sweep_receipt(shuffled))
        == events(sweep_receipt(ordered))
        == [[{"introduced": "0.5.19"}, {"fixed": "0.5.20"}]]
    )


def test_releases_that_are_not_neighbours_on_the_index_make_separate_ranges():
    """A list of releases says nothing of the releases between them: no run spans them."""
    r = sweep_receipt(
        [("0.5.14", "affected"), ("0.5.19", "affected"), ("0.5.23", "fixed")], spec="0.5.14,0.5.19,0.5.23"
    )
    test_sweep.listed_too(r, "0.5.15", "0.5.18", "0.5.20", "0.5.22")
    assert events(r) == [
        [{"introduced": "0"}, {"last_affected": "0.5.14"}],
        [{"introduced": "0"}, {"last_affected": "0.5.19"}],
    ]


@pytest.mark.parametrize(
    ("declared", "given", "want_id", "want_aliases"),
    [
        (
            {"id": "CVE-2026-1234", "aliases": ["GHSA-abcd-efgh-ijkm", "KVPROBE-2026-0001"]},
            None,
            "CVE-2026-1234",
            ["GHSA-abcd-efgh-ijkm", "KVPROBE-2026-0001"],
        ),
        (
            {"id": "KVPROBE-2026-0001", "aliases": ["GHSA-abcd-efgh-ijkm"]},
            None,
            "GHSA-abcd-efgh-ijkm",
            ["KVPROBE-2026-0001"],
        ),
        ({"id": "KVPROBE-2026-0001", "aliases": []}, "PYSEC-2026-7", "PYSEC-2026-7", ["KVPROBE-2026-0001"]),
    ],
)
def test_osv_id_has_a_prefix_the_schema_lists_and_every_other_declared_id_is_an_alias(
    declared, given, want_id, want_aliases
):
    r = sweep_receipt([("0.5.19", "affected"), ("0.5.20", "fixed")], spec="0.5.19..0.5.20", vulnerability=declared)
    doc = osv_of(r, osv_id=given)
    assert (doc["id"], doc["aliases"]) == (want_id, want_aliases)
    assert doc["schema_version"] == "1.7.5"
    assert schema.errors(doc, "osv") == []


def test_a_kvprobe_id_alone_is_no_osv_id():
    r = sweep_receipt([("0.5.19", "affected")], spec="0.5.19")
    with pytest.raises(UsageError, match=r"no OSV id for KVPROBE-2026-0001.*--osv-id"):
        osv_of(r)
    with pytest.raises(UsageError, match=r"--osv-id .KVPROBE-1. does not start with a database prefix"):
        osv_of(r, osv_id="KVPROBE-1")


def test_osv_references_name_the_fix_prs():
    r = sweep_receipt([("0.5.19", "affected"), ("0.5.20", "fixed")], spec="0.5.19..0.5.20")
    r["experiment"]["upstream"] = "https://github.com/sgl-project/sglang"
    r["experiment"]["fix"]["prs"] = [36988]
    refs = osv_of(r, osv_id="GHSA-xxxx-xxxx-xxxx")["references"]
    assert refs[0] == {"type": "FIX", "url": "https://github.com/sgl-project/sglang/pull/36988"}
    assert {"type": "PACKAGE", "url": "https://pypi.org/project/sglang/"} in refs


def test_osv_of_a_performance_fix_is_refused_in_osv_words():
    """#25: the refusal named OpenVEX for `--format osv`."""
    r = sweep_receipt([("0.5.19", "affected")], spec="0.5.19", vulnerability={"fix_kind": "performance"})
    with pytest.raises(UsageError) as caught:
        osv_of(r)
    assert "no OSV record is exported" in str(caught.value) and "OpenVEX" not in str(caught.value)


def test_sweep_markdown_shows_the_timeline_as_an_image_not_inline_svg():
    r = sweep_receipt([("0.5.19", "affected"), ("0.5.20", "fixed")], spec="0.5.19..0.5.20")
    view = BundleView(
        SweepReceipt.from_json(r),
        {"files": [{"path": "receipt.json", "sha256": "c" * 64}, {"path": "timeline.svg", "sha256": "e" * 64}]},
        "d" * 64,
        "my bundle",
    )
    md = render.render(view, "markdown")
    assert "<svg" not in md
    assert "](my%20bundle/timeline.svg)" in md and f"sha256 `{'e' * 64}`" in md


# ------------------------------------------------- every format on every bundle kind (#25)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    return one_bundle_of_each_kind(tmp_path_factory.mktemp("kinds"))


def one_bundle_of_each_kind(root):
    """One bundle of each kind: a run (tests/forge.py), a sweep (tests/relabel.py), a gates bundle."""
    from tests.relabel import relabelled_sweep
    from tests.unit.gates.test_gates_logs import GLM_CONTEXT, INCIDENT_POOL, startup_log, write

    log = write(root, "prefill.log", startup_log("0.5.22", "prefill", INCIDENT_POOL, GLM_CONTEXT))
    gates_out = root / "gates"
    made = CliRunner().invoke(main, ["gates", "--log", str(log), "--out", str(gates_out)], catch_exceptions=False)
    assert made.exit_code in (0, 1, 3), made.output
    return {
        "run": verified_bundle(root / "run"),
        "sweep": relabelled_sweep(root / "sweep"),
        "gates": gates_out,
    }


STATES = {
    ("run", "markdown"): "## kvprobe evidence",
    ("run", "openvex"): "openvex/0.2.0",
    ("run", "intoto"): "in-toto/statement-v1",
    ("run", "osv"): "--format osv takes a sweep bundle",
    ("sweep", "markdown"): "## kvprobe sweep",
    ("sweep", "openvex"): "openvex/0.2.0",
    ("sweep", "intoto"): "in-toto/statement-v1",
    ("sweep", "osv"): "osv",
    ("gates", "markdown"): "## kvprobe gates",
    ("gates", "intoto"): "in-toto/statement-v1",
    ("gates", "openvex"): "--format openvex states a vulnerability's status and a gates bundle names none",
    ("gates", "osv"): "--format osv takes a sweep bundle",
}


@pytest.mark.parametrize(("kind", "fmt"), sorted(STATES))
def test_every_format_on_every_bundle_kind(bundles, kind, fmt):
    """One loop over formats with the same options works for every bundle kind: each format
    renders (JSON valid against its vendored schema) or is refused with exit 2 and a reason."""
    result = report(bundles[kind], "--format", fmt, "--author", "Sec <s@x>", env={"SOURCE_DATE_EPOCH": "1767225600"})
    want = STATES[(kind, fmt)]
    if want.startswith("--format"):
        assert result.exit_code == 2 and want in result.stderr, result.output
        return
    assert result.exit_code == 0, result.output
    if want.startswith("##"):
        assert result.stdout.startswith(want)
        assert "**Reported by:** Sec &#60;s@x&#62;" in result.stdout
    else:
        assert schema.errors(json.loads(result.stdout), want) == []
    # none of the three is anchored (no digest given): each says so on stderr
    assert "SELF-CONSISTENT ONLY" in result.stderr


def test_gates_markdown_and_intoto_state_the_gates_and_the_files(bundles):
    receipt = json.loads((bundles["gates"] / "receipt.json").read_text())
    md = report(bundles["gates"]).stdout
    assert f"- **Overall:** **{receipt['overall']}**" in md
    for gate in receipt["gates"]:
        assert f"#### Gate {gate['number']}: " in md
        for check in gate["checks"]:
            assert f"`{check['name']}`" in md
    statement = official(report(bundles["gates"], "--format", "intoto").stdout)
    names = {s.name for s in statement.pb.subject}
    assert {"receipt.json", "manifest.json"} <= names


def test_sweep_intoto_names_each_release_wheel_with_its_class(bundles):
    receipt = json.loads((bundles["sweep"] / "receipt.json").read_text())
    statement = official(report(bundles["sweep"], "--format", "intoto").stdout)
    wheels = {s.name: (dict(s.digest), dict(s.annotations)) for s in statement.pb.subject if s.name.endswith(".whl")}
    assert len(wheels) == len(receipt["releases"])
    for release in receipt["releases"]:
        digest, notes = wheels[release["wheel"]["file"]]
        assert digest == {"sha256": release["wheel"]["sha256"]}
        assert (notes["kvprobeRelease"], notes["kvprobeClass"]) == (
            release["version"],
            release["classification"]["overall"],
        )


def test_an_anchored_export_carries_no_self_consistency_caveat(bundles):
    digest = hashlib.sha256((bundles["run"] / "manifest.json").read_bytes()).hexdigest()
    result = report(bundles["run"], "--expect-manifest-sha256", digest)
    assert result.exit_code == 0
    assert "SELF-CONSISTENT" not in result.output
    assert "- **Anchored:** manifest sha256 matches the digest given" in result.stdout
    assert "UNSHIPPED EXPERIMENT: forge-exp" in result.stdout  # the forge's experiment is not shipped
    wrong = report(bundles["run"], "--expect-manifest-sha256", "f" * 64)
    assert wrong.exit_code == 1 and wrong.stdout == ""


def test_report_help_names_the_default_format_and_what_author_does():
    text = CliRunner().invoke(main, ["report", "--help"], terminal_width=200).output
    assert "[default: markdown]" in " ".join(text.split())
    assert "ignored by intoto and osv" in " ".join(text.split())


def test_a_signed_attestation_anchors_the_export(tmp_path):
    """report --attestation FILE --key PUB anchors the export as verify's does; an attestation of
    another bundle leaves nothing to export (exit 1, as verify)."""
    from tests.unit.verify.test_attestation import key_pair, sign

    bundle = verified_bundle(tmp_path / "b")
    signer, public = key_pair(tmp_path, "cosign")
    statement = report(bundle, "--format", "intoto").stdout.encode()
    envelope = sign(statement, signer, tmp_path / "att.json")
    result = report(bundle, "--attestation", str(envelope), "--key", str(public))
    assert result.exit_code == 0, result.output
    assert "- **Anchored:** a DSSE attestation signed with key" in result.stdout
    assert "SELF-CONSISTENT" not in result.output
    other = forge.build(tmp_path / "other")
    forge.edit_receipt(other, lambda r: r["host"].update(system="Linux, another run"))
    foreign = sign(report(other, "--format", "intoto").stdout.encode(), signer, tmp_path / "other.json")
    refused = report(bundle, "--attestation", str(foreign), "--key", str(public))
    assert refused.exit_code == 1 and refused.stdout == ""
    alone = report(bundle, "--attestation", str(envelope))
    assert alone.exit_code == 2 and "--attestation and --key go together" in alone.stderr


def test_gates_receipts_of_schema_1_render_too(tmp_path):
    """verify accepts /1 gates receipts (inputs by path in the first shape): report renders them."""
    from tests.unit.gates.test_gates_logs import _as_first_shape, _gates_bundle, _rewrite_receipt

    bundle = _gates_bundle(tmp_path / "first")
    assert _rewrite_receipt(bundle, _as_first_shape) == "self-consistent"
    result = report(bundle)
    assert result.exit_code == 0, result.output
    assert "`/var/log/sglang/prefill.log`" in result.stdout
    assert report(bundle, "--format", "intoto").exit_code == 0


def test_sweep_markdown_names_the_oldest_release_observed_and_why_older_ones_were_not():
    r = sweep_receipt([("0.5.13", "affected"), ("0.5.14", "fixed")], spec="0.5.13..0.5.14")
    r["profile"]["serves"] = ">=0.5.13"
    md = render.render(test_sweep.view(r), "markdown")
    assert "Oldest release observed: 0.5.13. Releases older than it were not observed: the sweep selected " in md
    assert "0.5.13..0.5.14; profile `" in md and "serves `>=0.5.13`" in md

"""OpenVEX naming, authorship and timestamps; in-toto checked with the official bindings;
formats are assertions in kvprobe's schema checks (jsonschema's format checker)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from google.protobuf import json_format
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement

from kvprobe import schema
from kvprobe.cli import main
from kvprobe.errors import UsageError
from kvprobe.exports import intoto
from kvprobe.verify.pack import pack
from tests import forge
from tests.unit.test_report import COMMITS, make_receipt, vex, view_of


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
    return CliRunner().invoke(main, ["report", str(bundle), *args], env=env, catch_exceptions=False)


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


def test_intoto_subject_archive_is_the_packed_bundle(tmp_path):
    bundle = forge.build(tmp_path / "b")
    packed = pack(bundle, tmp_path / "b.tar.gz")
    result = report(bundle, "--format", "intoto", "--subject-archive", str(packed.archive))
    assert result.exit_code == 0, result.output
    statement = official(result.stdout)
    subjects = {s.name: dict(s.digest) for s in statement.pb.subject}
    assert subjects["b.tar.gz"] == {"sha256": packed.sha256}
    assert subjects["manifest.json"] == {"sha256": packed.manifest_sha256}


def test_intoto_subject_archive_of_another_bundle_is_refused(tmp_path):
    bundle = forge.build(tmp_path / "b")
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

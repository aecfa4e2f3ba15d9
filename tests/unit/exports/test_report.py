"""kvprobe report: Markdown parsed back, OpenVEX and in-toto validated against their vendored
schemas, on small receipts and bundles built here (compare.compare + manifest.write)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from jsonschema import Draft202012Validator, FormatChecker

from kvprobe import files, schema
from kvprobe.cli import main
from kvprobe.errors import UsageError, VerificationFailed
from kvprobe.evidence import manifest
from kvprobe.exports import bundle_view, intoto, markdown, openvex, render
from kvprobe.model.load import load
from kvprobe.model.receipt import Receipt
from kvprobe.names import PYTEST_REPORT_SCHEMA
from kvprobe.resources import schemas_dir
from kvprobe.rules import compare
from tests import forge

COMMITTED_MODEL_BUNDLE = Path(__file__).resolve().parents[3] / "bundles" / "model-model-20261201T112733Z"

TEST_FILE = "test/unit/test_door.py"
HOSTILE = "a|b\nc\\|d `tick` <b>x</b> | end"
WHEELS = {
    "base": {
        "kind": "wheel",
        "package": "sglang",
        "version": "0.5.19",
        "filename": "sglang-0.5.19-cp311-cp311-manylinux_2_34_x86_64.whl",
        "sha256": "1" * 64,
    },
    "head": {
        "kind": "wheel",
        "package": "sglang",
        "version": "0.5.20",
        "filename": "sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl",
        "sha256": "2" * 64,
    },
}
COMMITS = {"base": {"kind": "git", "commit": "a" * 40}, "head": {"kind": "git", "commit": "b" * 40}}
MODEL = {
    "base": {"kind": "synthetic", "switches": {"guard": False}},
    "head": {"kind": "synthetic", "switches": {"guard": True}},
}
DOES_NOT_SHOW = ["a cross-tenant leak: no tenant data", "anything on a GPU\nor over RDMA"]


# --------------------------------------------------------------------------- builders


def _case(name, observations, error=None):
    return {
        "name": name,
        "status": "raised" if error else "ok",
        "observations": observations,
        "error": {"type": error, "root_type": error} if error else None,
    }


def _probe_docs():
    return {
        "base": {
            "door": {
                "cases": [
                    _case("door.rejected", {"queued": True, "senders": 1, "note": HOSTILE}),
                    _case("door.crash", {"partial": 1}, error="AttributeError"),
                ]
            }
        },
        "head": {
            "door": {
                "cases": [
                    _case("door.rejected", {"queued": False, "senders": 0, "note": "fixed"}),
                    _case("door.crash", {"partial": 1, "retired": True}),
                ]
            }
        },
    }


def _expectations(*, reproduce: bool = True):
    return {
        "base": {"door/door.rejected": {"queued": True, "senders": 1}, "door/door.crash": {"raised": "AttributeError"}},
        "head": {
            "door/door.rejected": {"queued": not reproduce, "senders": 0},
            "door/door.crash": {"raised": False, "retired": True},
        },
    }


def _entry(name, when="call", outcome="passed", exception=None):
    return {
        "nodeid": f"{TEST_FILE}::{name}",
        "when": when,
        "outcome": outcome,
        "duration": 0.01,
        "exception": exception,
        "subtest": None,
        "xfail": None,
        "wasxfail": None,
        "longrepr": "",
    }


def _report_doc(tests, exitstatus):
    return {
        "schema": PYTEST_REPORT_SCHEMA,
        "complete": True,
        "exitstatus": exitstatus,
        "pytest_version": "9.2.0",
        "collected": 7,
        "tests": tests,
        "collection_errors": [],
        "running": None,
        "runner": {"file_nodeid": TEST_FILE, "returncode": exitstatus, "timed_out": False, "timeout_s": 60},
    }


def _test_runs():
    """Seven tests: 6 AttributeError + 1 ValueError on base, all passing on head."""
    base, head = [], []
    for i in range(7):
        name = f"test_{i}"
        root = "ValueError" if i == 6 else "AttributeError"
        exc = {
            "top_type": "Exception",
            "root_type": root,
            "root_module": "builtins",
            "root_message": "stub",
            "chain": ["Exception", root],
            "assertion": False,
        }
        base += [_entry(name, "setup"), _entry(name, "call", "failed", exc), _entry(name, "teardown")]
        head += [_entry(name, "setup"), _entry(name), _entry(name, "teardown")]
    return {
        TEST_FILE: {
            "base": {"report": _report_doc(base, 1), "problem": None, "exit_code": 1},
            "head": {"report": _report_doc(head, 0), "problem": None, "exit_code": 0},
        }
    }


def make_receipt(pins=WHEELS, *, reproduce=True, tests=True):
    kind = pins["base"]["kind"]
    expect = _expectations(reproduce=reproduce)
    comparison = compare.compare(
        expect=expect, probe_docs=_probe_docs(), probe_problems={}, test_runs=_test_runs() if tests else {}
    )
    receipt = {
        "schema": "kvprobe.receipt/1",
        "tool": {"name": "kvprobe", "version": "0.1.0"},
        "run_id": "exp-x-set-20260101T000000Z-abcdef",
        "created_utc": "2026-01-01T00:00:00Z",
        "experiment": {
            "id": "exp-x",
            "title": "PR #123: retire | rejected\nrequests",
            "layer": "diff-probe",
            "file": "probes/exp-x/experiment.toml",
            "sha256": "3" * 64,
            "upstream": "https://github.com/sgl-project/sglang",
            "profile": "sglang-cpu",
            "fix": {"prs": [123], "release": "0.5.20", "summary": "Retires rejected\nrequests at the door."},
            "vulnerability": {"id": "KVPROBE-2026-0001", "aliases": [], "fix_kind": "security"},
        },
        "pin_set": {"name": "set", "kind": kind, "pr": 123 if kind == "git" else None, "python_path": ["."]},
        "sides": {
            side: {"pin": pins[side], "source": dict(pins[side]), "tests": [], "probes": []}
            for side in ("base", "head")
        },
        "env": {
            "key": "k",
            "python": "3.11.7",
            "profile": "sglang-cpu",
            "lock_name": "sglang-cpu.txt",
            "lock_sha256": "4" * 64,
            "packages": {},
            "torch": None,
            "torch_index": None,
            "shared_by_sides": True,
        },
        "host": {"system": "Linux", "machine": "x86_64"},
        "settings": {},
        "expectations": expect,
        "comparison": comparison,
        "verdict": comparison["verdict"],
        "evidence": {
            "layer": "diff-probe",
            "shows": "A code-path difference\nbetween pins.",
            "does_not_show": list(DOES_NOT_SHOW),
            "mocks": {"door": {"kv|sender": "MagicMock: counts sends\nline | two <script>"}},
            "limits": ["CPU only"],
        },
        "timings": {"checks_s": 1.0},
    }
    schema.validate(receipt, "kvprobe.receipt/1", source="test receipt")
    return receipt


def make_bundle(root: Path, receipt: dict) -> str:
    """A small bundle like `kvprobe run` writes; returns manifest.json's sha256."""
    root.mkdir(parents=True)
    (root / "raw" / "base").mkdir(parents=True)
    (root / "raw" / "base" / "door.json").write_text('{"cases": []}\n', encoding="utf-8")
    (root / "README.md").write_text("# exp-x\n", encoding="utf-8")
    (root / "receipt.json").write_text(json.dumps(receipt, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return manifest.write(root)


def view_of(receipt, digest="5" * 64, name="exp-x-bundle"):
    files = [
        {"path": "receipt.json", "size": 1, "sha256": "6" * 64},
        {"path": "raw/base/door.json", "size": 1, "sha256": "7" * 64},
    ]
    typed = load(receipt)
    return bundle_view.BundleView(typed, {"schema": "kvprobe.manifest/1", "files": files}, digest, name)


def vex(view):
    return openvex.openvex(view, author="Security Team", issued="2026-02-01T00:00:00Z")


def validator(name):
    with open(schemas_dir() / "vendor" / name, encoding="utf-8") as handle:
        doc = json.load(handle)
    Draft202012Validator.check_schema(doc)
    return Draft202012Validator(doc, format_checker=FormatChecker())


def assert_valid(doc, name):
    errors = sorted(validator(name).iter_errors(doc), key=lambda e: list(e.absolute_path))
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]


# --------------------------------------------------------------- Markdown parsed back


def split_row(line: str) -> list[str]:
    """Cells of a GFM table row: a backslash takes the next character with it (cmark-gfm)."""
    assert line.startswith("|") and line.endswith("|"), line
    cells, current, i = [], "", 0
    while i < len(line):
        if line[i] == "\\":
            current += line[i : i + 2]
            i += 2
        elif line[i] == "|":
            cells.append(current)
            current = ""
            i += 1
        else:
            current += line[i]
            i += 1
    assert current == "", f"text after the last pipe: {line!r}"
    return [c.strip() for c in cells[1:]]


def unescape(text: str) -> str:
    """Undo the table escaping: backslash escapes, entities; <br> back to newlines."""
    text = re.sub(r"\\(.)", r"\1", text)
    return html.unescape(text.replace("<br>", "\n"))


def tables(md: str) -> list[dict]:
    found, block = [], []
    for line in [*md.split("\n"), ""]:
        if line.startswith("|"):
            block.append(line)
        elif block:
            header, delim, *rows = (split_row(x) for x in block)
            assert all(re.fullmatch(r":?-{3,}:?", c) for c in delim), block[1]
            assert len(delim) == len(header)
            for raw, row in zip(block[2:], rows, strict=True):
                assert len(row) == len(header), f"{len(row)} cells, header has {len(header)}: {raw!r}"
            found.append({"header": header, "rows": rows})
            block = []
    return found


def table_with(md, first_header, second_header=None):
    return [
        t
        for t in tables(md)
        if t["header"][0] == first_header and (second_header is None or t["header"][1] == second_header)
    ]


def test_markdown_has_verdict_pins_digest_verify_command_and_scope():
    receipt = make_receipt()
    md = markdown.markdown(view_of(receipt))
    lines = md.split("\n")
    assert "- **Verdict:** **reproduced**: 4/4 expected observations matched" in md
    assert "- **Evidence layer:** `diff-probe`" in lines
    assert "[#123](https://github.com/sgl-project/sglang/pull/123), first released in 0.5.20" in md
    assert f"- **Bundle manifest sha256:** `{'5' * 64}`" in md
    assert f"kvprobe verify exp-x-bundle --expect-manifest-sha256 {'5' * 64}" in lines
    assert "**What this shows:** A code-path difference between pins." in lines
    assert "**What this does not show:**" in lines
    assert "- a cross-tenant leak: no tenant data" in lines
    assert "- anything on a GPU or over RDMA" in lines  # a multi-line item stays one bullet
    assert "- CPU only" in lines
    [pins] = table_with(md, "side", "kind")
    assert [r[0] for r in pins["rows"]] == ["base", "head"]
    assert f"sha256 `{'1' * 64}`" in pins["rows"][0]
    assert "`sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl` (sglang 0.5.20)" in pins["rows"][1]


def test_markdown_cases_show_raised_vs_behaviour_and_expected_values():
    md = markdown.markdown(view_of(make_receipt()))
    [summary] = table_with(md, "case")
    by_case = {row[0]: row for row in summary["rows"]}
    assert by_case["`door/door.crash`"][1:3] == ["raised `AttributeError`", "behaviour"]
    assert by_case["`door/door.rejected`"][1:4] == ["behaviour", "behaviour", "2/2"]
    details = table_with(md, "observation")
    assert len(details) == 2
    rows = {(row[0]): row for t in details for row in t["rows"]}
    assert rows["`raised`"][1:] == ['`"AttributeError"`', '`"AttributeError"`', "`false`", "`false`", "ok"]
    assert rows["`retired`"][1:3] == ["(not recorded: case raised)", "—"]
    assert rows["`queued`"][1:] == ["`true`", "`true`", "`false`", "`false`", "ok"]


def test_markdown_mismatch_is_marked():
    md = markdown.markdown(view_of(make_receipt(reproduce=False)))
    assert "- **Verdict:** **not-reproduced**" in md
    assert "### Why the verdict is not-reproduced" in md
    rows = {row[0]: row for t in table_with(md, "observation") for row in t["rows"]}
    assert rows["`queued`"][-1] == "**mismatch**: head"


def _not_observing_receipt():
    """make_receipt's docs where base's crash case never reached its decision point (a hostile
    reason) and head's door is not present in the release."""
    docs = _probe_docs()
    base_crash, head_door = docs["base"]["door"]["cases"][1], docs["head"]["door"]["cases"][0]
    base_crash.update(observation="unobserved", reason="stub | lacks\n<b>field</b>", missing=[])
    head_door.update(observation="not-present", reason="gone", missing=["Door.add"], status="raised", observations={})
    receipt = make_receipt()
    receipt["comparison"] = compare.compare(expect=_expectations(), probe_docs=docs, probe_problems={}, test_runs={})
    receipt["verdict"] = receipt["comparison"]["verdict"]
    return receipt


def test_markdown_cases_that_did_not_observe_are_neither_behaviour_nor_mismatch():
    md = markdown.markdown(view_of(_not_observing_receipt()))
    assert "- **Verdict:** **could-not-observe**" in md
    [summary] = table_with(md, "case")
    by_case = {row[0]: row for row in summary["rows"]}
    assert unescape(by_case["`door/door.crash`"][1]) == "unobserved (stub | lacks\n<b>field</b>)"
    assert by_case["`door/door.rejected`"][2] == "not present (`Door.add`)"
    rows = {row[0]: row for t in table_with(md, "observation") for row in t["rows"]}
    assert rows["`queued`"][3] == "(not recorded: case did not observe)"
    assert rows["`queued`"][-1] == "unknown (could not observe): head"


def test_bundle_readme_names_how_far_each_case_got():
    from kvprobe.evidence.bundle_readme import render_readme

    readme = render_readme(Receipt.from_json(_not_observing_receipt()))
    [crash] = [line for line in readme.split("\n") if line.startswith("| `door/door.crash` |")]
    assert crash.count("|") == 5 and "<b>" not in crash  # the reason stays in its cell, inert
    assert html.unescape(crash.split(" | ")[1]) == "unobserved (stub | lacks <b>field</b>)"
    assert "| `door/door.rejected` | behaviour | not present (Door.add) |" in readme


def test_markdown_failure_kinds_and_test_transitions():
    md = markdown.markdown(view_of(make_receipt()))
    [files] = table_with(md, "file")
    [row] = files["rows"]
    assert unescape(row[0]) == f"`{TEST_FILE}`"
    assert row[1] == "7 FAIL_TO_PASS"
    assert row[2] == "0/7 passed; 6 AttributeError + 1 ValueError, 0 assertion failures"
    assert row[3] == "7/7 passed; 0 assertion failures"
    [per_test] = table_with(md, "test")
    assert len(per_test["rows"]) == 7
    assert {r[1] for r in per_test["rows"]} == {"failed (AttributeError)", "failed (ValueError)"}
    assert {r[3] for r in per_test["rows"]} == {"FAIL_TO_PASS"}


def test_markdown_pipes_newlines_and_html_in_values_do_not_break_tables():
    md = markdown.markdown(view_of(make_receipt()))
    rows = {row[0]: row for t in table_with(md, "observation") for row in t["rows"]}
    note = rows["`note`"]
    assert unescape(note[1]) == json.dumps(HOSTILE)
    assert note[3] == '`"fixed"`'
    [mocks] = table_with(md, "probe")
    [mock] = mocks["rows"]
    assert unescape(mock[1]) == "`kv|sender`"
    assert mock[2] == "MagicMock: counts sends<br>line &#124; two &#60;script&#62;"
    assert unescape(mock[2]) == "MagicMock: counts sends\nline | two <script>"
    assert "<script>" not in md
    # outside tables a multi-line value is one line
    assert "## kvprobe evidence: exp-x: PR #123: retire &#124; rejected requests" in md.split("\n")


@pytest.mark.parametrize(
    ("kinds", "text"),
    [
        (
            {"assertion": 0, "AttributeError": 6, "ValueError": 1},
            "6 AttributeError + 1 ValueError, 0 assertion failures",
        ),
        ({"assertion": 3}, "3 assertion failures"),
        ({"assertion": 1}, "1 assertion failure"),
        ({}, "0 assertion failures"),
        ({"assertion": 0, "collection": 2, "timeout": 1}, "2 collection errors + 1 timeout, 0 assertion failures"),
    ],
)
def test_failure_kinds_text(kinds, text):
    assert bundle_view.failure_kinds_text(kinds) == text


@pytest.mark.parametrize("text", ["a|b", "a\\|b", "a\\\\|b", "x\ny|z", "|", "\\", "`|`"])
def test_cell_escaping_round_trips_for_any_text(text):
    for rendered in (markdown.cell(text), markdown.code_cell(text)):
        line = f"| {rendered} | next |"
        cells = split_row(line)
        assert len(cells) == 2 and cells[1] == "next"
        shown = unescape(cells[0])
        if rendered != markdown.cell(text):  # a code span: drop its backticks
            shown = shown[1:-1]
        assert shown == text


# --------------------------------------------------------------------------- OpenVEX


def test_openvex_reproduced_wheels():
    receipt = make_receipt()
    view = view_of(receipt)
    doc = vex(view)
    assert_valid(doc, "openvex-0.2.0.schema.json")
    assert doc["@context"] == "https://openvex.dev/ns/v0.2.0"
    assert doc["timestamp"] == "2026-02-01T00:00:00Z" and doc["version"] == 1  # issued: the export
    base, head = doc["statements"]
    assert (base["status"], head["status"]) == ("affected", "fixed")
    assert base["products"] == [
        {
            "@id": "pkg:pypi/sglang@0.5.19",
            "identifiers": {"purl": "pkg:pypi/sglang@0.5.19"},
            "hashes": {"sha-256": "1" * 64},
        }
    ]
    assert head["products"][0]["@id"] == "pkg:pypi/sglang@0.5.20"
    assert head["products"][0]["hashes"] == {"sha-256": "2" * 64}
    assert "Upgrade sglang to 0.5.20 or later" in base["action_statement"]
    assert "backport #123" in base["action_statement"]
    assert base["vulnerability"]["name"] == "KVPROBE-2026-0001"
    assert "aliases" not in base["vulnerability"]
    assert "Fixed upstream by #123" in base["vulnerability"]["description"]
    for statement in (base, head):
        assert statement["timestamp"] == receipt["created_utc"]  # observed: the run
        notes = statement["status_notes"]
        assert view.receipt_sha256 in notes and view.manifest_sha256 in notes
        assert "Evidence layer diff-probe" in notes and "CPU only" in notes
        assert "a cross-tenant leak" in notes


def test_openvex_not_reproduced_claims_neither_affected_nor_fixed():
    doc = vex(view_of(make_receipt(reproduce=False)))
    assert_valid(doc, "openvex-0.2.0.schema.json")
    assert [s["status"] for s in doc["statements"]] == ["under_investigation", "under_investigation"]
    assert not any(s["status"] in ("fixed", "affected") for s in doc["statements"])
    assert all("not 'reproduced'" in s["status_notes"] for s in doc["statements"])
    assert all("head: door/door.rejected: queued expected True" in s["status_notes"] for s in doc["statements"])


def test_openvex_git_pins_are_github_purls():
    doc = vex(view_of(make_receipt(COMMITS)))
    assert_valid(doc, "openvex-0.2.0.schema.json")
    base, head = doc["statements"]
    assert base["products"] == [
        {
            "@id": f"pkg:github/sgl-project/sglang@{'a' * 40}",
            "identifiers": {"purl": f"pkg:github/sgl-project/sglang@{'a' * 40}"},
        }
    ]
    assert head["products"][0]["@id"] == f"pkg:github/sgl-project/sglang@{'b' * 40}"
    assert "Backport #123" in base["action_statement"]


def test_openvex_refuses_a_synthetic_model_receipt():
    with pytest.raises(UsageError, match="synthetic model"):
        vex(view_of(make_receipt(MODEL, tests=False)))


def test_render_validates_and_serializes():
    text = render.render(view_of(make_receipt()), "openvex", render.ExportOptions(author="Security Team"))
    doc = json.loads(text)
    assert doc["author"] == "Security Team"
    assert text.endswith("\n")


# ----------------------------------------------------------------------------- in-toto


def test_intoto_wheels_subjects_and_predicate():
    receipt = make_receipt()
    view = view_of(receipt)
    doc = intoto.intoto(view)
    assert_valid(doc, "in-toto-statement-v1.schema.json")
    assert doc["_type"] == "https://in-toto.io/Statement/v1"
    assert doc["predicateType"] == "https://kvprobe.dev/attestation/receipt/v1"
    assert doc["predicate"] == receipt
    names = {s["name"]: s for s in doc["subject"]}
    for entry in view.manifest["files"]:
        assert names[entry["path"]]["digest"] == {"sha256": entry["sha256"]}
    assert names["manifest.json"]["digest"] == {"sha256": view.manifest_sha256}
    wheel = names["sglang-0.5.19-cp311-cp311-manylinux_2_34_x86_64.whl"]
    assert wheel["digest"] == {"sha256": "1" * 64} and wheel["uri"] == "pkg:pypi/sglang@0.5.19"
    assert not any("gitCommit" in s["digest"] for s in doc["subject"])


def test_intoto_git_pins_are_gitcommit_subjects():
    doc = intoto.intoto(view_of(make_receipt(COMMITS)))
    assert_valid(doc, "in-toto-statement-v1.schema.json")
    commits = [s for s in doc["subject"] if "gitCommit" in s["digest"]]
    assert [s["digest"]["gitCommit"] for s in commits] == ["a" * 40, "b" * 40]
    assert commits[0]["uri"] == f"git+https://github.com/sgl-project/sglang@{'a' * 40}"
    assert [s["annotations"]["kvprobeSide"] for s in commits] == ["base", "head"]


def test_intoto_schema_rejects_what_the_spec_forbids():
    doc = intoto.intoto(view_of(make_receipt()))
    check = validator("in-toto-statement-v1.schema.json")
    assert not check.is_valid({**doc, "subject": []})
    assert not check.is_valid({**doc, "_type": "https://in-toto.io/Statement/v0.1"})
    assert not check.is_valid({**doc, "subject": [{"name": "x", "digest": {"sha256": "XYZ"}}]})
    assert not check.is_valid({**doc, "subject": [{"name": "x"}]})


def test_synthetic_receipt_still_renders_markdown_and_intoto():
    view = view_of(make_receipt(MODEL, tests=False))
    assert "model switches" in markdown.markdown(view)
    doc = intoto.intoto(view)
    assert_valid(doc, "in-toto-statement-v1.schema.json")
    assert len(doc["subject"]) == len(view.manifest["files"]) + 1


# -------------------------------------------------------------------- bundles and CLI


def verified_bundle(root: Path) -> str:
    """A bundle that `kvprobe verify` accepts (tests/forge.py); returns manifest.json's sha256."""
    forge.build(root)
    return files.sha256_file(root / "manifest.json")


def test_load_reads_a_bundle(tmp_path):
    digest = verified_bundle(tmp_path / "b")
    view = bundle_view.load(tmp_path / "b")
    assert view.manifest_sha256 == digest
    assert isinstance(view.receipt, Receipt)
    assert view.receipt.to_json() == forge.load(tmp_path / "b", "receipt.json")
    assert view.receipt_sha256 == files.sha256_file(tmp_path / "b" / "receipt.json")
    assert view.name == "b"


def test_load_reads_an_archive_as_verify_does(tmp_path):
    digest = verified_bundle(tmp_path / "b")
    archive = forge.tar_of(tmp_path / "b", tmp_path / "b.tar.gz")
    view = bundle_view.load(archive)
    assert (view.manifest_sha256, view.name) == (digest, "b.tar.gz")


def test_load_refuses_what_verify_refuses(tmp_path):
    verified_bundle(tmp_path / "dup")
    path = tmp_path / "dup" / "receipt.json"
    path.write_text(
        path.read_text(encoding="utf-8").replace('{\n  "comparison"', '{\n  "verdict": "x",\n  "comparison"', 1),
        encoding="utf-8",
    )
    with pytest.raises(VerificationFailed, match=r"json-duplicate-key: receipt\.json"):
        bundle_view.load(tmp_path / "dup")
    verified_bundle(tmp_path / "tampered")
    (tmp_path / "tampered" / "README.md").write_text("# edited\n", encoding="utf-8")
    with pytest.raises(VerificationFailed, match=r"size-mismatch: README\.md"):
        bundle_view.load(tmp_path / "tampered")


@pytest.mark.parametrize("fmt", ["markdown", "openvex", "intoto"])
def test_cli_report_to_stdout_and_file(tmp_path, fmt):
    bundle = tmp_path / "bundle"
    digest = verified_bundle(bundle)
    runner = CliRunner()
    digest_given = ["--expect-manifest-sha256", digest]  # an unshipped experiment's VEX needs an anchor
    author = ["--author", "Security Team", *digest_given] if fmt == "openvex" else []
    env = {"SOURCE_DATE_EPOCH": "1767225600"}  # 2026-01-01: the two runs write the same bytes
    result = runner.invoke(main, ["report", str(bundle), "--format", fmt, *author], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = tmp_path / "out" / f"report.{fmt}"
    out.parent.mkdir()
    written = runner.invoke(
        main, ["report", str(bundle), "--format", fmt, *author, "-o", str(out)], env=env, catch_exceptions=False
    )
    assert written.exit_code == 0
    assert out.read_text(encoding="utf-8") == result.stdout
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # no temp file left
    if fmt == "markdown":
        assert f"kvprobe verify bundle --expect-manifest-sha256 {digest}" in result.stdout
        tables(result.stdout)
    elif fmt == "openvex":
        assert_valid(json.loads(result.stdout), "openvex-0.2.0.schema.json")
    else:
        assert_valid(json.loads(result.stdout), "in-toto-statement-v1.schema.json")


def test_cli_not_a_bundle_exits_2(tmp_path):
    runner = CliRunner()
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x", encoding="utf-8")
    for path in (tmp_path / "empty", tmp_path / "file.txt", tmp_path / "missing"):
        result = runner.invoke(main, ["report", str(path), "--format", "markdown"], catch_exceptions=False)
        assert result.exit_code == 2, (path, result.output)
        assert "not a" in result.output
    bad = tmp_path / "bad"
    verified_bundle(bad)
    (bad / "manifest.json").write_text('{"schema": "kvprobe.manifest/1", "files": NaN}', encoding="utf-8")
    result = runner.invoke(main, ["report", str(bad), "--format", "intoto"], catch_exceptions=False)
    assert result.exit_code == 1, result.output  # a bundle that does not verify, as `verify` says
    assert "json-non-finite: manifest.json" in result.output and result.stdout == ""


def test_cli_tampered_bundle_exits_1_and_writes_nothing(tmp_path):
    bundle = tmp_path / "bundle"
    make_bundle(bundle, make_receipt())
    (bundle / "raw" / "base" / "door.json").write_text('{"cases": [1]}\n', encoding="utf-8")
    out = tmp_path / "vex.json"
    result = CliRunner().invoke(
        main, ["report", str(bundle), "--format", "openvex", "--author", "x", "-o", str(out)], catch_exceptions=False
    )
    assert result.exit_code == 1
    assert "raw/base/door.json" in result.output
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]


def test_cli_synthetic_openvex_exits_2(tmp_path):
    bundle = forge.copy(COMMITTED_MODEL_BUNDLE, tmp_path / "bundle")
    result = CliRunner().invoke(
        main, ["report", str(bundle), "--format", "openvex", "--author", "x"], catch_exceptions=False
    )
    assert result.exit_code == 2
    assert "synthetic model" in result.output


def test_git_pins_outside_github_are_generic_purls_with_vcs_url():
    receipt = make_receipt(COMMITS)
    receipt["experiment"]["upstream"] = "https://git.example.org/mirror/sglang.git"
    doc = vex(view_of(receipt))
    assert_valid(doc, "openvex-0.2.0.schema.json")
    assert doc["statements"][0]["products"][0]["@id"] == (
        f"pkg:generic/sglang@{'a' * 40}?vcs_url=git%2Bhttps%3A%2F%2Fgit.example.org%2Fmirror%2Fsglang.git%40{'a' * 40}"
    )
    receipt["experiment"]["upstream"] = None
    with pytest.raises(UsageError, match="names no upstream"):
        vex(view_of(receipt))


def test_bundle_readme_says_what_an_expected_absence_means():
    from kvprobe.evidence.bundle_readme import render_readme

    receipt = make_receipt()
    assert "expected to lack the code" not in render_readme(Receipt.from_json(receipt))
    base = dict(receipt["expectations"].get("base", {}))
    base["door/door.rejected"] = {"not_present": ["Door.add"]}
    receipt["expectations"] = {**receipt["expectations"], "base": base}
    readme = render_readme(Receipt.from_json(receipt))
    assert "The base is expected to lack the code of 1 case(s)" in readme
    assert "what the head shows for them is a feature it adds" in readme


def test_an_unanchored_run_export_says_so_in_markdown_and_every_openvex_statement():
    """#22: an export drawn from a bundle that only agrees with itself, of an experiment kvprobe
    does not ship, says both inside itself (the CLI also prints them on stderr)."""
    from dataclasses import replace

    from kvprobe.exports.bundle_view import Provenance

    view = replace(view_of(make_receipt()), provenance=Provenance(anchor=None, experiment="exp-x", shipped=False))
    md = markdown.markdown(view)
    assert "- **Caveat:** SELF-CONSISTENT ONLY" in md and "- **Caveat:** UNSHIPPED EXPERIMENT: exp-x" in md
    doc = vex(view)
    assert_valid(doc, "openvex-0.2.0.schema.json")
    for statement in doc["statements"]:
        assert statement["status_notes"].startswith("SELF-CONSISTENT ONLY")
        assert "UNSHIPPED EXPERIMENT: exp-x" in statement["status_notes"]
    anchored = replace(view, provenance=Provenance(anchor="a digest", experiment="exp-x", shipped=True))
    assert "Caveat" not in markdown.markdown(anchored)
    assert "- **Anchored:** a digest" in markdown.markdown(anchored)

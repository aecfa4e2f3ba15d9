"""`--json` is a contract: every document is an object naming its schema
(kvprobe.cli.<command>/1), and under --json an error is a kvprobe.cli.error/1 object on stdout
as well as the line on stderr."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvprobe.cli import main


def run(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env, catch_exceptions=False)


@pytest.fixture
def cache_root(tmp_path):
    return {"KVPROBE_CACHE_DIR": str(tmp_path / "cache")}


def test_every_json_document_names_its_schema(tmp_path, bundle, cache_root):
    documents = {
        "kvprobe.cli.list/1": run("list", "--json"),
        "kvprobe.cli.show/1": run("show", "model", "--json"),
        "kvprobe.cli.verify/1": run("verify", bundle, "--json"),
        "kvprobe.cli.cache-ls/1": run("cache", "ls", "--json", env=cache_root),
        "kvprobe.cli.cache-prune/1": run("cache", "prune", "--dry-run", "--json", env=cache_root),
        "kvprobe.cli.cache-verify/1": run("cache", "verify", "--json", env=cache_root),
        "kvprobe.cli.bundle-pack/1": run("bundle", "pack", bundle, "-o", tmp_path / "b.tar.gz", "--json"),
    }
    for schema, result in documents.items():
        assert result.exit_code == 0, (schema, result.output)
        doc = json.loads(result.stdout)
        assert isinstance(doc, dict) and doc["schema"] == schema, result.stdout
    listed = json.loads(documents["kvprobe.cli.list/1"].stdout)
    assert "model" in {e["id"] for e in listed["experiments"]}


def test_an_error_under_json_is_a_json_document_too(tmp_path):
    result = run("verify", tmp_path / "nothing-here", "--json")
    assert result.exit_code == 2
    doc = json.loads(result.stdout)
    assert doc["schema"] == "kvprobe.cli.error/1" and doc["command"] == "verify"
    assert doc["code"] == "not-a-bundle" and doc["exit"] == 2 and "not a bundle" in doc["message"]
    assert "kvprobe: error:" in result.stderr  # the line on stderr stays


def test_a_failed_verification_is_a_result_not_an_error(bundle):
    (bundle / "logs/base/probes/doors.stderr").write_bytes(b"edited\n")
    doc = json.loads(run("verify", bundle, "--json").stdout)
    assert doc["schema"] == "kvprobe.cli.verify/1" and doc["outcome"] == "failed"


def test_a_usage_error_click_finds_is_a_json_document_under_json():
    result = run("cache", "ls", "--json", "--no-such-option")
    assert result.exit_code == 2
    doc = json.loads(result.stdout)
    assert doc == {
        "schema": "kvprobe.cli.error/1",
        "command": "cache-ls",
        "code": "usage-error",
        "message": doc["message"],
        "hints": [],
        "exit": 2,
    }
    assert "--no-such-option" in doc["message"]


def test_without_json_an_error_leaves_stdout_empty(tmp_path):
    result = run("verify", tmp_path / "nothing-here")
    assert result.exit_code == 2 and result.stdout == ""
    assert run("cache", "ls", "--no-such-option").stdout == ""


def test_one_way_to_run_the_model():
    """The top-level `kvprobe model` duplicated `kvprobe run model` (#25): it is gone."""
    assert "model" not in main.commands
    assert run("model").exit_code == 2

"""Checks forked from a preloaded interpreter observe what fresh interpreters observe.

Each experiment runs twice, with and without ``--no-preload``, and the probe observation
documents are compared whole, but for durations and the run's own temporary directory
(probes record where SGLang was imported from, as a fact).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from kvprobe.env.venv import load_profile

_RUN_DIR = re.compile(r"kvprobe-run-[A-Za-z0-9_]+")


def _run(tmp_path: Path, exp_id: str, *flags: str, name: str = "") -> dict[str, Any]:
    out = tmp_path / f"{exp_id}{''.join(flags)}{name}"
    result = CliRunner().invoke(main, ["run", exp_id, "--out", str(out), "--json", *flags], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    receipt = json.loads((out / "receipt.json").read_text())
    docs = {p.relative_to(out).as_posix(): _normal(json.loads(p.read_text())) for p in (out / "raw").rglob("*.json")}
    return {"receipt": receipt, "docs": docs}


def _normal(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items() if k != "duration_s"}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    return _RUN_DIR.sub("kvprobe-run-*", value) if isinstance(value, str) else value


def _same_both_ways(tmp_path: Path, exp_id: str) -> dict[str, Any]:
    forked = _run(tmp_path, exp_id)
    fresh = _run(tmp_path, exp_id, "--no-preload")
    assert {c["mode"] for c in forked["receipt"]["execution"]["checks"]} == {"forked"}
    assert {(c["mode"], c["reason"]) for c in fresh["receipt"]["execution"]["checks"]} == {("fresh", "--no-preload")}
    assert fresh["receipt"]["execution"]["preloaded"] == {}
    assert sorted(forked["docs"]) == sorted(fresh["docs"]) and forked["docs"]
    for name, doc in forked["docs"].items():
        assert doc == fresh["docs"][name], name
    assert forked["receipt"]["comparison"] == fresh["receipt"]["comparison"]
    return forked["receipt"]


def test_the_model_observes_the_same_forked_and_fresh(tmp_path):
    _same_both_ways(tmp_path, "model")


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("exp_id", ["experiment-a", "experiment-b"])
def test_sglang_experiments_observe_the_same_forked_and_fresh(tmp_path, exp_id):
    receipt = _same_both_ways(tmp_path, exp_id)
    preloaded = receipt["execution"]["preloaded"]
    assert {"torch", "transformers", "torchvision"} <= set(preloaded) <= set(load_profile("sglang-cpu").preload or ())
    assert preloaded["torch"] == receipt["env"]["torch"]["version"]


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("exp_id", ["experiment-a", "experiment-b"])
def test_sglang_experiments_observe_the_same_from_a_kept_server(tmp_path, exp_id, monkeypatch):
    """The run that starts a kept server and the run that finds it observe what fresh
    interpreters observe, and their receipts say which run started it."""
    from kvprobe.checks.keptserver import stop_kept_servers

    runtime = tempfile.mkdtemp(prefix="kvrt-")  # short: a socket path has 107 bytes
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
    try:
        kept = [_run(tmp_path, exp_id, "--keep-server", name=str(i)) for i in (1, 2)]
    finally:
        stop_kept_servers()
        shutil.rmtree(runtime, ignore_errors=True)
    fresh = _run(tmp_path, exp_id, "--no-preload")
    assert [k["receipt"]["execution"]["server"]["reused"] for k in kept] == [False, True]
    for run in kept:
        assert {c["mode"] for c in run["receipt"]["execution"]["checks"]} == {"forked"}
        assert run["docs"] == fresh["docs"] and run["docs"]
        assert run["receipt"]["comparison"] == fresh["receipt"]["comparison"]

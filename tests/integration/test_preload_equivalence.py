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


_SWEEP_DIR = re.compile(r"kvprobe-sweeps-[A-Za-z0-9_]+/release-[0-9.]+-[A-Za-z0-9_]+")


def _sweep(tmp_path: Path, name: str, *flags: str) -> dict[str, Any]:
    out = tmp_path / name
    # --no-reuse: both sides observe; a unit kept in the cache by another checkout would be
    # another run's raw output (its tracebacks name that checkout's paths)
    args = ["sweep", "experiment-a", "experiment-b", "--releases", "0.5.13", "--out", str(out), "--json", "--no-reuse"]
    result = CliRunner().invoke(main, [*args, *flags], catch_exceptions=False)
    assert result.exit_code in (0, 3), result.output
    found: dict[str, Any] = {"receipts": {}, "docs": {}}
    for exp_id in ("experiment-a", "experiment-b"):
        bundle = out / exp_id
        found["receipts"][exp_id] = json.loads((bundle / "receipt.json").read_text())
        for path in (bundle / "raw").rglob("*.json"):
            text = _SWEEP_DIR.sub("kvprobe-sweeps-*/release-*", path.read_text())
            found["docs"][f"{exp_id}/{path.relative_to(bundle).as_posix()}"] = _normal(json.loads(text))
    return found


@pytest.mark.slow
@pytest.mark.network
def test_two_sglang_experiments_observe_the_same_from_a_shared_release_and_fresh(tmp_path):
    """Two experiments on one release, their probes forked from one process that imported the
    release's SGLang once (run.release_imports), observe what fresh interpreters observe: raw
    outputs compared whole but durations and the sweep's temporary directory (probes record
    where SGLang was imported from, as a fact)."""
    shared = _sweep(tmp_path, "shared")
    fresh = _sweep(tmp_path, "fresh", "--no-preload")
    for receipt in shared["receipts"].values():
        (release,) = receipt["releases"]
        assert {p["mode"] for p in release["execution"]["probes"]} == {"forked"}
        assert {"torch", "sglang", "sglang.srt.managers.schedule_batch"} <= set(release["execution"]["preloaded"])
    for receipt in fresh["receipts"].values():
        assert {p["mode"] for r in receipt["releases"] for p in r["execution"]["probes"]} == {"fresh"}
    assert sorted(shared["docs"]) == sorted(fresh["docs"]) and len(shared["docs"]) == 2
    for name, doc in shared["docs"].items():
        assert doc == fresh["docs"][name], name
    for exp_id, receipt in shared["receipts"].items():
        classes = [r["classification"] for r in receipt["releases"]]
        assert classes == [r["classification"] for r in fresh["receipts"][exp_id]["releases"]]

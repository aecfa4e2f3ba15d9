"""The behavioural gates' probes (gate 2: A, B; gate 3: F; gate 4: C, D, E) forked from the gates
run's one preloaded interpreter observe what fresh ones do.

`kvprobe gates` runs twice on a fake SGLang tree (the few files the fix markers read), with and
without ``--no-preload``. The probes' env is kvprobe's own interpreter here, not the 6 GB sglang-cpu
env (the slow test_gates_sglang runs that one): the fork server, the probes and what they
observe on that tree are the real ones. The receipt's ``execution`` says how each probe ran,
and verification never reads it: taking it out or changing it changes no recomputed result.
"""

from __future__ import annotations

import json
import platform
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from kvprobe.evidence import manifest
from kvprobe.files import json_bytes
from kvprobe.model.gates_receipt import GatesReceipt
from kvprobe.model.receipt import EnvRecord
from tests.unit.gates.test_gates_logs import GLM_CONTEXT, RAISED_POOL, fake_tree, startup_log

_WORK_DIR = re.compile(r"kvprobe-gates-[A-Za-z0-9_]+")
PROBES = [  # (gate, probe) in the order a gates run runs them
    (2, "experiment-a/admission_doors"),
    (2, "experiment-b/prefill_result_cleanup"),
    (3, "experiment-f/handoff_checksum"),
    (4, "experiment-c/drain_acks"),
    (4, "experiment-d/deferred_release"),
    (4, "experiment-e/deferred_default"),
]


@pytest.fixture
def interpreter_env(monkeypatch, tmp_path):
    """The probes' env is kvprobe's interpreter (as a synthetic pin set's is)."""
    from kvprobe.run.session import CheckSession, SessionEnv

    def environment(session: CheckSession) -> SessionEnv:
        record = EnvRecord("kvprobe-interpreter", platform.python_version(), "sglang-cpu", None, None, {}, None, None)
        session.env = SessionEnv(record, sys.executable, {}, None)
        return session.env

    monkeypatch.setattr(CheckSession, "environment", environment)
    monkeypatch.setenv("KVPROBE_CACHE_DIR", str(tmp_path / "cache"))


def _gates(tmp_path: Path, *flags: str) -> tuple[dict[str, Any], Path]:
    log = tmp_path / "prefill.log"
    log.write_text(startup_log("0.5.22", "prefill", RAISED_POOL, GLM_CONTEXT))
    tree = fake_tree(tmp_path / "sglang-tree", fixed=True)
    out = tmp_path / f"bundle{''.join(flags)}"
    argv = ["gates", "--log", str(log), "--sglang", str(tree), "--out", str(out), "--json", *flags]
    result = CliRunner().invoke(main, argv, catch_exceptions=False)
    assert result.exit_code in (1, 3), result.output
    receipt = json.loads((out / "receipt.json").read_text())
    assert json_bytes(GatesReceipt.from_json(receipt).to_json()) == (out / "receipt.json").read_bytes()
    return receipt, out


def _normal(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items() if k != "duration_s"}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    return _WORK_DIR.sub("kvprobe-gates-*", value) if isinstance(value, str) else value


def _observed(bundle: Path) -> dict[str, Any]:
    return {
        p.relative_to(bundle).as_posix(): _normal(json.loads(p.read_text())) for p in (bundle / "raw").rglob("*.json")
    }


def _verify(bundle: Path) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["verify", str(bundle), "--json"], catch_exceptions=False)
    return json.loads(result.stdout)


def test_the_probes_observe_the_same_forked_and_fresh_and_say_which(interpreter_env, tmp_path):
    forked, forked_bundle = _gates(tmp_path)
    fresh, fresh_bundle = _gates(tmp_path, "--no-preload")
    assert [(c["name"], c["mode"], c["reason"]) for c in forked["execution"]["checks"]] == [
        (name, "forked", None) for _gate, name in PROBES
    ]
    assert [(c["name"], c["mode"], c["reason"]) for c in fresh["execution"]["checks"]] == [
        (name, "fresh", "--no-preload") for _gate, name in PROBES
    ]
    assert fresh["execution"]["preloaded"] == {}
    assert {c["side"] for c in forked["execution"]["checks"]} == {"head"}
    observed = _observed(forked_bundle)
    assert sorted(observed) == sorted(f"raw/gate{gate}/{name}.json" for gate, name in PROBES)
    assert observed == _observed(fresh_bundle)
    for key in ("gates", "overall", "exit_code"):
        assert forked[key] == fresh[key], key
    # the raw files' digests differ by durations and work dirs only, which _observed compared without
    unhashed = [[{**p, "raw": p["raw"]["path"]} for p in r["probes"]] for r in (forked, fresh)]
    assert _normal(unhashed[0]) == _normal(unhashed[1])
    assert forked["gates"][1]["checks"], "gate 2 decided nothing"


def test_verify_reads_no_execution_into_a_recomputed_gate(interpreter_env, tmp_path):
    _receipt, bundle = _gates(tmp_path)
    before = _verify(bundle)
    assert before["outcome"] == "self-consistent", before

    def rewrite(change) -> dict[str, Any]:
        doc = json.loads((bundle / "receipt.json").read_text())
        change(doc)
        (bundle / "receipt.json").write_bytes(json_bytes(doc))
        manifest.write(bundle)
        return _verify(bundle)

    def as_fresh(doc: dict[str, Any]) -> None:
        doc["execution"] = {
            "preloaded": {},
            "checks": [{**c, "mode": "fresh", "reason": "--no-preload"} for c in doc["execution"]["checks"]],
        }

    flipped = rewrite(as_fresh)
    assert flipped["outcome"] == "self-consistent", flipped
    without = rewrite(lambda doc: doc.pop("execution"))  # as gates receipts were before gate 2 forked
    assert without["outcome"] == "self-consistent", without
    assert [s["notes"] for s in flipped["steps"][:5]] == [s["notes"] for s in without["steps"][:5]]

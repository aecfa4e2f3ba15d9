"""Gate 2 as `kvprobe gates --sglang` leaves it in a bundle, grafted onto a real gates bundle made
without --sglang (gate 2 needs the SGLang env to run for real: tests/integration/test_gates_sglang.py).

What is grafted: the installed experiment files and probe sources of both gate-2 experiments
under probes/<id>/, one probe output per declared probe under raw/gate2/<id>/ in which every
head expectation holds (unless ``edit`` changes them), the probe records, the ``gate2`` basis,
a target, and gate 2's checks decided by kvprobe's own rule (evidence/gate2). The hashes are
re-written, so the bundle is self-consistent.
"""

from __future__ import annotations

import copy
import shutil
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvprobe.evidence import gate2
from kvprobe.evidence.gate_status import RECORDED_EXIT_CODE, Status, combine
from kvprobe.experiments import experiment
from tests import forge

Outputs = dict[str, dict[str, dict[str, Any]]]  # {experiment id: {probe name: output}}


def _case(name: str, expected: dict[str, Any]) -> dict[str, Any]:
    """One observed case whose observations are the head expectation (``raised`` as its error)."""
    raised = expected.get("raised") or None
    error = None
    if raised:
        error = {"type": raised, "message": "m", "root_type": raised, "root_message": "m", "traceback": "t"}
    return {
        "name": name,
        "description": "as fixed",
        "status": "raised" if raised else "ok",
        "observation": "observed",
        "decision_point": "Queue.add",
        "reason": None,
        "missing": [],
        "preconditions": {},
        "observations": {k: v for k, v in expected.items() if k != "raised"},
        "error": error,
        "notes": [],
        "duration_s": 0.01,
    }


def as_fixed() -> Outputs:
    """Every gate-2 experiment's probe outputs in which each head expectation holds."""
    outputs: Outputs = {}
    for exp_id in gate2.EXPERIMENTS:
        exp = experiment.load(exp_id)
        docs = outputs.setdefault(exp_id, {})
        for probe in exp.probes:
            docs[probe.name] = {
                "schema": "kvprobe.probe-output/1",
                "probe": probe.name,
                "description": "grafted",
                "python": "3.11.7",
                "facts": {},
                "mocks": {"sender": "MagicMock KV sender"},
                "configuration": [],
                "absorbed": [],
                "cases": [],
            }
        for key, expected in sorted(exp.expectations["head"].items()):
            probe, case = key.split("/")
            docs[probe]["cases"].append(_case(case, expected))
    return outputs


def case_of(outputs: Outputs, exp_id: str, key: str) -> dict[str, Any]:
    probe, case = key.split("/")
    return next(c for c in outputs[exp_id][probe]["cases"] if c["name"] == case)


def graft(
    bundle: Path,
    written: Outputs | None = None,
    decided: Outputs | None = None,
    edit_toml: Callable[[str], str] | None = None,
) -> None:
    """Graft gate 2 onto ``bundle``: ``written`` are the raw outputs (as fixed by default) and
    ``decided`` the outputs its checks are stated from (``written`` by default: an honest
    receipt; anything else is a receipt whose gate 2 its raw outputs do not support). The
    checks hold them to the bundled experiment files' head expectations; ``edit_toml`` edits
    experiment A's bundled file first (then it is no longer the installed copy)."""
    written = written or as_fixed()
    decided = copy.deepcopy(decided or written)
    receipt = forge.load(bundle, "receipt.json")
    probes, experiments, checks = [], [], []
    for exp_id in gate2.EXPERIMENTS:
        exp = experiment.load(exp_id)
        (bundle / "probes" / exp_id).mkdir(parents=True)
        for path in [exp.directory / "experiment.toml", *sorted(exp.directory.glob("*.py"))]:
            shutil.copy2(path, bundle / "probes" / exp_id / path.name)  # what a run copies (verify/anchor)
        toml = f"probes/{exp_id}/experiment.toml"
        if edit_toml is not None and exp_id == "experiment-a":
            (bundle / toml).write_text(edit_toml((bundle / toml).read_text()))
        data = tomllib.loads((bundle / toml).read_text())
        experiments.append({"id": exp_id, "file": {"path": toml, "sha256": forge.sha((bundle / toml).read_bytes())}})
        for probe in exp.probes:
            doc = written[exp_id][probe.name]
            raw_rel = f"raw/gate2/{exp_id}/{probe.name}.json"
            (bundle / raw_rel).parent.mkdir(parents=True, exist_ok=True)
            (bundle / raw_rel).write_bytes(forge.dumps(doc))
            source = f"probes/{exp_id}/{probe.path}"
            probes.append(
                {
                    "experiment": exp_id,
                    "name": probe.name,
                    "source": {"path": source, "sha256": forge.sha((bundle / source).read_bytes())},
                    "raw": {"path": raw_rel, "sha256": forge.sha((bundle / raw_rel).read_bytes())},
                    "exit_code": 0,
                    "problem": None,
                    "duration_s": 1.0,
                    "configuration": doc["configuration"],
                    "absorbed": doc["absorbed"],
                }
            )
        checks += gate2.experiment_checks(exp_id, exp.fix.prs, data["expect"]["head"], decided[exp_id], [])
    receipt["target"] = {"spec": "sglang", "kind": "path", "identity": {}, "markers": [], "settings": None}
    receipt["probes"] = probes
    receipt["gate2"] = {"algorithm": gate2.ALGORITHM, "experiments": experiments}
    gate = next(g for g in receipt["gates"] if g["number"] == 2)
    gate["checks"] = [c.record().to_json() for c in checks]
    gate["status"] = combine(c.status for c in checks).value
    overall = combine(Status(g["status"]) for g in receipt["gates"])
    receipt.update(overall=overall.value, exit_code=RECORDED_EXIT_CODE[overall])
    (bundle / "receipt.json").write_bytes(forge.dumps(receipt))
    forge.rehash(bundle)

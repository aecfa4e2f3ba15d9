"""The behavioural gates (2, 3 and 4) as `kvprobe gates --sglang` leaves them in a bundle, grafted
onto a real gates bundle made without --sglang (the probes need the SGLang env to run for real:
tests/integration/test_gates_sglang.py).

What is grafted: the installed experiment files and probe sources of every behavioural gate's
experiments (A, B for gate 2; F for gate 3; C, D, E for gate 4) under probes/<id>/, one probe
output per declared probe under raw/gate<N>/<id>/ in which every head expectation holds (unless
``written`` says otherwise), the probe records, the ``behaviour`` bases, a target, and each
gate's probe checks decided by kvprobe's own rule (rules/gate_probes): all of gate 2's
checks, the first of gates 3 and 4's (their settings and marker checks stay as the bundle had
them). The hashes are re-written, so the bundle is self-consistent.
"""

from __future__ import annotations

import copy
import shutil
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvprobe.evidence.gates_readme import render_readme
from kvprobe.experiments import experiment
from kvprobe.gates import fixmarkers
from kvprobe.model.gates_receipt import GatesReceipt
from kvprobe.rules import gate_probes
from kvprobe.rules.gate_status import RECORDED_EXIT_CODE, Status, combine
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


def experiments() -> list[tuple[int, str]]:
    """(gate, experiment id) of every behavioural gate, in the order a gates run runs them."""
    return [(n, e) for n in gate_probes.BEHAVIOURAL for e in gate_probes.RULES[n].experiments]


def as_fixed() -> Outputs:
    """Every behavioural experiment's probe outputs in which each head expectation holds."""
    outputs: Outputs = {}
    for _gate, exp_id in experiments():
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
    """Graft gates 2-4's probes onto ``bundle``: ``written`` are the raw outputs (as fixed by
    default) and ``decided`` the outputs the checks are stated from (``written`` by default: an
    honest receipt; anything else is a receipt whose probe checks its raw outputs do not
    support). The checks hold them to the bundled experiment files' head expectations;
    ``edit_toml`` edits experiment A's bundled file first (then it is no longer the installed copy)."""
    written = written or as_fixed()
    decided = copy.deepcopy(decided or written)
    receipt = forge.load(bundle, "receipt.json")
    probes: list[dict[str, Any]] = []
    cited: dict[int, list[dict[str, Any]]] = {n: [] for n in gate_probes.BEHAVIOURAL}
    checks: dict[int, list] = {n: [] for n in gate_probes.BEHAVIOURAL}
    for gate_number, exp_id in experiments():
        rule = gate_probes.RULES[gate_number]
        exp = experiment.load(exp_id)
        (bundle / "probes" / exp_id).mkdir(parents=True)
        for path in [exp.directory / "experiment.toml", *sorted(exp.directory.glob("*.py"))]:
            shutil.copy2(path, bundle / "probes" / exp_id / path.name)  # what a run copies (verify/anchor)
        toml = f"probes/{exp_id}/experiment.toml"
        if edit_toml is not None and exp_id == "experiment-a":
            (bundle / toml).write_text(edit_toml((bundle / toml).read_text()))
        data = tomllib.loads((bundle / toml).read_text())
        digest = forge.sha((bundle / toml).read_bytes())
        cited[gate_number].append({"id": exp_id, "file": {"path": toml, "sha256": digest}})
        for probe in exp.probes:
            doc = written[exp_id][probe.name]
            raw_rel = f"raw/gate{gate_number}/{exp_id}/{probe.name}.json"
            (bundle / raw_rel).parent.mkdir(parents=True, exist_ok=True)
            (bundle / raw_rel).write_bytes(forge.dumps(doc))
            source = f"probes/{exp_id}/{probe.path}"
            probes.append(
                {
                    "gate": gate_number,
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
        head = data["expect"]["head"]
        checks[gate_number] += gate_probes.experiment_checks(rule, exp_id, exp.fix.prs, head, decided[exp_id], [])
    # a tree whose markers could not be read: each marker check the bundle has stays unknown
    unread = [
        {
            "pr": m.pr,
            "gate": m.gate,
            "title": m.title,
            "presence": "unknown",
            "evidence": "anchor not found",
            "first_release": m.first_release,
            "basis": m.basis,
        }
        for m in fixmarkers.markers()
    ]
    receipt["target"] = {"spec": "sglang", "kind": "path", "identity": {}, "markers": unread, "settings": None}
    receipt["probes"] = probes
    receipt["behaviour"] = [
        {"gate": n, "algorithm": gate_probes.RULES[n].algorithm, "experiments": cited[n]}
        for n in gate_probes.BEHAVIOURAL
    ]
    for gate in receipt["gates"]:
        if gate["number"] not in checks:
            continue
        rule = gate_probes.RULES[gate["number"]]
        rest = [c for c in gate["checks"] if not (gate["number"] == 2 or rule.owns(c["name"]))]
        gate["checks"] = [c.record().to_json() for c in checks[gate["number"]]] + rest
        gate["status"] = combine(Status(c["status"]) for c in gate["checks"] if c["decides"]).value
    overall = combine(Status(g["status"]) for g in receipt["gates"])
    receipt.update(overall=overall.value, exit_code=RECORDED_EXIT_CODE[overall])
    reseal(bundle, receipt)


def reseal(bundle: Path, receipt: dict[str, Any]) -> None:
    """Write ``receipt``, README.md as kvprobe renders it from the receipt, and the hashes: what a
    writer derives, so only what the receipt states is left to verify."""
    (bundle / "receipt.json").write_bytes(forge.dumps(receipt))
    (bundle / "README.md").write_text(render_readme(GatesReceipt.from_json(receipt)), encoding="utf-8")
    forge.rehash(bundle)


def as_schema_3(receipt: dict[str, Any]) -> None:
    """``receipt`` (/4) rewritten as kvprobe wrote /3: gate 2 the only behavioural gate (its basis
    ``gate2``, probes without ``gate``), gates 3 and 4 without probe checks, decided by markers."""
    receipt["schema"] = "kvprobe.gates-receipt/3"
    basis = next(b for b in receipt.pop("behaviour") if b["gate"] == 2)
    receipt["gate2"] = {"algorithm": basis["algorithm"], "experiments": basis["experiments"]}
    receipt["probes"] = [{k: v for k, v in p.items() if k != "gate"} for p in receipt["probes"] if p["gate"] == 2]
    for gate in receipt["gates"]:
        if gate["number"] in (3, 4):
            rule = gate_probes.RULES[gate["number"]]
            gate["checks"] = [c for c in gate["checks"] if not rule.owns(c["name"])]
            for check in gate["checks"]:
                check["decides"] = check["decides"] or check["name"].endswith(" in code")

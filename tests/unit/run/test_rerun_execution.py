"""How checks were started (fresh or forked) is noted by a rerun, never counted as a difference."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from kvprobe.model.receipt import Receipt
from kvprobe.run.rerun import diff_runs, env_notes

MODEL_BUNDLE = next(Path(__file__).resolve().parents[3].joinpath("bundles").glob("model-*"))


def _forked(receipt: dict) -> dict:
    forked = copy.deepcopy(receipt)
    forked["execution"] = {
        "preloaded": {"torch": "2.14.1+cpu"},
        "checks": [
            {"side": side, "check": "probe", "name": p["name"], "mode": "forked", "reason": None}
            for side in ("base", "head")
            for p in receipt["sides"][side]["probes"]
        ],
    }
    return forked


def test_a_rerun_in_another_mode_differs_in_nothing_but_a_note():
    doc = json.loads((MODEL_BUNDLE / "receipt.json").read_text())
    assert "execution" not in doc  # published before the fork server: fresh interpreters
    published, rerun = Receipt.from_json(doc), Receipt.from_json(_forked(doc))
    assert diff_runs(published, rerun) == []
    assert "checks ran forked in the rerun, fresh when published" in env_notes(published, rerun)


def test_the_same_mode_is_not_noted():
    published = Receipt.from_json(_forked(json.loads((MODEL_BUNDLE / "receipt.json").read_text())))
    assert not [n for n in env_notes(published, copy.deepcopy(published)) if n.startswith("checks ran")]

"""Tests of the synthetic PD handoff model (probes/model): every case on both sides,
the invariant search on both sides, and the probe files run the way the runner runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvprobe.experiments.experiment import load_file

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "probes" / "model"
PROBE_API = ROOT / "kvprobe" / "probe_api"
sys.path[:0] = [str(MODEL_DIR), str(PROBE_API)]

import admission  # noqa: E402
import handoff  # noqa: E402
import invariants  # noqa: E402
import pd_model as m  # noqa: E402

SIDES = {"base": m.BASE, "head": m.HEAD}
MODULES = {"handoff": handoff, "admission": admission, "invariants": invariants}


# ---------------------------------------------------------------- expectations


def _expected() -> dict[str, dict[str, dict]]:
    """Case ("<probe>/<case>") -> side -> observations that must be recorded exactly so: the shipped
    experiment's [expect] tables, the ones `kvprobe run model` compares against."""
    by_case: dict[str, dict[str, dict]] = {}
    for side, cases in load_file(MODEL_DIR / "experiment.toml").expectations.items():
        for case, observations in cases.items():
            by_case.setdefault(case, {})[side] = dict(observations)
    return by_case


EXPECTED = _expected()

# which invariant a case searches (for replaying its trace)
CASE_INVARIANT = {name: name.split(".")[0] for name in invariants.CASES}


def _subset(observed: dict, expected: dict) -> dict:
    return {k: observed.get(k, "<missing>") for k in expected}


# ---------------------------------------------------------------- coverage of the table


def test_every_case_has_expectations_for_both_sides():
    registered = {f"{p}/{c}" for p, mod in MODULES.items() for c in mod.CASES}
    assert registered == set(EXPECTED)
    assert all(set(v) == {"base", "head"} for v in EXPECTED.values())
    assert len(handoff.CASES) >= 7 and len(admission.CASES) >= 9


def test_the_invariant_cases_expect_the_search_budget_the_module_runs():
    budget = dict(seed=invariants.SEED, max_examples=invariants.MAX_EXAMPLES, stateful_step_count=invariants.STEPS)
    searched = [obs for case, sides in EXPECTED.items() if case.startswith("invariants/") for obs in sides.values()]
    assert len(searched) == 10 and all(_subset(obs, budget) == budget for obs in searched)


def test_case_names_and_docstrings():
    for mod in MODULES.values():
        for name, fn in mod.CASES.items():
            assert name == name.lower() and set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789_.")
            assert (fn.__doc__ or "").strip(), name


# ---------------------------------------------------------------- the model's pieces


def test_switches_round_trip_and_are_strict():
    assert m.Switches.from_dict(m.BASE.to_dict()) == m.BASE
    assert m.HEAD.to_dict() == {
        "door": "pending_reject",
        "result_cleanup": "post_36988",
        "kv_checksum": False,
        "deferred_release": True,
    }
    with pytest.raises(ValueError, match="missing"):
        m.Switches.from_dict({"door": "finished"})
    with pytest.raises(ValueError, match="unknown"):
        m.Switches.from_dict({**m.BASE.to_dict(), "extra": 1})
    with pytest.raises(ValueError, match="door"):
        m.BASE.replace(door="open")
    with pytest.raises(RuntimeError, match="no side switches"):
        m.switches_from_side({})


def test_geometry_keeps_the_incident_ratio():
    g = m.Geometry.scaled()
    assert (g.context_tokens, g.prefill_pool_tokens, g.page_size) == (1024, 665, 16)
    real = m.INCIDENT_PREFILL_POOL_TOKENS / m.INCIDENT_CONTEXT_TOKENS
    assert abs(g.prefill_pool_tokens / g.context_tokens - real) < 0.001
    assert m.Geometry.scaled(m.INCIDENT_RAISED_POOL_TOKENS).prefill_pool_tokens >= g.context_tokens


def test_rejection_hides_in_to_finish_until_update_finish_state():
    req = m.Req("r0", "a", list(range(1, 801)))
    req.set_finish_with_abort(m.ABORT_TOO_LONG)
    assert req.origin_input_ids == [0] and req.to_finish == m.ABORT_TOO_LONG
    assert not req.finished()
    assert m.door_admits(req, "finished")  # the pre-#38935 door lets it in
    assert not m.door_admits(req, "pending_reject")  # the #38935 door does not
    req.update_finish_state()
    assert req.finished() and req.to_finish is None


def test_door_keeps_reentry():
    for flags, holds in (
        ({"is_retracted": True}, None),
        ({"is_rebootstrap": True}, None),
        ({}, "metadata_buffer_index"),
        ({}, "kv_retraction_backup"),
        ({}, "holds_kv"),
        ({}, "holds_mamba"),
    ):
        req = m.Req("r0", "a", [1])
        req.to_finish = "abort"
        if holds:
            setattr(req, holds, 0 if holds == "metadata_buffer_index" else True)
        assert m.door_admits(req, "pending_reject", **flags), (flags, holds)
    bare = m.Req("r0", "a", [1], to_finish="abort")
    assert not m.door_admits(bare, "pending_reject")


def test_ledger_counts_double_frees_and_leaks():
    ledger = m.Ledger()
    a = ledger.allocate("kv", "r0")
    ledger.allocate("mamba", "r0")
    ledger.free(a)
    ledger.free(a)
    assert ledger.double_frees() == ["kv:r0"] and ledger.leaks() == ["mamba:r0"]
    with pytest.raises(AssertionError):
        ledger.allocate("kv", "r0")


def test_released_pages_keep_their_contents():
    pool = m.PagePool("decode", 64, 16)
    pages = pool.reserve(2)
    for i in pages:
        pool.write(i, m.Req("r0", "b", [1]))
    pool.release(pages)
    again = pool.reserve(4)
    assert again[:2] == pages and [pool.pages[i].canary for i in again] == ["b/r0", "b/r0", None, None]


# ---------------------------------------------------------------- every case, both sides

HANDOFF_ADMISSION = [(p, c, s) for p in ("handoff", "admission") for c in MODULES[p].CASES for s in SIDES]


@pytest.mark.parametrize("probe,case,side", HANDOFF_ADMISSION, ids=[f"{p}/{c}[{s}]" for p, c, s in HANDOFF_ADMISSION])
def test_case(probe, case, side):
    observed = MODULES[probe].CASES[case](SIDES[side])
    expected = EXPECTED[f"{probe}/{case}"][side]
    assert _subset(observed, expected) == expected
    json.dumps(observed, allow_nan=False)  # every observation is plain JSON


def test_base_and_head_differ_where_the_fixes_act():
    """A guard against a model that always passes: the headline cases must differ."""
    for key in (
        "handoff/over_pool.buggy_door",
        "handoff/late_result.after_abort",
        "admission/prefill.rejected_new",
        "admission/session.streaming_detach",
    ):
        probe, case = key.split("/")
        fn = MODULES[probe].CASES[case]
        assert fn(m.BASE) != fn(m.HEAD), key


INVARIANT_CASES = [(c, s) for c in invariants.CASES for s in SIDES]


@pytest.mark.parametrize("case,side", INVARIANT_CASES, ids=[f"{c}[{s}]" for c, s in INVARIANT_CASES])
def test_invariant_search(case, side):
    result = invariants.CASES[case](SIDES[side])
    expected = EXPECTED[f"invariants/{case}"][side]
    assert _subset(result, expected) == expected
    if result["counterexample_found"]:
        assert result["trace"] and result["trace_length"] == len(result["trace"])
        # the shrunk trace is a real counterexample: replayed without hypothesis, it breaks the invariant
        cluster = invariants.replay(result["trace"], m.Switches.from_dict(result["switches"]))
        check = invariants.INVARIANTS[CASE_INVARIANT[case]]
        assert check(cluster) is not None
        assert result["violation"].startswith(CASE_INVARIANT[case])
    else:
        assert result["trace"] == [] and result["violation"] is None


def test_head_is_clean_on_every_example_the_search_generates():
    """No find on head is not a vacuous pass: the same machine finds lifetime bugs once a
    single fix is pinned off (see the two pinned cases) and runs its whole budget."""
    joint = invariants.search(tuple(invariants.INVARIANTS), m.HEAD)
    assert not joint["counterexample_found"]
    assert joint["machine_runs"] >= invariants.MAX_EXAMPLES


# ---------------------------------------------------------------- run like the runner


def _run_probe(stem: str, side: str, tmp_path: Path, config: str | None = "side") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "KVPROBE_SIDE_CONFIG"}
    env["PYTHONPATH"] = f"{MODEL_DIR}:{PROBE_API}"
    if config == "side":
        env["KVPROBE_SIDE_CONFIG"] = json.dumps({"side": side, "switches": SIDES[side].to_dict()})
    return subprocess.run(
        [sys.executable, str(MODEL_DIR / f"{stem}.py"), "--out", str(tmp_path / "out.json")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


RUNS = [(stem, side) for stem in MODULES for side in SIDES]


@pytest.mark.parametrize("stem,side", RUNS, ids=[f"{s}[{d}]" for s, d in RUNS])
def test_probe_file_as_the_runner_runs_it(stem, side, tmp_path):
    proc = _run_probe(stem, side, tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["schema"] == "kvprobe.probe-output/1" and doc["probe"] == stem
    assert "sglang" in doc["mocks"] and "not SGLang" in doc["mocks"]["sglang"]
    assert "nothing about SGLang" in doc["description"]
    assert doc["facts"]["switches"] == SIDES[side].to_dict()
    names = [c["name"] for c in doc["cases"]]
    assert names == list(MODULES[stem].CASES)
    for case in doc["cases"]:
        assert case["status"] == "ok", case["error"]
        assert case["description"]
        expected = EXPECTED[f"{stem}/{case['name']}"][side]
        assert _subset(case["observations"], expected) == expected, case["name"]
    assert not (tmp_path / ".hypothesis").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_probe_file_without_side_config_fails_loudly(tmp_path):
    proc = _run_probe("handoff", "base", tmp_path, config=None)
    assert proc.returncode != 0
    assert "no side switches" in proc.stderr
    assert not (tmp_path / "out.json").exists()

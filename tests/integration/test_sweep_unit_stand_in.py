"""Sweep units of experiment-a on a stand-in release (a small wheel named sglang 0.5.19 on a
local find-links directory): no SGLang, no network, real probe processes.

- A unit run by the local executor finds experiments where its driver does. `verify --rerun`
  of a sweep re-runs the installed experiment inside
  :func:`kvprobe.resources.builtin_search_path`, never a ./probes of the current directory.
  A thread does not inherit the driver's context, so each unit must be handed it: otherwise
  it loads the experiment by id from ./probes (a planted copy with the installed
  experiment.toml passes the unit's digest check) and runs its probe files.
- The driver refuses a unit whose files would take the merged sweep past the bundle limits:
  one unit must not make the whole sweep fail its own verification.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

import pytest

from kvprobe.evidence.safetree import Limits
from kvprobe.experiments.experiment import copy_into_bundle, load_file
from kvprobe.model.receipt import EnvRecord
from kvprobe.model.records import Experiment, WheelPin
from kvprobe.progress import Reporter
from kvprobe.resources import builtin_probes_dir, builtin_search_path
from kvprobe.run.session import CheckSession, SessionEnv, SessionSettings
from kvprobe.run.sweep_unit import Expected, LocalExecutor, UnitRequest, accept_unit, wheel_pin_set
from kvprobe.verify.anchor import installed_experiment
from tests.wheelfactory import build_wheel


@pytest.fixture
def stand_in(tmp_path, monkeypatch) -> tuple[Experiment, UnitRequest, CheckSession]:
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    links = tmp_path / "links"
    links.mkdir()
    # the probes find no SGLang code in it; a release experiment-a does not pin (a pinned one
    # must be the pinned wheel: verify holds a sweep's release to the experiment's sha256)
    wheel = build_wheel(links, "sglang", "0.5.19")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    installed = installed_experiment("experiment-a")
    assert installed is not None
    exp = load_file(installed / "experiment.toml")
    pin = WheelPin("sglang", "0.5.19", wheel.name, hashlib.sha256(wheel.read_bytes()).hexdigest())
    request = UnitRequest(exp.id, exp.file_sha256, pin, 60.0, None, tmp_path / "cache")
    env = EnvRecord("test", "3", exp.profile, None, None, {}, None, None)
    given = SessionEnv(env, sys.executable, {}, None)
    return exp, request, CheckSession(exp, wheel_pin_set(exp), SessionSettings(tmp_path / "cache"), env=given)


def test_a_local_unit_inside_a_rerun_runs_the_installed_probes_not_dot_probes(stand_in, tmp_path):
    exp, request, session = stand_in
    marker = tmp_path / "MARKER-planted-probe-ran"
    planted = tmp_path / "cwd" / "probes" / "experiment-a"
    shutil.copytree(builtin_probes_dir() / "experiment-a", planted)  # experiment.toml: the installed bytes
    for probe in planted.glob("*.py"):
        probe.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('planted code ran')\n")
    with builtin_search_path():
        (outcome,) = LocalExecutor(exp, session, 1, Reporter()).run([request])
    assert not marker.exists(), "the unit ran ./probes' copy of the experiment"
    assert outcome.archive is not None, outcome.problem


def test_a_unit_that_would_overfill_the_sweep_is_refused_not_merged(stand_in, tmp_path):
    exp, request, session = stand_in
    (outcome,) = LocalExecutor(exp, session, 1, Reporter()).run([request])
    assert outcome.archive is not None, outcome.problem
    staging = tmp_path / "staging"
    copy_into_bundle(exp, staging)
    limits = Limits(max_files=100)  # the unit alone fits: it verifies under these limits
    for i in range(100 - 16 - _count(staging) - 1):  # earlier units' files: room for one more
        (staging / "logs" / "0.5.19").mkdir(parents=True, exist_ok=True)
        (staging / "logs" / "0.5.19" / f"{i}.log").write_text("x")
    entry, env = accept_unit(outcome, Expected(exp, staging, session.record, limits), tmp_path)
    assert env is None
    assert entry.classification.overall == "could-not-observe"
    assert entry.problem is not None and "would take the sweep past 100 files" in entry.problem
    assert not (staging / "raw" / "0.5.19").exists()

    room = Expected(exp, tmp_path / "empty", session.record, limits)
    copy_into_bundle(exp, room.staging)
    entry, env = accept_unit(outcome, room, tmp_path)
    assert entry.problem is None and env == session.record  # with room, the same unit is merged
    assert (room.staging / "raw" / "0.5.19").is_dir()


def _count(root: Path) -> int:
    return sum(1 for p in root.rglob("*") if p.is_file())

"""A sweep unit run by the local executor finds experiments where its driver does.

`verify --rerun` of a sweep re-runs the installed experiment inside
:func:`kvprobe.resources.builtin_search_path`: never a ./probes of the current directory. The
local executor runs units in threads, and a thread does not inherit the driver's context, so
each unit must be handed it: otherwise the unit loads the experiment by id from ./probes
(a planted copy with the installed experiment.toml passes the unit's digest check) and runs
its probe files.
"""

from __future__ import annotations

import hashlib
import shutil
import sys

from kvprobe.model.records import WheelPin
from kvprobe.progress import Reporter
from kvprobe.resources import builtin_probes_dir, builtin_search_path
from kvprobe.run.sweep_unit import LocalExecutor, Prepared, UnitRequest
from kvprobe.sources.wheel import WheelSource
from kvprobe.verify.anchor import installed_experiment
from tests.wheelfactory import build_wheel


def test_a_local_unit_inside_a_rerun_runs_the_installed_probes_not_dot_probes(tmp_path, monkeypatch):
    marker = tmp_path / "MARKER-planted-probe-ran"
    planted = tmp_path / "cwd" / "probes" / "experiment-a"
    shutil.copytree(builtin_probes_dir() / "experiment-a", planted)  # experiment.toml: the installed bytes
    for probe in planted.glob("*.py"):
        probe.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('planted code ran')\n")
    monkeypatch.chdir(tmp_path / "cwd")
    links = tmp_path / "links"
    links.mkdir()
    wheel = build_wheel(links, "sglang", "0.5.20")  # a stand-in release: the probes find no SGLang code
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    installed = installed_experiment("experiment-a")
    assert installed is not None
    from kvprobe.experiments.experiment import load_file

    exp = load_file(installed / "experiment.toml")
    pin = WheelPin("sglang", "0.5.20", wheel.name, hashlib.sha256(wheel.read_bytes()).hexdigest())
    request = UnitRequest(exp.id, exp.file_sha256, pin, 60.0, None, tmp_path / "cache")
    prepared = Prepared({"key": "test"}, sys.executable, {}, WheelSource(tmp_path / "cache"))
    with builtin_search_path():
        (outcome,) = LocalExecutor(prepared, 1, Reporter()).run([request])
    assert not marker.exists(), "the unit ran ./probes' copy of the experiment"
    assert outcome.archive is not None, outcome.problem

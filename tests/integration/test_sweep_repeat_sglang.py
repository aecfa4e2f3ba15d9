"""`kvprobe sweep experiment-a --releases 0.5.21 --repeat 2` on the real SGLang wheel: both runs
of the probe agree on the fix release (classification.unstable is empty), so the release keeps
its class; the bundle cites both runs and verifies."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvprobe.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.network]


def test_a_repeated_sweep_of_real_sglang_is_stable_and_verifies(tmp_path):
    out = tmp_path / "sweep"
    runner = CliRunner()
    argv = ["sweep", "experiment-a", "--releases", "0.5.21", "--repeat", "2", "--out", str(out), "--json", "--no-reuse"]
    result = runner.invoke(main, argv, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["summary"] == {"fixed": ["0.5.21"]}
    receipt = json.loads((out / "receipt.json").read_text())
    (release,) = receipt["releases"]
    assert receipt["repeats"] == 2 and release["classification"]["unstable"] == {}
    for probe in release["probes"]:
        (again,) = probe["repeats"]
        assert again["raw"]["path"] == f"raw/0.5.21/probes/{probe['name']}.repeat-2.json"
        first = json.loads((out / probe["raw"]["path"]).read_text())
        second = json.loads((out / again["raw"]["path"]).read_text())
        assert [c["observations"] for c in first["cases"]] == [c["observations"] for c in second["cases"]]
    assert runner.invoke(main, ["verify", str(out)], catch_exceptions=False).exit_code == 0

"""./probes or KVPROBE_PROBES_PATH over a built-in experiment: warned about only when the
files differ (a checkout's own probes/ is the same experiment), with how to run the other."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from kvprobe.resources import builtin_probes_dir


@pytest.fixture
def local_copy(tmp_path, monkeypatch):
    """./probes/model in the current directory: a byte-for-byte copy of the built-in one."""
    monkeypatch.delenv("KVPROBE_PROBES_PATH", raising=False)
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "probes" / "model"
    shutil.copytree(builtin_probes_dir() / "model", target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def show():
    return CliRunner().invoke(main, ["show", "model"], catch_exceptions=False)


def test_the_same_experiment_in_probes_is_not_warned_about(local_copy):
    result = show()
    assert result.exit_code == 0, result.output
    assert "shadows" not in result.stderr and "warning" not in result.stderr


def test_a_different_experiment_in_probes_is_warned_about_with_the_way_out(local_copy):
    probe = next(p for p in sorted(local_copy.glob("*.py")))
    probe.write_text(probe.read_text() + "\n# a local edit\n")
    result = show()
    assert result.exit_code == 0, result.output
    assert "experiment model from ./probes" in result.stderr
    assert "shadows the built-in one" in result.stderr and probe.name in result.stderr
    assert "run from a directory without ./probes/model" in result.stderr


def test_a_different_experiment_on_kvprobe_probes_path_says_to_unset_it(local_copy, tmp_path, monkeypatch):
    other = tmp_path / "elsewhere"
    shutil.copytree(local_copy, other / "model")
    (other / "model" / "extra_helper.py").write_text("X = 1\n")
    monkeypatch.setenv("KVPROBE_PROBES_PATH", str(other))
    result = show()
    assert "experiment model from KVPROBE_PROBES_PATH" in result.stderr
    assert "extra_helper.py" in result.stderr and "unset KVPROBE_PROBES_PATH" in result.stderr
    assert result.stderr.count("warning") == 2  # over ./probes and over the built-in one


def test_sweep_warns_too(local_copy):
    """sweep never warned (#25); it says so before it refuses or runs anything."""
    (local_copy / "experiment.toml").write_text((local_copy / "experiment.toml").read_text() + "\n# edited\n")
    result = CliRunner().invoke(main, ["sweep", "model", "--releases", "1.0"], catch_exceptions=False)
    assert "experiment model from ./probes" in result.stderr and "experiment.toml" in result.stderr

"""`kvprobe run` and `kvprobe sweep` with several experiments (issue #23): what --all means,
the combined exit code, and the usage errors refused before anything runs."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import kvprobe.run.runner as runner
import kvprobe.run.sweep_runner as sweep
from kvprobe.cli import main
from kvprobe.cli.run_cmds import _worst
from kvprobe.experiments.experiment import shipped_ids
from kvprobe.resources import builtin_probes_dir


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """The CLI with the built-in experiments only, an empty cache, and nothing allowed to run."""
    monkeypatch.chdir(tmp_path)  # no ./probes
    monkeypatch.delenv("KVPROBE_PROBES_PATH", raising=False)
    monkeypatch.setenv("KVPROBE_CACHE_DIR", str(tmp_path / "cache"))

    def refuse(*args, **kwargs):
        raise AssertionError("ran an experiment after a usage error")

    monkeypatch.setattr(runner, "run_experiment", refuse)
    monkeypatch.setattr(sweep, "sweep_experiment", refuse)

    def invoke(*args: str):
        return CliRunner().invoke(main, list(args), catch_exceptions=False)

    return invoke


def test_all_is_every_shipped_experiment_with_an_env_not_the_model():
    shipped = sorted(p.parent.name for p in builtin_probes_dir().glob("*/experiment.toml"))
    assert "model" in shipped
    assert shipped_ids() == [name for name in shipped if name != "model"]
    assert len(shipped_ids()) >= 6


@pytest.mark.parametrize(
    "codes, worst",
    [([0, 0], 0), ([0, 1], 1), ([1, 3, 0], 3), ([3, 1], 3), ([0, 2, 3], 2), ([0], 0)],
)
def test_the_exit_code_of_several_is_the_worst(codes, worst):
    assert _worst(codes) == worst


@pytest.mark.parametrize("command", ["run", "sweep"])
@pytest.mark.parametrize(
    "args, says",
    [
        (["experiment-c", "experiment-c"], "named twice"),
        (["--all", "experiment-c"], "not both"),
        ([], "give an experiment id"),
        (["experiment-c", "no-such-experiment"], "no-such-experiment"),
    ],
)
def test_several_ids_usage_errors_are_exit_2(cli, tmp_path, command, args, says):
    result = cli(command, *args, "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert says in result.stderr and result.stderr.startswith("kvprobe: error:")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--pins", "release"], "--pins applies to one experiment"),
        (["--repo", "/tmp"], "--repo applies to one experiment"),
        (["--record-expectations"], "--record-expectations applies to one experiment"),
    ],
)
@pytest.mark.parametrize("ids", [["experiment-c", "experiment-d"], ["--all"]])
def test_run_refuses_what_is_ambiguous_with_several(cli, tmp_path, ids, flags, says):
    result = cli("run", *ids, *flags, "--out", str(tmp_path / "out"))
    assert result.exit_code == 2 and says in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", [["run"], ["sweep", "--releases", "0.5.20,0.5.21"]])
def test_a_taken_bundle_refuses_every_experiment_before_any_runs(cli, tmp_path, command):
    out = tmp_path / "out"
    (out / "experiment-d").mkdir(parents=True)
    (out / "experiment-d" / "keep.txt").write_text("user data")
    result = cli(*command, "experiment-c", "experiment-d", "--out", str(out))
    assert result.exit_code == 2 and "experiment-d" in result.stderr and "refusing to overwrite" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["experiment-d"]

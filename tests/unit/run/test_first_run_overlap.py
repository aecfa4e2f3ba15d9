"""A first run builds its env while the trees are fetched, not after (issue #26)."""

from __future__ import annotations

import threading

import pytest

import kvprobe.run.runner as runner
from kvprobe.errors import ObserveError
from kvprobe.experiments.experiment import load
from kvprobe.run.session import CheckSession


class Stop(Exception):
    pass


@pytest.fixture
def first_run(tmp_path, monkeypatch):
    """run_experiment with no env cached: the session's build and _materialize() record each other."""
    seen: dict[str, bool] = {}
    env_started, trees_started = threading.Event(), threading.Event()

    def look_up(self, build):
        if not build:
            return None  # nothing cached
        env_started.set()
        seen["trees_started_before_env_returned"] = trees_started.wait(10)
        raise ObserveError("env build failed (test)")

    def materialize(exp, pin_set, opts, work, reporter, held):
        trees_started.set()
        seen["env_building_while_trees"] = env_started.wait(10)
        raise Stop

    monkeypatch.setattr(runner, "_check_sources", lambda exp, pin_set, opts: None)
    monkeypatch.setattr(CheckSession, "_look_up", look_up)
    monkeypatch.setattr(runner, "_materialize", materialize)
    opts = runner.RunOptions(cache_root=tmp_path / "cache", bundles_dir=tmp_path / "bundles", jobs=1)
    return opts, seen


def test_the_env_is_built_while_the_trees_are_materialized(first_run):
    opts, seen = first_run
    with pytest.raises(Stop):  # the trees' error wins; the env build was waited for, not left running
        runner.run_experiment(load("experiment-a"), opts)
    assert seen == {"env_building_while_trees": True, "trees_started_before_env_returned": True}


@pytest.mark.parametrize("preload", [True, False])
def test_an_env_build_error_still_ends_the_run(first_run, monkeypatch, preload):
    opts, _ = first_run
    opts.preload = preload

    def look_up(self, build):
        if build:
            raise ObserveError("env build failed (test)")
        return None

    monkeypatch.setattr(CheckSession, "_look_up", look_up)
    monkeypatch.setattr(runner, "_materialize", lambda *a: {})
    with pytest.raises(ObserveError, match="env build failed"):
        runner.run_experiment(load("experiment-a"), opts)

"""The check session run, sweep and gates open: when it asks for a server, and what it records.

A synthetic experiment's env is kvprobe's own interpreter (nothing built), and a server share
that starts none stands in for the invocation's pool: nothing here starts a process.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from types import SimpleNamespace

from kvprobe.checks.forkserver import FORKED, FRESH, PRELOAD, Execution, ForkServer
from kvprobe.experiments import experiment
from kvprobe.model.records import Side
from kvprobe.run.session import CheckSession, SessionEnv, SessionSettings


class _NoServers:
    """A share that records what it was asked for and starts nothing."""

    def __init__(self) -> None:
        self.leases = contextlib.ExitStack()
        self.asked: list[tuple[str, tuple[str, ...], bool]] = []

    def get(
        self, env: SessionEnv, settings: SessionSettings, modules: tuple[str, ...]
    ) -> tuple[ForkServer | None, str | None]:
        self.asked.append((env.python, modules, settings.preload))
        return None, "the share has none"


def _model() -> CheckSession:
    exp = experiment.load("model")
    return CheckSession(exp, exp.pin_sets[exp.default_pin_set], SessionSettings(Path("unused-cache")))


def test_the_server_is_asked_for_once_and_only_once_the_env_is_known():
    exp = experiment.load("model")
    share = _NoServers()
    with CheckSession(exp, exp.pin_sets["model"], SessionSettings(Path("unused-cache")), share=share) as session:
        session.start(Path("unused-work"), 60.0)
        assert share.asked == []  # no env yet: the caller starts it again once there is one
        env = session.cached()  # a synthetic pin set: kvprobe's interpreter, nothing to build
        assert env is not None and (env.python, env.directory, env.record.key) == (
            sys.executable,
            None,
            "kvprobe-interpreter",
        )
        session.start(Path("unused-work"), 60.0)
        session.start(Path("unused-work"), 60.0)
        assert share.asked == [(sys.executable, PRELOAD, True)]
        assert session.ready() is None and session.fresh_reason == "the share has none"


def test_the_execution_gives_fresh_checks_the_sessions_reason_and_keeps_their_own():
    session = _model()
    session.environment()
    session.fresh_reason = "--no-preload"

    def probe(name: str, how: Execution) -> dict[str, object]:
        return {"name": name, "run": SimpleNamespace(execution=how)}

    ran = [probe("a", Execution(FRESH)), probe("b", Execution(FRESH, "its own")), probe("c", Execution(FORKED))]
    record = session.execution({Side.HEAD: {"tests": [], "probes": ran}})
    assert [(c.name, c.mode, c.reason) for c in record.checks] == [
        ("a", FRESH, "--no-preload"),
        ("b", FRESH, "its own"),
        ("c", FORKED, None),
    ]
    assert record.preloaded == {}


def test_a_server_started_when_needed_waits_for_launch_and_starts_once(monkeypatch):
    """start(when_needed=True) only notes the server (its checks still count as forked, so a
    unit's cache key does not change); launch(), or ready(), starts it, once."""
    started: list[tuple[str, float]] = []

    def fork_server(python, env_vars, work, lifetime_s, preload, *rest):
        started.append((python, lifetime_s))
        return None, "stands in for a server"

    monkeypatch.setattr("kvprobe.run.session.fork_server", fork_server)
    with _model() as session:
        session.environment()
        session.start(Path("unused-work"), 60.0, when_needed=True)
        session.start(Path("unused-work"), 90.0, when_needed=True)
        assert started == [] and session.forks and session.server is None
        session.launch()
        session.launch()
        assert started == [(sys.executable, 60.0)]
        assert not session.forks  # the stand-in gave none: the checks run fresh
        assert session.ready() is None and session.fresh_reason == "stands in for a server"
    with _model() as session:
        session.environment()
        session.start(Path("unused-work"), 60.0, when_needed=True)
        assert session.ready() is None and len(started) == 2  # ready() launches a pending server


def test_without_preload_nothing_waits_and_nothing_forks(monkeypatch):
    exp = experiment.load("model")
    settings = SessionSettings(Path("unused-cache"), preload=False)
    with CheckSession(exp, exp.pin_sets[exp.default_pin_set], settings) as session:
        session.environment()
        session.start(Path("unused-work"), 60.0, when_needed=True)
        assert not session.forks and session.fresh_reason == "--no-preload"

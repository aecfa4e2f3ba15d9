"""The one subprocess door: timeouts kill the whole group, env is allow-listed, stdin closed."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from kvprobe import proc


def _leaves_a_child(pidfile: Path) -> list[str]:
    """argv of a process that starts a child sleeping a minute, writes its pid to ``pidfile``
    and sleeps too: what a timeout or a lifetime must kill as one group."""
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    return [sys.executable, "-c", script]


def _alive_after_a_moment(pidfile: Path) -> bool:
    """Whether the process whose pid the test's child wrote still runs (a zombie does not count)."""
    child = int(pidfile.read_text())
    time.sleep(0.2)
    try:
        os.kill(child, 0)
        return Path(f"/proc/{child}/stat").read_text().split()[2] != "Z"
    except ProcessLookupError:
        return False


def test_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    started = time.monotonic()
    result = proc.run(
        _leaves_a_child(pidfile),
        timeout_s=2,
        env=proc.clean_env(),
        stdout_path=tmp_path / "o",
        stderr_path=tmp_path / "e",
    )
    assert result.timed_out and not result.ok
    assert time.monotonic() - started < 15
    assert not _alive_after_a_moment(pidfile), "the grandchild survived the timeout"


def test_environment_is_allow_listed_and_home_is_scratch(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_x")
    env = proc.clean_env({"EXTRA": "1"}, home=tmp_path)
    result = proc.capture(
        [sys.executable, "-c", "import os, json; print(json.dumps(dict(os.environ)))"], timeout_s=30, env=env
    )
    import json

    seen = json.loads(result.stdout)
    assert "AWS_SECRET_ACCESS_KEY" not in seen and "GITHUB_TOKEN" not in seen
    assert seen["HOME"] == str(tmp_path) and seen["EXTRA"] == "1"


def test_stdin_is_closed_and_exit_codes_are_results(tmp_path):
    result = proc.capture(
        [sys.executable, "-c", "import sys; d = sys.stdin.read(); sys.exit(7 if d == '' else 0)"],
        timeout_s=30,
        env=proc.clean_env(),
    )
    assert result.returncode == 7 and not result.timed_out and not result.ok


def test_missing_program_is_an_observe_error(tmp_path):
    import pytest

    from kvprobe.errors import ObserveError

    with pytest.raises(ObserveError, match="cannot start"):
        proc.capture(["/nonexistent/program"], timeout_s=5, env=proc.clean_env())


def test_a_service_is_killed_with_its_group_when_its_lifetime_ends(tmp_path):
    pidfile = tmp_path / "child.pid"
    service = proc.start(
        _leaves_a_child(pidfile),
        lifetime_s=2,
        env=proc.clean_env(),
        stdout_path=tmp_path / "o",
        stderr_path=tmp_path / "e",
    )
    deadline = time.monotonic() + 15
    while service.running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not service.running(), "the service outlived its lifetime"
    assert not _alive_after_a_moment(pidfile), "the service's child survived it"

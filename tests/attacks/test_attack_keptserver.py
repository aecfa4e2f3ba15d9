"""A kept fork server is input, not a friend (issue #28).

Code that ran earlier as the same user can leave a process listening where a kept server's
socket lives (``$XDG_RUNTIME_DIR/kvprobe/fs-<key>/server.sock``) and holding its ``alive``
lock. What it answers is untrusted: every reply is bounded in size and time and checked
against ``schemas/forkserver-reply.schema.json``; ``cache servers`` skips and names a bad one
(exit 0), prints none of its text raw, and ``--stop`` says what did not stop; ``run
--keep-server`` runs its checks fresh and says why. The planted servers are real processes
(tests/plantedserver.py) this module starts and kills by pid.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.attacks.harness import REPO, assert_contained, assert_outcome

pytestmark = pytest.mark.attack

PLANTER = REPO / "tests" / "plantedserver.py"


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


class Runtime:
    """A private XDG_RUNTIME_DIR (short: a socket path has 107 bytes) and the planted
    processes started in it."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="kvrt-"))
        self.dir = self.root / "kvprobe"
        self.dir.mkdir(mode=0o700)
        self.planted: list[subprocess.Popen] = []

    @property
    def env(self) -> dict[str, str]:
        return {"XDG_RUNTIME_DIR": str(self.root)}

    def plant(self, home: Path, mode: str) -> int:
        """A planted server on ``home``'s socket (its pid, once it listens)."""
        child = subprocess.Popen(
            [sys.executable, str(PLANTER), str(home), mode, "120"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.planted.append(child)
        deadline = time.monotonic() + 30
        while not (home / "planted.pid").is_file() or not (home / "planted.pid").read_text():
            assert child.poll() is None and time.monotonic() < deadline, f"the planted {mode} server did not start"
            time.sleep(0.02)
        return child.pid

    def close(self) -> None:
        for child in self.planted:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
            child.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def runtime():
    made = Runtime()
    yield made
    made.close()


BAD = ("number", "no-pid", "no-loaded", "bidi", "endless", "silent", "other-pid")


def test_cache_servers_skips_and_names_every_reply_that_is_not_a_kept_servers(sandbox, runtime):
    """A reply that is a number, lacks pid or loaded, carries a raw U+202E, never ends its
    line (12 MiB and on), never comes, or names a pid that is not the socket's: each is
    skipped and named, exit 0, the one real-looking server still listed."""
    for mode in BAD:
        runtime.plant(runtime.dir / f"fs-{mode}", mode)
    good = runtime.plant(runtime.dir / "fs-good", "ignores-stop")
    listed = sandbox.run("cache", "servers", env=runtime.env)
    assert_outcome(sandbox, listed, 0)
    for mode in BAD:
        assert f"skipped  {runtime.dir / f'fs-{mode}' / 'server.sock'}" in listed.err, listed.describe()
    assert "\u202e" not in listed.err + listed.out
    assert listed.out.startswith(f"running  pid {good}  since 2026-01-01T00:00:00Z"), listed.describe()
    assert "longer than" in listed.err and "no complete reply within" in listed.err
    assert listed.seconds < 30, listed.describe()  # each read is bounded in time
    as_json = sandbox.run("cache", "servers", "--json", env=runtime.env)
    assert_contained(sandbox, as_json)
    doc = json.loads(as_json.stdout)
    assert [s["pid"] for s in doc["servers"]] == [good]
    assert sorted(Path(s["socket"]).parent.name for s in doc["skipped"]) == sorted(f"fs-{m}" for m in BAD)


def test_cache_servers_stop_says_which_server_did_not_stop(sandbox, runtime):
    """A server that answers the stop request and goes on running is not reported stopped:
    its pid is checked after the request, and exit 1 says one did not stop."""
    pid = runtime.plant(runtime.dir / "fs-stubborn", "ignores-stop")
    result = sandbox.run("cache", "servers", "--stop", env=runtime.env)
    line = assert_outcome(sandbox, result, 1, "NOT STOPPED", f"pid {pid} still runs")
    assert "fs-stubborn" in line
    assert f"stopped  pid {pid}" not in result.out
    assert _alive(pid)


def test_run_keep_server_against_a_planted_server_runs_its_checks_fresh(sandbox, runtime):
    """The first run leaves a real kept server on its key; it is stopped and a process that
    answers without ``loaded`` is planted in its place. The next run neither crashes nor
    forks from it: its checks run fresh, and the reason is on the terminal and in the receipt."""
    first = sandbox.run("run", "model", "--keep-server", "--out", sandbox.out, env=runtime.env, allow=(sandbox.out,))
    assert first.code == 0, first.describe()
    (home,) = runtime.dir.glob("fs-*")
    stopped = sandbox.run("cache", "servers", "--stop", env=runtime.env)
    assert stopped.code == 0, stopped.describe()
    runtime.plant(home, "no-loaded")
    out = sandbox.root / "out-2"
    second = sandbox.run("run", "model", "--keep-server", "--out", out, env=runtime.env, allow=(sandbox.out, out))
    line = assert_outcome(sandbox, second, 0, "checks run fresh", str(home))
    assert "not a kept-hello reply" in line and "loaded" in line
    execution = json.loads((out / "receipt.json").read_text())["execution"]
    assert "server" not in execution
    assert {c["mode"] for c in execution["checks"]} == {"fresh"}
    assert all(str(home) in c["reason"] for c in execution["checks"])

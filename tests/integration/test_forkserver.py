"""The preloaded fork server: each check in its own forked child, process group and timeout.

The server runs in kvprobe's own interpreter with stdlib modules standing in for torch and
friends (the preload mechanism is the same); /proc is read to show nothing is left behind.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from kvprobe import proc
from kvprobe.checks.forkserver import FORKED, FRESH, STATUS_LOST, Execution, ForkServer, run_check
from kvprobe.errors import CheckRunError, ObserveError

STAND_INS = ("decimal", "xml.dom.minidom")


def _groups() -> dict[int, int]:
    """pid -> process group id of every live (non-zombie) process."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            found[int(entry.name)] = int(fields[2])
    return found


def _alive(pid: int) -> bool:
    return pid in _groups()


def _gone(pids: list[int], within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def _groups_gone(groups: list[int], within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not set(groups) & set(_groups().values()):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def server(tmp_path):
    with ForkServer(sys.executable, preload=STAND_INS, env={}, work=tmp_path / "server", lifetime_s=300) as running:
        yield running
    assert _gone([running.service.pid]), "the server outlived close()"
    assert _groups_gone([running.service.pid]), "the server's group outlived close()"


def _check(server: ForkServer, tmp_path: Path, source: str, *, timeout_s: float = 60, name: str = "check"):
    script = tmp_path / f"{name}.py"
    script.write_text(source)
    (tmp_path / "cwd").mkdir(exist_ok=True)
    env = proc.clean_env({"KVPROBE_SIDE_CONFIG": '{"side": "base"}'}, home=tmp_path / "cwd")
    return server.run(
        [str(script), "--out", "x"],
        path=[tmp_path / "tree"],
        env=env,
        cwd=tmp_path / "cwd",
        stdout_path=tmp_path / "logs" / f"{name}.stdout",
        stderr_path=tmp_path / "logs" / f"{name}.stderr",
        timeout_s=timeout_s,
    )


def _run_check(server: ForkServer, tmp_path: Path, source: str, *, name: str):
    """A check as probes and tests run one: forked, or fresh again when its status was lost."""
    script = tmp_path / f"{name}.py"
    script.write_text(source)
    (tmp_path / "cwd").mkdir(exist_ok=True)
    return run_check(
        [sys.executable, str(script)],
        server=server,
        path=[],
        env=proc.clean_env({}, home=tmp_path / "cwd"),
        cwd=tmp_path / "cwd",
        stdout_path=tmp_path / "logs" / f"{name}.stdout",
        stderr_path=tmp_path / "logs" / f"{name}.stderr",
        timeout_s=60,
    )


def test_a_check_runs_as_its_own_script_with_the_preloaded_modules(server, tmp_path):
    assert set(server.preloaded) == set(STAND_INS)
    tree = str(tmp_path / "tree")
    result = _check(
        server,
        tmp_path,
        "import os, sys\n"
        "print('preloaded', 'decimal' in sys.modules)\n"
        "print('argv', sys.argv[1:], '__main__', __name__)\n"
        f"print('path', sys.path[:2] == [os.path.dirname(os.path.abspath(__file__)), {tree!r}])\n"
        "print('cwd', os.getcwd() == os.environ['HOME'], os.environ['KVPROBE_SIDE_CONFIG'])\n"
        "print('fixed hash seed', sys.flags.hash_randomization == 0, sys.dont_write_bytecode)\n"
        "sys.stderr.write('to stderr\\n')\n"
        "sys.exit(4)\n",
    )
    assert (result.returncode, result.timed_out) == (4, False)
    out = result.stdout().splitlines()
    assert out == [
        "preloaded True",
        "argv ['--out', 'x'] __main__ __main__",
        "path True",
        'cwd True {"side": "base"}',
        "fixed hash seed True True",
    ]
    assert result.stderr() == "to stderr\n"


@pytest.mark.parametrize(
    ("source", "code"),
    [
        ("import os\nos._exit(3)\n", 3),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", -signal.SIGSEGV),
        ("import ctypes\nctypes.string_at(0)\n", -signal.SIGSEGV),
        ("raise RuntimeError('boom')\n", 1),
    ],
    ids=["os-exit", "sigsegv", "ctypes-null", "exception"],
)
def test_a_crashing_check_ends_only_its_own_child(server, tmp_path, source, code):
    crashed = _check(server, tmp_path, source, name="crash")
    assert (crashed.returncode, crashed.timed_out) == (code, False)
    after = _check(server, tmp_path, "print('still serving')\n", name="after")
    assert after.ok and after.stdout() == "still serving\n"
    assert server.service.running()


@pytest.mark.parametrize("source", ["import sys\nsys.exit(255)\n", "raise SystemExit(255)\n"])
def test_a_check_that_really_exits_255_is_exit_255_forked_not_rerun(server, tmp_path, source):
    result = _run_check(server, tmp_path, "print('once')\n" + source, name="exit255")
    assert (result.returncode, result.timed_out, result.execution) == (255, False, Execution(FORKED))
    assert result.stdout() == "once\n"


def test_a_check_whose_status_the_server_lost_runs_again_fresh_and_says_so(server, tmp_path):
    forked = tmp_path / "forked.pid"
    result = _run_check(
        server,
        tmp_path,
        "import os, signal, time\n"
        "parent = open(f'/proc/{os.getppid()}/cmdline', 'rb').read()\n"
        "if b'multiprocessing.forkserver' in parent:  # forked: kill the process that would report its status\n"
        f"    open({str(forked)!r} + '.tmp', 'w').write(str(os.getpid()))\n"
        f"    os.replace({str(forked)!r} + '.tmp', {str(forked)!r})\n"
        "    os.kill(os.getppid(), signal.SIGKILL)\n"
        "    time.sleep(600)\n"
        "print('ran fresh')\n",
        name="lost",
    )
    assert (result.returncode, result.timed_out) == (0, False)
    assert result.execution == Execution(FRESH, STATUS_LOST)
    assert result.stdout() == "ran fresh\n"  # the forked attempt's logs are not the result's
    assert _gone([int(forked.read_text())]), "the forked attempt outlived its lost status"
    after = _run_check(server, tmp_path, "import sys\nprint('decimal' in sys.modules)\n", name="after")
    assert (after.stdout(), after.execution) == ("True\n", Execution(FORKED))  # a new reaper, preloaded again


def test_a_hanging_check_and_its_grandchild_are_killed_at_its_timeout(server, tmp_path):
    pids = tmp_path / "pids"
    started = time.monotonic()
    result = _check(
        server,
        tmp_path,
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(600)\n",
        timeout_s=3,
        name="hang",
    )
    assert result.timed_out and not result.ok
    assert time.monotonic() - started < 3 + 10
    check, grandchild = map(int, pids.read_text().split())
    assert _gone([check, grandchild]), "the hanging check or its grandchild survived the timeout"
    assert _groups_gone([check])
    assert _check(server, tmp_path, "print('next')\n", name="next").ok


def test_a_grandchild_left_by_a_finished_check_goes_with_it(server, tmp_path):
    pids = tmp_path / "pids"
    result = _check(
        server,
        tmp_path,
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pids)!r}, 'w').write(str(child.pid))\n",
        name="leaver",
    )
    assert result.ok
    assert _gone([int(pids.read_text())]), "a daemon the check left behind survived it"


def test_the_server_dying_mid_check_is_an_error_not_a_hang(tmp_path):
    pids = tmp_path / "pid"
    with ForkServer(sys.executable, preload=STAND_INS, env={}, work=tmp_path / "server", lifetime_s=300) as server:
        group = server.service.pid

        def kill_server() -> None:
            while not pids.exists():
                time.sleep(0.05)
            os.kill(server.service.pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_server)
        killer.start()
        started = time.monotonic()
        with pytest.raises(CheckRunError, match="fork server failed"):
            _check(
                server,
                tmp_path,
                # written whole, then renamed: the killer never sees a half-written pid
                f"import os, time\nopen('pid.tmp', 'w').write(str(os.getpid()))\n"
                f"os.replace('pid.tmp', {str(pids)!r})\ntime.sleep(600)\n",
                timeout_s=600,
                name="orphan",
            )
        killer.join()
        assert time.monotonic() - started < 30
        check = int(pids.read_text())
        assert _gone([check]), "the check outlived its server"
    assert _groups_gone([group, check]), "a process of the dead server's run is left"


def test_a_server_that_cannot_start_is_an_observe_error(tmp_path):
    with pytest.raises(ObserveError, match="cannot start /nonexistent/python"):
        ForkServer("/nonexistent/python", preload=STAND_INS, env={}, work=tmp_path / "server", lifetime_s=60)


def test_a_server_started_in_the_background_is_waited_for_by_its_first_check(tmp_path):
    with ForkServer(
        sys.executable, preload=STAND_INS, env={}, work=tmp_path / "server", lifetime_s=300, wait=False
    ) as server:
        assert _check(server, tmp_path, "import sys\nprint('decimal' in sys.modules)\n").stdout() == "True\n"
        assert set(server.preloaded) == set(STAND_INS)


def test_a_background_server_that_dies_while_preloading_leaves_its_checks_fresh_with_the_reason(tmp_path):
    from kvprobe.run.session import fork_server, server_ready

    dies = tmp_path / "python"
    dies.write_text("#!/bin/sh\necho 'no torch here' >&2\nexit 7\n")
    dies.chmod(0o755)
    server, reason = fork_server(str(dies), {}, tmp_path, 60, preload=True, modules=("torch",))
    assert server is not None and reason is None  # started: its failure shows when it is waited for
    assert server_ready(server, reason) == (
        None,
        "the fork server did not start: the fork server exited while preloading: server exited; no torch here",
    )
    assert _groups_gone([server.service.pid])
    with pytest.raises(CheckRunError, match=r"failed before check\.py"):
        _check(server, tmp_path, "print('never')\n")


_HOST = """
import sys
from pathlib import Path
from kvprobe import proc
from kvprobe.checks.forkserver import ForkServer

work = Path(sys.argv[1])
(work / "cwd").mkdir()
hang = work / "hang.py"
pid_file = str(work / "check.pid")
hang.write_text(f"import os, time\\nopen({pid_file!r}, 'w').write(str(os.getpid()))\\ntime.sleep(600)\\n")
server = ForkServer(sys.executable, preload=("decimal",), env={}, work=work / "server", lifetime_s=600)
print(server.service.pid, flush=True)
env = proc.clean_env(home=work / "cwd")
logs = {"stdout_path": work / "o", "stderr_path": work / "e"}
server.run([str(hang)], path=[], env=env, cwd=work / "cwd", timeout_s=600, **logs)
"""


def test_a_host_killed_without_stopping_its_server_takes_the_server_and_its_checks_along(tmp_path):
    """SIGKILL (or an OOM kill) of `kvprobe run` leaves no chance to stop the server: it must
    not idle, preloaded, for the lifetime the host set, nor leave a running check behind."""
    import subprocess

    host = subprocess.Popen(
        [sys.executable, "-c", _HOST, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    try:
        server_pid = int(host.stdout.readline())
        deadline = time.monotonic() + 60
        while not (tmp_path / "check.pid").is_file() or not (tmp_path / "check.pid").read_text():
            assert time.monotonic() < deadline and host.poll() is None, "the check never started"
            time.sleep(0.1)
        check_pid = int((tmp_path / "check.pid").read_text())
        assert _alive(server_pid) and _alive(check_pid)
    finally:
        host.kill()
        host.wait()
    assert _gone([server_pid, check_pid]), "the server or its check outlived the host"
    assert _groups_gone([server_pid, check_pid])


def test_a_check_whose_tree_provides_a_preloaded_module_runs_fresh_with_its_own(server, tmp_path):
    """A forked child keeps the server's copy of a module its own tree also provides (a git pin
    set of a preloaded package, or of a package a preloaded one imports): fresh, the tree's
    copy is imported, as a fresh interpreter with the tree on PYTHONPATH would."""
    tree = tmp_path / "tree" / "decimal"
    tree.mkdir(parents=True)
    (tree / "__init__.py").write_text("WHERE = 'tree'\n")
    script = tmp_path / "which.py"
    script.write_text("import decimal\nprint(getattr(decimal, 'WHERE', 'server'))\n")
    (tmp_path / "cwd").mkdir()
    result = run_check(
        [sys.executable, str(script)],
        server=server,
        path=[tmp_path / "tree"],
        env=proc.clean_env({"PYTHONPATH": str(tmp_path / "tree")}, home=tmp_path / "cwd"),
        cwd=tmp_path / "cwd",
        stdout_path=tmp_path / "logs" / "which.stdout",
        stderr_path=tmp_path / "logs" / "which.stderr",
        timeout_s=60,
    )
    assert result.stdout() == "tree\n"
    assert result.execution == Execution(FRESH, "its tree provides decimal, which the fork server had imported")


def test_the_preload_is_a_reported_step_with_heartbeat_and_time(tmp_path):
    """`env ... cached` then silence while torch imports (#25): the preload says it started,
    beats while it is waited for on a log, and ends with its time; the second wait is silent."""
    import io

    from kvprobe.cli.console import PlainReporter, make_console
    from kvprobe.run.session import fork_server, server_ready

    slow = tmp_path / "python"  # an interpreter whose start (the preload, as far as we see) takes 1 s
    slow.write_text(f'#!/bin/sh\nsleep 1\nexec "{sys.executable}" "$@"\n')
    slow.chmod(0o755)
    buffer = io.StringIO()
    reporter = PlainReporter(make_console(buffer), heartbeat_s=0.2)
    work = Path(tempfile.mkdtemp(prefix="kv-"))  # the server's TMPDIR holds an AF_UNIX socket: short
    server, reason = fork_server(str(slow), {}, work, 60, True, STAND_INS, reporter=reporter)
    assert server is not None and reason is None
    with server:
        ready = server_ready(server, reason, reporter)
        assert ready == (server, None), (work / "forkserver" / "server.stderr").read_text()
        lines = buffer.getvalue().splitlines()
        assert lines[0] == "· preload: fork server started, importing decimal, xml.dom.minidom in the background"
        assert lines[1] == "… preload: fork server importing decimal, xml.dom.minidom"
        assert any("preload: fork server importing decimal, xml.dom.minidom: still running" in x for x in lines)
        assert re.fullmatch(r"✓ preload: fork server importing decimal, xml\.dom\.minidom \(\d+\.\ds\)", lines[-2])
        assert re.fullmatch(r"· preload: fork server ready, \d+\.\ds after it started", lines[-1])
        assert float(lines[-1].split(", ")[1].split("s ")[0]) >= 1.0
        before = buffer.getvalue()
        assert server_ready(server, None, reporter) == (server, None)
        assert buffer.getvalue() == before
    shutil.rmtree(work, ignore_errors=True)


def test_a_preload_that_fails_says_its_checks_run_fresh(tmp_path):
    import io

    from kvprobe.cli.console import PlainReporter, make_console
    from kvprobe.run.session import fork_server, server_ready

    dies = tmp_path / "python"
    dies.write_text("#!/bin/sh\necho 'no torch here' >&2\nexit 7\n")
    dies.chmod(0o755)
    buffer = io.StringIO()
    reporter = PlainReporter(make_console(buffer), heartbeat_s=10)
    server, reason = fork_server(str(dies), {}, tmp_path, 60, True, ("torch",), reporter=reporter)
    assert server_ready(server, reason, reporter)[0] is None
    lines = buffer.getvalue().splitlines()
    assert lines[-2].startswith("✗ preload: fork server importing torch (")
    assert lines[-1].startswith("· preload: the fork server did not start (") and "fresh interpreters" in lines[-1]

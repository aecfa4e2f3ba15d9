"""The fork server kept between runs (``kvprobe run --keep-server``): found again by its key,
one per key however many runs start at once, gone after its idle limit, holding its env's
lease while it lives, refused a socket directory others may enter.

Real servers in kvprobe's own interpreter with stdlib modules standing in for torch and
friends; each test has its own runtime directory (XDG_RUNTIME_DIR) and stops what it started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe import proc
from kvprobe.checks import keptserver
from kvprobe.checks.keptserver import KeptServer, kept_servers, runtime_dir, stop_kept_servers
from kvprobe.cli import main
from kvprobe.env import cache
from kvprobe.errors import ObserveError
from kvprobe.run.session import env_lease, fork_server

STAND_INS = ("decimal",)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(autouse=True)
def runtime(monkeypatch):
    """A private runtime directory per test (short: a socket path has 107 bytes); every server
    still up at the end is stopped."""
    root = Path(tempfile.mkdtemp(prefix="kvrt-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(root))
    yield root / "kvprobe"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(root))  # a test may have pointed it elsewhere
    if (root / "kvprobe").is_dir():
        (root / "kvprobe").chmod(0o700)  # a test made it unsafe on purpose
    for server in stop_kept_servers():
        assert _gone(server.pid), "a stopped kept server is still running"
    shutil.rmtree(root)


def _kept(preload=STAND_INS, env=None, **kwargs) -> KeptServer:
    return KeptServer(sys.executable, preload=preload, env=env or {}, **kwargs)


def _check(server: KeptServer, tmp_path: Path, source: str) -> str:
    script = tmp_path / "check.py"
    script.write_text(source)
    (tmp_path / "cwd").mkdir(exist_ok=True)
    result = server.run(
        [str(script)],
        path=[],
        env=proc.clean_env({}, home=tmp_path / "cwd"),
        cwd=tmp_path / "cwd",
        stdout_path=tmp_path / "logs" / "check.stdout",
        stderr_path=tmp_path / "logs" / "check.stderr",
        timeout_s=60,
    )
    assert result.returncode == 0, result.stderr()
    return result.stdout()


def test_a_second_run_forks_from_the_server_the_first_left_running(tmp_path):
    first = _kept()
    assert _check(first, tmp_path, "import sys\nprint('decimal' in sys.modules)\n") == "True\n"
    started = first.kept
    first.close()
    assert not first.reused and _alive(started.pid), "closing let go of the server, it did not stop it"
    second = _kept()
    again = second.kept
    assert second.reused and (again.pid, again.started_utc) == (started.pid, started.started_utc)
    assert again.served == 1 and again.attached == 1
    assert _check(second, tmp_path, "import os\nprint(os.getppid() != 1)\n") == "True\n"
    second.close()
    assert [s.pid for s in kept_servers()] == [started.pid]


def test_a_different_preload_list_or_variables_get_a_server_of_their_own():
    one, other, third = _kept(), _kept(preload=("decimal", "fractions")), _kept(env={"X": "1"})
    pids = {one.kept.pid, other.kept.pid, third.kept.pid}
    for server in (one, other, third):
        server.close()
    assert len(pids) == 3
    assert set(other.preloaded) == {"decimal", "fractions"}


def test_runs_starting_at_once_share_one_server():
    found: list[KeptServer] = []
    threads = [threading.Thread(target=lambda: found.append(_kept())) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len({s.kept.pid for s in found}) == 1
    assert sorted(s.reused for s in found) == [False, True, True, True]
    for server in found:
        server.close()


def test_an_idle_server_exits_and_gives_its_socket_back(tmp_path):
    server = _kept(idle_s=1)
    pid = server.kept.pid
    socket_path = server.socket_path
    time.sleep(2)  # attached: it does not idle out under a run that is using it
    assert _alive(pid)
    assert _check(server, tmp_path, "print('still here')\n") == "still here\n"
    server.close()
    assert _gone(pid), "the kept server did not exit after its idle limit"
    assert not socket_path.exists()
    assert kept_servers() == []


def test_a_server_killed_outright_is_replaced_by_the_next_run(tmp_path):
    server = _kept()
    pid = server.kept.pid
    server.close()
    os.kill(pid, signal.SIGKILL)
    assert _gone(pid)
    assert server.socket_path.exists()  # left behind by the kill
    replaced = _kept()
    assert not replaced.reused and replaced.kept.pid != pid
    assert _check(replaced, tmp_path, "print(1)\n") == "1\n"
    replaced.close()


def test_a_kept_server_holds_its_envs_lease_so_prune_leaves_the_env(tmp_path):
    root = tmp_path / "cache"
    env = root / "envs" / "prof-0123"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to(sys.executable)
    (env / cache.ENV_MARKER).write_text("{}")
    (root / "envs" / "prof-0123.users").mkdir()
    server, reason = fork_server(
        str(env / "bin" / "python"), {}, tmp_path, 60, True, STAND_INS, 300, lease=env_lease(env)
    )
    assert reason is None and isinstance(server, KeptServer)
    server.ready()
    server.close()
    pruned = {o.entry.key: o for o in cache.prune(root, older_than_days=None, everything=True, dry_run=False)}
    assert pruned["prof-0123"].action == "skipped" and "kept fork server" in pruned["prof-0123"].reason
    (stopped,) = stop_kept_servers()
    assert _gone(stopped.pid)
    assert list((root / "envs" / "prof-0123.users").iterdir()) == []  # its lease file went with it
    pruned = {o.entry.key: o for o in cache.prune(root, older_than_days=None, everything=True, dry_run=False)}
    assert pruned["prof-0123"].action == "deleted" and not env.exists()


@pytest.mark.parametrize("mode", [0o755, 0o777])
def test_a_runtime_directory_others_may_enter_is_refused(runtime, tmp_path, mode):
    runtime.mkdir(mode=0o700)
    runtime.chmod(mode)
    with pytest.raises(ObserveError, match="not a private directory"):
        runtime_dir()
    server, reason = fork_server(sys.executable, {}, tmp_path, 60, True, STAND_INS, 300)
    assert server is None and reason is not None and "not a private directory" in reason
    assert list(runtime.iterdir()) == []  # no socket was made there


def test_a_socket_path_too_long_is_refused_before_anything_starts(monkeypatch, tmp_path):
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(deep))
    with pytest.raises(ObserveError, match="too long for a socket path"):
        _kept()


def test_a_server_that_cannot_start_is_an_observe_error(runtime):
    with pytest.raises(ObserveError, match="cannot start"):
        KeptServer(str(runtime.parent / "no-python"), preload=STAND_INS, env={})


def test_cache_servers_lists_the_kept_servers_and_stops_them():
    server = _kept()
    pid = server.kept.pid
    server.close()
    listed = CliRunner().invoke(main, ["cache", "servers", "--json"], catch_exceptions=False)
    assert listed.exit_code == 0
    (row,) = json.loads(listed.stdout)["servers"]
    assert (row["pid"], row["preload"], row["attached"]) == (pid, ["decimal"], 0)
    stopped = CliRunner().invoke(main, ["cache", "servers", "--stop"], catch_exceptions=False)
    assert stopped.exit_code == 0 and f"stopped  pid {pid}" in stopped.stdout
    assert _gone(pid)
    empty = CliRunner().invoke(main, ["cache", "servers"], catch_exceptions=False)
    assert empty.exit_code == 0 and "no kept fork server is running" in empty.stdout


def _venv(where: Path) -> str:
    """A real venv of kvprobe's interpreter (no pip: seconds); its python."""
    made = proc.run(
        [sys.executable, "-m", "venv", "--without-pip", str(where)],
        timeout_s=60,
        env=proc.clean_env(),
        stdout_path=where.parent / f"{where.name}.out",
        stderr_path=where.parent / f"{where.name}.err",
    )
    assert made.returncode == 0, made.stderr()
    return str(where / "bin" / "python")


def test_two_envs_of_one_base_interpreter_get_a_server_each(tmp_path):
    """A venv's python is a symlink to its base interpreter: two envs (two locks, two torch
    versions) resolve to one real path, yet each must fork from a server that imported its own."""
    pythons = [_venv(tmp_path / name) for name in ("env-a", "env-b")]
    assert os.path.realpath(pythons[0]) == os.path.realpath(pythons[1])
    servers = [KeptServer(p, preload=STAND_INS, env={}) for p in pythons]
    try:
        assert [s.kept.python for s in servers] == pythons
        assert servers[0].kept.pid != servers[1].kept.pid
    finally:
        for server in servers:
            server.close()


_HOST = """
import sys
from pathlib import Path
from kvprobe import proc
from kvprobe.checks.keptserver import KeptServer

work = Path(sys.argv[1])
server = KeptServer(sys.executable, preload=("decimal",), env={})
server.run(
    [sys.argv[2]], path=[], env=proc.clean_env({}, home=work), cwd=work,
    stdout_path=work / "check.stdout", stderr_path=work / "check.stderr", timeout_s=600,
)
"""


def test_a_run_killed_outright_takes_its_running_check_with_it(tmp_path):
    """A run SIGKILLed while its check runs on the kept server: the check goes too, as with a
    run's own server, instead of running on to its timeout (minutes) with no one to read it."""
    check = tmp_path / "check.py"
    pid_file = str(tmp_path / "pid")
    check.write_text(f"import os, time\nopen({pid_file!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n")
    host = proc.start(
        [sys.executable, "-c", _HOST, str(tmp_path), str(check)],
        lifetime_s=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        stdout_path=tmp_path / "host.stdout",
        stderr_path=tmp_path / "host.stderr",
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "pid").is_file() or not (tmp_path / "pid").read_text():
        assert host.running() and time.monotonic() < deadline, (tmp_path / "host.stderr").read_text()
        time.sleep(0.05)
    check_pid = int((tmp_path / "pid").read_text())
    os.kill(host.pid, signal.SIGKILL)
    host.stop()
    assert _gone(check_pid), "the check of a killed run kept running on the kept server"


def test_a_runtime_directory_that_cannot_be_made_is_an_observe_error(monkeypatch, tmp_path):
    """XDG_RUNTIME_DIR naming a directory that is gone (a session's, after `su`): the run's
    checks run fresh and say why, and `cache servers` says why, not a crash."""
    root = tmp_path / "gone"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(root))
    server, reason = fork_server(sys.executable, {}, tmp_path, 60, True, STAND_INS, 300)
    assert server is None and reason is not None and str(root) in reason
    listed = CliRunner().invoke(main, ["cache", "servers"], catch_exceptions=False)
    assert listed.exit_code == 3 and str(root) in listed.stderr


def test_a_relative_runtime_directory_is_ignored(monkeypatch, tmp_path):
    """The XDG spec: a relative XDG_RUNTIME_DIR is invalid and ignored. Used as it was, it named
    one place for this process and another for the server, which starts in its own directory."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert runtime_dir() == tmp_path / f"kvprobe-{os.getuid()}"


@pytest.mark.parametrize("entry", ["file", "symlink"])
def test_a_server_entry_that_is_not_a_private_directory_is_refused(runtime, tmp_path, entry):
    """An ``fs-<key>`` entry that is a file, or a symlink to a directory anyone may enter: the
    checks run fresh and say why; no socket is made through it."""
    server = _kept()
    home = server.home
    server.close()
    (stopped,) = stop_kept_servers()
    assert _gone(stopped.pid)
    shutil.rmtree(home)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o777)
    elsewhere.chmod(0o777)
    if entry == "file":
        home.write_text("")
    else:
        home.symlink_to(elsewhere)
    server, reason = fork_server(sys.executable, {}, tmp_path, 60, True, STAND_INS, 300)
    assert server is None and reason is not None and str(home) in reason
    assert list(elsewhere.iterdir()) == []


def test_a_run_under_other_host_variables_gets_a_server_of_its_own(monkeypatch, tmp_path):
    """The server inherits PATH, the locale and TZ from the run that started it, and a forked
    check keeps what the preload made of them (``time.tzname``, set once at import): a run
    from a shell with other ones must not fork from it."""
    monkeypatch.setenv("TZ", "UTC")
    first = _kept()
    assert _check(first, tmp_path, "import time\nprint(time.tzname[0])\n") == "UTC\n"
    first.close()
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    second = _kept()
    assert _check(second, tmp_path, "import time\nprint(time.tzname[0])\n") == "JST\n"
    second.close()


def test_a_server_that_never_answers_is_stopped_by_the_run_that_gave_up_on_it(monkeypatch, tmp_path):
    """A kept server stuck in its preload holds its key and never idles out (its clock starts
    once the preload is done); the run that gave up on it stops it, or every later run would
    wait for it as long again, and `cache servers` cannot see or stop what does not answer."""
    _venv(tmp_path / "env")
    (site,) = (tmp_path / "env" / "lib").glob("python*/site-packages")
    (site / "stuck_on_import.py").write_text("import time\ntime.sleep(3600)\n")
    monkeypatch.setattr(keptserver, "START_TIMEOUT_S", 3.0)
    with pytest.raises(ObserveError, match="did not start within"):
        KeptServer(str(tmp_path / "env" / "bin" / "python"), preload=("stuck_on_import",), env={})
    (home,) = runtime_dir().glob("fs-*")
    pid = int((home / "alive.lock").read_text())
    assert _gone(pid), "a kept server that never answered was left running"


def test_an_env_removed_and_built_again_gets_a_new_server(tmp_path):
    """An env deleted by hand (damaged, or to rebuild it) and built again at the same path: the
    server that preloaded from the old one holds modules whose files are gone; the new env's
    runs must not fork from it."""
    python = _venv(tmp_path / "env")
    first = KeptServer(python, preload=STAND_INS, env={})
    started = first.kept
    first.close()
    shutil.rmtree(tmp_path / "env")
    assert _venv(tmp_path / "env") == python
    second = KeptServer(python, preload=STAND_INS, env={})
    again = second.kept
    second.close()
    assert not second.reused and again.pid != started.pid

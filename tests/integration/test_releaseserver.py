"""A release's imports shared by its checks: a second level under the preloaded fork server.

The fork server runs in kvprobe's own interpreter with stdlib stand-ins for torch; the
"release" is a tree made here whose modules log each import to a file, so a test sees who
imported what, and how often. Checks print what they saw; forked and fresh runs of the same
check must print the same bytes.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from kvprobe import proc
from kvprobe.checks.forkserver import FORKED, FRESH, ForkServer, run_check
from kvprobe.checks.releaseserver import ReleaseServer, open_release

STAND_INS = ("decimal",)

_LOGGED = "import os\nopen(os.environ['IMPORT_LOG'], 'a').write(f'{__name__} {os.getpid()}\\n')\n"
RELEASE = {
    "fakerel/__init__.py": _LOGGED + "__version__ = '9.9'\n",
    "fakerel/core.py": _LOGGED + "STATE = {'made': 1}\n",
    "fakerel/helper.py": "VALUE = 7\n",
    "fakerel/bad.py": "from fakerel import helper\nimport fakerel.core\n"
    "raise ValueError(f'bad at import {helper.VALUE}')\n",
    "fakerel/threaded.py": "import threading, time\n"
    "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n",
}

CHECK = """\
import sys, traceback
import fakerel, fakerel.core
print(fakerel.__file__, fakerel.__version__, fakerel.core.STATE)
print('helper early', hasattr(fakerel, 'helper'), 'fakerel.helper' in sys.modules)
try:
    import fakerel.bad
except ValueError:
    print(traceback.format_exc())
print(sorted(m for m in sys.modules if m.startswith('fakerel')))
print('helper bound', hasattr(fakerel, 'helper'), hasattr(fakerel, 'bad'))
"""


@pytest.fixture
def world(tmp_path):
    tree = tmp_path / "tree"
    for rel, text in RELEASE.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    log = tmp_path / "imports.log"
    env = proc.clean_env({"IMPORT_LOG": str(log)}, home=tmp_path / "home")
    (tmp_path / "home").mkdir()
    with ForkServer(sys.executable, preload=STAND_INS, env={}, work=tmp_path / "server", lifetime_s=300) as server:
        yield {"tree": tree, "log": log, "env": env, "server": server, "tmp": tmp_path}


def _release(world, modules, name="release"):
    return ReleaseServer(
        world["server"], path=[world["tree"]], modules=modules, env=world["env"], work=world["tmp"] / name
    )


def _run(world, server, name, path=None):
    script = world["tmp"] / "check.py"
    script.write_text(CHECK)
    path = [world["tree"]] if path is None else path
    return run_check(
        [sys.executable, str(script)],
        server=server,
        path=path,
        env={**world["env"], "PYTHONPATH": ":".join(map(str, path))},
        cwd=world["tmp"] / "home",
        stdout_path=world["tmp"] / "logs" / f"{name}.stdout",
        stderr_path=world["tmp"] / "logs" / f"{name}.stderr",
        timeout_s=60,
    )


def _imports(world) -> list[str]:
    return world["log"].read_text().splitlines() if world["log"].exists() else []


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_checks_fork_from_the_release_that_imported_it_once_and_see_what_fresh_ones_see(world):
    fresh = [_run(world, None, f"fresh{i}") for i in (1, 2)]
    assert [r.execution.mode for r in fresh] == [FRESH, FRESH]
    fresh_imports = len(_imports(world))
    assert fresh_imports == 4  # fakerel and core, once per fresh check
    with _release(world, ["fakerel", "fakerel.core", "fakerel.core.STATE", "fakerel.bad"]) as release:
        assert release.preloaded == {"decimal": "1.70", "fakerel": "9.9", "fakerel.core": None}
        assert set(release.failed) == {"fakerel.bad"} and "bad at import 7" in release.failed["fakerel.bad"]
        shared = [_run(world, release, f"shared{i}") for i in (1, 2)]
        logged = _imports(world)[fresh_imports:]
        assert [line.split()[0] for line in logged] == ["fakerel", "fakerel.core"]  # once, for both checks
        assert {int(line.split()[1]) for line in logged} == {release.pid}
        pid = release.pid
    assert _gone(pid), "the release's process outlived close()"
    assert [r.execution.mode for r in shared] == [FORKED, FORKED]
    for ran in [*fresh, *shared]:
        assert (ran.returncode, ran.timed_out) == (0, False), ran.stderr()
    outputs = {r.stdout() for r in [*fresh, *shared]}
    assert len(outputs) == 1, outputs  # the failed import included: rolled back, then the same traceback
    (output,) = outputs
    assert "ValueError: bad at import 7" in output and "helper early False False" in output
    assert f"{world['tree'] / 'fakerel' / '__init__.py'} 9.9" in output


def test_a_check_whose_path_is_not_the_release_tree_runs_fresh(world, tmp_path):
    other = tmp_path / "other"
    other.symlink_to(world["tree"], target_is_directory=True)  # the same files, another path
    (tmp_path / "shadow").mkdir()
    (tmp_path / "shadow" / "fakerel.py").write_text("raise ImportError('shadow')\n")
    with _release(world, ["fakerel"]) as release:
        elsewhere = _run(world, release, "elsewhere", path=[other])
        shadowed = _run(world, release, "shadowed", path=[world["tree"], tmp_path / "shadow"])
        assert release.shadowed([world["tree"], tmp_path]) == []
    reason = "its tree provides fakerel, which the fork server had imported"
    assert (elsewhere.execution.mode, elsewhere.execution.reason) == (FRESH, reason)
    assert str(other / "fakerel" / "__init__.py") in elsewhere.stdout()
    assert shadowed.execution.mode == FRESH and "fakerel" in str(shadowed.execution.reason)


def test_a_release_is_gone_with_its_fork_server(world, tmp_path):
    release = _release(world, ["fakerel"])
    assert _alive(release.pid)
    world["server"].close()
    assert _gone(release.pid), "the release's process outlived its fork server"
    assert not release.running()
    release.close()


def test_a_release_whose_imports_start_a_thread_is_not_served(world):
    server, reason = open_release(
        world["server"], path=[world["tree"]], modules=["fakerel.threaded"], env=world["env"], work=world["tmp"] / "t"
    )
    assert isinstance(server, ReleaseServer)
    with pytest.raises(Exception, match="a thread is running after the imports"):
        server.ready()
    server.close()
    assert reason is None
    assert open_release(world["server"], path=[world["tree"]], modules=[], env={}, work=world["tmp"] / "n") == (
        world["server"],
        "no module to import for the release",
    )


def test_a_check_dies_with_its_release_process(world):
    """A check has a process group of its own, which the fork server does not know: when the
    release's process is killed mid-check, the check goes with it (not on to its timeout)."""
    import signal
    import threading

    pid_file = world["tmp"] / "check.pid"
    script = world["tmp"] / "sleeper.py"
    script.write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n")
    failed: list[BaseException] = []
    with _release(world, ["fakerel"]) as release:

        def check() -> None:
            try:
                release.run(
                    [str(script)],
                    path=[world["tree"]],
                    env=world["env"],
                    cwd=world["tmp"] / "home",
                    stdout_path=world["tmp"] / "logs" / "sleeper.stdout",
                    stderr_path=world["tmp"] / "logs" / "sleeper.stderr",
                    timeout_s=120,
                )
            except BaseException as exc:  # the run must fail: its server died
                failed.append(exc)

        runner = threading.Thread(target=check)
        runner.start()
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the check did not start"
            time.sleep(0.05)
        check_pid = int(pid_file.read_text())
        os.kill(release.pid, signal.SIGKILL)
        assert _gone(check_pid), "the check outlived its release's process"
        runner.join(60)
    assert failed and "failed during sleeper.py" in str(failed[0])

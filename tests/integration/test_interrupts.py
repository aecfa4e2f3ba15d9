"""Ctrl-C and SIGTERM (issue #28): exit 130 and 143, not click's "Aborted!" and exit 1 (the
code for "not reproduced"), with one line saying what was left behind; the processes kvprobe
started are stopped, temporary directories removed, nothing half-written published.

Real ``python -m kvprobe`` processes, signalled while a sweep's env build and its units are
under way (a run's checks: tests/attacks/test_attack_interrupts.py)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_sweep_local_index import PROBE, RELEASES, experiment_toml, make_index

REPO = Path(__file__).resolve().parents[2]


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as stderr:  # the child keeps its own copy
        return subprocess.Popen(
            [sys.executable, "-m", "kvprobe", *argv],
            env={**os.environ, "PYTHONPATH": str(REPO), **env},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )


def _wait_for(what, child: subprocess.Popen, log: Path, within_s: float = 600) -> None:
    deadline = time.monotonic() + within_s
    while not what():
        assert child.poll() is None, f"kvprobe ended first:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"not reached in {within_s}s:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)


def _stop(child: subprocess.Popen, sig: int, log: Path) -> tuple[int, str]:
    child.send_signal(sig)
    try:
        code = child.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        raise AssertionError(f"kvprobe did not end within 120s of {sig}:\n{log.read_text()[-3000:]}") from None
    return code, log.read_text()


def _processes_under(path: Path) -> list[str]:
    """Command lines of live processes that name ``path`` in their argv or variables (what
    kvprobe started with TMPDIR there: every process it starts keeps TMPDIR)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or entry.name == str(os.getpid()):
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (entry / "environ").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text()
        except OSError:
            continue
        if state[state.rindex(")") + 2] != "Z" and (str(path) in cmdline or str(path) in environ):
            found.append(cmdline[:200])
    return found


def _one_line(text: str, signame: str) -> str:
    lines = [ln for ln in text.splitlines() if f"interrupted by {signame}" in ln]
    assert len(lines) == 1, text[-3000:]
    assert "Aborted!" not in text and "Traceback" not in text
    return lines[0]


# --- a sweep: its env build, then its units (a local index; the env's lock from PyPI) ------


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("interrupt-world")
    wheels = make_index(root, RELEASES)
    folder = root / "probes" / "scrub-sweep"
    folder.mkdir(parents=True)
    (folder / "experiment.toml").write_text(experiment_toml(wheels))
    (folder / "scrub.py").write_text(PROBE)
    shutil.copytree(REPO / "probes" / "profiles", root / "probes" / "profiles")
    return root


def _sweep_env(world: Path, tmp: Path) -> dict[str, str]:
    return {
        "KVPROBE_PROBES_PATH": str(world / "probes"),
        "KVPROBE_CACHE_DIR": str(world / "cache"),
        "PIP_INDEX_URL": (world / "simple").as_uri(),
        "TMPDIR": str(tmp),
    }


@pytest.mark.network
def test_a_sweep_interrupted_while_its_env_builds_and_while_its_units_run(world, tmp_path):
    """SIGTERM while the env is being built: the builder's children are stopped and its
    `.build-*` directory removed, no env entry is left half-made (the next run builds it
    whole). Then, the env built, SIGINT while the units run: exit 130, no bundle."""
    from kvprobe.env.cache import ENV_MARKER

    envs = world / "cache" / "envs"
    shutil.rmtree(world / "cache", ignore_errors=True)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    log = tmp_path / "build.stderr"
    out = tmp_path / "sweep"
    argv = ["sweep", "scrub-sweep", "--releases", "1.0..2.1", "--out", str(out)]
    # the env's lock comes from PyPI, the releases from the local index
    env = {**_sweep_env(world, tmp), "PIP_EXTRA_INDEX_URL": (world / "simple").as_uri()}
    del env["PIP_INDEX_URL"]
    child = _start(argv, env, log)
    _wait_for(lambda: envs.is_dir() and any(envs.glob(".build-*")), child, log, 300)
    time.sleep(1.0)  # the installer is at work
    status, text = _stop(child, signal.SIGTERM, log)
    assert status == 143, text[-3000:]
    _one_line(text, "SIGTERM")
    assert list(envs.glob(".build-*")) == [] and not [p for p in envs.glob("*/" + ENV_MARKER)]
    assert not out.exists()
    time.sleep(0.5)
    assert _processes_under(world / "cache") == [] and _processes_under(tmp) == []

    from kvprobe.env.venv import EnvManager, load_profile

    saved = dict(os.environ)
    os.environ["KVPROBE_PROBES_PATH"] = str(world / "probes")
    try:
        EnvManager(world / "cache").ensure(load_profile("pytest-minimal"))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    log = tmp_path / "units.stderr"
    child = _start(argv, _sweep_env(world, tmp), log)
    _wait_for(lambda: "sweeping" in log.read_text() and _processes_under(tmp), child, log, 300)
    status, text = _stop(child, signal.SIGINT, log)
    assert status == 130, text[-3000:]
    _one_line(text, "SIGINT")
    assert not out.exists()
    time.sleep(0.5)
    assert _processes_under(tmp) == [] and list(tmp.iterdir()) == []

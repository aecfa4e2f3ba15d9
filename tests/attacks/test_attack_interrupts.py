"""Interrupts (issue #28): Ctrl-C is exit 130 and SIGTERM 143, never click's "Aborted!" and
exit 1 (the code for "not reproduced"), with one line saying what was left behind. The
sweep and env-build cases are in tests/integration/test_interrupts.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.attacks.harness import TRACEBACK

pytestmark = pytest.mark.attack


def _started_under(tmp: Path) -> list[str]:
    """Live processes with ``tmp`` as their TMPDIR: what kvprobe started there (checks, the
    fork server); every process it starts keeps TMPDIR."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text()
        except OSError:
            continue
        if f"TMPDIR={tmp}".encode() in environ and state[state.rindex(")") + 2] != "Z":
            found.append(entry.name)
    return found


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_run_signalled_while_its_checks_run(sandbox, sig, code):
    """`run model` in the sandbox, signalled once its checks run: exit 128 + the signal, one
    line naming it, no bundle, no temporary file, nothing written outside the cache."""
    before = sandbox.snapshot()
    err = sandbox.io / "stderr"
    with open(err, "wb") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-m", "kvprobe", "run", "model", "--out", str(sandbox.out)],
            env=sandbox.env(),
            cwd=sandbox.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
    deadline = time.monotonic() + 120
    while "running checks" not in err.read_text(errors="replace") or len(_started_under(sandbox.tmp)) < 2:
        assert child.poll() is None and time.monotonic() < deadline, err.read_text()
        time.sleep(0.05)
    child.send_signal(sig)
    try:
        status = child.wait(60)
    finally:
        if child.poll() is None:
            child.kill()
    text = err.read_text(errors="replace")
    assert status == code, text
    lines = [ln for ln in text.splitlines() if f"interrupted by {signal.Signals(sig).name}" in ln]
    assert len(lines) == 1 and "Aborted!" not in text and TRACEBACK not in text, text
    assert not sandbox.out.exists() and list(sandbox.tmp.iterdir()) == []
    time.sleep(0.5)
    assert _started_under(sandbox.tmp) == [], "a process kvprobe started outlived it"
    after = sandbox.snapshot()
    changed = [p for p in set(before) | set(after) if before.get(p) != after.get(p)]
    assert [p for p in changed if not p.startswith("kvprobe-cache")] == [], changed

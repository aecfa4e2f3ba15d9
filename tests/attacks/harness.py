"""The hostile-publisher harness: kvprobe runs as a user would run it, in a subprocess.

Every attack goes through the CLI (``python -m kvprobe ...``), never through kvprobe's
modules, so the tier holds whatever the package's inside looks like. One run happens in a
private sandbox (``tmp_path``): HOME, XDG_CACHE_HOME, KVPROBE_CACHE_DIR, TMPDIR and the cwd
all point inside it, so :meth:`Sandbox.run` can check that

- nothing was written anywhere in the sandbox but the paths a test allows (the temp dir
  must end empty; inputs, HOME and cwd unchanged; no ``./bundles/`` left behind);
- no bundle code ran: hostile bundles are *armed*: their Python files write
  :attr:`Sandbox.marker` when executed (:func:`arm`);
- memory stayed bounded: the peak RSS (VmHWM) of the child and of the probes it runs is
  sampled from /proc while they run (getrusage would start from this process's own RSS);
- it ended on its own: a child that outlives its timeout (a FIFO read, a hang) is killed
  with its process group and reported as such; so is one whose resident memory passes the cap.

Bundles are built with tests/forge.py (a valid forged bundle plus rehash/recite helpers)
or copied from the committed bundles/; the committed bundles are never modified. The
fixtures are in conftest.py.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import resource
import select
import signal
import stat
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests import forge

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "bundles"
MODEL_BUNDLE = COMMITTED / "model-model-20261201T112733Z"
# the committed experiment A release bundle (republished under a new name when A changes)
EXP_A_BUNDLE = max(COMMITTED.glob("experiment-a-release-*"), default=COMMITTED / "experiment-a-release-missing")

MEMORY_CAP_MIB = 300  # a correctness bound: the README promises flat, tens-of-MiB verification
# The child's address space is capped so that a runaway attack fails fast with MemoryError
# instead of taking gigabytes from a shared machine; it sits far above MEMORY_CAP_MIB.
ADDRESS_SPACE_CAP = 3 << 30
TRACEBACK = "Traceback (most recent call last)"


@dataclass
class Result:
    argv: list[str]
    code: int | None
    stdout: bytes
    stderr: bytes
    peak_rss_mib: float
    seconds: float
    killed: str | None  # why the harness killed it (timeout, memory), or None
    changed: list[str] = field(default_factory=list)  # sandbox paths written outside the allowed ones

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    def describe(self) -> str:
        return (
            f"argv: {self.argv[3:]}\nexit {self.code} (killed: {self.killed}) in {self.seconds:.1f}s, "
            f"peak RSS {self.peak_rss_mib:.0f} MiB\n--- stderr ---\n{self.err[-3000:]}\n"
            f"--- stdout ---\n{self.out[-1500:]}"
        )


class Sandbox:
    """A private world for one kvprobe run; see the module docstring."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home, self.xdg, self.cache = root / "home", root / "xdg-cache", root / "kvprobe-cache"
        self.tmp, self.cwd, self.inputs = root / "tmp", root / "cwd", root / "inputs"
        self.out = root / "out"  # the one place a test may name as an output (it does not exist yet)
        self.io = root / ".io"  # the child's stdout/stderr, outside the snapshot
        for d in (self.home, self.xdg, self.cache, self.tmp, self.cwd, self.inputs, self.io):
            d.mkdir()
        (self.home / ".profile").write_text("# the sandbox user's own file\n")
        self.marker = root / "MARKER-bundle-code-ran"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(REPO),
            "HOME": str(self.home),
            "XDG_CACHE_HOME": str(self.xdg),
            "KVPROBE_CACHE_DIR": str(self.cache),
            "TMPDIR": str(self.tmp),
            "LC_ALL": "C.UTF-8",
            "COLUMNS": "400",
            "LINES": "50",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        env.update(extra or {})
        return env

    def snapshot(self) -> dict[str, tuple]:
        """Every path in the sandbox but the child's output and the marker: mode, and size and mtime
        of non-directories (a directory's mtime moves when a temp entry comes and goes)."""
        found = {}
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=False):
            if Path(dirpath) == self.root and self.io.name in dirnames:
                dirnames.remove(self.io.name)
            for name in dirnames + filenames:
                path = Path(dirpath, name)
                st = os.lstat(path)
                rel = path.relative_to(self.root).as_posix()
                if rel != self.marker.name:  # asserted on its own: bundle code ran
                    found[rel] = (st.st_mode,) if stat.S_ISDIR(st.st_mode) else (st.st_mode, st.st_size, st.st_mtime_ns)
        return found

    def run(
        self,
        *args: str,
        timeout: float = 60,
        allow: tuple[Path, ...] = (),
        env: dict[str, str] | None = None,
        tty: bool = False,
        cwd: Path | None = None,
        stdin: bytes = b"",
    ) -> Result:
        """``python -m kvprobe *args`` in the sandbox; ``allow``: paths it may create or change.

        ``tty``: stdout and stderr are one pseudo-terminal (both land in ``Result.stderr``),
        so click and rich behave as they do for a person at a terminal. ``stdin``: piped
        input (never a terminal).
        """
        before = self.snapshot()
        argv = [sys.executable, "-m", "kvprobe", *map(str, args)]
        started = time.monotonic()
        run_env = self.env({"TERM": "xterm-256color", **(env or {})} if tty else env)
        if tty:
            code, peak, killed, out, err = _run_on_pty(argv, run_env, cwd or self.cwd, timeout)
        else:
            out_path, err_path, in_path = self.io / "stdout", self.io / "stderr", self.io / "stdin"
            in_path.write_bytes(stdin)
            with open(out_path, "wb") as out_f, open(err_path, "wb") as err_f, open(in_path, "rb") as in_f:
                child = subprocess.Popen(
                    argv,
                    env=run_env,
                    cwd=cwd or self.cwd,
                    stdin=in_f,
                    stdout=out_f,
                    stderr=err_f,
                    start_new_session=True,
                    preexec_fn=_limit_child,
                )
                code, peak, killed = _wait(child, timeout)
            out, err = out_path.read_bytes(), err_path.read_bytes()
        result = Result(argv, code, out, err, peak, time.monotonic() - started, killed)
        after = self.snapshot()
        allowed = [p.relative_to(self.root).as_posix() for p in allow]
        result.changed = sorted(
            rel
            for rel in set(before) | set(after)
            if before.get(rel) != after.get(rel) and not any(rel == a or rel.startswith(a + "/") for a in allowed)
        )
        return result


def _limit_child() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_CAP, ADDRESS_SPACE_CAP))


def _run_on_pty(argv, env, cwd, timeout):
    """Run with a 400-column pseudo-terminal as stdout/stderr, reading it as the child writes."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 400, 0, 0))
    try:
        child = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=_limit_child,
        )
    finally:
        os.close(slave)
    chunks: list[bytes] = []

    def drain(wait: float) -> bool:
        ready, _, _ = select.select([master], [], [], wait)
        if not ready:
            return False
        try:
            data = os.read(master, 1 << 16)
        except OSError:  # EIO: every writer is gone
            return False
        chunks.append(data)
        return bool(data)

    try:
        code, peak, killed = _wait(child, timeout, between=lambda: drain(0.01))
        while drain(0.05):
            pass
    finally:
        os.close(master)
    return code, peak, killed, b"", b"".join(chunks)


def _wait(child: subprocess.Popen, timeout: float, between=lambda: time.sleep(0.01)):
    """(exit code or None, peak RSS in MiB, why it was killed or None).

    The peak is the highest VmHWM read from /proc while the child and its descendants (its
    session) run. Not wait4/getrusage: a child's ru_maxrss starts from this (large) test
    process's RSS, which fork or vfork hands it before exec. A child past its timeout, or
    whose resident memory passes MEMORY_CAP_MIB, is killed with its process group: an attack
    that would take gigabytes fails fast instead of taking them from a shared machine.
    """
    deadline = time.monotonic() + timeout
    killed, peak, tick = None, 0.0, 0
    while True:
        rss, hwm = _memory_mib(child.pid)
        peak = max(peak, hwm, _session_peak_mib(child.pid) if tick % 10 == 0 else 0.0)
        done, status = os.waitpid(child.pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            killed = f"still running after {timeout:.0f}s"
        elif rss >= MEMORY_CAP_MIB:
            killed = f"resident memory passed {MEMORY_CAP_MIB} MiB"
        if killed:
            with _Quiet():
                os.killpg(child.pid, signal.SIGKILL)
            _, status = os.waitpid(child.pid, 0)
            break
        tick += 1
        between()
    child.returncode = os.waitstatus_to_exitcode(status)
    return (None if killed else child.returncode), peak, killed


def _memory_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a live process, 0 when gone."""
    found = {b"VmRSS:": 0.0, b"VmHWM:": 0.0}
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                key = line.split(b" ", 1)[0].split(b"\t", 1)[0]
                if key in found:
                    found[key] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return found[b"VmRSS:"], found[b"VmHWM:"]


def _session_peak_mib(sid: int) -> float:
    """The highest VmHWM among the processes of session ``sid`` (the child and the probes it runs)."""
    peak = 0.0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat_file:
                fields = stat_file.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # fields after the name: state ppid pgrp session ...
            peak = max(peak, _memory_mib(int(entry.name))[1])
    return peak


class _Quiet:
    """A process group that is already gone is fine to kill."""

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        return kind is ProcessLookupError


# --- the assertions every attack makes ----------------------------------------------------


def assert_contained(sandbox: Sandbox, result: Result, *, code_may_run: bool = False) -> None:
    """No traceback, never killed, no write outside the allowed paths, no bundle code, bounded memory."""
    assert not result.killed, f"kvprobe was killed: {result.killed}\n{result.describe()}"
    assert TRACEBACK not in result.err and TRACEBACK not in result.out, f"a traceback\n{result.describe()}"
    assert result.changed == [], f"written outside the allowed paths: {result.changed[:20]}\n{result.describe()}"
    assert list(sandbox.tmp.iterdir()) == [], f"temp files left behind: {list(sandbox.tmp.iterdir())}"
    if not code_may_run:
        assert not sandbox.marker.exists(), f"code from the bundle ran (marker written)\n{result.describe()}"
    assert result.peak_rss_mib < MEMORY_CAP_MIB, (
        f"peak RSS {result.peak_rss_mib:.0f} MiB >= {MEMORY_CAP_MIB} MiB\n{result.describe()}"
    )


def line_naming(text: str, *words: str | tuple[str, ...]) -> str:
    """The first line of ``text`` holding every one of ``words`` (case-insensitive; a tuple
    is satisfied by any of its members), or ''."""

    def has(line: str, word: str | tuple[str, ...]) -> bool:
        options = (word,) if isinstance(word, str) else word
        return any(o.lower() in line.lower() for o in options)

    for line in text.splitlines():
        if all(has(line, w) for w in words):
            return line
    return ""


def assert_outcome(
    sandbox: Sandbox,
    result: Result,
    code: int | tuple[int, ...],
    *words: str | tuple[str, ...],
    code_may_run: bool = False,
) -> str:
    """The common contract: exit code, one stderr line naming the defect, and containment."""
    codes = (code,) if isinstance(code, int) else code
    assert result.code in codes, f"exit {result.code}, expected {codes}\n{result.describe()}"
    found = line_naming(result.err, *words) if words else "-"
    assert found, f"no single stderr line names {words}\n{result.describe()}"
    assert_contained(sandbox, result, code_may_run=code_may_run)
    return found


# --- hostile bundles -----------------------------------------------------------------------


def payload(marker: Path) -> bytes:
    """Python that leaves evidence it ran: appended to a bundle's probe files."""
    return (
        f"\nimport pathlib as _kv_attack\n_kv_attack.Path({str(marker)!r}).write_text('bundle code ran')\n"
    ).encode()


def arm(bundle: Path, marker: Path, names: list[str] | None = None) -> None:
    """Append the marker payload to the bundle's probe sources (all .py, or ``names``), then
    re-cite and re-hash: the bundle stays self-consistent."""
    changed = []
    for path in sorted(bundle.glob("probes/*/*.py")):
        if names is None or path.name in names:
            path.write_bytes(path.read_bytes() + payload(marker))
            changed.append(path.relative_to(bundle).as_posix())
    for rel in changed:
        forge.recite(bundle, rel)
    forge.rehash(bundle)


def copy_committed(src: Path, sandbox: Sandbox, name: str | None = None) -> Path:
    return forge.copy(src, sandbox.inputs / (name or src.name))


def reseal_sweep(bundle: Path, receipt: dict) -> None:
    """Write an edited sweep ``receipt`` back with all a forger can re-derive from it (the
    summary, the observed range, README.md, the timeline, the hashes): a genuine resealed
    bundle, which only verify's later steps can tell from a published one."""
    from kvprobe.evidence.sweep_view import TIMELINE, recomputed_range, render_readme, timeline_svg
    from kvprobe.model.sweep_receipt import SweepReceipt
    from kvprobe.rules.sweep_classification import summary

    typed = SweepReceipt.from_json(receipt)  # the edit keeps the schema
    receipt["summary"] = summary(typed.releases)
    receipt["observed"] = recomputed_range(typed).to_json()
    (bundle / "receipt.json").write_bytes(forge.dumps(receipt))
    resealed = SweepReceipt.from_json(receipt)
    (bundle / "README.md").write_text(render_readme(resealed), encoding="utf-8")
    (bundle / TIMELINE).write_text(timeline_svg(resealed), encoding="utf-8")
    forge.rehash(bundle)


def rename_experiment(bundle: Path, new_id: str) -> None:
    """Make a committed bundle name an experiment kvprobe does not ship (same probes, new id)."""
    old_id = forge.load(bundle, "receipt.json")["experiment"]["id"]
    (bundle / "probes" / old_id).rename(bundle / "probes" / new_id)
    toml = bundle / "probes" / new_id / "experiment.toml"
    toml.write_bytes(toml.read_bytes().replace(f'id = "{old_id}"'.encode(), f'id = "{new_id}"'.encode(), 1))
    digest = forge.sha(toml.read_bytes())

    def retarget(node):
        if isinstance(node, dict):
            for key, value in list(node.items()):
                if isinstance(value, str) and value.startswith(f"probes/{old_id}/"):
                    node[key] = f"probes/{new_id}/" + value[len(f"probes/{old_id}/") :]
                else:
                    retarget(value)
        elif isinstance(node, list):
            for value in node:
                retarget(value)

    def change(receipt):
        retarget(receipt)
        receipt["experiment"]["id"] = new_id
        receipt["experiment"]["sha256"] = digest
        receipt["run_id"] = new_id + receipt["run_id"][len(old_id) :]

    forge.edit_receipt(bundle, change)
    forge.recite(bundle, f"probes/{new_id}/experiment.toml")


ANSI_PAYLOAD = "\x1b]0;pwned-title\x07\x1b[2J\x1b[31mFAKE: verified\x1b[0m"
BIDI_PAYLOAD = "\u202eexe.txt\u2066hidden\u2069"


def assert_no_raw_escapes(data: bytes | str) -> None:
    """None of the bundle's control sequences (ANSI_PAYLOAD) or bidi controls reaches the output raw."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    assert "\x1b]0;" not in text and "\x1b[2J" not in text, f"raw escape sequence in output: {text[-800:]!r}"
    bidi = re.findall("[\u202a-\u202e\u2066-\u2069]", text)
    assert not bidi, f"bidi controls in output: {bidi}; {text[-800:]!r}"

"""The one door to external processes.

Every process kvprobe starts goes through :func:`run`: an argv list (never a shell),
an explicit timeout, stdin closed, stdout/stderr to files, a new session so that the
whole process group can be killed on timeout, and an environment built from an
allow-list rather than inherited, so credentials and the user's HOME never reach
untrusted code (upstream tests, probes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvprobe.errors import ObserveError

# Variables a trusted tool (git, pip) may need to reach a registry or mirror.
_NETWORK_VARS = (
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "GIT_SSL_CAINFO",
)
_BASE_VARS = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR")
_GRACE_S = 3.0
_CAPTURE_LIMIT = 1 << 20
# The process groups of the commands and services under way (never a kept server, which
# outlives kvprobe by design): what an interrupt stops. An RLock: the signal handler that
# stops them runs in the main thread, which may hold it already.
_RUNNING: set[int] = set()
_RUNNING_LOCK = threading.RLock()
_INTERRUPTED: list[int] = []  # the signal that stopped this process's work, once it came


@dataclass(frozen=True)
class CommandResult:
    """What a finished (or killed) process left behind."""

    argv: tuple[str, ...]
    returncode: int
    duration_s: float
    timed_out: bool
    stdout_path: Path
    stderr_path: Path

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def stdout(self, limit: int = _CAPTURE_LIMIT) -> str:
        return read_tail(self.stdout_path, limit)

    def stderr(self, limit: int = _CAPTURE_LIMIT) -> str:
        return read_tail(self.stderr_path, limit)

    def summary(self, limit: int = 400) -> str:
        """One line for an error message: the last meaningful stderr line."""
        lines = [ln.strip() for ln in self.stderr(64 * 1024).splitlines() if ln.strip()]
        tail = lines[-1] if lines else f"exit {self.returncode}"
        if self.timed_out:
            tail = f"timed out after {self.duration_s:.0f}s"
        return tail[:limit]


def read_tail(path: Path, limit: int) -> str:
    """The last ``limit`` bytes of a log as text: enough to say why a process failed."""
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - limit))
        return handle.read().decode("utf-8", errors="replace")


def clean_env(
    extra: Mapping[str, str] | None = None,
    *,
    home: Path | None = None,
    network: bool = False,
    passthrough_prefixes: Sequence[str] = (),
) -> dict[str, str]:
    """An environment from an allow-list: PATH/locale, optionally network settings.

    ``home`` replaces HOME (untrusted code gets a scratch HOME); ``network`` lets a
    trusted tool see proxy and CA settings; ``passthrough_prefixes`` (e.g. "PIP_")
    lets a tool see its own configuration variables.
    """
    env = {k: os.environ[k] for k in _BASE_VARS if k in os.environ}
    env.setdefault("PATH", os.defpath)
    env.setdefault("LANG", "C.UTF-8")
    if network:
        env.update({k: os.environ[k] for k in _NETWORK_VARS if k in os.environ})
    for prefix in passthrough_prefixes:
        env.update({k: v for k, v in os.environ.items() if k.startswith(prefix)})
    env["HOME"] = str(home) if home else os.environ.get("HOME", tempfile.gettempdir())
    env.update(extra or {})
    return env


def run(
    argv: Sequence[str | os.PathLike],
    *,
    timeout_s: float,
    env: Mapping[str, str],
    stdout_path: Path,
    stderr_path: Path,
    cwd: Path | None = None,
    poll: Callable[[], None] | None = None,
) -> CommandResult:
    """Run ``argv`` to completion or timeout; never raises for a non-zero exit.

    Raises ObserveError only when the program cannot be started at all.
    """
    args = tuple(os.fspath(a) for a in argv)
    started = time.monotonic()
    process = _spawn(args, env, stdout_path, stderr_path, cwd)
    try:
        timed_out = _wait(process, timeout_s, poll)
    finally:
        _forget(process.pid)
    return CommandResult(
        argv=args,
        returncode=process.returncode,
        duration_s=time.monotonic() - started,
        timed_out=timed_out,
        stdout_path=stdout_path,
        stderr_path=stderr_path,
    )


@dataclass(frozen=True)
class Captured:
    """A short command's result with its output read back as text."""

    returncode: int
    timed_out: bool
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def summary(self, limit: int = 400) -> str:
        """The last meaningful stderr line, for a one-line error message."""
        if self.timed_out:
            return f"timed out after {self.duration_s:.0f}s"
        lines = [ln.strip() for ln in self.stderr.splitlines() if ln.strip()]
        return (lines[-1] if lines else f"exit {self.returncode}")[:limit]


def capture(
    argv: Sequence[str | os.PathLike],
    *,
    timeout_s: float,
    env: Mapping[str, str],
    cwd: Path | None = None,
) -> Captured:
    """:func:`run` for short commands whose output the caller reads (git plumbing)."""
    with tempfile.TemporaryDirectory(prefix="kvprobe-proc-") as scratch:
        result = run(
            argv,
            timeout_s=timeout_s,
            env=env,
            cwd=cwd,
            stdout_path=Path(scratch, "stdout"),
            stderr_path=Path(scratch, "stderr"),
        )
        return Captured(
            returncode=result.returncode,
            timed_out=result.timed_out,
            stdout=result.stdout(),
            stderr=result.stderr(),
            duration_s=result.duration_s,
        )


def _wait(process: subprocess.Popen, timeout_s: float, poll: Callable[[], None] | None) -> bool:
    """Wait, calling ``poll`` twice a second; kill the whole group on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            _kill_group(process)
            return True
        try:
            process.wait(timeout=min(0.5, remaining) if poll else remaining)
            return False
        except subprocess.TimeoutExpired:
            if poll:
                poll()


def _kill_group(process: subprocess.Popen) -> None:
    """SIGTERM the process group, then SIGKILL what is left after a grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=_GRACE_S)
            if sig == signal.SIGTERM:
                # the leader exited; children may linger in the group
                os.killpg(process.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


class Detached:
    """A process meant to outlive kvprobe (a kept fork server). It enforces its own end (an
    idle limit it was given), so kvprobe only watches it come up, and stops it if it does not."""

    def __init__(self, process: subprocess.Popen) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        return self._process.pid

    def running(self) -> bool:
        return self._process.poll() is None

    def stop(self) -> None:
        if self._process.poll() is None:
            _kill_group(self._process)


class Service(Detached):
    """A long-lived process (the preloaded fork server): started in its own session, stopped
    by killing its whole group, and killed anyway once ``lifetime_s`` has passed."""

    def __init__(self, process: subprocess.Popen, lifetime_s: float) -> None:
        super().__init__(process)
        with _RUNNING_LOCK:
            _RUNNING.add(process.pid)
        self._timer = threading.Timer(lifetime_s, self.stop)
        self._timer.daemon = True
        self._timer.start()

    def stop(self) -> None:
        """SIGTERM the group, SIGKILL what is left: nothing it started outlives it."""
        self._timer.cancel()
        if self._process.poll() is None:
            _kill_group(self._process)
        else:
            kill_group(self._process.pid)  # a leader gone early may leave its group behind
        _forget(self._process.pid)

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(
    argv: Sequence[str | os.PathLike],
    *,
    lifetime_s: float,
    env: Mapping[str, str],
    stdout_path: Path,
    stderr_path: Path,
    cwd: Path | None = None,
) -> Service:
    """Start ``argv`` and return at once; the caller stops it (or ``lifetime_s`` does).

    Raises ObserveError when the program cannot be started at all.
    """
    return Service(_spawn(tuple(os.fspath(a) for a in argv), env, stdout_path, stderr_path, cwd), lifetime_s)


def start_detached(
    argv: Sequence[str | os.PathLike],
    *,
    env: Mapping[str, str],
    stdout_path: Path,
    stderr_path: Path,
    cwd: Path | None = None,
) -> Detached:
    """Start ``argv`` in its own session, to outlive this process: no lifetime timer (the
    program must end itself), output to files, stdin closed.

    Raises ObserveError when the program cannot be started at all.
    """
    process = _spawn(tuple(os.fspath(a) for a in argv), env, stdout_path, stderr_path, cwd)
    _forget(process.pid)  # it outlives kvprobe by design: an interrupt leaves it running
    return Detached(process)


def _spawn(
    args: tuple[str, ...], env: Mapping[str, str], stdout_path: Path, stderr_path: Path, cwd: Path | None
) -> subprocess.Popen[bytes]:
    """Start ``args`` in a new session (its group is what a timeout kills), output to files.

    The child keeps its own copies of the two file descriptors, so ours close at once.
    """
    if not args:
        raise ValueError("empty argv")
    for path in (stdout_path, stderr_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    # started and registered at once (under the lock): an interrupt stops it, or it never starts
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err, _RUNNING_LOCK:
        if _INTERRUPTED:
            raise ObserveError(f"not starting {Path(args[0]).name}: kvprobe was interrupted")
        try:
            process = subprocess.Popen(
                args,
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise ObserveError(f"cannot start {args[0]}: {exc.strerror or exc}") from exc
        _RUNNING.add(process.pid)
        return process


def _forget(pgid: int) -> None:
    with _RUNNING_LOCK:
        _RUNNING.discard(pgid)


def interrupt(signum: int) -> int:
    """Stop every command and service kvprobe started and is waiting for (SIGKILL to each
    process group; a kept fork server is not one), and start no new one: kvprobe is ending
    on ``signum``. Safe in a signal handler. Returns how many groups were stopped."""
    with _RUNNING_LOCK:
        if not _INTERRUPTED:
            _INTERRUPTED.append(signum)
        groups = list(_RUNNING)
        _RUNNING.clear()
    for pgid in groups:
        kill_group(pgid)
    return len(groups)


def interrupted() -> int | None:
    """The signal :func:`interrupt` was called for, or None."""
    return _INTERRUPTED[0] if _INTERRUPTED else None


def reset_interrupt() -> None:
    """Start processes again (a test's CliRunner runs many commands in one process)."""
    with _RUNNING_LOCK:
        _INTERRUPTED.clear()


def kill_group(pgid: int) -> None:
    """SIGKILL a process group a service reported (a check forked in its own group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def python_executable() -> str:
    """The interpreter kvprobe runs under (for pip, virtualenv and synthetic probes)."""
    import sys

    return sys.executable

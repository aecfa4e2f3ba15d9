"""A fork server kept between runs (``kvprobe run --keep-server``).

With two cores and two sides, a run's own server cannot make a warm run much faster than
fresh interpreters: its preload (torch, transformers, ...: ~7 s of one core) is the longest
link of the run, and the floor already imports the same modules on both cores at once
(docs/architecture.md, "What the preload cannot do with two cores"). Only an interpreter
that has preloaded *before* the run takes that link away. A kept server is that
interpreter: the first run with ``--keep-server`` starts it, and later ones fork their
checks from it exactly as from a run's own server.

It is found again by its key: the env's python, the preload list, the variables it
imported them under, and the server script's bytes, so a run never forks from a server that
preloaded anything else. Its socket lives in a directory only this user may enter (refused
otherwise, as ssh-agent and tmux refuse theirs). It holds a lease on its env, so ``kvprobe
cache prune`` leaves the env alone while it lives, and exits after ``idle_s`` seconds with
no run attached and no check running. ``kvprobe cache servers`` lists and stops them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import stat
import struct
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from kvprobe import proc
from kvprobe.checks.forkserver import (
    MAX_HELLO_BYTES,
    SERVER_SCRIPT,
    START_TIMEOUT_S,
    BadReply,
    ForkServer,
    Replies,
    server_env,
)
from kvprobe.errors import ObserveError
from kvprobe.resources import probe_api_dir

IDLE_S = 600.0
_SPAWN_TIMEOUT_S = 30.0  # until the new server holds its --alive lock (an interpreter start)
_START_LOCK_TIMEOUT_S = 60.0
_PREFIX = "fs-"
_ATTACH_TRIES = 3
_DETACH_TIMEOUT_S = 5.0
_SOCKET_PATH_MAX = 107  # sun_path less its terminating NUL
_ASK_TIMEOUT_S = 5.0  # `cache servers`: a kept server answers hello and stop at once
_STOP_WAIT_S = 5.0  # a stopped server kills its checks' groups and exits


@dataclass(frozen=True)
class KeptInfo:
    """What a kept server says of itself; the receipt records it for the run that used it."""

    pid: int
    started_utc: str
    idle_s: float
    served: int
    attached: int
    python: str
    preload: tuple[str, ...]

    @classmethod
    def from_hello(cls, reply: Mapping[str, Any]) -> KeptInfo:
        """From a reply :class:`Replies` has checked against the ``kept-hello`` schema."""
        return cls(
            pid=int(reply["pid"]),
            started_utc=str(reply["started_utc"]),
            idle_s=float(reply["idle_s"]),
            served=int(reply["served"]),
            attached=int(reply["attached"]),
            python=str(reply["python"]),
            preload=tuple(reply["preload"]),
        )


def runtime_dir() -> Path:
    """``$XDG_RUNTIME_DIR/kvprobe``, else ``<tmp>/kvprobe-<uid>``: created 0700 (a relative
    XDG_RUNTIME_DIR is ignored, as the XDG spec says: the server starts in another directory).

    Raises ObserveError unless it is a directory this user owns that no one else may enter:
    whoever can reach a server's socket can run code as its user."""
    base = os.environ.get("XDG_RUNTIME_DIR", "")
    root = Path(base) / "kvprobe" if os.path.isabs(base) else Path(tempfile.gettempdir()) / f"kvprobe-{os.getuid()}"
    return _private(root)


def _private(path: Path) -> Path:
    """``path``, made 0700 if it is not there. Raises ObserveError when it cannot be made, or
    is not a directory (a symlink included) this user owns that no one else may enter."""
    try:
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        info = os.lstat(path)
    except OSError as exc:
        raise ObserveError(f"cannot make {path} for a kept fork server's socket: {exc.strerror}") from exc
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise ObserveError(
            f"{path} is not a private directory of this user (mode {stat.filemode(info.st_mode)}, "
            f"owner {info.st_uid}): refusing to keep a fork server's socket there"
        )
    return path


def server_key(python: str, preload: Sequence[str], env: Mapping[str, str]) -> str:
    """What a kept server must match to be used: the env's python, what it preloaded, the
    variables it imported them under, and the server and probe API it runs. Raises
    ObserveError when there is no ``python``.

    The python by its own path, not only its real one: a venv's python is a symlink to its
    base interpreter, so every env made from one base resolves to the same file, while each
    has its own site-packages (its own torch). And by that path's file itself, which an env
    removed and built again at the same path makes anew: the old env's server holds modules
    whose files are gone."""
    script = probe_api_dir() / SERVER_SCRIPT
    try:
        made = os.lstat(python)
    except OSError as exc:
        raise ObserveError(f"cannot start {python}: {exc.strerror}") from exc
    doc = {
        "python": os.path.abspath(python),
        "python_file": [made.st_dev, made.st_ino, made.st_mtime_ns],
        "interpreter": os.path.realpath(python),
        "preload": list(preload),
        # what the server inherits from this process too (PATH, locale, TZ): it imports under them
        "env": dict(sorted(proc.clean_env(env).items())),
        "script": hashlib.sha256(script.read_bytes()).hexdigest(),
        "probe_api": str(probe_api_dir()),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:24]


class KeptServer(ForkServer):
    """A kept server for ``python`` and ``preload``: the running one with the same key, or a
    new one started detached. :meth:`close` lets go of it; it stays up for the next run.

    Raises ObserveError when none can be found or started (the caller runs checks fresh)."""

    def __init__(
        self,
        python: str,
        *,
        preload: Sequence[str],
        env: Mapping[str, str],
        idle_s: float = IDLE_S,
        lease: Path | None = None,
        wait: bool = True,
    ) -> None:
        self.home = _private(runtime_dir() / f"{_PREFIX}{server_key(python, preload, env)}")
        self.socket_path = self.home / "server.sock"
        if len(os.fsencode(self.socket_path)) + len(".tmp") > _SOCKET_PATH_MAX:
            raise ObserveError(f"{self.socket_path} is too long for a socket path (AF_UNIX: {_SOCKET_PATH_MAX} bytes)")
        self.log_dir = self.home
        self.started = time.monotonic()
        self.modules = tuple(preload)
        self._closed = False
        self._ready = threading.Lock()
        self._hello_reply: dict[str, Any] | None = None
        self._attached: socket.socket | None = None
        self.alive = _Alive(self.home / "alive.lock")
        self._spec = (python, tuple(preload), dict(env), idle_s, lease)
        self.reused = self._find_or_start()
        self._wait_ready(wait)

    def _find_or_start(self) -> bool:
        """True when a server with this key is running, else start one (one host at a time)."""
        with _locked(self.home / "start.lock"):
            if self.alive.running():
                return True
            self._start(*self._spec)
            return False

    def _start(
        self, python: str, preload: Sequence[str], env: Mapping[str, str], idle_s: float, lease: Path | None
    ) -> None:
        """Start a detached server and wait until it holds its --alive lock (not for its preload)."""
        self.socket_path.unlink(missing_ok=True)  # a dead server's: none holds --alive
        argv = [
            python,
            str(probe_api_dir() / SERVER_SCRIPT),
            "--socket",
            str(self.socket_path),
            "--preload",
            ",".join(preload),
            "--idle-s",
            str(idle_s),
            "--alive",
            str(self.alive.path),
            *(["--lease", str(lease)] if lease is not None else []),
        ]
        started = proc.start_detached(
            argv,
            env=server_env(env, self.home),
            stdout_path=self.home / "server.stdout",
            stderr_path=self.home / "server.stderr",
            cwd=self.home / "home",
        )
        deadline = time.monotonic() + _SPAWN_TIMEOUT_S
        while not self.alive.running():
            if not started.running() or time.monotonic() > deadline:
                started.stop()
                raise ObserveError(f"the kept fork server did not start: {self._last_error()}")
            time.sleep(0.02)

    def _hello(self) -> dict[str, Any]:
        """Attach: the server does not idle out while we are. A server that was ending as we
        came (its idle limit, a kill) is replaced, up to ``_ATTACH_TRIES`` times."""
        for _ in range(_ATTACH_TRIES - 1):
            reply = self._attach()
            if reply is not None:
                return reply
            self.reused = self._find_or_start()
        reply = self._attach()
        if reply is None:
            raise ObserveError(f"the kept fork server went away as this run attached: {self._last_error()}")
        return reply

    def _attach(self) -> dict[str, Any] | None:
        """The server's reply to ``attach`` on a connection kept open, or None when the server
        ended before answering. Raises ObserveError when it never comes up."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                conn = self._connect(START_TIMEOUT_S)
                break
            except ObserveError:
                if not self.alive.running():
                    return None
                if time.monotonic() > deadline:
                    self._stop_stuck()
                    raise ObserveError(
                        f"the kept fork server did not start within {START_TIMEOUT_S:.0f}s (stopped it)"
                    ) from None
                time.sleep(0.05)
        try:
            replies = Replies(conn, f"the kept fork server at {self.home}")
            replies.send({"op": "attach"})
            reply = replies.read("kept-hello", max_bytes=MAX_HELLO_BYTES)
            if reply is not None:
                check_peer(conn, reply["pid"], replies.source)
        except OSError:
            reply = None
        except BadReply:
            conn.close()
            raise
        if reply is None:
            conn.close()
            return None
        conn.settimeout(None)
        self._attached = conn
        return reply

    def _stop_stuck(self) -> None:
        """Kill a server that holds its key but never answered (a preload that hangs): it would
        not idle out, its clock starts once the preload is done, and `cache servers` cannot
        reach it; every later run would wait for it as long as this one did."""
        pid = self.alive.pid
        if pid is not None and self.alive.running():
            proc.kill_group(pid)  # its own session: its group is it and its multiprocessing helper

    def running(self) -> bool:
        return self.alive.running()

    @property
    def kept(self) -> KeptInfo:
        """What the server said of itself when this run attached (waits for it)."""
        self.ready()
        assert self._hello_reply is not None, "ready() sets it or raises"
        return KeptInfo.from_hello(self._hello_reply)

    def close(self) -> None:
        """Let go of the server (it stays up, idle, for the next run), once it has counted this
        run out: it closes its end only then, so what ``cache servers`` says next is true."""
        if self._closed:
            return
        self._closed = True
        if self._attached is not None:
            with contextlib.suppress(OSError):
                self._attached.shutdown(socket.SHUT_WR)
                self._attached.settimeout(_DETACH_TIMEOUT_S)
                while self._attached.recv(4096):
                    pass
            self._attached.close()


class _Alive:
    """A kept server's ``--alive`` lock: held for exactly as long as the server lives."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def running(self) -> bool:
        """Whether a server holds the lock (taken and given back at once when none does)."""
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing gives the lock back
        return False

    @property
    def pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            return int(self.path.read_text())
        return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One host at a time decides whether to start a server for a key."""
    lock = FileLock(str(path), timeout=_START_LOCK_TIMEOUT_S)
    try:
        lock.acquire()
    except Timeout:
        raise ObserveError(f"another run held {path} for {_START_LOCK_TIMEOUT_S:.0f}s") from None
    try:
        yield
    finally:
        lock.release()


def check_peer(conn: socket.socket, pid: int, source: str) -> None:
    """Raises BadReply unless the process at the other end of ``conn`` is this user's and is
    the ``pid`` its reply named (the kernel says who listens: SO_PEERCRED), so that a stop
    is checked on the process that was asked, not on a number it gave."""
    peer_pid, peer_uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    if peer_uid != os.getuid():
        raise BadReply(f"{source}: its socket belongs to user {peer_uid}, not this user")
    if peer_pid != pid:
        raise BadReply(f"{source}: it says it is pid {pid}, but its socket is pid {peer_pid}'s")


@dataclass(frozen=True)
class Skipped:
    """A socket in the runtime directory that answered, but not as a kept server answers."""

    socket: str
    reason: str


@dataclass(frozen=True)
class Survey:
    """What ``cache servers`` found: the kept servers that answered, and what was skipped."""

    servers: list[KeptInfo]
    skipped: list[Skipped]


@dataclass(frozen=True)
class StopOutcome:
    """What ``cache servers --stop`` did: stopped (their pid gone), or still running, and why."""

    stopped: list[KeptInfo]
    not_stopped: list[Skipped]
    skipped: list[Skipped]


def survey() -> Survey:
    """Every kept server of this user that answers, oldest first, and every socket whose
    reply was not a kept server's (too long, too slow, not its schema), named. Raises
    ObserveError when the runtime directory is unusable."""
    found, skipped = _survey()
    return Survey([info for _, info in found], skipped)


def _survey() -> tuple[list[tuple[Path, KeptInfo]], list[Skipped]]:
    found, skipped = [], []
    for home in sorted(runtime_dir().glob(f"{_PREFIX}*")):
        sock = home / "server.sock"
        try:
            reply = _ask(sock, {"op": "hello"}, "kept-hello")
        except BadReply as exc:
            skipped.append(Skipped(str(sock), str(exc)))
            continue
        if reply is not None:
            found.append((sock, KeptInfo.from_hello(reply)))
    return sorted(found, key=lambda f: f[1].started_utc), skipped


def kept_servers() -> list[KeptInfo]:
    """Every kept server of this user that answers, oldest first."""
    return survey().servers


def stop_all() -> StopOutcome:
    """Ask every kept server of this user to stop (their running checks with them), and
    check that each one's process is gone. A socket whose reply is not a kept server's is
    skipped and named; a server whose process still runs after ``_STOP_WAIT_S`` is named
    as not stopped. Raises ObserveError when the runtime directory is unusable."""
    found, skipped = _survey()
    stopped, not_stopped = [], []
    for sock, server in found:
        why = ""
        try:
            if _ask(sock, {"op": "stop"}, "stopping", expect_pid=server.pid) is None:
                why = "; it did not answer the request to stop"
        except BadReply as exc:
            why = f"; {exc}"
        if _gone(server.pid, _STOP_WAIT_S):
            stopped.append(server)
        else:
            reason = f"pid {server.pid} still runs {_STOP_WAIT_S:.0f}s after it was asked to stop{why}"
            not_stopped.append(Skipped(str(sock), reason))
    return StopOutcome(stopped, not_stopped, skipped)


def stop_kept_servers() -> list[KeptInfo]:
    """Stop every kept server of this user; returns those whose process is gone."""
    return stop_all().stopped


def _gone(pid: int, within_s: float) -> bool:
    """Whether process ``pid`` has ended (a zombie has) within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            stat_line = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        if stat_line[stat_line.rindex(")") + 2] == "Z":
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _ask(path: Path, message: dict[str, Any], kind: str, expect_pid: int | None = None) -> dict[str, Any] | None:
    """One request, one ``kind`` reply from the process listening at ``path`` (checked: its
    schema, and that it is the pid it names); None when nothing answers there. Raises
    BadReply for a reply that is too long, too slow or not a ``kind``."""
    source = f"the socket {path}"
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(_ASK_TIMEOUT_S)
        try:
            conn.connect(str(path))
        except OSError:
            return None  # a dead server's socket, or none
        replies = Replies(conn, source)
        try:
            replies.send(message)
            reply = replies.read(kind, timeout_s=_ASK_TIMEOUT_S, max_bytes=MAX_HELLO_BYTES)
        except OSError:
            return None
        if reply is not None:
            pid = reply["pid"] if "pid" in reply else reply["stopping"]
            if expect_pid is not None and pid != expect_pid:
                raise BadReply(f"{source}: it was pid {expect_pid} and says it is stopping pid {pid}")
            check_peer(conn, pid, source)
        return reply
    finally:
        conn.close()

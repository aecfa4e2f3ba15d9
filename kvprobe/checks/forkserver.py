"""Checks forked from one preloaded interpreter per run, instead of a fresh one each.

A side's check used to pay interpreter start and the torch/transformers/torchvision imports
(about 4 s of a probe's 6-7 s) every time. ``probe_api/kvprobe_forkserver.py`` imports them
once, in the target env's own python, through ``multiprocessing``'s fork server (made for
exactly this: a single-threaded process that preloads modules and only forks); each check
is a child set up as ``python SCRIPT ARGS`` would be. SGLang and the sides' trees are never
preloaded: the server's path holds only the probe API. Yet a preloaded module may be one a
side's tree provides too (a git pin set of torch, or of a package a preloaded one imports):
a forked child would keep the server's copy where a fresh interpreter imports the tree's, so
such a check runs fresh, and says why.

:class:`Execution` is what the receipt says of one check: ``fresh`` or ``forked``. A check
whose exit status the server lost (it says so: ``multiprocessing`` would report 255, the
same as a real exit 255) is run again fresh, and says why: a lost status is never a result.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvprobe import proc, schema, strict_json
from kvprobe.defects import BundleDefect
from kvprobe.errors import CheckRunError, ObserveError
from kvprobe.names import FORKSERVER_REPLY_SCHEMA
from kvprobe.resources import probe_api_dir

# The heavy third-party imports of the sglang-cpu env; never SGLang (it is the code under test).
PRELOAD = ("torch", "transformers", "torchvision")
SERVER_SCRIPT = "kvprobe_forkserver.py"
FRESH, FORKED = "fresh", "forked"
# 255 with no exit record from the check: the server lost its status, or the check left
# through os._exit(255) or C's exit(255), which skip the record. A fresh run tells which.
STATUS_LOST = "exit 255 without the check's own exit record (status lost, or os._exit); ran again fresh"
START_TIMEOUT_S = 300.0
_REPLY_GRACE_S = 30.0  # the server's own kill and reap after a check's timeout
# A reply once connected: the server listens only after its preload, so it answers at once.
REPLY_TIMEOUT_S = 30.0
# Reply lines are capped: a hello lists every module the preload imported (torch and
# transformers: a few thousand names, ~100 KiB); every other reply is one short line.
MAX_HELLO_BYTES = 8 << 20
MAX_REPLY_BYTES = 4096


@dataclass(frozen=True)
class Execution:
    """How one check ran, and why it ran fresh when a server was there."""

    mode: str
    reason: str | None = None


@dataclass(frozen=True)
class CheckResult(proc.CommandResult):
    """A check's result from :meth:`ForkServer.run`, and how it ran (forked, or fresh again)."""

    execution: Execution = Execution(FORKED)


class BadReply(ObserveError):
    """A fork server's reply that is not one: too long, too slow, not strict JSON, or not the
    message its schema (``schemas/forkserver-reply.schema.json``) describes."""


class Replies:
    """The reply lines of one connection to a fork server. Each read is bounded in bytes and
    in time and checked against its schema before a field of it is used: a kept server may be
    any process of this user that holds its key (docs/architecture.md)."""

    def __init__(self, conn: socket.socket, source: str) -> None:
        self.conn = conn
        self.source = source
        self._buffer = bytearray()

    def send(self, message: dict[str, Any]) -> None:
        self.conn.settimeout(REPLY_TIMEOUT_S)
        self.conn.sendall(json.dumps(message).encode() + b"\n")

    def read(
        self, kind: str, *, timeout_s: float = REPLY_TIMEOUT_S, max_bytes: int = MAX_REPLY_BYTES
    ) -> dict[str, Any] | None:
        """The next reply, a ``kind`` message of the schema; None when the server closed the
        connection without one. Raises BadReply (a line over ``max_bytes``, none within
        ``timeout_s``, or one that is not a ``kind``) and OSError from the socket."""
        line = self._line(timeout_s, max_bytes)
        if line is None:
            return None
        try:
            reply = strict_json.loads(line, self.source, max_bytes=max_bytes, max_depth=8)
        except BundleDefect as defect:
            raise BadReply(f"{self.source}: its reply is not strict JSON: {defect.detail[:240]}") from None
        problems = schema.errors(reply, FORKSERVER_REPLY_SCHEMA, kind)
        if problems:
            problem = problems[0] if len(problems[0]) <= 240 else problems[0][:240] + "..."
            raise BadReply(f"{self.source}: its reply is not a {kind} reply: {problem}")
        return dict(reply)

    def _line(self, timeout_s: float, max_bytes: int) -> bytes | None:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            if len(self._buffer) > max_bytes:
                raise BadReply(f"{self.source}: a reply line longer than {max_bytes} bytes")
            left = deadline - time.monotonic()
            if left <= 0:
                raise BadReply(f"{self.source}: no complete reply within {timeout_s:.0f}s")
            self.conn.settimeout(left)
            try:
                chunk = self.conn.recv(min(1 << 16, max_bytes + 1 - len(self._buffer)))
            except TimeoutError:
                continue  # the deadline says
            if not chunk:
                return None
            self._buffer += chunk
        line, _, rest = bytes(self._buffer).partition(b"\n")
        if len(line) > max_bytes:
            raise BadReply(f"{self.source}: a reply line longer than {max_bytes} bytes")
        self._buffer = bytearray(rest)
        return line


class StatusLost(CheckRunError):
    """A forked check ended and the server could not say how: not a result, run it again fresh."""


class ForkServer:
    """A running fork server in ``python``'s env; stop it with :meth:`close` (or ``with``).

    Raises ObserveError when the server cannot start or does not answer within
    ``START_TIMEOUT_S`` (preloading torch takes seconds, not minutes). With ``wait=False``
    the constructor only starts the process, so its preload overlaps whatever the caller
    does next; :meth:`ready` (and the first check) then waits for it.
    """

    # how its start is told: what it is, what it does while starting, its hello reply's kind
    NAME, STARTING, HELLO = "the fork server", "preloading", "hello"

    def __init__(
        self,
        python: str,
        *,
        preload: Sequence[str],
        env: Mapping[str, str],
        work: Path,
        lifetime_s: float,
        wait: bool = True,
    ) -> None:
        self.started = time.monotonic()  # when its preload began (progress reports it)
        self.modules = tuple(preload)
        # AF_UNIX paths are limited to 107 bytes: the socket gets a short directory of its own
        self._socket_dir = Path(tempfile.mkdtemp(prefix="kvprobe-fs-"))
        self._closed = False
        self.socket_path = self._socket_dir / "server.sock"
        self.log_dir = work
        argv = [python, str(probe_api_dir() / SERVER_SCRIPT), "--socket", str(self.socket_path)]
        try:
            self.service = proc.start(
                [*argv, "--preload", ",".join(preload)],
                lifetime_s=lifetime_s,
                env=server_env(env, work),
                stdout_path=work / "server.stdout",
                stderr_path=work / "server.stderr",
                cwd=work / "home",
            )
        except ObserveError:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            raise
        self._ready = threading.Lock()
        self._hello_reply: dict[str, Any] | None = None
        self._wait_ready(wait)

    def _wait_ready(self, wait: bool) -> None:
        """The constructor's wait for the preload (with ``wait``); a server failing it is closed."""
        if not wait:
            return
        try:
            self.ready()
        except BaseException:
            self.close()
            raise

    def ready(self) -> None:
        """Wait until the server has preloaded and answered (once; later calls return at once).

        Raises ObserveError when it exited or fell silent; the caller closes it."""
        with self._ready:
            if self._hello_reply is None:
                self._hello_reply = self._hello()

    @property
    def is_ready(self) -> bool:
        """Whether :meth:`ready` has returned already (no wait left)."""
        return self._hello_reply is not None

    @property
    def preloaded(self) -> dict[str, str | None]:
        """What the server imported, with versions (waits for it to be ready)."""
        self.ready()
        assert self._hello_reply is not None, "ready() sets it or raises"
        return dict(self._hello_reply["preloaded"])

    def shadowed(self, path: Sequence[Path]) -> list[str]:
        """The modules the server holds that ``path`` (a check's own tree) provides as well: a
        fresh interpreter imports those from the tree, a forked child would keep the server's."""
        self.ready()
        assert self._hello_reply is not None, "ready() sets it or raises"
        provided = set().union(*(top_level_names(Path(p)) for p in path))
        return [name for name in self._hello_reply["loaded"] if name in provided]

    def _hello(self) -> dict[str, Any]:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.socket_path.exists():
            if not self.running():
                raise ObserveError(f"{self.NAME} exited while {self.STARTING}: {self._last_error()}")
            if time.monotonic() > deadline:
                raise ObserveError(f"{self.NAME} did not start within {START_TIMEOUT_S:.0f}s")
            time.sleep(0.05)
        with self._connect(START_TIMEOUT_S) as conn:
            replies = Replies(conn, self.NAME)
            replies.send({"op": "hello"})
            reply = replies.read(self.HELLO, max_bytes=MAX_HELLO_BYTES)
        if reply is None:
            raise ObserveError(f"{self.NAME} did not answer: {self._last_error()}")
        return reply

    def run(
        self,
        argv: Sequence[str],
        *,
        path: Sequence[Path],
        env: Mapping[str, str],
        cwd: Path,
        stdout_path: Path,
        stderr_path: Path,
        timeout_s: float,
    ) -> CheckResult:
        """``python ARGV`` in a forked child (``path`` first on sys.path, as PYTHONPATH would be).

        A crash, a non-zero exit or a timeout is the result's; raises CheckRunError when the
        server dies or falls silent, after killing the check's process group itself, and
        StatusLost when the check ended but its exit status did not reach the server.
        """
        for log in (stdout_path, stderr_path):
            log.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.ready()
        except ObserveError as exc:
            raise CheckRunError(f"the fork server failed before {Path(argv[0]).name}: {exc}") from exc
        request = {
            "op": "run",
            "argv": list(argv),
            "path": [str(Path(p).absolute()) for p in path],
            "env": dict(env),
            "cwd": str(cwd),
            "stdout": str(stdout_path),
            "stderr": str(stderr_path),
            "timeout_s": timeout_s,
        }
        started, pgid = time.monotonic(), None
        try:
            with self._connect(REPLY_TIMEOUT_S) as conn:
                replies = Replies(conn, "the fork server")
                replies.send(request)
                first = replies.read("started")
                pgid = first["started"] if first else None
                reply = replies.read("finished", timeout_s=timeout_s + _REPLY_GRACE_S) if first else None
        except (OSError, BadReply) as exc:  # a reply that is not one is no result
            reply, why = None, str(exc)
        else:
            why = self._last_error()
        if reply is None:
            if pgid is not None:
                proc.kill_group(pgid)
            raise CheckRunError(f"the fork server failed during {Path(argv[0]).name}: {why}")
        if reply.get("lost"):
            raise StatusLost(f"{Path(argv[0]).name}: {STATUS_LOST} (multiprocessing said exit {reply['exit']})")
        return CheckResult(
            argv=("<forked>", *argv),
            returncode=reply["exit"],
            duration_s=time.monotonic() - started,
            timed_out=reply["timed_out"],
            stdout_path=stdout_path,
            stderr_path=stderr_path,
        )

    def _connect(self, timeout_s: float) -> socket.socket:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(timeout_s)
        try:
            conn.connect(str(self.socket_path))
        except OSError as exc:
            conn.close()
            raise ObserveError(f"cannot reach the fork server: {exc}") from exc
        return conn

    def _last_error(self) -> str:
        path = self.log_dir / "server.stderr"
        lines = [ln for ln in proc.read_tail(path, 8192).splitlines() if ln.strip()] if path.exists() else []
        state = "running" if self.running() else "exited"
        return f"server {state}" + (f"; {lines[-1].strip()}" if lines else "")

    def running(self) -> bool:
        """Whether the server process is still there."""
        return self.service.running()

    def close(self) -> None:
        """Stop the server and its group (once: a later call does nothing)."""
        if self._closed:
            return
        self._closed = True
        self.service.stop()
        shutil.rmtree(self._socket_dir, ignore_errors=True)

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def server_env(env: Mapping[str, str], work: Path) -> dict[str, str]:
    """The server's variables (its checks set their own): ``env``, the probe API on its path,
    and a scratch HOME and TMPDIR under ``work``, made here."""
    for scratch in ("home", "tmp"):
        (work / scratch).mkdir(parents=True, exist_ok=True)
    return proc.clean_env(
        {
            **env,
            "PYTHONPATH": str(probe_api_dir()),
            # children inherit both: hashing and bytecode behave as in a fresh interpreter
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
            # multiprocessing's own socket directory, which a killed server cannot remove
            "TMPDIR": str(work / "tmp"),
        },
        home=work / "home",
    )


def run_check(
    argv: Sequence[str],
    *,
    server: ForkServer | None,
    path: Sequence[Path],
    env: Mapping[str, str],
    cwd: Path,
    stdout_path: Path,
    stderr_path: Path,
    timeout_s: float,
    reset: Callable[[], None] | None = None,
) -> CheckResult:
    """``argv`` (the env's python first) in a fresh interpreter, or forked from ``server``'s
    preloaded one. A forked check whose status the server lost runs again fresh (after
    ``reset`` clears what the first attempt left) and its execution says why.

    Raises what :func:`proc.run` and :meth:`ForkServer.run` raise, StatusLost aside.
    """
    execution = Execution(FRESH)
    shadowed = server.shadowed(path) if server is not None else []
    if shadowed:
        execution = Execution(FRESH, f"its tree provides {', '.join(shadowed)}, which the fork server had imported")
    elif server is not None:
        try:
            return server.run(
                argv[1:],
                path=path,
                env=env,
                cwd=cwd,
                timeout_s=timeout_s,
                stdout_path=stdout_path,
                stderr_path=stderr_path,
            )
        except StatusLost:
            if reset is not None:
                reset()
            execution = Execution(FRESH, STATUS_LOST)
    ran = proc.run(argv, timeout_s=timeout_s, env=env, cwd=cwd, stdout_path=stdout_path, stderr_path=stderr_path)
    return CheckResult(**vars(ran), execution=execution)


def top_level_names(directory: Path) -> set[str]:
    """The names a top-level import can find in ``directory``: modules and regular packages.
    One listing per path entry (a stat per loaded module and suffix took ~40 ms a check)."""
    suffixes = importlib.machinery.all_suffixes()
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return set()
    names = set()
    for entry in entries:
        if entry.is_dir():
            if os.path.isfile(os.path.join(entry.path, "__init__.py")):
                names.add(entry.name)
        elif entry.is_file():
            names.update(entry.name[: -len(s)] for s in suffixes if entry.name.endswith(s))
    return {name for name in names if name and "." not in name}

"""One release's imports, shared: run INSIDE the target env (stdlib only; imports nothing from
kvprobe), as a child forked from the preloaded fork server (kvprobe_forkserver.py).

The fork server starts :func:`serve` on ``{"op": "release", ...}``: a process that puts one
release's tree first on ``sys.path``, imports the modules asked (what the sweep's probes
import of the package under test), puts ``sys.path`` back, and then serves checks of that
release only, each forked from it and set up by ``kvprobe_forkserver.child`` exactly as a
check forked from the fork server is. It serves no other release: the host starts one per
release and stops it when the release is done (and the fork server kills it when the host's
connection closes).

A module that fails to import here is taken out again: every module the failed attempt added
to ``sys.modules`` (and its binding on a parent package that was there before) is removed, so
a check imports it itself and fails as it would in a fresh interpreter. A name that is not a
module at all (``from pkg.mod import Class`` lists ``pkg.mod.Class`` as a candidate) is
skipped. When the imports leave a second thread running, nothing is served: a fork would copy
a process whose other thread may hold a lock (the host then runs the checks as before).

The host (``kvprobe.checks.releaseserver``) talks to this process over its own Unix socket,
one connection per request, one JSON line each way, the fork server's lines:

    {"op": "hello"}  ->  {"preloaded": {module: version}, "loaded": [top-level name],
                          "pid": N, "path": [...], "failed": {module: "Type: message"}}
    {"op": "run", ...as the fork server's...}
                     ->  {"started": PID}  then  {"exit": CODE, "timed_out": B, "duration_s": S,
                                                  "lost": false}

One check at a time, in this process's only thread: it forks, so no other thread may exist.
The status comes from ``waitpid`` on its own child, never lost.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import json
import os
import select
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback

import kvprobe_forkserver

_HERE = os.path.dirname(os.path.abspath(__file__))
_PR_SET_PDEATHSIG = 1
try:  # looked up here, once: a check forked from this process calls it without importing
    import ctypes

    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (ImportError, OSError, AttributeError):
    _PRCTL = None
_POLL_S = 0.5
_GRACE_S = 3.0


class _Record:
    """What ``kvprobe_forkserver.child`` sends its exit code through: here a pipe nobody needs
    to read (``waitpid`` tells the status), closed with the child."""

    def __init__(self, fd):
        self.fd = fd

    def send(self, code):
        os.write(self.fd, str(code).encode())


def imports(modules):
    """Import ``modules`` in order: (module -> version of each imported, module -> why each
    failed). A failed attempt is rolled back (see the module's docstring)."""
    done, failed = {}, {}
    for name in modules:
        parent = name.rpartition(".")[0]
        if parent and parent in sys.modules and not _is_module(name):
            continue  # ``from parent import name``: an attribute, not a submodule
        before = dict(sys.modules)
        try:
            module = importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - SystemExit at import too: the check sees it
            _roll_back(before)
            failed[name] = f"{type(exc).__name__}: {exc}"[:500]
            continue
        done[name] = str(getattr(module, "__version__", "") or "") or None
    return done, failed


def _is_module(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, AttributeError, ValueError):  # a parent that is a module, not a package
        return False


def _roll_back(before):
    for added in set(sys.modules) - set(before):
        module = sys.modules.pop(added)
        parent, _, child = added.rpartition(".")
        holder = before.get(parent)
        if holder is not None and getattr(holder, child, None) is module:
            delattr(holder, child)


def census():
    """Every top-level module this process holds but the probe API's own (as the fork
    server's census lists them)."""
    ours = {
        name
        for name, module in sys.modules.items()
        if os.path.dirname(getattr(module, "__file__", None) or "") == _HERE
    }
    return sorted({name.partition(".")[0] for name in sys.modules} - ours)


def serve(request):
    """The release's process (the fork server's ``Process`` target); never returns."""
    os.setpgid(0, 0)
    forker = os.getppid()  # the fork server's forker: when it is gone, so is the fork server
    for fd, key in ((1, "stdout"), (2, "stderr")):
        log = os.open(request[key], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, fd)
        os.close(log)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", line_buffering=True)
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
    )
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None
        os.chdir(request["cwd"])
        base = list(sys.path)
        sys.path[:] = [*request["path"], *base]
        done, failed = imports(request["modules"])
        sys.path[:] = base
        importlib.invalidate_caches()
        for name, why in failed.items():
            print(
                f"release imports: {name} did not import here ({why}); its checks import it themselves", file=sys.stderr
            )
        if threading.active_count() > 1:
            names = ", ".join(t.name for t in threading.enumerate() if t is not threading.current_thread())
            print(f"release imports: a thread is running after the imports ({names}); not serving", file=sys.stderr)
            os._exit(3)
        hello = {
            "preloaded": done,
            "loaded": census(),
            "pid": os.getpid(),
            "path": list(request["path"]),
            "failed": failed,
        }
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(request["socket"] + ".tmp")
        listener.listen(4)
        os.replace(request["socket"] + ".tmp", request["socket"])  # the path appears once it accepts
    except BaseException:  # noqa: BLE001 - why it could not start is the host's to read
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(3)
    while True:
        ready, _, _ = select.select([listener], [], [], _POLL_S)
        if os.getppid() != forker:
            os._exit(0)
        if ready:
            conn, _ = listener.accept()
            try:
                _handle(conn, listener, hello)
            except Exception:  # noqa: BLE001 - one bad connection is not the end of the release
                traceback.print_exc()
            finally:
                conn.close()


def _handle(conn, listener, hello):
    with conn.makefile("rwb") as stream:
        request = json.loads(stream.readline())
        if request["op"] == "hello":
            _send(stream, hello)
        elif request["op"] == "stop":
            os._exit(0)
        else:
            _run(request, stream, conn, listener)


def _run(request, stream, host, listener):
    """One check, forked from this process; its group killed at its timeout, when its host
    hangs up, and when it ends."""
    started = time.monotonic()
    sys.stdout.flush()
    sys.stderr.flush()
    record_r, record_w = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the check
        try:
            _die_with_parent(parent)
            # the descriptors themselves: the host's stream still refers to its socket, and a
            # check holding it would keep the host from seeing this process end
            for fd in (listener.fileno(), host.fileno(), record_r):
                os.close(fd)
        finally:
            kvprobe_forkserver.child(request, _Record(record_w))
    os.close(record_w)
    os.close(record_r)
    _send(stream, {"started": pid})
    status, hung_up = _wait(pid, started + request["timeout_s"], host)
    timed_out = status is None and not hung_up
    if status is None:
        _kill_group(pid)
        status = _wait(pid, time.monotonic() + _GRACE_S)[0]
        if status is None:
            os.kill(pid, signal.SIGKILL)
            status = os.waitpid(pid, 0)[1]
    _kill_group(pid)  # whatever the check started goes with it
    if hung_up:
        return
    code = os.waitstatus_to_exitcode(status)
    _send(stream, {"exit": code, "timed_out": timed_out, "duration_s": time.monotonic() - started, "lost": False})


def _die_with_parent(parent):
    """The check is killed when this process is (it has a group of its own, which the fork
    server does not know): Linux's parent-death signal, where libc has prctl."""
    if _PRCTL is None:
        return
    try:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # it died before the call
            os._exit(1)
    except Exception:  # noqa: BLE001 - without it, a check outlives a killed release process
        pass


def _wait(pid, deadline, host=None):
    """(the check's wait status, or None at ``deadline``; whether ``host`` hung up)."""
    try:
        ended = os.pidfd_open(pid)
    except (AttributeError, OSError):
        ended = None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status, False
            left = deadline - time.monotonic()
            if left <= 0:
                return None, False
            watch = [f for f in (ended, host) if f is not None]
            ready, _, _ = select.select(watch, [], [], min(left, 0.05 if ended is None else _POLL_S))
            if host is not None and host in ready:
                return None, True  # the host sends nothing after its request: readable is its end
    finally:
        if ended is not None:
            os.close(ended)


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _send(stream, message):
    stream.write(json.dumps(message).encode() + b"\n")
    stream.flush()

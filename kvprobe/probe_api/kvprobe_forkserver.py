"""Preloaded fork server, run INSIDE the target env (stdlib only; imports nothing from kvprobe).

    python kvprobe_forkserver.py --socket PATH --preload torch,transformers,torchvision

Heavy third-party modules are imported once, in ``multiprocessing``'s fork server (a
single-threaded process that does nothing but fork); never SGLang or anything from a
side's tree, which is not on this process's path at all. Each check then runs in a
child forked from it, set up as a fresh ``python SCRIPT ARGS`` (or ``python -m MOD
ARGS``) would be: its own tree first on ``sys.path``, its own environment, cwd, argv,
stdout/stderr files, and its own process group, which is killed at its timeout and
again when it ends, so nothing it started outlives it.

The host (``kvprobe.checks.forkserver``) talks to this process over a Unix socket, one
connection per request, one JSON line each way:

    {"op": "hello"}  ->  {"preloaded": {module: version}, "loaded": [top-level name], "pid": N}
    {"op": "run", "argv": [...], "env": {...}, "cwd": D, "path": [...],
     "stdout": F, "stderr": F, "timeout_s": T}
                     ->  {"started": PID}  then  {"exit": CODE, "timed_out": B, "duration_s": S,
                                                  "lost": B}

    {"op": "release", "socket": S, "path": [...], "env": {...}, "cwd": D, "modules": [...],
     "stdout": F, "stderr": F}
                     ->  {"started": PID}: one release's server (kvprobe_releaseserver.py), a
                         child of this preloaded interpreter that imports the release's modules
                         once and serves that release's checks on S; it lives as long as the
                         host keeps this connection open

``started`` names the check's process group, so the host can kill it itself if this
server dies mid-check; and when the host dies without stopping this server (SIGKILL, an
OOM kill), the server kills every running check's group and exits. A connection the host
closes before the reply (it died, or gave up) ends its check's group at once: a kept
server outlives its hosts, and would otherwise run that check on to its timeout.

Kept between runs (``--idle-s``, ``kvprobe run --keep-server``), the server belongs to no
host: it holds ``--alive`` (a lock that says it lives) and ``--lease`` (the env's, so the
cache is not pruned under it) for its whole life, counts each host that is ``attach``-ed,
and exits once ``--idle-s`` seconds pass with no host attached and no check running.

    {"op": "attach"} ->  the hello reply, plus "started_utc", "idle_s", "served"; the
                         connection stays open while the host uses the server
    {"op": "stop"}   ->  {"stopping": PID}; running checks' groups are killed

``lost`` says the check's exit status may not have reached this process: ``multiprocessing``
reports a status it could not read as 255, the same number as a real ``sys.exit(255)``, so
each child also sends the code it exits with through a pipe of its own, and 255 without that
record saying 255 is never taken as a result (the host reruns the check fresh). A check
that leaves through ``os._exit(255)`` sends no record either: its fresh run then says 255.

Why a status got lost: ``Process.start()`` polls every unjoined child of this process
(``multiprocessing.process._cleanup``), so a check starting in one thread read the status
pipe of a check ending in another; of two concurrent reads one gets the status and the other
EOF, which ``popen_forkserver`` turns into 255 and may store last. ``_MP_LOCK`` keeps starts
and polls apart (waits on a child's sentinel run outside it).
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import io
import json
import multiprocessing
import multiprocessing.connection
import os
import runpy
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback

_HERE = os.path.dirname(os.path.abspath(__file__))
_GRACE_S = 3.0
_LOST = 255  # what multiprocessing's forkserver Popen reports when it cannot read a status
_MP_LOCK = threading.Lock()  # Process.start() and every poll of a child's status: one at a time
_HOST_POLL_S = 0.5
_HOLD_TRIES_S = 2.0  # a host checking whether --alive is held takes it for a moment
_HELD = []  # the --alive and --lease descriptors: their locks last as long as this process
_BOUND = []  # the inode of the socket path this server bound, the paths to give back at exit


def census(conn, modules):
    """Which of ``modules`` the fork server really imported, with their versions, and every
    top-level module it holds (theirs included) but the probe API's own, which checks have on
    their path too: a check whose path provides one of those would get this copy forked, not
    its own."""
    found = {}
    for name in modules:
        module = sys.modules.get(name)
        if module is not None:
            found[name] = str(getattr(module, "__version__", "") or "") or None
    ours = {
        name
        for name, module in sys.modules.items()
        if os.path.dirname(getattr(module, "__file__", None) or "") == _HERE
    }
    conn.send((found, sorted({name.partition(".")[0] for name in sys.modules} - ours)))
    conn.close()


def child(request, record):
    """One check, set up as a fresh interpreter would be; never returns. ``record`` gets the
    code it exits with, so the server can tell a real 255 from a status it lost."""
    os.setpgid(0, 0)
    code = 1
    try:
        out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
        sys.stderr = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
        )
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # chosen again from this check's TMPDIR, as a fresh python would
        os.chdir(request["cwd"])
        sys.dont_write_bytecode = True
        code = _run(request["argv"], request["path"])
    except BaseException:  # noqa: BLE001 - a set-up failure is the check's exit 1, as in python
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream cannot be flushed
                pass
    try:
        record.send(code)
    except Exception:  # noqa: BLE001 - no record: a 255 then counts as lost, and is rerun
        pass
    os._exit(code)


def _run(argv, path):
    """``python ARGV`` in this process: its sys.path, sys.argv, __main__ and exit code."""
    base = [p for p in sys.path if p and os.path.abspath(p) != _HERE]
    if argv[0] == "-m":
        first = os.getcwd()
        sys.argv = [argv[1], *argv[2:]]
    else:
        first = os.path.dirname(os.path.abspath(argv[0]))
        sys.argv = list(argv)
    sys.path[:] = [first, *path, *base]
    try:
        if argv[0] == "-m":
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        return _exit_code(exc.code)
    except BaseException:  # noqa: BLE001 - an uncaught exception is exit 1, as in python
        traceback.print_exc()
        return 1
    return 0


def _exit_code(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Server:
    def __init__(self, preload, idle_s=None):
        self.running = set()  # the process groups of the checks under way
        self.idle_s = idle_s  # kept between runs: idle seconds before exiting; None: a run's own
        self.attached = 0  # hosts using a kept server now
        self.served = 0
        self.last_active = time.monotonic()
        self.started_utc = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(list(preload))
        receive, send = self.context.Pipe(duplex=False)
        counter = self.context.Process(target=census, args=(send, list(preload)))
        counter.start()
        send.close()
        self.preloaded, self.loaded = receive.recv()
        counter.join()
        self.last_active = time.monotonic()  # the idle clock starts once the preload is done

    def handle(self, conn):
        with conn, conn.makefile("rwb") as stream:
            request = json.loads(stream.readline())
            if request["op"] == "hello":
                _send(stream, self.hello())
            elif request["op"] == "attach":
                self.attach(stream)
            elif request["op"] == "stop":
                _send(stream, {"stopping": os.getpid()})
                self.exit()
            elif request["op"] == "release":
                self.release(request, stream, conn)
            else:
                self.run(request, stream, conn)

    def hello(self):
        reply = {"preloaded": self.preloaded, "loaded": self.loaded, "pid": os.getpid()}
        if self.idle_s is not None:
            with _MP_LOCK:
                attached, served = self.attached, self.served
            reply.update(
                started_utc=self.started_utc,
                idle_s=self.idle_s,
                served=served,
                attached=attached,
                python=sys.executable,
                preload=sorted(self.preloaded),
            )
        return reply

    def attach(self, stream):
        """A host uses this kept server until it closes the connection (or dies)."""
        with _MP_LOCK:
            self.attached += 1
        try:
            _send(stream, self.hello())
            while stream.read(4096):
                pass
        finally:
            with _MP_LOCK:
                self.attached -= 1
                self.last_active = time.monotonic()

    def exit(self, idle=False):
        """End every running check's group, give the socket path back, and exit; with ``idle``,
        only when ``idle_s`` has passed with no host attached and no check running. All under
        the lock an attach takes, so a host attaching now is counted in or finds us gone."""
        with _MP_LOCK:
            if idle and (self.attached or self.running or time.monotonic() - self.last_active < self.idle_s):
                return
            for pgid in self.running:
                _kill_group(pgid)
            _give_back()
            os._exit(0)

    def release(self, request, stream, host):
        """One release's server (kvprobe_releaseserver.py), forked from this preloaded
        interpreter; it lives as long as ``host`` keeps this connection open."""
        import kvprobe_releaseserver

        server = self.context.Process(target=kvprobe_releaseserver.serve, args=(request,))
        with _MP_LOCK:
            server.start()
            self.running.add(server.pid)
        _send(stream, {"started": server.pid})
        _wait(server, None, host)  # it stopped, or its host hung up
        _kill_group(server.pid)
        if _wait(server, _GRACE_S) is None:
            server.kill()
            _wait(server, None)
        with _MP_LOCK:
            self.running.discard(server.pid)
            self.last_active = time.monotonic()

    def run(self, request, stream, host):
        """One check; ended early when ``host`` hangs up (the run was killed, or gave up on it)."""
        started = time.monotonic()
        receive, send = self.context.Pipe(duplex=False)
        check = self.context.Process(target=child, args=(request, send))
        with _MP_LOCK:
            check.start()
            self.running.add(check.pid)
            self.served += 1
        send.close()
        _send(stream, {"started": check.pid})
        code = _wait(check, request["timeout_s"], host)
        hung_up = code is None and _hung_up(host)
        timed_out = code is None and not hung_up
        if code is None:  # its timeout, or its host is gone: its group goes, it is reaped
            _kill_group(check.pid)
            code = _wait(check, _GRACE_S)
            if code is None:
                check.kill()
                code = _wait(check, None)
        _kill_group(check.pid)  # whatever the check started goes with it
        with _MP_LOCK:
            self.running.discard(check.pid)
            self.last_active = time.monotonic()
        said = _record(receive)
        if hung_up:
            return
        lost = code == _LOST and said != _LOST and not timed_out  # a timeout is the check's result
        _send(stream, {"exit": code, "timed_out": timed_out, "duration_s": time.monotonic() - started, "lost": lost})


def _send(stream, message):
    stream.write(json.dumps(message).encode() + b"\n")
    stream.flush()


def _record(receive):
    """The exit code the check said it exits with, or None when it ended without saying."""
    try:
        return receive.recv() if receive.poll() else None
    except (EOFError, OSError):
        return None
    finally:
        receive.close()


def _wait(check, timeout_s, host=None):
    """The check's exit status once it ended, or None at ``timeout_s`` or when ``host`` hangs
    up: the wait itself on its sentinel, the status read under ``_MP_LOCK`` (see the module's
    docstring)."""
    multiprocessing.connection.wait([check.sentinel, *([host] if host else [])], timeout_s)
    with _MP_LOCK:
        code = check.exitcode
        if code is not None:
            check.join(0)  # reads no status (it is known): only forgets the child, as join does
        return code


def _hung_up(host):
    """Whether the host closed its connection: it sends nothing after its request, so the
    connection turns readable only at its end (a kept server's host may die while others
    still use the server, so _exit_with_host cannot be its end)."""
    return bool(multiprocessing.connection.wait([host], 0))


def _exit_with_host(server, host):
    """The host that started this server is its only client. When it is gone (killed by a
    signal that left it no chance to stop us), end every check's group and exit, instead of
    idling with a preloaded interpreter until the lifetime the host set, which nothing
    enforces once the host is gone."""
    while os.getppid() == host:
        time.sleep(_HOST_POLL_S)
    with _MP_LOCK:
        for pgid in server.running:
            _kill_group(pgid)
    os._exit(0)


def _exit_when_idle(server):
    """A kept server's end: ``idle_s`` with no host attached and no check running."""
    while True:
        time.sleep(min(_HOST_POLL_S, server.idle_s))
        server.exit(idle=True)


def _hold(path):
    """Take the lock on ``path`` for this process's life and write our pid in it; False when
    another process holds it (after retrying a moment: a host's liveness check takes it
    briefly)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + _HOLD_TRIES_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                return False
            time.sleep(0.01)
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _HELD.append(fd)
    return True


def _give_back():
    """Remove our socket path (unless it is already another server's) and our env lease."""
    for inode, path, lease in _BOUND:
        try:
            if os.stat(path).st_ino == inode:
                os.unlink(path)
        except OSError:
            pass
        if lease:
            try:
                os.unlink(lease)
            except OSError:
                pass


def serve(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--preload", default="")
    parser.add_argument("--idle-s", type=float, help="kept between runs: exit after this long unused")
    parser.add_argument("--alive", help="with --idle-s: the lock this server holds while it lives")
    parser.add_argument("--lease", help="with --idle-s: the env's lease file, held while it lives")
    args = parser.parse_args(argv)
    host = os.getppid()
    if args.idle_s is not None:
        if not _hold(args.alive):
            print(f"another kept server holds {args.alive}", file=sys.stderr)
            return
        if args.lease and not _hold(args.lease):
            print(f"cannot hold the env's lease {args.lease}", file=sys.stderr)
            return
    server = Server([m for m in args.preload.split(",") if m], args.idle_s)
    if args.idle_s is None:
        threading.Thread(target=_exit_with_host, args=(server, host), daemon=True).start()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if args.idle_s is not None and os.path.exists(args.socket + ".tmp"):
        os.unlink(args.socket + ".tmp")  # a dead kept server's; we hold --alive, so none is live
    listener.bind(args.socket + ".tmp")
    listener.listen(16)
    _BOUND.append((os.stat(args.socket + ".tmp").st_ino, args.socket, args.lease))
    os.replace(args.socket + ".tmp", args.socket)  # the path appears only once it accepts
    if args.idle_s is not None:
        threading.Thread(target=_exit_when_idle, args=(server,), daemon=True).start()
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=server.handle, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    import kvprobe_forkserver  # the module by name, so its functions pickle into the children

    kvprobe_forkserver.serve()

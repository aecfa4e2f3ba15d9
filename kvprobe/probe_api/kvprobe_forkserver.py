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

    {"op": "hello"}  ->  {"preloaded": {module: version}, "pid": N}
    {"op": "run", "argv": [...], "env": {...}, "cwd": D, "path": [...],
     "stdout": F, "stderr": F, "timeout_s": T}
                     ->  {"started": PID}  then  {"exit": CODE, "timed_out": B, "duration_s": S}

``started`` names the check's process group, so the host can kill it itself if this
server dies mid-check.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
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


def census(conn, modules):
    """Which of ``modules`` the fork server really imported, with their versions."""
    found = {}
    for name in modules:
        module = sys.modules.get(name)
        if module is not None:
            found[name] = str(getattr(module, "__version__", "") or "") or None
    conn.send(found)
    conn.close()


def child(request):
    """One check, set up as a fresh interpreter would be; never returns."""
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
    def __init__(self, preload):
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(list(preload))
        receive, send = self.context.Pipe(duplex=False)
        counter = self.context.Process(target=census, args=(send, list(preload)))
        counter.start()
        send.close()
        self.preloaded = receive.recv()
        counter.join()

    def handle(self, conn):
        with conn, conn.makefile("rwb") as stream:
            request = json.loads(stream.readline())
            if request["op"] == "hello":
                reply = {"preloaded": self.preloaded, "pid": os.getpid()}
                stream.write(json.dumps(reply).encode() + b"\n")
                stream.flush()
                return
            self.run(request, stream)

    def run(self, request, stream):
        started = time.monotonic()
        check = self.context.Process(target=child, args=(request,))
        check.start()
        stream.write(json.dumps({"started": check.pid}).encode() + b"\n")
        stream.flush()
        check.join(request["timeout_s"])
        timed_out = check.exitcode is None
        if timed_out:
            _kill_group(check.pid)
            check.join(_GRACE_S)
            if check.exitcode is None:
                check.kill()
                check.join()
        _kill_group(check.pid)  # whatever the check started goes with it
        reply = {"exit": check.exitcode, "timed_out": timed_out, "duration_s": time.monotonic() - started}
        stream.write(json.dumps(reply).encode() + b"\n")
        stream.flush()


def serve(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--preload", default="")
    args = parser.parse_args(argv)
    server = Server([m for m in args.preload.split(",") if m])
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(args.socket + ".tmp")
    listener.listen(16)
    os.replace(args.socket + ".tmp", args.socket)  # the path appears only once it accepts
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=server.handle, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    import kvprobe_forkserver  # the module by name, so its functions pickle into the children

    kvprobe_forkserver.serve()

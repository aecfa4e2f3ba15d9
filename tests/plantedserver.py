"""A process planted on a kept fork server's socket: what code that ran earlier as the same
user can leave behind (docs/design/kept-server.md). Stdlib only; run as a script:

    python tests/plantedserver.py HOME MODE [LIFETIME_S]

It binds HOME/server.sock, holds HOME/alive.lock as a real kept server does (so a run takes
it for the server of its key), answers every connection as MODE says, and exits after
LIFETIME_S (default 120) whatever happens. It writes HOME/planted.pid once it listens.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import threading
import time

MODES = ("number", "no-pid", "no-loaded", "bidi", "endless", "silent", "ignores-stop", "other-pid")


def hello(pid: int) -> dict:
    return {
        "preloaded": {},
        "loaded": ["json"],
        "pid": pid,
        "started_utc": "2026-01-01T00:00:00Z",
        "idle_s": 600.0,
        "served": 0,
        "attached": 0,
        "python": sys.executable,
        "preload": [],
    }


def answer(conn: socket.socket, mode: str) -> None:
    with conn:
        request = b""
        while not request.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                return
            request += chunk
        op = json.loads(request).get("op")
        reply: object = hello(os.getpid())
        if mode == "number":
            reply = 42
        elif mode == "no-pid":
            del reply["pid"]  # type: ignore[attr-defined]
        elif mode == "no-loaded":
            del reply["loaded"]  # type: ignore[attr-defined]
        elif mode == "bidi":
            reply["started_utc"] = "2026-01-01T00:00:00Z\u202e)gnineppah si gnihton("  # type: ignore[index]
        elif mode == "other-pid":
            reply["pid"] = os.getppid()  # type: ignore[index]
        elif mode == "endless":  # a line with no end: 12 MiB, then silence
            block = b"x" * (1 << 20)
            for _ in range(12):
                conn.sendall(block)
            time.sleep(60)
            return
        elif mode == "silent":
            time.sleep(60)
            return
        elif mode == "ignores-stop" and op == "stop":
            reply = {"stopping": os.getpid()}  # says so, and goes on running
        conn.sendall(json.dumps(reply).encode() + b"\n")
        if op == "attach":
            while conn.recv(4096):
                pass


def main() -> None:
    home, mode = sys.argv[1], sys.argv[2]
    lifetime = float(sys.argv[3]) if len(sys.argv) > 3 else 120.0
    assert mode in MODES, mode
    threading.Timer(lifetime, lambda: os._exit(0)).start()
    os.makedirs(home, mode=0o700, exist_ok=True)
    lock = os.open(os.path.join(home, "alive.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    os.ftruncate(lock, 0)
    os.write(lock, str(os.getpid()).encode())
    path = os.path.join(home, "server.sock")
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    with open(os.path.join(home, "planted.pid"), "w") as handle:
        handle.write(str(os.getpid()))
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=answer, args=(conn, mode), daemon=True).start()


if __name__ == "__main__":
    main()

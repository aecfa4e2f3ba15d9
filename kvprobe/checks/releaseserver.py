"""A release's imports, shared: a second level under the preloaded fork server.

The fork server (:mod:`kvprobe.checks.forkserver`) preloads the env's heavy third-party
modules once; each check still imported its release's SGLang itself, so a sweep of several
experiments imported the same release again for every probe of every experiment. A
:class:`ReleaseServer` is one process per release, forked from the fork server, that has
put the release's tree on its path and imported that release's modules once (those the
probes import at module level: :func:`probe_imports`); every probe of every experiment on
that release forks from it. It serves that release only (its own process, never reused for
another) and is killed when the host closes it, or when the fork server goes.

Observations stay those of a fresh interpreter:
- a check forks from it only when its path starts with the release's tree (the same
  directory, so ``sglang.__file__`` is the same string) and nothing else on its path
  provides a module the release process holds; otherwise the check runs fresh, and says why;
- a module that fails to import at this level is taken out again (every module the attempt
  added), so the check imports it itself and fails as a fresh interpreter would;
- only the imports a probe makes before running any code of its own are imported here (its
  module's leading imports, and those of the probe's own helper modules it imports there):
  a lazy import inside a function may follow a patch the probe made, so it stays the probe's.
What it cannot make the same: the release process imported with its own scratch HOME and
cwd (each check then gets its own), as the fork server preloads with its own.
"""

from __future__ import annotations

import ast
import select
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvprobe.checks.forkserver import (
    REPLY_TIMEOUT_S,
    ForkServer,
    Replies,
    top_level_names,
)
from kvprobe.errors import ObserveError


class ReleaseServer(ForkServer):
    """One release's server under ``parent`` (a ready or starting :class:`ForkServer`),
    importing ``modules`` with ``path`` (the release's tree) first on its path and ``env`` as
    its environment; stop it with :meth:`close` (or ``with``).

    Raises ObserveError when the parent cannot start it, or it exits or falls silent before
    answering (its log under ``work`` says why). With ``wait=False`` the constructor only asks
    the parent to start it; :meth:`ready` (and the first check) waits for its imports.
    """

    NAME, STARTING, HELLO = "the release's server", "importing", "release-hello"

    def __init__(
        self,
        parent: ForkServer,
        *,
        path: Sequence[Path],
        modules: Sequence[str],
        env: Mapping[str, str],
        work: Path,
        wait: bool = True,
    ) -> None:
        self.parent = parent
        self.started = time.monotonic()
        self.modules = tuple(modules)
        self.path = [str(Path(p).absolute()) for p in path]
        self.log_dir = work
        self._closed = False
        self._ready = threading.Lock()
        self._hello_reply: dict[str, Any] | None = None
        (work / "home").mkdir(parents=True, exist_ok=True)
        self._socket_dir = Path(tempfile.mkdtemp(prefix="kvprobe-rs-"))
        self.socket_path = self._socket_dir / "release.sock"
        try:
            parent.ready()
            self._link = parent._connect(REPLY_TIMEOUT_S)
        except ObserveError:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            raise
        request = {
            "op": "release",
            "socket": str(self.socket_path),
            "path": self.path,
            "env": dict(env),
            "cwd": str(work / "home"),
            "modules": list(modules),
            "stdout": str(work / "server.stdout"),
            "stderr": str(work / "server.stderr"),
        }
        try:
            replies = Replies(self._link, "the fork server")
            replies.send(request)
            first = replies.read("started")
        except (OSError, ObserveError) as exc:
            self.close()
            raise ObserveError(f"the fork server did not start the release's server: {exc}") from exc
        if first is None:
            self.close()
            raise ObserveError("the fork server did not start the release's server")
        self.pid = int(first["started"])
        self._wait_ready(wait)

    @property
    def preloaded(self) -> dict[str, str | None]:
        """What a check forked from here has imported: the fork server's preload and the
        release's modules (waits for both)."""
        self.ready()
        assert self._hello_reply is not None, "ready() sets it or raises"
        return {**self.parent.preloaded, **self._hello_reply["preloaded"]}

    @property
    def failed(self) -> dict[str, str]:
        """The modules that did not import here, and why (their checks import them)."""
        self.ready()
        assert self._hello_reply is not None, "ready() sets it or raises"
        return dict(self._hello_reply["failed"])

    def shadowed(self, path: Sequence[Path]) -> list[str]:
        """The modules this process holds that a check with ``path`` would not get from the
        same place in a fresh interpreter: all it imported from the release's tree when the
        check's path does not start with that tree, else those another entry provides."""
        self.ready()
        assert self._hello_reply is not None, "ready() sets it or raises"
        loaded = self._hello_reply["loaded"]
        mine = [str(Path(p).absolute()) for p in path]
        if mine[: len(self.path)] != self.path:
            provided = set().union(*(top_level_names(Path(p)) for p in self.path))
            return [name for name in loaded if name in provided] or ["the release's tree"]
        others = set().union(*(top_level_names(Path(p)) for p in mine[len(self.path) :]))
        return [name for name in loaded if name in others]

    def running(self) -> bool:
        """Whether the release's process is there: the fork server closes the link when it ends."""
        if self._closed:
            return False
        try:
            readable, _, _ = select.select([self._link], [], [], 0)
            return not readable or self._link.recv(1, socket.MSG_PEEK) != b""
        except (OSError, ValueError):
            return False

    def _last_error(self) -> str:
        path = self.log_dir / "server.stderr"
        lines = []
        if path.exists():
            lines = [ln for ln in path.read_text(errors="replace").splitlines()[-20:] if ln.strip()]
        state = "running" if self.running() else "exited"
        return f"release server {state}" + (f"; {lines[-1].strip()}" if lines else "")

    def close(self) -> None:
        """Stop the release's process (its fork server kills its group once the link closes)."""
        if self._closed:
            return
        self._closed = True
        link = getattr(self, "_link", None)
        if link is not None:
            link.close()
        shutil.rmtree(self._socket_dir, ignore_errors=True)

    def __enter__(self) -> ReleaseServer:
        return self


def probe_imports(files: Iterable[Path], package: str) -> list[str]:
    """The modules of ``package`` the probe ``files`` import before running code of their own:
    each file's leading module-level imports, in order, following an import of a helper module
    beside the file (``import admission_world``) into that module's own leading imports. The
    union over files, in first-seen order; ``from M import N`` lists M and then M.N (the
    release's server skips M.N when it is not a module).

    Leading: up to the first statement that is not an import, a docstring, a constant
    assignment (a literal) or the probe's declaration (``NAME = kp.Probe(...)``, which
    records and imports nothing).
    """
    found: dict[str, None] = {}
    seen: set[Path] = set()

    def scan(file: Path) -> None:
        if file in seen or not file.is_file():
            return
        seen.add(file)
        try:
            tree = ast.parse(file.read_text(encoding="utf-8"), str(file))
        except (SyntaxError, ValueError, UnicodeDecodeError):
            return
        api = {"kvprobe_probe"}
        for node in tree.body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "kvprobe_probe":
                        api.add(alias.asname or alias.name)
                    take(file, alias.name)
            elif isinstance(node, ast.ImportFrom):
                if node.level or node.module is None:
                    break
                take(file, node.module)
                for alias in node.names:
                    if node.module.split(".")[0] == package and alias.name != "*":
                        found.setdefault(f"{node.module}.{alias.name}")
            elif not _inert(node, api):
                break

    def take(file: Path, module: str) -> None:
        top = module.split(".")[0]
        if top == package:
            found.setdefault(module)
        elif "." not in module:
            scan(file.parent / f"{module}.py")  # the probe's own helper, beside it

    for file in files:
        scan(Path(file))
    return list(found)


def _inert(node: ast.stmt, api: set[str]) -> bool:
    """A module-level statement that changes nothing an import sees."""
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return True
    if isinstance(node, ast.AnnAssign) and node.value is None:
        return True  # ``probe: kp.Probe``: an annotation only
    if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
        value = node.value  # a name bound: nothing else changes (``os.environ[K] = V`` does)
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        value = node.value
    else:
        return False
    if isinstance(value, ast.Call):
        func = value.func
        return (
            isinstance(func, ast.Attribute)
            and func.attr == "Probe"
            and isinstance(func.value, ast.Name)
            and func.value.id in api
        )
    try:
        ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def open_release(
    parent: ForkServer | None, *, path: Sequence[Path], modules: Sequence[str], env: Mapping[str, str], work: Path
) -> tuple[ForkServer | None, str | None]:
    """The release's server under ``parent`` (started, importing in the background), or
    ``parent`` itself and why not (no parent, nothing to import, or it could not start)."""
    if parent is None:
        return None, None
    if not modules:
        return parent, "no module to import for the release"
    try:
        return ReleaseServer(parent, path=path, modules=modules, env=env, work=work, wait=False), None
    except ObserveError as exc:
        return parent, f"the release's server did not start: {exc}"

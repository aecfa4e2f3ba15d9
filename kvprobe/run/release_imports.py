"""A release's tree and imports, shared by every probe a sweep runs on that release.

The wiring of :class:`kvprobe.checks.releaseserver.ReleaseServer` into sweeps: per release,
the wheel's tree placed once at one path and one release server under the sweep's fork
server; every unit of the release (one per experiment) runs its probes from them, and both
go when the release is done. Without a fork server (``--no-preload``, a Ray worker) there is
only the tree, and the probes run fresh as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass
from pathlib import Path

from kvprobe.checks.forkserver import BadReply, ForkServer
from kvprobe.checks.probes import probe_env
from kvprobe.checks.releaseserver import ReleaseServer, open_release, probe_imports
from kvprobe.errors import CheckoutError, DigestMismatch, FetchError, ObserveError
from kvprobe.model.records import Experiment, WheelPin
from kvprobe.progress import Reporter
from kvprobe.run.session import CheckSession
from kvprobe.sources.wheel import WheelSource


@dataclass(frozen=True)
class Release:
    """One release, ready for its units: its tree (or why there is none) and the server its
    probes fork from (the release's own, or the fork server and why not)."""

    version: str
    tree: Path
    identity: dict[str, str] | None  # the wheel's, as WheelSource.materialize returns it
    problem: str | None  # "wheel: ..." when there is no tree
    server: ForkServer | None
    reason: str | None = None


def release_modules(experiments: Sequence[Experiment], package: str) -> list[str]:
    """What a release's server imports: the union of the experiments' probes' leading
    imports of ``package``, in first-seen order."""
    files = [exp.directory / check.path for exp in experiments for check in exp.probes]
    return probe_imports(files, package.lower().replace("-", "_"))


@contextlib.contextmanager
def opened(
    pin: WheelPin,
    *,
    wheels: WheelSource,
    python: str,
    env_vars: dict[str, str],
    server: ForkServer | None,
    modules: Sequence[str],
    work: Path,
) -> Iterator[Release]:
    """The release of ``pin`` under ``work`` (its tree at ``work/tree``, leased from the tree
    cache) and, with a fork ``server``, its release server: both gone when the block ends."""
    with contextlib.ExitStack() as held:
        tree = work / "tree"
        try:
            identity, problem = wheels.materialize(pin, tree, python=python, hold=held), None
        except (FetchError, DigestMismatch, CheckoutError) as exc:
            identity, problem = None, f"wheel: {exc}"
        reason = None
        if problem is None and server is not None:
            config = {"side": "release", "release": pin.version}
            env = probe_env([str(tree)], config, env_vars, work / "server" / "home")
            server, reason = open_release(server, path=[tree], modules=modules, env=env, work=work / "server")
            if isinstance(server, ReleaseServer):
                held.callback(server.close)  # before the tree's lease goes (last in, first out)
        yield Release(pin.version, tree, identity, problem, server, reason)


def opened_for(session: CheckSession, pin: WheelPin, modules: Sequence[str], work: Path) -> ContextManager[Release]:
    """:func:`opened` with the env, variables and fork server of ``session``'s checks."""
    return opened(
        pin,
        wheels=WheelSource(session.settings.cache_root, reporter=session.reporter),
        python=session.python,
        env_vars=session.variables,
        server=session.server,
        modules=modules,
        work=work,
    )


def ready(release: Release, reporter: Reporter) -> tuple[ForkServer | None, str | None]:
    """The release's server once it has imported, or the fork server under it (and why) when
    it could not: its probes then fork from the fork server, as before."""
    server = release.server
    if not isinstance(server, ReleaseServer):
        return server, release.reason
    try:
        server.ready()
    except (ObserveError, BadReply) as exc:
        server.close()
        reporter.note(f"{release.version}: the release's server did not start ({exc}); probes import it themselves")
        return server.parent, f"the release's server did not start: {exc}"
    return server, None

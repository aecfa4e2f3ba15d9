"""The check session: the env a pipeline's checks run in and the fork server they fork from.

`kvprobe run`, a sweep (and its local units) and `kvprobe gates` each open one
:class:`CheckSession` for an experiment's pin set: it refuses a bad preload list at once,
finds the env in the cache early (:meth:`CheckSession.cached`, so the fork server can preload
while trees are materialized) or builds it (:meth:`CheckSession.environment`), starts the
fork server (:meth:`CheckSession.start`, or takes the invocation's shared one), waits for it
(:meth:`CheckSession.ready`) and writes the receipt's ``execution``
(:meth:`CheckSession.execution`). Closing it stops the server and releases the env's lease.
"""

from __future__ import annotations

import contextlib
import platform
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kvprobe import __version__
from kvprobe.checks.forkserver import FRESH, PRELOAD, BadReply, ForkServer
from kvprobe.checks.keptserver import KeptServer
from kvprobe.errors import ExperimentError, ObserveError
from kvprobe.model.receipt import CheckExecution, EnvRecord, ExecutionRecord, InstallerRecord, KeptServerRecord
from kvprobe.model.records import EnvInfo, Experiment, PinSet, Side, SourceKind, WheelPin
from kvprobe.progress import Reporter


@dataclass(frozen=True)
class SessionSettings:
    """What a session is opened with: the cache its env comes from, the torch index, and
    whether (and how long, kept between runs) its checks fork from a preloaded interpreter."""

    cache_root: Path
    torch_index: str | None = None
    preload: bool = True  # False (--no-preload): every check in a fresh interpreter
    keep_server_s: float | None = None  # the server kept between runs, exiting after this long unused


@dataclass(frozen=True)
class SessionEnv:
    """The env the checks run in: its receipt record, python, the pinned variables, and its
    directory in the cache (None: an interpreter outside it, kvprobe's own)."""

    record: EnvRecord
    python: str
    variables: dict[str, str]
    directory: Path | None


class ServerShare(Protocol):
    """The fork servers of one invocation, shared by its sessions (run.runner.ServerPool)."""

    leases: contextlib.ExitStack  # the envs' leases, held while the invocation's servers may fork from them

    def get(
        self, env: SessionEnv, settings: SessionSettings, modules: tuple[str, ...]
    ) -> tuple[ForkServer | None, str | None]: ...


class CheckSession:
    """One pipeline's env and fork server; a context manager (closing stops the server and
    releases the env's lease).

    ``share``: the invocation's servers (the session takes its server from them, and leaves
    the env's lease with them: they outlive it). ``env``: an env given as is (a test's
    stand-in), nothing looked up."""

    def __init__(
        self,
        exp: Experiment,
        pin_set: PinSet,
        settings: SessionSettings,
        reporter: Reporter | None = None,
        share: ServerShare | None = None,
        env: SessionEnv | None = None,
    ) -> None:
        self.exp, self.pin_set, self.settings = exp, pin_set, settings
        self.reporter = reporter or Reporter()
        self.modules = preload_modules(exp, pin_set)  # a bad profile is refused before anything is built
        self.env = env
        self.server: ForkServer | None = None
        self.fresh_reason: str | None = None  # why checks run fresh when there is no server
        self._share = share
        self._held = contextlib.ExitStack()  # the server (not a shared one) and the env's lease
        self._leases = share.leases if share is not None else self._held
        self._started = False
        self._pending: tuple[Path, float] | None = None  # start(when_needed=True)'s, until launch()
        self._early = False  # the env was found by cached()
        self._lock = threading.Lock()  # units in threads wait on one server

    def __enter__(self) -> CheckSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._held.close()

    # --- the env ---------------------------------------------------------------------------

    def cached(self) -> SessionEnv | None:
        """The env when it is already there (nothing to build), else None: its python is then
        known early enough to start the fork server before the trees are materialized."""
        if self.env is None:
            self.env = self._look_up(build=False)
            self._early = self.env is not None
        return self.env

    def environment(self) -> SessionEnv:
        """The env, built if it is not in the cache (one lock; leased while the session lasts)."""
        if self.env is None:
            self.env = self._look_up(build=True)
        elif self._early and self.env.record.lock_name is not None:
            self.reporter.note(f"env {self.env.record.key}: cached")  # where a build would say it
            self._early = False
        assert self.env is not None, "a built env"
        return self.env

    @property
    def record(self) -> EnvRecord:
        return self._known().record

    @property
    def python(self) -> str:
        return self._known().python

    @property
    def variables(self) -> dict[str, str]:
        return self._known().variables

    @property
    def directory(self) -> Path | None:
        return self._known().directory

    def _known(self) -> SessionEnv:
        assert self.env is not None, "the session's env is known: cached() or environment() first"
        return self.env

    def _look_up(self, build: bool) -> SessionEnv | None:
        exp, opts = self.exp, self.settings
        if self.pin_set.kind is SourceKind.SYNTHETIC:
            from importlib.metadata import version  # not `import hypothesis`: 0.8 s to read one string

            packages = {"hypothesis": version("hypothesis"), "kvprobe": __version__}
            record = EnvRecord(
                "kvprobe-interpreter", platform.python_version(), exp.profile, None, None, packages, None, None
            )
            return SessionEnv(record, sys.executable, {}, None)
        from kvprobe.env.venv import EnvManager, load_profile

        profile = load_profile(exp.profile)
        manager = EnvManager(opts.cache_root, reporter=self.reporter)
        if build:
            info: EnvInfo | None = manager.ensure(profile, torch_index=opts.torch_index, hold=self._leases)
        else:
            info = manager.cached(profile, torch_index=opts.torch_index, hold=self._leases)
        return None if info is None else _described(info, profile.name, dict(profile.env))

    # --- the fork server -------------------------------------------------------------------

    def start(self, work: Path, lifetime_s: float, *, when_needed: bool = False) -> None:
        """Start the fork server in the env's python (its preload runs while the caller goes
        on), once: nothing when the env is not known yet or the server was asked for already.
        Its ``lifetime_s`` covers every check it serves; it works under ``work``.

        ``when_needed``: only note what to start; :meth:`launch` starts it when a check is
        about to run (a sweep whose every unit is reused from the cache starts none)."""
        if self.env is None or self._started:
            return
        self._started = True
        if when_needed and self._share is None and self.settings.preload:
            self._pending = (work, lifetime_s)
            return
        self._start(work, lifetime_s)

    def launch(self) -> None:
        """Start the server :meth:`start` was asked for with ``when_needed`` (once; nothing
        when none is pending): a check is about to run."""
        with self._lock:
            pending, self._pending = self._pending, None
            if pending is not None:
                self._start(*pending)

    @property
    def forks(self) -> bool:
        """Whether its checks are to fork from a server: one started, or one :meth:`launch` starts."""
        return self.server is not None or self._pending is not None

    def _start(self, work: Path, lifetime_s: float) -> None:
        assert self.env is not None, "start() checked the env is known"
        if self._share is not None:
            self.server, self.fresh_reason = self._share.get(self.env, self.settings, self.modules)
            return
        s = self.settings
        lease = env_lease(self.env.directory) if s.keep_server_s is not None else None
        self.server, self.fresh_reason = fork_server(
            self.env.python,
            self.env.variables,
            work,
            lifetime_s,
            s.preload,
            self.modules,
            s.keep_server_s,
            self.reporter,
            lease,
        )
        if self.server is not None:
            self._held.enter_context(self.server)

    def ready(self) -> ForkServer | None:
        """The server once it has preloaded (started first if it was pending), or None
        (``fresh_reason`` says why)."""
        self.launch()
        with self._lock:
            self.server, self.fresh_reason = server_ready(self.server, self.fresh_reason, self.reporter)
            return self.server

    def execution(self, checks: dict[Side, dict[str, Any]]) -> ExecutionRecord:
        """The receipt's ``execution`` for ``checks`` (run.side.run_side's, per side)."""
        return execution_record(self.server, self.fresh_reason, checks)


def _described(info: EnvInfo, profile: str, env_vars: dict[str, str]) -> SessionEnv:
    env = EnvRecord(
        key=info.key,
        python=info.python,
        profile=profile,
        lock_name=info.lock_name,
        lock_sha256=info.lock_sha256,
        packages=dict(sorted(info.packages.items())),
        torch=info.build.get("torch"),
        torch_index=info.build.get("torch_index"),
        installer=installer_record(info),
    )
    return SessionEnv(env, str(info.path / "bin" / "python"), env_vars, info.path)


def installer_record(info: EnvInfo) -> InstallerRecord | None:
    """The installer the env's build recorded (``kvprobe-env.json``), with its version: uv's
    as it reported it, pip's the one in the env. None when the build recorded none."""
    how = info.build.get("installer")
    if not isinstance(how, dict) or how.get("tool") not in ("uv", "pip"):
        return None
    if how["tool"] == "uv":
        words = str(how.get("version", "")).split()  # "uv 0.13.9 (x86_64-unknown-linux-gnu)"
        version = words[1] if len(words) > 1 and words[0] == "uv" and words[1][:1].isdigit() else None
        return InstallerRecord("uv", version)
    return InstallerRecord("pip", info.packages.get("pip"))


def preload_modules(exp: Experiment, pin_set: PinSet) -> tuple[str, ...]:
    """What the checks' fork server imports: the profile's ``preload`` (PRELOAD where it names
    none). Never the package under test (ExperimentError): its code comes from each side's tree."""
    if pin_set.kind is SourceKind.SYNTHETIC:
        return PRELOAD
    from kvprobe.env.venv import load_profile

    modules = load_profile(exp.profile).preload
    modules = PRELOAD if modules is None else modules
    wheels = [pin for pin in (pin_set.base, pin_set.head) if isinstance(pin, WheelPin)]
    tested = {pin.package.lower().replace("-", "_") for pin in wheels}
    for name in modules:
        if name.split(".")[0].lower() in tested:
            raise ExperimentError(
                f"profile {exp.profile}: preload names {name!r}, part of the package under test "
                "(its code must come from each side's tree)"
            )
    return modules


def fork_server(
    python: str,
    env_vars: dict[str, str],
    work: Path,
    lifetime_s: float,
    preload: bool,
    modules: Sequence[str],
    keep_s: float | None = None,
    reporter: Reporter | None = None,
    lease: Path | None = None,
) -> tuple[ForkServer | None, str | None]:
    """The run's fork server importing ``modules``, started (its preload runs while the caller
    goes on), or None and why its checks run in fresh interpreters. :func:`server_ready` waits.
    With ``keep_s``, the server kept between runs (found running, or started to stay up
    ``keep_s`` seconds unused), holding ``lease`` on its env when the env is a cache entry.
    """
    if not preload:
        return None, "--no-preload"
    reporter = reporter or Reporter()
    server: ForkServer
    try:
        if keep_s is not None:
            server = KeptServer(python, preload=modules, env=env_vars, idle_s=keep_s, lease=lease, wait=False)
        else:
            server = ForkServer(
                python, preload=modules, env=env_vars, work=work / "forkserver", lifetime_s=lifetime_s, wait=False
            )
    except ObserveError as exc:
        reporter.note(f"preload: the fork server did not start ({exc}); checks run in fresh interpreters")
        return None, f"the fork server did not start: {exc}"
    if isinstance(server, KeptServer) and server.reused:
        reporter.note(f"preload: the kept fork server is running ({_listed(modules)})")
    else:
        reporter.note(f"preload: fork server started, importing {_listed(modules)} in the background")
    return server, None


def _listed(modules: Sequence[str]) -> str:
    return ", ".join(modules) if modules else "nothing"


def env_lease(directory: Path | None) -> Path | None:
    """A lease file on the cache env at ``directory`` (its runs hold leases beside it); None
    for an interpreter outside the cache (a synthetic experiment's, kvprobe's own)."""
    from kvprobe.env.cache import lease_file

    if directory is None or not (directory.parent / f"{directory.name}.users").is_dir():
        return None
    return lease_file(directory)


def server_ready(
    server: ForkServer | None, reason: str | None, reporter: Reporter | None = None
) -> tuple[ForkServer | None, str | None]:
    """The server once it has preloaded, or None and why: a server that cannot start is not a
    failed run, its checks run fresh and the receipt says why (it is closed here). The first
    wait is a reporter step (a heartbeat while torch and the rest import, then its time)."""
    if server is None:
        return None, reason
    reporter = reporter or Reporter()
    waited = not server.is_ready
    try:
        if waited:
            with reporter.step(f"preload: fork server importing {_listed(server.modules)}"):
                server.ready()
        else:
            server.ready()
    except BadReply as exc:  # a kept server found on the run's key is any process of this user
        server.close()
        return None, f"ignored a fork server whose reply is not one: {exc}"
    except ObserveError as exc:
        server.close()
        reporter.note(f"preload: the fork server did not start ({exc}); checks run in fresh interpreters")
        return None, f"the fork server did not start: {exc}"
    if waited:
        reporter.note(f"preload: fork server ready, {time.monotonic() - server.started:.1f}s after it started")
    return server, None


def execution_record(
    server: ForkServer | None, fresh_reason: str | None, checks: dict[Side, dict[str, Any]]
) -> ExecutionRecord:
    """The receipt's ``execution``: how each check ran, and what its interpreter had preloaded."""
    rows = []
    for side, ran in checks.items():
        named = [("test", t["path"], t["execution"]) for t in ran["tests"]]
        named += [("probe", p["name"], p["run"].execution) for p in ran["probes"]]
        for kind, name, how in named:
            reason = how.reason or (fresh_reason if how.mode == FRESH else None)
            rows.append(CheckExecution(name=name, mode=how.mode, reason=reason, side=side.value, check=kind))
    kept = None
    if isinstance(server, KeptServer):
        kept = KeptServerRecord(server.kept.started_utc, server.reused, server.kept.idle_s)
    return ExecutionRecord(dict(sorted(server.preloaded.items())) if server else {}, tuple(rows), kept)

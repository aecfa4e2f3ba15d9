"""Virtualenvs per (python, dependency lock, torch index), built once, cached and reused.

A profile is ``probes/profiles/<name>.toml`` naming a hash-pinned lock file. An env is
built in a temp dir beside its final place with ``virtualenv`` and ``uv pip install`` (or
``pip install`` without uv; see kvprobe.env.installer) ``--require-hashes --no-deps``,
described in a marker file, and renamed into place only when complete; a file lock keeps
concurrent builders from doing the work twice.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath
from urllib.parse import urlsplit

from filelock import FileLock, Timeout

from kvprobe import proc
from kvprobe.env import installer
from kvprobe.env.cache import UV_DIR, lease
from kvprobe.errors import EnvBuildError, ExperimentError, UsageError
from kvprobe.model.records import EnvInfo
from kvprobe.progress import Reporter
from kvprobe.resources import experiment_dirs

MARKER = "kvprobe-env.json"
_DESCRIBE = r"""
import importlib.metadata as md, json, platform, sys
info = {"python": platform.python_version(),
        "packages": {d.metadata["Name"]: d.version for d in md.distributions()}}
try:
    import torch
    info["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda,
                     "cuda_available": bool(torch.cuda.is_available())}
except Exception as exc:
    info["torch"] = None if isinstance(exc, ImportError) else {"error": repr(exc)}
print(json.dumps(info, sort_keys=True))
"""


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    python: str
    lock_name: str
    lock_bytes: bytes
    torch_replaces: tuple[str, ...] = ()
    torch_requirements: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    serves: str | None = None  # the releases whose code this env imports (a PEP 440 specifier set)
    serves_why: str | None = None  # why it imports no other release: every not-run reason says it
    preload: tuple[str, ...] | None = None  # what the checks' fork server imports; None: its default

    @property
    def lock_sha256(self) -> str:
        return hashlib.sha256(self.lock_bytes).hexdigest()


_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")


def load_profile(name: str) -> Profile:
    """Find ``profiles/<name>.toml`` on the experiment search path and check it whole.

    ExperimentError (exit 2) for a profile that is not TOML, names no lock, names a lock
    outside its folder, or whose lock has a line that is not hash-pinned: all before any
    fetch or env build, and the lock is never read from outside the profile folder.
    """
    if not isinstance(name, str) or not _PROFILE_NAME.match(name):
        # a name from an experiment file or a bundle's receipt: never a path, never unbounded
        shown = str(name)[:80]
        raise ExperimentError(f"bad dependency profile name {shown!r}: letters, digits, '.', '_' and '-' only")
    for directory in experiment_dirs():
        path = directory / "profiles" / f"{name}.toml"
        if path.is_file():
            return _read_profile(path)
    raise ExperimentError(f"unknown dependency profile {name!r} (no profiles/{name}.toml)")


def _read_profile(path: Path) -> Profile:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ExperimentError(f"profile {path}: not valid TOML: {str(exc).splitlines()[0]}") from None
    lock = _lock_path(path, data.get("lock"))
    lock_bytes = lock.read_bytes()
    check_lock(lock_bytes, lock)
    torch_index = data.get("torch_index", {})
    return Profile(
        name=str(data.get("name", path.stem)),
        description=str(data.get("description", "")),
        python=str(data.get("python", "3")),
        lock_name=lock.name,
        lock_bytes=lock_bytes,
        torch_replaces=tuple(torch_index.get("replaces", ())),
        torch_requirements=tuple(torch_index.get("requirements", ())),
        env=tuple(sorted((k, str(v)) for k, v in data.get("env", {}).items())),
        serves=data.get("serves"),
        serves_why=None if data.get("serves_why") is None else str(data.get("serves_why")),
        preload=_preload(path, data.get("preload")),
    )


_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _preload(profile: Path, names: object) -> tuple[str, ...] | None:
    """The profile's ``preload``: dotted module names, checked before anything runs."""
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) and _MODULE.fullmatch(n) for n in names):
        raise ExperimentError(f'profile {profile}: `preload` must be a list of module names (e.g. "torch")')
    return tuple(names)


def _lock_path(profile: Path, name: object) -> Path:
    """The lock a profile names: a file in the profile's own folder, symlinks resolved."""
    if not isinstance(name, str) or not name:
        raise ExperimentError(f"profile {profile}: no `lock` key naming its hash-pinned lock file")
    folder = profile.parent.resolve()
    lock = (folder / name).resolve()
    if PurePath(name).is_absolute() or lock.parent != folder:
        raise ExperimentError(f"profile {profile}: lock {name!r} is outside the profile folder {folder}")
    if not lock.is_file():
        raise ExperimentError(f"profile {profile}: lock {name!r}: no such file in {folder}")
    return lock


_REQUIREMENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(?:\[[\w,.\s-]*\])?==\S+")
_HASH_RE = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def check_lock(data: bytes, lock: Path) -> None:
    """Every requirement in the lock is ``name==version`` with a sha256 ``--hash``; no options
    (``-r``, ``--index-url``...), which could pull files or indexes from elsewhere."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ExperimentError(f"lock {lock}: not UTF-8 text") from None
    for number, line in _logical_lines(text):
        words = line.split()
        if not _REQUIREMENT_RE.fullmatch(words[0]):
            raise ExperimentError(f"lock {lock}:{number}: {words[0]!r} is not a name==version requirement")
        rest = [w for w in words[1:] if not _HASH_RE.fullmatch(w)]
        if len(rest) == len(words) - 1:
            raise ExperimentError(f"lock {lock}:{number}: {words[0]} has no --hash=sha256: (every line is hash-pinned)")
        if rest and not rest[0].startswith(";"):
            raise ExperimentError(f"lock {lock}:{number}: {words[0]}: unexpected {rest[0]!r}")


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, requirement text) with comments dropped and ``\\`` continuations joined."""
    found: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = re.sub(r"(^|\s)#.*", "", raw).rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pending += line
        if pending.strip():
            found.append((start, pending.strip()))
        pending = ""
    if pending.strip():
        found.append((start, pending.strip()))
    return found


def check_index_url(url: str | None) -> str | None:
    """``--torch-index``: https, or file:// for a local mirror. Plain http lets anyone on the path
    choose the torch that runs (those lines are not hash-pinned), and credentials in the URL
    would be recorded in the receipt."""
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.scheme == "file" or (parts.scheme == "https" and parts.hostname):
        if parts.username or parts.password:
            raise UsageError(
                "--torch-index: credentials in the URL would be recorded in the receipt; use ~/.netrc or pip's keyring"
            )
        return url
    raise UsageError(
        f"--torch-index {url!r}: only https:// (or file:// for a local index) is accepted, "
        f"not {parts.scheme or 'a bare path'}"
    )


def find_python(version: str) -> str:
    """An interpreter for ``version`` ("3.11"): this one if it matches, else pythonX.Y on PATH."""
    if platform.python_version().startswith(version.rstrip(".") + ".") or version == "3":
        return sys.executable
    found = shutil.which(f"python{version}")
    if not found:
        raise EnvBuildError(f"profile needs Python {version}, and python{version} is not on PATH")
    return found


def split_lock(profile: Profile, torch_index: str | None) -> tuple[str, list[str]]:
    """(hash-pinned lock text, index requirements): with an index, torch lines move out."""
    check_index_url(torch_index)
    if not torch_index:
        return profile.lock_bytes.decode("utf-8"), []
    if not profile.torch_requirements:
        raise EnvBuildError(f"profile {profile.name} has no torch_index section; --torch-index does not apply")
    kept, skip = [], False
    for line in profile.lock_bytes.decode("utf-8").splitlines():
        if line.startswith((" ", "\t")):
            if not skip:
                kept.append(line)
            continue
        name = line.split("==", 1)[0].strip().lower()
        skip = (
            bool(name)
            and not line.startswith("#")
            and any(fnmatch.fnmatch(name, pattern) for pattern in profile.torch_replaces)
        )
        if not skip:
            kept.append(line)
    return "\n".join(kept) + "\n", list(profile.torch_requirements)


class EnvManager:
    """Builds and caches envs under ``cache_root/envs``."""

    def __init__(self, cache_root: Path, *, reporter: Reporter | None = None, timeout_s: float = 3600.0) -> None:
        self.root = cache_root / "envs"
        self.uv_cache = cache_root / UV_DIR  # shared by every profile's lock
        self.reporter = reporter or Reporter()
        self.timeout_s = timeout_s

    def key(self, profile: Profile, python: str, torch_index: str | None) -> str:
        ident = {
            "python": _python_identity(python),
            "lock": profile.lock_sha256,
            "torch_index": torch_index or "",
            "format": 1,
        }
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:20]

    def ensure(
        self, profile: Profile, *, torch_index: str | None = None, hold: contextlib.ExitStack | None = None
    ) -> EnvInfo:
        """The env for ``profile``: reused if complete, else built (under a lock).

        With ``hold``, a lease on the env is taken before the lock is released and kept
        until ``hold`` closes: `kvprobe cache prune` never deletes an env a run is using.
        """
        python = find_python(profile.python)
        key = self.key(profile, python, torch_index)
        final = self.root / f"{profile.name}-{key}"
        self.root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.root / f"{profile.name}-{key}.lock")):
            if not (final / MARKER).is_file():
                self._build(profile, python, torch_index, final)
            else:
                self.reporter.note(f"env {final.name}: cached")
            return _use(final, hold)

    def cached(
        self, profile: Profile, *, torch_index: str | None = None, hold: contextlib.ExitStack | None = None
    ) -> EnvInfo | None:
        """The env for ``profile`` if it is already complete (leased like :meth:`ensure`), else None.

        Says nothing (the caller notes the cached env where :meth:`ensure` would have), never
        builds and never raises for the env: a missing interpreter, an env being built
        by someone else or one not built yet is left to :meth:`ensure`, at its usual place."""
        try:
            python = find_python(profile.python)
            key = self.key(profile, python, torch_index)
        except EnvBuildError:
            return None
        final = self.root / f"{profile.name}-{key}"
        try:
            with FileLock(str(self.root / f"{profile.name}-{key}.lock"), timeout=0):
                return _use(final, hold) if (final / MARKER).is_file() else None
        except (Timeout, FileNotFoundError):  # being built now, or no envs directory yet
            return None

    def _build(self, profile: Profile, python: str, torch_index: str | None, final: Path) -> None:
        if final.exists():  # an incomplete leftover without marker: not ours to trust
            shutil.rmtree(final)
        tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=f".build-{final.name}-"))
        try:
            with self.reporter.step(f"building env {profile.name} (first time: may take minutes)"):
                started = time.monotonic()
                env_dir = tmp / "env"
                self._create(python, env_dir, tmp)
                how = self._fill(profile, python, env_dir, tmp, torch_index)
                info = self._describe(env_dir / "bin" / "python", tmp)
                info.update(
                    {
                        "installer": how,
                        "profile": profile.name,
                        "lock_name": profile.lock_name,
                        "lock_sha256": profile.lock_sha256,
                        "torch_index": torch_index or "pypi",
                        "build_seconds": round(time.monotonic() - started, 1),
                    }
                )
                (env_dir / MARKER).write_text(json.dumps(info, indent=2, sort_keys=True))
                os.replace(env_dir, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _create(self, python: str, env_dir: Path, tmp: Path) -> None:
        result = proc.run(
            [
                sys.executable,
                "-m",
                "virtualenv",
                "--no-download",
                "--no-periodic-update",
                "--quiet",
                "-p",
                python,
                str(env_dir),
            ],
            timeout_s=300,
            env=proc.clean_env(),
            stdout_path=tmp / "venv.out",
            stderr_path=tmp / "venv.err",
        )
        if not result.ok:
            raise EnvBuildError(f"virtualenv failed: {result.summary()}")

    def _fill(self, profile: Profile, python: str, env_dir: Path, tmp: Path, torch_index: str | None) -> dict:
        """Install the lock with uv if present, else (or if uv fails) pip; says which ran."""
        uv = installer.find_uv()
        if uv is None:
            self._install(profile, env_dir, tmp, torch_index)
            return {"tool": "pip"}
        try:
            with uv_cache_lease(self.uv_cache):
                self._install_uv(uv, profile, env_dir, tmp, torch_index)
            return {"tool": "uv", "version": installer.uv_version(uv)}
        except EnvBuildError as exc:
            self.reporter.note(f"uv could not build env {profile.name} ({exc}); building it with pip")
            shutil.rmtree(env_dir)
            self._create(python, env_dir, tmp)
            self._install(profile, env_dir, tmp, torch_index)
            return {"tool": "pip", "fallback_from_uv": str(exc)[:400]}

    def _install_uv(self, uv: str, profile: Profile, env_dir: Path, tmp: Path, torch_index: str | None) -> None:
        lock_text, index_reqs = split_lock(profile, torch_index)
        config = installer.pip_config(env_dir)
        reqs = installer.parse_lock(lock_text)
        lock_file = tmp / "uv-lock.txt"
        lock_file.write_text(installer.uv_requirements(reqs, installer.local_files(reqs, config)))
        base = [
            uv,
            "pip",
            "install",
            "--python",
            str(env_dir / "bin" / "python"),
            "--no-deps",
            "--compile-bytecode",  # as pip does: the env's own imports start from bytecode
            "--cache-dir",
            str(self.uv_cache),
        ]
        index = installer.uv_index_args(config)
        env = installer.uv_env(config)
        self._tool(
            [*base, *index, "--require-hashes", "--only-binary", ":all:", "-r", str(lock_file)],
            tmp,
            "uv-lock",
            env,
            what="uv pip install (lock)",
        )
        self.reporter.note(f"env {profile.name}: {uv_summary(tmp / 'uv-lock.err')}")
        if index_reqs and torch_index:  # split_lock moves lines out only for an index
            self._tool(
                [*base, "--index-url", torch_index, *index_reqs],
                tmp,
                "uv-torch",
                env,
                what="uv pip install (torch-index)",
            )

    def _install(self, profile: Profile, env_dir: Path, tmp: Path, torch_index: str | None) -> None:
        lock_text, index_reqs = split_lock(profile, torch_index)
        lock_file = tmp / "lock.txt"
        lock_file.write_text(lock_text)
        python = str(env_dir / "bin" / "python")
        base = [
            python,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--disable-pip-version-check",
            "--no-input",
            "--progress-bar",
            "off",
        ]
        self._pip([*base, "--require-hashes", "--only-binary=:all:", "-r", str(lock_file)], tmp, "lock")
        if torch_index and index_reqs:  # split_lock: index requirements only with an index
            self._pip([*base, "--index-url", torch_index, *index_reqs], tmp, "torch-index")

    def _pip(self, argv: list[str], tmp: Path, label: str) -> None:
        env = proc.clean_env(network=True, passthrough_prefixes=("PIP_",))
        self._tool(argv, tmp, f"pip-{label}", env, what=f"pip install ({label})")

    def _tool(self, argv: list[str], tmp: Path, label: str, env: dict[str, str], *, what: str) -> None:
        out = tmp / f"{label}.out"

        def poll() -> None:
            self.reporter.update(_last_action(out, what))

        result = proc.run(
            argv, timeout_s=self.timeout_s, stdout_path=out, stderr_path=tmp / f"{label}.err", env=env, poll=poll
        )
        if not result.ok:
            raise EnvBuildError(f"{what} failed: {result.summary()}")

    def _describe(self, python: Path, tmp: Path) -> dict:
        result = proc.run(
            [str(python), "-c", _DESCRIBE],
            timeout_s=300,
            env=proc.clean_env(home=tmp),
            stdout_path=tmp / "describe.out",
            stderr_path=tmp / "describe.err",
        )
        if not result.ok:
            raise EnvBuildError(f"the new env's python does not run: {result.summary()}")
        return json.loads(result.stdout())


@contextlib.contextmanager
def uv_cache_lease(uv_cache: Path) -> Iterator[None]:
    """A lease on uv's cache while uv reads and fills it, taken under ``uv.lock``: the lock
    `kvprobe cache prune` holds while it checks for leases and removes the cache."""
    uv_cache.parent.mkdir(parents=True, exist_ok=True)
    held = contextlib.ExitStack()
    with FileLock(str(uv_cache.parent / f"{UV_DIR}.lock")):
        held.enter_context(lease(uv_cache))
    with held:
        yield
    with contextlib.suppress(OSError):
        os.utime(uv_cache)  # last used, for `cache ls` / `prune --older-than`


_UV_PHASE = re.compile(r"(Resolved|Prepared|Installed|Bytecode compiled) \d+ \w+ in [\w. ]+")


def uv_summary(err: Path) -> str:
    """uv's own timing of a finished install, its phases on one line ("Prepared 119 packages
    in 41.2s; Installed 119 packages in 1.3s; ..."): where a first run's minutes went."""
    try:
        lines = proc.read_tail(err, 8192).splitlines()
    except OSError:
        return "uv said nothing of its phases"
    found = [ln.strip() for ln in lines if _UV_PHASE.fullmatch(ln.strip())]
    return "; ".join(found) or "uv said nothing of its phases"


def _python_identity(python: str) -> str:
    """The interpreter part of an env's key; kvprobe's own is known without starting it again."""
    if python == sys.executable:
        return f"{sys.version} {platform.machine()}".strip()
    result = proc.capture(
        [python, "-c", "import sys,platform;print(sys.version, platform.machine())"], timeout_s=60, env=proc.clean_env()
    )
    if not result.ok:
        raise EnvBuildError(f"cannot run {python}: {result.summary()}")
    return result.stdout.strip()


def _last_action(path: Path, what: str) -> str:
    """The installer's last line of output, or that ``what`` (uv's or pip's step) is starting."""
    try:
        lines = [ln for ln in proc.read_tail(path, 4096).splitlines() if ln.strip()]
    except OSError:
        return f"starting {what}"
    return lines[-1][:100] if lines else f"starting {what}"


def _use(final: Path, hold: contextlib.ExitStack | None) -> EnvInfo:
    """A complete env, marked as used now (for `cache ls` / `cache prune`) and leased in ``hold``."""
    os.utime(final / MARKER)
    if hold is not None:
        hold.enter_context(lease(final))
    return _read_marker(final)


def _read_marker(env_dir: Path) -> EnvInfo:
    data = json.loads((env_dir / MARKER).read_text())
    return EnvInfo(
        key=env_dir.name,
        path=env_dir,
        python=data["python"],
        lock_name=data["lock_name"],
        lock_sha256=data["lock_sha256"],
        packages=data["packages"],
        build={
            "torch": data.get("torch"),
            "torch_index": data.get("torch_index"),
            "build_seconds": data.get("build_seconds"),
            "installer": data.get("installer"),  # absent: a build that did not record it
        },
    )

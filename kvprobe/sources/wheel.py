"""WheelSource: a release wheel pinned by file name and sha256, checked before unpacking."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from filelock import FileLock
from installer.exceptions import InstallerError
from installer.records import parse_record_file
from installer.sources import WheelFile
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from kvprobe import proc
from kvprobe.errors import CheckoutError, DigestMismatch, FetchError, UsageError
from kvprobe.files import sha256_file
from kvprobe.model.records import WheelPin
from kvprobe.progress import Reporter
from kvprobe.sources.treecache import TreeCache, cache_tag, place_copy, place_shared


def run_pip(args: list[str], scratch: Path, *, timeout_s: float, failure: str) -> proc.CommandResult:
    """``python -m pip ARGS`` with pip's logs in ``scratch``, on the network with PIP_* kept;
    FetchError starting with ``failure`` when pip fails."""
    scratch.mkdir(parents=True, exist_ok=True)
    result = proc.run(
        [proc.python_executable(), "-m", "pip", *args, "--disable-pip-version-check"],
        timeout_s=timeout_s,
        stdout_path=scratch / "pip.out",
        stderr_path=scratch / "pip.err",
        env=proc.clean_env(network=True, passthrough_prefixes=("PIP_",)),
    )
    if not result.ok:
        raise FetchError(f"{failure}: {result.summary()}")
    return result


def pip_download(requirement: str, scratch: Path, flags: list[str], *, timeout_s: float, failure: str) -> list[Path]:
    """``pip download --no-deps`` of one requirement into ``scratch/out`` (pip's logs beside it);
    returns the files pip wrote. FetchError starting with ``failure`` when pip fails."""
    out = scratch / "out"
    args = ["download", "--no-deps", "--no-cache-dir", "--progress-bar", "off", *flags, "--dest", str(out), requirement]
    run_pip(args, scratch, timeout_s=timeout_s, failure=failure)
    return sorted(out.iterdir()) if out.is_dir() else []


def platform_args(filename: str) -> list[str]:
    """pip download flags that select exactly the wheel a pin names, on any host."""
    try:
        tags = parse_wheel_filename(filename)[3]
    except InvalidWheelFilename:
        return []
    args = ["--only-binary=:all:"]
    for platform in sorted({t.platform for t in tags} - {"any"}):
        args += ["--platform", platform]
    interpreters, abis = {t.interpreter for t in tags}, {t.abi for t in tags}
    if len(interpreters) == 1 and len(abis) == 1:
        (python,), (abi,) = interpreters, abis
        if python.startswith("cp") and python[2:].isdigit():
            args += ["--python-version", python[2:], "--implementation", "cp", "--abi", abi]
    return args


def names_release(filename: str, package: str, version: str) -> bool:
    """``filename`` is a wheel of ``package`` at ``version`` (names as PEP 503, versions as
    PEP 440): a recorded wheel that names another package or release is not that release's."""
    try:
        name, parsed, _, _ = parse_wheel_filename(filename)
        return name == canonicalize_name(package) and parsed == Version(version)
    except (InvalidWheelFilename, InvalidVersion):
        return False


def pin_for_file(path: Path) -> WheelPin:
    """The pin of a local wheel file: name and version from its file name, its sha256.
    UsageError when the name is not a wheel file name."""
    try:
        name, version, _, _ = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise UsageError(f"{path.name}: not a wheel file name: {exc}") from exc
    return WheelPin(name, str(version), path.name, sha256_file(path))


class WheelSource:
    """Downloads a pinned wheel once per digest into the cache and unpacks it per side."""

    def __init__(
        self,
        cache_root: Path,
        *,
        pip_args: list[str] | None = None,
        timeout_s: float = 900.0,
        reporter: Reporter | None = None,
    ) -> None:
        self.store = cache_root / "wheels"
        self.pip_args = list(pip_args or [])
        self.timeout_s = timeout_s
        self.reporter = reporter or Reporter()

    def cached_path(self, pin: WheelPin) -> Path:
        return self.store / pin.sha256 / pin.filename

    def fetch(self, pin: WheelPin) -> tuple[Path, str]:
        """The verified wheel file and how it was obtained ("cache" or "download")."""
        cached = self.cached_path(pin)
        if cached.is_file():
            if sha256_file(cached) == pin.sha256:
                os.utime(cached)  # last used, for `kvprobe cache ls` / `prune`
                return cached, "cache"
            # a damaged entry is kept aside for inspection, never silently reused
            os.replace(cached, cached.with_name(cached.name + ".corrupt"))
        self.store.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.store, prefix=".download-") as tmp:
            downloaded = self._download(pin, Path(tmp))
            actual = sha256_file(downloaded)
            if actual != pin.sha256:
                raise DigestMismatch(
                    f"{pin.filename}: sha256 mismatch: pinned {pin.sha256}, downloaded {actual}; nothing was cached"
                )
            cached.parent.mkdir(parents=True, exist_ok=True)
            os.replace(downloaded, cached)
        return cached, "download"

    def keep(self, pin: WheelPin, wheel: Path) -> Path:
        """Copy ``wheel``, whose sha256 is ``pin``'s (``kvprobe new`` just hashed it), into the
        cache entry :meth:`fetch` reads; atomic, and a no-op when the entry exists."""
        cached = self.cached_path(pin)
        cached.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.store / f"{pin.sha256}.lock")):
            if not cached.is_file():
                with tempfile.TemporaryDirectory(dir=self.store, prefix=".keep-") as tmp:
                    staged = Path(tmp) / pin.filename
                    shutil.copyfile(wheel, staged)
                    os.replace(staged, cached)
        return cached

    def _download(self, pin: WheelPin, tmp: Path) -> Path:
        self.reporter.update(f"downloading {pin.filename}")
        got = pip_download(
            f"{pin.package}=={pin.version}",
            tmp,
            [*platform_args(pin.filename), *self.pip_args],
            timeout_s=self.timeout_s,
            failure=f"could not download {pin.filename}",
        )
        path = tmp / "out" / pin.filename
        if path not in got:
            names = ", ".join(sorted(p.name for p in got)) or "nothing"
            raise FetchError(f"pip download of {pin.package}=={pin.version} gave {names}, not {pin.filename}")
        return path

    def materialize(
        self, pin: WheelPin, dest: Path, *, python: str | None = None, hold: contextlib.ExitStack | None = None
    ) -> dict[str, str]:
        """``dest``: the pinned wheel's verified tree, from the tree cache (RECORD checked,
        unpacked and, for ``python``, byte-compiled once per digest); returns its identity.

        With ``hold`` (a run that writes nothing into the tree), ``dest`` is the cached tree
        itself, leased until ``hold`` closes; otherwise a private copy of hard links."""
        fetched: dict[str, str] = {}

        def build(tree: Path) -> None:
            self.store.mkdir(parents=True, exist_ok=True)
            # held from check to unpack: `kvprobe cache prune` skips a wheel while it is locked
            with FileLock(str(self.store / f"{pin.sha256}.lock")):
                wheel, fetched["via"] = self.fetch(pin)
                safe_unzip(wheel, tree)  # RECORD checked before anything is extracted

        tag = cache_tag(python) if python else "source"
        tree, how = TreeCache(self.store.parent).ensure(f"{pin.sha256}-{tag}", build, python=python, hold=hold)
        (place_copy if hold is None else place_shared)(tree, dest)
        return {**pin.identity(), "fetched_via": fetched.get("via", "cache"), "tree_cache": how, "bytecode": tag}


def safe_unzip(wheel: Path, dest: Path) -> None:
    """Check the wheel against its RECORD, then extract regular members only.

    CheckoutError (one line) when a member is unsafe (absolute, '..', a symlink), missing
    from RECORD or not matching its size and digest there, or RECORD lists a file the wheel
    does not hold: nothing unchecked is ever extracted."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                name = PurePosixPath(info.filename)
                if name.is_absolute() or ".." in name.parts or "\\" in info.filename:
                    raise CheckoutError(f"{wheel.name}: unsafe member {info.filename!r}")
                if (info.external_attr >> 16) & 0o170000 == 0o120000:
                    raise CheckoutError(f"{wheel.name}: symlink member {info.filename!r}")
            check_record(archive, wheel.name)
            archive.extractall(dest)
    except zipfile.BadZipFile as exc:
        raise CheckoutError(f"{wheel.name}: not a valid wheel: {exc}") from exc


def check_record(archive: zipfile.ZipFile, name: str) -> None:
    """installer's RECORD validation (every member listed, sizes and digests match), plus
    the converse it leaves out: every file RECORD lists is in the wheel."""
    try:
        source = WheelFile(archive)
        source.validate_record(validate_contents=True)
        listed = {row[0] for row in parse_record_file(source.read_dist_info("RECORD").splitlines())}
    except (InstallerError, ValueError, KeyError) as exc:
        issues = [i.removeprefix(f"In {archive.filename}, ") for i in getattr(exc, "issues", None) or [str(exc)]]
        more = f" (+{len(issues) - 1} more)" if len(issues) > 1 else ""
        raise CheckoutError(f"{name}: does not match its RECORD: {issues[0]}{more}") from exc
    absent = sorted(listed - set(archive.namelist()))
    if absent:
        more = f" (+{len(absent) - 1} more)" if len(absent) > 1 else ""
        raise CheckoutError(f"{name}: RECORD lists {absent[0]!r}, which the wheel does not hold{more}")

"""WheelSource: a release wheel pinned by file name and sha256, checked before unpacking."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from filelock import FileLock

from kvprobe import proc
from kvprobe.errors import CheckoutError, DigestMismatch, FetchError
from kvprobe.files import sha256_file
from kvprobe.model.records import WheelPin
from kvprobe.progress import Reporter


def pip_download(requirement: str, scratch: Path, flags: list[str], *, timeout_s: float, failure: str) -> list[Path]:
    """``pip download --no-deps`` of one requirement into ``scratch/out`` (pip's logs beside it);
    returns the files pip wrote. FetchError starting with ``failure`` when pip fails."""
    out = scratch / "out"
    argv = [
        proc.python_executable(),
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        *flags,
        "--dest",
        str(out),
        requirement,
    ]
    result = proc.run(
        argv,
        timeout_s=timeout_s,
        stdout_path=scratch / "pip.out",
        stderr_path=scratch / "pip.err",
        env=proc.clean_env(network=True, passthrough_prefixes=("PIP_",)),
    )
    if not result.ok:
        raise FetchError(f"{failure}: {result.summary()}")
    return sorted(out.iterdir()) if out.is_dir() else []


def platform_args(filename: str) -> list[str]:
    """pip download flags that select exactly the wheel a pin names, on any host."""
    parts = filename[:-4].split("-")
    if len(parts) < 5:
        return []
    python_tag, abi_tag, platform_tag = parts[-3:]
    args = ["--only-binary=:all:"]
    if platform_tag != "any":
        for tag in platform_tag.split("."):
            args += ["--platform", tag]
    if python_tag.startswith("cp") and python_tag[2:].isdigit():
        args += ["--python-version", python_tag[2:], "--implementation", "cp", "--abi", abi_tag]
    return args


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

    def materialize(self, pin: WheelPin, dest: Path) -> dict[str, str]:
        """Unpack the verified wheel into ``dest`` (created atomically); returns its identity."""
        self.store.mkdir(parents=True, exist_ok=True)
        # held from check to unpack: `kvprobe cache prune` skips a wheel while it is locked
        with FileLock(str(self.store / f"{pin.sha256}.lock")):
            wheel, fetched_via = self.fetch(pin)
            tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}-"))
            try:
                safe_unzip(wheel, tmp)
                check_record(tmp, pin)
                os.replace(tmp, dest)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        return {**pin.identity(), "fetched_via": fetched_via}


def safe_unzip(wheel: Path, dest: Path) -> None:
    """Extract regular members only; absolute paths and '..' are refused."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                name = PurePosixPath(info.filename)
                if name.is_absolute() or ".." in name.parts or "\\" in info.filename:
                    raise CheckoutError(f"{wheel.name}: unsafe member {info.filename!r}")
                if (info.external_attr >> 16) & 0o170000 == 0o120000:
                    raise CheckoutError(f"{wheel.name}: symlink member {info.filename!r}")
                archive.extract(info, dest)
    except zipfile.BadZipFile as exc:
        raise CheckoutError(f"{wheel.name}: not a valid wheel: {exc}") from exc


def check_record(tree: Path, pin: WheelPin) -> None:
    """Every file the wheel's RECORD lists must match its recorded digest (tree == pin)."""
    import base64
    import csv

    records = list(tree.glob("*.dist-info/RECORD"))
    if len(records) != 1:
        raise CheckoutError(f"{pin.filename}: expected one dist-info RECORD, found {len(records)}")
    with open(records[0], newline="", encoding="utf-8") as handle:
        for row in csv.reader(handle):
            if len(row) < 2 or not row[1]:
                continue
            algo, _, expected = row[1].partition("=")
            digest = hashlib.new(algo, (tree / row[0]).read_bytes()).digest()
            if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != expected:
                raise CheckoutError(f"{pin.filename}: {row[0]} does not match the wheel's RECORD")

"""Scratch directories in RAM for tiers that write many small files (the unit and attack tiers).

Creating a file on this machine's disk costs about 0.3 ms and a forged bundle about 8 ms; on a
tmpfs, 0.4 ms. The tiers that only write small bundles, logs and keys get their ``tmp_path``
and ``tmp_path_factory`` from here: one session directory under /dev/shm where it is a
writable directory with a GiB free (else the system's temp dir), removed when the session ends. The
integration tier keeps pytest's own (it builds virtualenvs of gigabytes). KVPROBE_TEST_TMP
names another parent directory, e.g. to keep a failing test's files on disk.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

RAM = Path("/dev/shm")


def parent() -> str | None:
    """Where session directories go: KVPROBE_TEST_TMP, else /dev/shm when it is a writable
    directory with a GiB free, else the system's temp dir."""
    chosen = os.environ.get("KVPROBE_TEST_TMP")
    if chosen:
        return chosen
    usable = RAM.is_dir() and os.access(RAM, os.W_OK | os.X_OK)
    return str(RAM) if usable and _free(RAM) >= RAM_FREE_NEEDED else None


# The unit tier leaves ~45 MB of scratch by its end; a container's default /dev/shm is 64 MB.
RAM_FREE_NEEDED = 1 << 30


def _free(path: Path) -> int:
    found = os.statvfs(path)
    return found.f_bavail * found.f_frsize


class Scratch:
    """The part of pytest's TempPathFactory these tiers use: numbered directories under one base."""

    def __init__(self, base: Path) -> None:
        self._base = base
        self._numbers = itertools.count()

    def getbasetemp(self) -> Path:
        return self._base

    def mktemp(self, basename: str, numbered: bool = True) -> Path:
        name = re.sub(r"[^\w.-]", "_", basename)[:40] or "tmp"
        path = self._base / (f"{name}{next(self._numbers)}" if numbered else name)
        path.mkdir()
        return path


def session(tier: str) -> Iterator[Scratch]:
    """A Scratch for one tier's session; its directory is gone when the generator closes.
    Directories of sessions whose process is gone (killed before its end) are removed first:
    in RAM they would hold memory until the machine restarts."""
    where = parent()
    _remove_orphans(Path(where or tempfile.gettempdir()), tier)
    base = Path(tempfile.mkdtemp(prefix=f"kvprobe-{tier}-{os.getpid()}-", dir=where))
    try:
        yield Scratch(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _remove_orphans(where: Path, tier: str) -> None:
    for old in where.glob(f"kvprobe-{tier}-*-*"):
        pid = old.name.split("-")[2]
        if pid.isdigit() and not _alive(int(pid)) and old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

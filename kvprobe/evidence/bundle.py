"""Writing a bundle: file references for the receipt, and sealing a staged directory.

Shared by `kvprobe run` and `kvprobe gates` bundles.
"""

from __future__ import annotations

import errno
import os
import platform
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvprobe import schema
from kvprobe.evidence import manifest
from kvprobe.files import sha256_file, write_atomic, write_json
from kvprobe.model.receipt import FileRef
from kvprobe.names import README, RECEIPT


def cite(path: Path, root: Path) -> FileRef:
    """A file in the bundle being written, as a receipt cites it."""
    return FileRef(path.relative_to(root).as_posix(), sha256_file(path))


def seal_bundle(
    receipt: dict[str, Any],
    version: str,
    readme: str,
    staging: Path,
    final: Path,
    check: Callable[[Path], None] | None = None,
) -> str:
    """Validate, write, hash, check, then rename into place (nothing half-written).

    Returns manifest.json's sha256. ``check`` runs on the finished staging directory and
    raises to keep it from being published. ``final``'s parent is created only here, when
    there is a bundle to publish: a run that fails earlier leaves nothing behind.
    """
    schema.validate(receipt, version, source="receipt")
    write_json(staging / RECEIPT, receipt)
    write_atomic(staging / README, readme.encode("utf-8"))
    digest = manifest.write(staging)
    if check is not None:
        check(staging)
    publish(staging, final)
    return digest


def publish(staging: Path, final: Path) -> None:
    """Move a finished directory to ``final`` atomically, even from another file system
    (staging lives in the run's private temp dir): copied beside ``final``, then renamed."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        final.rmdir()  # empty, checked before the run
    try:
        os.replace(staging, final)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    beside = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.tmp-"))
    try:
        shutil.copytree(staging, beside / "b", symlinks=True)
        os.replace(beside / "b", final)
    finally:
        shutil.rmtree(beside, ignore_errors=True)


def host_facts() -> dict[str, Any]:
    """The machine a receipt was made on, as every receipt records it."""
    return {
        "system": platform.system(),
        "machine": platform.machine(),
        "release": platform.release(),
        "python": platform.python_version(),
        "cpus": os.cpu_count() or 0,
    }

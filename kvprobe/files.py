"""Files on disk, written once: atomic writes, kvprobe's canonical JSON, and a file's sha256."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_atomic(
    path: Path, data: bytes, *, mode: int | None = None, check: Callable[[Path], None] | None = None
) -> None:
    """Temp file in ``path``'s directory, flushed to disk, then ``os.replace``: all or nothing.

    ``check`` sees the finished temp file and raises to keep it from replacing ``path``.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        if check is not None:
            check(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def json_bytes(doc: Any) -> bytes:
    """The bytes kvprobe writes for a JSON document (what gets hashed): sorted keys, no NaN, LF."""
    return (json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n").encode("utf-8")


def write_json(path: Path, doc: Any) -> None:
    """``json_bytes(doc)`` written atomically; parent directories are created."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json_bytes(doc))


def sha256_file(path: Path) -> str:
    """Streamed (memory stays flat whatever the size) by hashlib.file_digest."""
    with open(path, "rb", buffering=0) as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()

"""Files on disk, written once: atomic writes, kvprobe's canonical JSON, a file's sha256, and
the one way to read a file a user names (a regular file only, capped)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
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


def kind_of(mode: int) -> str:
    """What a file mode says the entry is, in words (``a FIFO``, ``a character device``, ...)."""
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return name
    return "a special file"


def read_regular(path: Path, max_bytes: int) -> bytes:
    """The bytes of the regular file at ``path`` (at most ``max_bytes``). A FIFO, a device or
    a socket is refused without a read (opened non-blocking: a FIFO with no writer does not
    hang the open). Raises OSError when it cannot be opened or is not a regular file, and
    ValueError when it holds more than ``max_bytes``."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"not a regular file ({kind_of(mode)})", str(path))
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise ValueError(f"{path}: larger than {max_bytes} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def input_refusal(path: Path, source: Path) -> str | None:
    """Why a command may not write its output at ``path`` when it reads the bundle ``source``
    (a directory or an archive), or None when it may: into the bundle, a file the manifest does
    not list (or one it does, with --force) breaks the evidence the output was drawn from, and
    the input itself is never replaced. Symlinks are resolved on both sides."""
    out, src = Path(os.path.realpath(path)), Path(os.path.realpath(source))
    if out == src:
        return f"{path} is the bundle being read ({source}); refusing to write over it"
    if src in out.parents:
        return (
            f"{path} is inside the bundle {source}: a file written there changes the evidence "
            "(one its manifest does not list fails verification); write it outside the bundle"
        )
    return None


def output_refusal(path: Path, force: bool) -> str | None:
    """Why a command may not write its output file at ``path``, or None when it may: the one
    rule of every ``-o``. A path that exists is kept unless ``force``; one that is anything
    but a regular file (a device, a FIFO, a directory, a symlink) is never replaced, with
    ``force`` or without: as root, replacing ``/dev/full`` with a file breaks the system."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if not stat.S_ISREG(mode):
        return f"{path} is {kind_of(mode)}; refusing to replace it (--force replaces a regular file only)"
    if not force:
        return f"{path} exists; refusing to overwrite it (--force replaces it)"
    return None

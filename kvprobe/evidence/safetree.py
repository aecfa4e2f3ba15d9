"""Read an untrusted directory tree without being led outside it.

Every open is relative to a directory descriptor, component by component, with
``O_NOFOLLOW``; a name is ``lstat``-ed before it is opened and opened only when it is a
regular file (FIFOs, devices and sockets are never opened; ``O_NONBLOCK`` guards the race).
Names must be canonical: the manifest's path alphabet, no '.', '..', empty or over-long parts.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field

from kvprobe import strict_json
from kvprobe.defects import (
    BadName,
    BundleDefect,
    BundleTooLarge,
    FileTooLarge,
    NameCollision,
    NotABundle,
    SpecialFile,
    SymlinkEntry,
    TooManyFiles,
    UnreadableEntry,
)
from kvprobe.names import MAX_BUNDLE_BYTES, MAX_BUNDLE_FILE_BYTES, MAX_BUNDLE_FILES

NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Caps that make a hostile bundle fail fast with little memory (raise with CLI flags)."""

    max_files: int = MAX_BUNDLE_FILES
    max_file_bytes: int = MAX_BUNDLE_FILE_BYTES
    max_total_bytes: int = MAX_BUNDLE_BYTES
    max_json_bytes: int = 8 << 20  # receipt, manifest, raw outputs (the largest seen: 0.2 MiB)
    max_json_values: int = strict_json.MAX_VALUES
    max_json_depth: int = strict_json.MAX_DEPTH
    max_toml_bytes: int = 1 << 20  # a bundled experiment.toml (a few KiB)
    max_path_chars: int = 1024
    max_path_depth: int = 32
    max_name_chars: int = 255


@dataclass(frozen=True)
class ScannedPath:
    """A path the scan saw: what it is (never followed) and its size when a regular file."""

    rel: str
    kind: str  # file | dir | symlink | fifo | socket | device | other
    size: int


@dataclass
class Scan:
    entries: dict[str, ScannedPath] = field(default_factory=dict)
    defects: list[BundleDefect] = field(default_factory=list)
    complete: bool = True  # every entry was seen (integrity needs this)
    stopped: bool = False  # a cap was hit: scanning stopped early

    def files(self) -> dict[str, ScannedPath]:
        return {rel: e for rel, e in self.entries.items() if e.kind == "file"}


class NotRegularFile(OSError):
    """A path that is not a regular file where one was expected (never opened)."""


def display(name: str) -> str:
    """A printable form of a name that may carry undecodable bytes (surrogate escapes)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def kind_of(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "other"


def name_problem(name: str, limits: Limits = Limits()) -> str | None:
    """Why one path component is not canonical, or None."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "name is not valid UTF-8"
    if name in ("", ".", ".."):
        return f"{name!r} is not a file name" if name else "empty path component"
    if len(name) > limits.max_name_chars:
        return f"name longer than {limits.max_name_chars} characters"
    if unicodedata.normalize("NFC", name) != name:
        return "name is not NFC-normalised"
    if not NAME_RE.match(name):
        return "name has characters outside [A-Za-z0-9_.+-]"
    return None


def path_problem(rel: str, limits: Limits = Limits()) -> str | None:
    """Why a POSIX relative path is unsafe or non-canonical, or None."""
    if not isinstance(rel, str) or not rel:
        return "empty path"
    if rel.startswith("/"):
        return "absolute path"
    if "\\" in rel or "\x00" in rel:
        return "backslash or NUL in path"
    parts = rel.split("/")
    if ".." in parts:
        return "'..' component (path traversal)"
    if len(rel) > limits.max_path_chars or len(parts) > limits.max_path_depth:
        return "path too long or too deep"
    for part in parts:
        problem = name_problem(part, limits)
        if problem:
            return problem
    return None


def collision_key(rel: str) -> str:
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", rel).casefold())


def find_collisions(paths: list[str], make: Callable[[str, str], BundleDefect]) -> list[BundleDefect]:
    """``make(path, detail)`` for every path equal to an earlier one after folding."""
    seen: dict[str, str] = {}
    found = []
    for rel in paths:
        key = collision_key(display(rel))
        if key in seen and seen[key] != rel:
            found.append(make(display(rel), f"collides with {display(seen[key])!r} (case or Unicode normalisation)"))
        seen.setdefault(key, rel)
    return found


class Tree:
    """An open bundle directory; use as a context manager (holds one directory descriptor)."""

    def __init__(self, root: os.PathLike | str) -> None:
        try:
            self.fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise NotABundle(f"{root}: not a bundle directory ({exc.strerror})") from exc
        self.root = str(root)

    def __enter__(self) -> Tree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # --- scanning --------------------------------------------------------------------

    def scan(self, limits: Limits) -> Scan:
        """Every entry (never following links), with layout defects and caps applied."""
        result = Scan()
        total = 0
        stack: list[tuple[str, int]] = [("", os.dup(self.fd))]
        try:
            while stack:
                prefix, dir_fd = stack.pop()
                try:
                    total = self._scan_dir(prefix, dir_fd, result, stack, limits, total)
                finally:
                    os.close(dir_fd)
                if result.stopped:
                    break
        finally:
            for _, fd in stack:
                os.close(fd)
        result.defects += find_collisions(sorted(result.entries), NameCollision)
        return result

    def _scan_dir(
        self, prefix: str, dir_fd: int, result: Scan, stack: list[tuple[str, int]], limits: Limits, total: int
    ) -> int:
        with os.scandir(dir_fd) as it:
            names = sorted((e.name, e.stat(follow_symlinks=False)) for e in it)
        for name, st in names:
            rel = f"{prefix}{name}"
            if len(result.entries) >= limits.max_files:
                result.defects.append(
                    TooManyFiles(display(rel), f"more than {limits.max_files} entries (raise with --max-files)")
                )
                result.complete, result.stopped = False, True
                return total
            entry = ScannedPath(rel, kind_of(st.st_mode), st.st_size if stat.S_ISREG(st.st_mode) else 0)
            result.entries[rel] = entry
            total = self._check_entry(entry, name, result, limits, total)
            if entry.kind == "dir":
                try:
                    stack.append((f"{rel}/", os.open(name, _DIR_FLAGS, dir_fd=dir_fd)))
                except OSError as exc:
                    result.defects.append(UnreadableEntry(display(rel), f"directory cannot be opened ({exc.strerror})"))
                    result.complete = False
        return total

    @staticmethod
    def _check_entry(entry: ScannedPath, name: str, result: Scan, limits: Limits, total: int) -> int:
        shown = display(entry.rel)
        problem = name_problem(name, limits) or (
            "path too long or too deep" if path_problem(entry.rel, limits) else None
        )
        if problem:
            result.defects.append(BadName(shown, problem))
        if entry.kind == "symlink":
            result.defects.append(SymlinkEntry(shown, "symbolic link (never followed)"))
        elif entry.kind in ("fifo", "socket", "device", "other"):
            result.defects.append(SpecialFile(shown, f"{entry.kind} (never opened)"))
        elif entry.kind == "file":
            if entry.size > limits.max_file_bytes:
                result.defects.append(
                    FileTooLarge(
                        shown, f"{entry.size} bytes > cap {limits.max_file_bytes} (raise with --max-file-bytes)"
                    )
                )
            if total <= limits.max_total_bytes < total + entry.size:
                result.defects.append(
                    BundleTooLarge(shown, f"bundle exceeds {limits.max_total_bytes} bytes (raise with --max-bytes)")
                )
            total += entry.size
        return total

    # --- reading ---------------------------------------------------------------------

    def open_regular(self, rel: str) -> int:
        """A descriptor for ``rel``, only if every component is a real directory/regular file.

        Raises FileNotFoundError, NotRegularFile, or OSError (ELOOP on a symlink).
        """
        if path_problem(rel):
            raise NotRegularFile(f"unsafe path {rel!r}")
        parts = rel.split("/")
        cur = os.dup(self.fd)
        try:
            for part in parts[:-1]:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=cur)
                os.close(cur)
                cur = nxt
            st = os.stat(parts[-1], dir_fd=cur, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                raise NotRegularFile(f"{rel} is a {kind_of(st.st_mode)}, not a regular file")
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=cur)
        finally:
            os.close(cur)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise NotRegularFile(f"{rel} changed into a non-regular file")
        return fd

    def read_bytes(self, rel: str, cap: int) -> bytes:
        """The whole file, refusing (ValueError) one larger than ``cap`` before reading it."""
        fd = self.open_regular(rel)
        try:
            size = os.fstat(fd).st_size
            if size > cap:
                raise ValueError(f"{size} bytes > cap {cap}")
            data = _read_upto(fd, cap + 1)
        finally:
            os.close(fd)
        if len(data) > cap:
            raise ValueError(f"grew past cap {cap} while being read")
        return data

    def sha256(self, rel: str, expected_size: int) -> tuple[str, int]:
        """Streaming sha256 reading at most ``expected_size + 1`` bytes; returns (hex, bytes read)."""
        fd = self.open_regular(rel)
        digest = hashlib.sha256()
        remaining, count = expected_size + 1, 0
        try:
            while remaining > 0:
                chunk = os.read(fd, min(_CHUNK, remaining))
                if not chunk:
                    break
                digest.update(chunk)
                count += len(chunk)
                remaining -= len(chunk)
        finally:
            os.close(fd)
        return digest.hexdigest(), count


def _read_upto(fd: int, limit: int) -> bytes:
    chunks, count = [], 0
    while count < limit:
        chunk = os.read(fd, min(_CHUNK, limit - count))
        if not chunk:
            break
        chunks.append(chunk)
        count += len(chunk)
    return b"".join(chunks)

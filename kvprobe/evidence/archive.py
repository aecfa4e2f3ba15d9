"""Reading a bundle archive (.tar.gz) safely: scan every member, then extract.

Every member is scanned before anything is written (regular files and directories only; no
links, devices, FIFOs; no absolute or '..' names; caps on count and sizes, and on the
decompressed stream itself); only then is the archive extracted into a private temp dir.
The writer is :mod:`kvprobe.verify.pack`.
"""

from __future__ import annotations

import gzip
import io
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvprobe.defects import (
    ArchiveDuplicateMember,
    ArchiveHeaderTooLarge,
    ArchiveLinkMember,
    ArchiveSpecialMember,
    ArchiveTraversal,
    BadName,
    BundleDefect,
    BundleTooLarge,
    FileTooLarge,
    NameCollision,
    NotABundle,
    TooManyFiles,
)
from kvprobe.evidence.safetree import Limits, display, find_collisions, path_problem

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

_HEADER_ALLOWANCE = 64 << 10  # per member: tar and PAX headers in the decompressed stream


# --- scan and extract --------------------------------------------------------------------


class _Overflow(Exception):
    pass


class _CappedReader(io.RawIOBase):
    """A decompressed stream that stops at ``cap`` bytes: a gzip bomb fails fast."""

    def __init__(self, inner: gzip.GzipFile, cap: int) -> None:
        self.inner, self.cap, self.count = inner, cap, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        data = self.inner.read(len(view))
        self.count += len(data)
        if self.count > self.cap:
            raise _Overflow(self.count)
        view[: len(data)] = data
        return len(data)


class _HeaderTooLargeError(Exception):
    pass


class _CappedTarInfo(tarfile.TarInfo):
    """Refuses an extended header from its declared size, before tarfile reads it into memory.

    ``_proc_member`` is tarfile's documented hook for subclasses (see its comment); PAX and GNU
    long-name headers are read whole by the stock methods, and GNU sparse maps are refused
    outright (their continuation blocks are read until the archive says stop).
    """

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        extended = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE)
        if self.type == tarfile.GNUTYPE_SPARSE or (self.type in extended and self.size > _HEADER_ALLOWANCE):
            raise _HeaderTooLargeError(self.type, self.size)
        return super()._proc_member(tarfile_)  # type: ignore[misc]  # the hook typeshed leaves out


_HEADER_KINDS = {
    tarfile.GNUTYPE_LONGNAME: "GNU long-name",
    tarfile.GNUTYPE_LONGLINK: "GNU long-link",
    tarfile.XHDTYPE: "PAX extended",
    tarfile.XGLTYPE: "PAX global",
    tarfile.GNUTYPE_SPARSE: "GNU sparse",
}


@dataclass(frozen=True)
class Member:
    name: str
    kind: str  # file | dir
    size: int


@contextmanager
def _members(archive: Path, limits: Limits) -> Iterator[Iterator[tuple[tarfile.TarInfo, tarfile.TarFile]]]:
    cap = limits.max_total_bytes + (limits.max_files + 2) * _HEADER_ALLOWANCE
    with open(archive, "rb") as handle, gzip.GzipFile(fileobj=handle, mode="rb") as gz:
        reader = io.BufferedReader(_CappedReader(gz, cap), 1 << 16)
        with tarfile.open(
            fileobj=reader, mode="r|", encoding="utf-8", errors="surrogateescape", tarinfo=_CappedTarInfo
        ) as tar:
            yield ((member, tar) for member in tar)


def scan_archive(archive: Path, limits: Limits) -> tuple[list[Member], list[BundleDefect]]:
    """Every member checked before anything is written; raises NotABundle if unreadable."""
    members: list[Member] = []
    defects: list[BundleDefect] = []
    total = 0
    try:
        with _members(archive, limits) as stream:
            for info, _tar in stream:
                if len(members) >= limits.max_files:
                    defects.append(
                        TooManyFiles(
                            display(info.name), f"more than {limits.max_files} members (raise with --max-files)"
                        )
                    )
                    break
                member, found = check_member(info, limits, total)
                defects += found
                if member is not None:
                    members.append(member)
                    total += member.size
    except _Overflow:
        defects.append(
            BundleTooLarge(archive.name, "decompressed archive exceeds the size cap (raise with --max-bytes)")
        )
    except _HeaderTooLargeError as exc:
        kind, size = exc.args
        defects.append(
            ArchiveHeaderTooLarge(
                archive.name,
                f"{_HEADER_KINDS[kind]} header of {size} bytes after member {len(members)} "
                f"(cap {_HEADER_ALLOWANCE}); not read",
            )
        )
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, OSError) as exc:
        raise NotABundle(f"{archive}: not a readable .tar.gz ({exc})") from exc
    return members, defects + structure_defects(members)


def check_member(info: tarfile.TarInfo, limits: Limits, total: int) -> tuple[Member | None, list[BundleDefect]]:
    name = display(info.name)
    if info.issym() or info.islnk():
        kind = "symbolic" if info.issym() else "hard"
        return None, [
            ArchiveLinkMember(name, f"{kind} link member (to {display(info.linkname)!r}); links are not allowed")
        ]
    if not (info.isreg() or info.isdir()) or info.issparse():
        return None, [
            ArchiveSpecialMember(
                name, f"special member (tar type {info.type!r}); only regular files and directories are allowed"
            )
        ]
    found: list[BundleDefect] = []
    problem = path_problem(info.name, limits)
    if info.name.startswith("/") or ".." in info.name.split("/"):
        found.append(ArchiveTraversal(name, f"member escapes the extraction directory ({problem})"))
    elif problem:
        found.append(BadName(name, problem))
    if info.isreg() and info.size > limits.max_file_bytes:
        found.append(
            FileTooLarge(name, f"{info.size} bytes > cap {limits.max_file_bytes} (raise with --max-file-bytes)")
        )
    elif info.isreg() and total <= limits.max_total_bytes < total + info.size:
        found.append(BundleTooLarge(name, f"archive exceeds {limits.max_total_bytes} bytes (raise with --max-bytes)"))
    member = Member(info.name, "file" if info.isreg() else "dir", info.size if info.isreg() else 0)
    return (None if found else member), found


def structure_defects(members: list[Member]) -> list[BundleDefect]:
    """Duplicates, a file used as a directory, and case/normalisation collisions."""
    found: list[BundleDefect] = []
    kinds: dict[str, str] = {}
    for m in members:
        if m.name in kinds:
            found.append(ArchiveDuplicateMember(display(m.name), "member appears more than once"))
        kinds[m.name] = m.kind
    for m in members:
        parts = m.name.split("/")
        for i in range(1, len(parts)):
            if kinds.get("/".join(parts[:i])) == "file":
                found.append(ArchiveDuplicateMember(display(m.name), "a parent of this member is a file member"))
                break
    found += find_collisions(sorted(kinds), NameCollision)
    return found


def bundle_root(members: list[Member]) -> str:
    """The archive's single top directory when everything sits under one, else ''."""
    tops = {m.name.split("/")[0] for m in members}
    if len(tops) == 1:
        top = next(iter(tops))
        if all(m.name != top or m.kind == "dir" for m in members) and any("/" in m.name for m in members):
            return top
    return ""


def extract(archive: Path, members: list[Member], dest: Path, limits: Limits) -> None:
    """Write the scanned members into ``dest`` (private, empty); the stream must match the scan."""
    expected = iter(members)
    with _members(archive, limits) as stream:
        for info, tar in stream:
            member = next(expected, None)
            kind = "file" if info.isreg() else "dir" if info.isdir() else "other"
            if member is None or (member.name, member.kind, member.size) != (
                info.name,
                kind,
                info.size if kind == "file" else 0,
            ):
                raise NotABundle(f"{archive}: changed while being read")
            target = dest.joinpath(*info.name.split("/"))
            if kind == "dir":
                target.mkdir(mode=0o700, parents=True, exist_ok=True)
                continue
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            source = tar.extractfile(info)
            assert source is not None, "a regular member has a stream"
            with open(target, "xb") as handle:
                shutil.copyfileobj(source, handle, 1 << 20)


@contextmanager
def extracted(archive: Path, limits: Limits) -> Iterator[tuple[Path | None, list[BundleDefect]]]:
    """(bundle root in a private temp dir, []) or (None, defects) when a member is refused.

    The temp dir is removed on exit whatever happens.
    """
    members, defects = scan_archive(archive, limits)
    if defects:
        yield None, defects
        return
    private = Path(tempfile.mkdtemp(prefix="kvprobe-verify-"))
    try:
        (private / "x").mkdir()
        try:
            extract(archive, members, private / "x", limits)
        except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, _Overflow, _HeaderTooLargeError) as exc:
            raise NotABundle(f"{archive}: not a readable .tar.gz ({exc})") from exc
        top = bundle_root(members)
        yield (private / "x" / top if top else private / "x"), []
    finally:
        shutil.rmtree(private, ignore_errors=True)

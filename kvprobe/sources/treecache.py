"""Verified trees, built once per key, read-only after: ``<wheel sha256>-<tag>`` for a wheel,
``git-<tree id>-<tag>`` for a git export (the tag: an interpreter's bytecode tag, or "source").

An entry is ``trees/<key>/`` holding ``tree/`` and ``kvprobe-tree.json``, the sha256,
size and mtime of every file (a symlink's target). It is built in a ``.build-*`` directory
(a wheel unpacked and checked against its RECORD, or a commit exported and hashed against
its tree id; bytecode compiled once with checked-hash ``.pyc`` so a stale one can never be
used), frozen (``chmod a-w``) and renamed into place only when complete: a build killed
half way leaves a ``.build-*`` leftover that nothing reads and ``cache prune`` removes. A
file lock serializes builders, so two first users build once.

Each use re-checks the entry cheaply against its marker (the same files, sizes, mtimes
and no write bits); a difference, or a missing or unreadable marker, makes it rebuilt.
``verify`` re-hashes every file (`kvprobe cache verify`). A run gets its own copy made of
hard links: cheap, and nothing a run adds to its copy reaches the cache.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from kvprobe import proc
from kvprobe.env.cache import lease
from kvprobe.errors import CheckoutError
from kvprobe.files import sha256_file, write_atomic

MARKER = "kvprobe-tree.json"
_WRITE = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


@dataclass(frozen=True)
class Problem:
    """Why an entry cannot be trusted (a file name and what differs)."""

    path: str
    what: str

    def __str__(self) -> str:
        return f"{self.path}: {self.what}"


class TreeCache:
    """``cache_root/trees``: one frozen, verified tree per key."""

    def __init__(self, cache_root: Path) -> None:
        self.root = cache_root / "trees"

    def ensure(
        self,
        key: str,
        build: Callable[[Path], None],
        *,
        python: str | None = None,
        hold: contextlib.ExitStack | None = None,
    ) -> tuple[Path, str]:
        """The entry's tree and "cache" or "built"; ``build(dest)`` fills a new tree.

        With ``python``, the tree's bytecode is compiled by that interpreter. With ``hold``, a
        lease on the entry is taken under its lock and kept until ``hold`` closes, so `cache
        prune` leaves it alone while a run uses the tree in place (:func:`place_shared`).
        """
        self.root.mkdir(parents=True, exist_ok=True)
        entry = self.root / key
        with FileLock(str(self.root / f"{key}.lock")):
            how = "cache"
            if entry.exists() and quick_problems(entry):
                discard(entry)  # tampered or half written: never reused
            if entry.exists():
                os.utime(entry / MARKER)  # last used, for `cache ls` / `prune`
            else:
                self._build(entry, build, python)
                how = "built"
            if hold is not None:
                hold.enter_context(lease(entry))
        return entry / "tree", how

    def _build(self, entry: Path, build: Callable[[Path], None], python: str | None) -> None:
        tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=f".build-{entry.name}-"))
        try:
            build(tmp / "tree")
            if python:
                compile_bytecode(python, tmp / "tree", tmp)
            files = freeze(tmp / "tree")
            write_atomic(tmp / MARKER, (json.dumps({"files": files}, sort_keys=True) + "\n").encode())
            os.chmod(tmp, 0o755)
            os.rename(tmp, entry)
        except BaseException:
            discard(tmp)
            raise


def compile_bytecode(python: str, tree: Path, scratch: Path) -> None:
    """``.pyc`` for every module, checked by source hash (never by mtime) when imported."""
    result = proc.run(
        [python, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "checked-hash", str(tree)],
        timeout_s=900,
        env=proc.clean_env(home=scratch),
        stdout_path=scratch / "compileall.out",
        stderr_path=scratch / "compileall.err",
    )
    # exit 1: some file is not valid Python (test data); it would not import either
    if result.timed_out or result.returncode not in (0, 1):
        raise CheckoutError(f"compiling bytecode failed: {result.summary()}")


def _scan(tree: Path) -> dict[str, os.stat_result]:
    """Every file and symlink under ``tree`` by relative POSIX path, with its lstat (a symlink
    to a directory is a leaf, never entered). One scandir pass: the check on every use of a
    ~9,500-file SGLang tree then costs ~0.2 s, where os.walk and Path objects took ~0.7 s."""
    found = {}
    stack = [("", os.fspath(tree))]
    while stack:
        prefix, directory = stack.pop()
        with os.scandir(directory) as it:
            for item in it:
                rel = prefix + item.name
                if item.is_dir(follow_symlinks=False):
                    stack.append((rel + "/", item.path))
                else:
                    found[rel] = item.stat(follow_symlinks=False)
    return found


def _leaves(tree: Path) -> Iterator[tuple[str, Path]]:
    """Every file and symlink under ``tree``, in path order."""
    return ((rel, tree / rel) for rel in sorted(_scan(tree)))


def freeze(tree: Path) -> dict[str, dict]:
    """Drop write permission on everything under ``tree``; returns each file's record.

    A symlink (git trees have them) is recorded by its target, never followed or chmodded.
    """
    files: dict[str, dict] = {}
    for rel, path in _leaves(tree):
        if path.is_symlink():
            files[rel] = {"symlink": os.readlink(path)}
            continue
        os.chmod(path, os.lstat(path).st_mode & ~_WRITE)
        st = os.lstat(path)
        files[rel] = {"sha256": sha256_file(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    for dirpath, _dirs, _files in os.walk(tree, topdown=False):
        os.chmod(dirpath, os.lstat(dirpath).st_mode & ~_WRITE)
    return files


def _listing(entry: Path) -> dict[str, dict] | None:
    try:
        data = json.loads((entry / MARKER).read_text(encoding="utf-8"))
        return data["files"] if isinstance(data.get("files"), dict) else None
    except (OSError, ValueError, AttributeError, KeyError):
        return None


def _record_problem(rel: str, want: object) -> str | None:
    """Why a listing record cannot be checked, or None: a path that is not plain and inside the
    tree (absolute, ``..``, empty parts) is never opened, and a record is a symlink's target
    or a file's sha256, size and mtime. A planted listing makes problems, not crashes."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in rel:
        return "not a path inside the tree"
    if not isinstance(want, dict):
        return "not a file record"
    if "symlink" in want:
        return None if isinstance(want["symlink"], str) else "not a file record"
    fields = (want.get("sha256"), want.get("size"), want.get("mtime_ns"))
    if not isinstance(fields[0], str) or not all(isinstance(n, int) and not isinstance(n, bool) for n in fields[1:]):
        return "not a file record"
    return None


def quick_problems(entry: Path) -> list[Problem]:
    """Cheap check (stat only): the marker's files, sizes and mtimes, symlink targets, nothing
    writable. The entry's ``tree`` must be a directory itself (never a symlink out of the cache)."""
    listing = _listing(entry)
    if listing is None:
        return [Problem(MARKER, "missing or unreadable (half-written entry)")]
    tree = entry / "tree"
    try:
        if not stat.S_ISDIR(os.lstat(tree).st_mode):
            return [Problem("tree", "not a directory (a file or a symlink stands in its place)")]
        found = _scan(tree)
    except OSError as exc:
        return [Problem("tree", f"unreadable ({exc.strerror or exc})")]
    bad = {rel: why for rel, want in listing.items() if (why := _record_problem(rel, want))}
    problems = [Problem(rel, why) for rel, why in sorted(bad.items())]
    problems += [Problem(p, "not in the listing") for p in sorted(set(found) - set(listing))]
    problems += [Problem(p, "missing") for p in sorted(set(listing) - set(found) - set(bad))]
    for rel, st in found.items():
        want = listing.get(rel)
        if want is None or rel in bad:
            continue
        if "symlink" in want:
            if not stat.S_ISLNK(st.st_mode) or os.readlink(tree / rel) != want["symlink"]:
                problems.append(Problem(rel, "symlink changed"))
        elif not stat.S_ISREG(st.st_mode):
            problems.append(Problem(rel, "not a regular file"))
        elif st.st_size != want["size"] or st.st_mtime_ns != want["mtime_ns"] or st.st_mode & _WRITE:
            problems.append(Problem(rel, "size, mtime or permissions changed"))
    return problems


def verify(entry: Path) -> list[Problem]:
    """Full check: the quick one, then every file's sha256 against the listing (only where the
    quick check found the tree itself sound: nothing outside it is ever read)."""
    problems = quick_problems(entry)
    if any(p.path in (MARKER, "tree") for p in problems):
        return problems
    listing = _listing(entry) or {}
    found = _scan(entry / "tree")  # a regular file under the tree itself, never one through a symlink
    for rel, want in sorted(listing.items()):
        st = found.get(rel)
        if _record_problem(rel, want) is not None or "sha256" not in want or st is None or not stat.S_ISREG(st.st_mode):
            continue
        if sha256_file(entry / "tree" / rel) != want["sha256"]:
            problems.append(Problem(rel, "sha256 differs from the listing"))
    return problems


def entries(cache_root: Path) -> list[Path]:
    """Every entry (not work in progress, trash or a lease folder ``<key>.users``)."""
    root = cache_root / "trees"
    if not root.is_dir() or root.is_symlink():
        return []
    return sorted(
        p
        for p in root.iterdir()
        if p.is_dir() and not p.is_symlink() and not p.name.startswith(".") and not p.name.endswith(".users")
    )


def link_copy(tree: Path, dest: Path) -> None:
    """``dest``: a private copy of ``tree`` whose files are hard links (dirs are new, symlinks made anew)."""
    for dirpath, _dirs, _files in os.walk(tree):
        (dest / Path(dirpath).relative_to(tree)).mkdir(parents=True, exist_ok=True)
    for rel, path in _leaves(tree):
        if path.is_symlink():
            os.symlink(os.readlink(path), dest / rel)
            continue
        try:
            os.link(path, dest / rel)
        except OSError:  # another file system, or no hard links there
            shutil.copy2(path, dest / rel)


def place_shared(tree: Path, dest: Path) -> None:
    """``dest`` (absent or empty): a symlink to the frozen tree itself, for a run that writes
    nothing into its tree (probes only). It saves the per-file link copy and its removal
    (~9,000 files and ~2,000 directories per SGLang release); anything written through it
    anyway lands in the entry, which the next use's check finds and rebuilds."""
    if dest.is_dir() and not dest.is_symlink():
        dest.rmdir()  # empty, or refused
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.symlink_to(tree, target_is_directory=True)


def place_copy(tree: Path, dest: Path) -> None:
    """``dest`` (absent or empty): a link copy of ``tree``, built beside it and renamed into place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}-"))
    try:
        link_copy(tree, tmp / "tree")
        os.replace(tmp / "tree", dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cache_tag(python: str) -> str:
    """The interpreter's bytecode tag ("cpython-311"): compiled trees are kept per tag."""
    result = proc.capture(
        [python, "-c", "import sys; print(sys.implementation.cache_tag)"], timeout_s=60, env=proc.clean_env()
    )
    tag = result.stdout.strip()
    if not result.ok or not tag.replace("-", "").isalnum():
        raise CheckoutError(f"cannot ask {python} for its bytecode tag: {result.summary()}")
    return tag


def discard(path: Path) -> None:
    """Remove a (frozen) tree: renamed aside first, so no reader sees it half deleted. An entry
    that is a symlink is only unlinked: os.walk enters a symlinked top directory, and its
    chmod would reach outside the cache."""
    if path.is_symlink():
        path.unlink()
        return
    if not path.exists():
        return
    aside = path.with_name(f".trash-{path.name}-{uuid.uuid4().hex[:8]}")
    os.rename(path, aside)
    for dirpath, _dirs, _files in os.walk(aside):
        os.chmod(dirpath, 0o755)
    shutil.rmtree(aside, ignore_errors=True)

"""The kvprobe cache as entries: list them (kind, key, size, last used) and prune them safely.

Layout under the cache root::

    git/<key>/              bare object store per upstream URL      lock: git/<key>.lock
    wheels/<sha256>/<file>  one pinned wheel per digest             lock: wheels/<sha256>.lock
    envs/<profile>-<key>/   virtualenv, complete when kvprobe-env.json exists
                                                                    lock: envs/<name>.lock
                            runs in progress hold envs/<name>.users/<lease>.lock
    trees/<digest>-<tag>/   a wheel's verified tree, frozen, complete when kvprobe-tree.json
    trees/git-<tree>-<tag>/ exists; a git export's likewise, keyed by the commit's tree id
                            (kvprobe.sources.treecache)           lock: trees/<name>.lock
                            runs using it in place hold trees/<name>.users/<lease>.lock
    units/<exp>-<version>-<key>/  a verified sweep unit (kvprobe.run.unit_cache): unit.tar.gz,
                            complete when kvprobe-unit.json exists    lock: units/<name>.lock
    uv/                     uv's download cache, shared by every lock     lock: uv.lock
                            env builds hold uv.users/<lease>.lock while uv runs
    */.build-* .download-* .<key>.tmp-*   work in progress (or left behind by a crash)
    */.trash-*                            already condemned by a prune that was interrupted

Pruning never blocks and never breaks a run in progress: an entry is removed only while
its lock is taken without waiting (filelock, timeout 0) and, for an env, while no run
holds a lease on it; it is first renamed to a trash name inside the same directory (so no
reader ever sees half a tree) and then deleted. uv's cache is one entry, removed the same
way while no env build holds a lease on it. Work in progress younger than
``PARTIAL_GRACE_S`` is left alone. Nothing outside the root is touched: symlinks are never
followed, and a kind directory that is itself a symlink is skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from kvprobe.errors import UsageError

ENV_MARKER = "kvprobe-env.json"  # kvprobe.env.venv.MARKER (not imported: cache needs none of venv)
GIT_URL_MARKER = "kvprobe-url"  # kvprobe.sources.git.URL_MARKER
TREE_MARKER = "kvprobe-tree.json"  # kvprobe.sources.treecache.MARKER
UNIT_MARKER = "kvprobe-unit.json"  # kvprobe.run.unit_cache.MARKER
KIND_DIRS = {"git": "git", "wheel": "wheels", "env": "envs", "tree": "trees", "unit": "units"}
_MARKERS = {"env": ENV_MARKER, "tree": TREE_MARKER, "unit": UNIT_MARKER}
UV_DIR = "uv"  # uv's cache: one entry (kind "uv"), leased by env builds like an env by runs
PARTIAL_PREFIXES = (".build-", ".download-")
TRASH_PREFIX = ".trash-"
PARTIAL_GRACE_S = 6 * 3600.0
DAY_S = 86400.0


def default_cache_root() -> Path:
    """$KVPROBE_CACHE_DIR, else the platform's user cache directory for kvprobe."""
    from platformdirs import user_cache_dir

    return Path(os.environ.get("KVPROBE_CACHE_DIR") or user_cache_dir("kvprobe"))


@dataclass(frozen=True)
class Entry:
    """One removable thing in the cache."""

    kind: str  # git | wheel | env | tree | uv | partial | trash
    key: str  # the name under its kind directory
    path: Path
    size: int
    last_used: float  # epoch seconds
    lock: Path | None
    complete: bool = True
    label: str = ""  # what the key stands for: a git URL, a wheel's file name
    # bytes of its files hard-linked to a file counted already, by an earlier entry or by this
    # one (uv links an env's files to its own cache): not in ``size``, so sizes add up to disk use
    linked: int = 0

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "key": self.key,
            "label": self.label,
            "path": str(self.path),
            "size": self.size,
            "linked_size": self.linked,
            "last_used": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.last_used)),
            "complete": self.complete,
        }


@dataclass(frozen=True)
class Outcome:
    """What prune did (or would do) with one entry."""

    entry: Entry
    action: str  # deleted | would-delete | skipped
    reason: str = ""

    def to_json(self) -> dict:
        return {**self.entry.to_json(), "action": self.action, "reason": self.reason}


# --- listing -----------------------------------------------------------------------------


def scan(root: Path) -> list[Entry]:
    """Every entry under ``root`` (an absent root is an empty cache), sorted by kind and key.

    Each file (device and inode) is counted once across the entries, by the first entry that
    holds it: a file hard-linked between an env and uv's cache is in the env's ``size`` and
    the uv entry's ``linked``, so the sizes add up to what the cache takes on disk."""
    root = Path(root)
    if root.is_symlink() or not root.is_dir():
        return []
    entries = []
    seen: set[tuple[int, int]] = set()
    for kind, dirname in KIND_DIRS.items():
        kind_dir = root / dirname
        if kind_dir.is_symlink() or not kind_dir.is_dir():
            continue  # a symlinked kind dir points outside the root: not ours
        for child in sorted(kind_dir.iterdir()):
            entry = _entry(kind, child, seen)
            if entry is not None:
                entries.append(entry)
    uv = root / UV_DIR
    if uv.is_dir() and not uv.is_symlink():
        lock, label = root / f"{UV_DIR}.lock", "uv's download cache (shared by every lock)"
        size, linked = footprint(uv, seen)
        entries.append(Entry("uv", UV_DIR, uv, size, _last_used_tree(uv), lock, label=label, linked=linked))
    return entries


def _entry(kind: str, path: Path, seen: set[tuple[int, int]]) -> Entry | None:
    name = path.name
    if name.endswith(".lock") or name.endswith(".users"):
        return None  # locks and lease folders belong to their entry
    if name.startswith(TRASH_PREFIX):
        size, linked = footprint(path, seen)
        return Entry("trash", name, path, size, _mtime(path), None, complete=False, linked=linked)
    if name.startswith(PARTIAL_PREFIXES) or (name.startswith(".") and ".tmp-" in name):
        size, linked = footprint(path, seen)
        return Entry("partial", name, path, size, _mtime(path), None, complete=False, linked=linked)
    if name.startswith(".") or not path.is_dir() or path.is_symlink():
        return None
    lock = path.parent / f"{name}.lock"
    size, linked = footprint(path, seen)
    if kind in _MARKERS:
        marker = path / _MARKERS[kind]
        complete = marker.is_file()
        used = _mtime(marker) if complete else _mtime(path)
        label = _unit_label(marker) if kind == "unit" and complete else ""
        return Entry(kind, name, path, size, used, lock, complete, label=label, linked=linked)
    label = _label(kind, path)
    return Entry(kind, name, path, size, _last_used_tree(path), lock, label=label, linked=linked)


def _label(kind: str, path: Path) -> str:
    """A git store's URL or a wheel dir's file name, best effort (display only)."""
    try:
        if kind == "git":
            return (path / GIT_URL_MARKER).read_text(encoding="utf-8").strip()[:200]
        return ", ".join(sorted(p.name for p in path.iterdir()))[:200]
    except (OSError, UnicodeDecodeError):
        return ""


def _unit_label(marker: Path) -> str:
    """A sweep unit's experiment, release and when it was observed, best effort (display only:
    a sweep trusts none of it, it checks the unit itself)."""
    try:
        if marker.is_symlink() or marker.stat().st_size > 4096:
            return ""
        doc = json.loads(marker.read_text(encoding="utf-8"))
        return " ".join(str(doc[k]) for k in ("experiment", "release", "observed_utc"))[:200]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return ""


def _mtime(path: Path) -> float:
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return 0.0


def _last_used_tree(path: Path) -> float:
    """A git store or wheel dir: the newest mtime of the dir and its direct children."""
    times = [_mtime(path)]
    with contextlib.suppress(OSError):
        times += [_mtime(child) for child in path.iterdir()]
    return max(times)


def tree_size(path: Path) -> int:
    """Bytes under ``path`` (lstat, symlinks not followed; vanishing files ignored; a file
    hard-linked twice under it counted once)."""
    return footprint(path, set())[0]


def footprint(path: Path, seen: set[tuple[int, int]]) -> tuple[int, int]:
    """(bytes under ``path`` not yet in ``seen``, bytes of files already in it): each file
    with more than one link is added to ``seen`` by (st_dev, st_ino), so that it is counted
    once however many entries link it."""
    if path.is_symlink() or path.is_file():
        return _count(os.lstat(path), seen)
    counted = linked = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            new, old = _count(st, seen)
            counted, linked = counted + new, linked + old
    return counted, linked


def _count(st: os.stat_result, seen: set[tuple[int, int]]) -> tuple[int, int]:
    if st.st_nlink < 2:
        return st.st_size, 0
    key = (st.st_dev, st.st_ino)
    if key in seen:
        return 0, st.st_size
    seen.add(key)
    return st.st_size, 0


# --- pruning -----------------------------------------------------------------------------


def select(entries: list[Entry], *, older_than_days: float | None, everything: bool, now: float) -> list[Entry]:
    """Leftovers (partial, trash, incomplete envs) always; complete entries by age or --all."""
    if older_than_days is not None and older_than_days < 0:
        raise UsageError(f"--older-than must be >= 0 days, not {older_than_days}")
    chosen = []
    for entry in entries:
        leftover = entry.kind in ("partial", "trash") or not entry.complete
        old = older_than_days is not None and now - entry.last_used >= older_than_days * DAY_S
        if leftover or everything or old:
            chosen.append(entry)
    return chosen


def prune(
    root: Path,
    *,
    older_than_days: float | None = None,
    everything: bool = False,
    dry_run: bool = False,
    now: float | None = None,
    kinds: tuple[str, ...] = (),
) -> list[Outcome]:
    """Remove the selected entries that nobody is using; one Outcome per selected entry.
    ``kinds``: only entries of these kinds, and the leftovers in their directories (none: all)."""
    now = time.time() if now is None else now
    root = Path(root)
    entries = [e for e in scan(root) if not kinds or kind_of(e) in kinds]
    entries = select(entries, older_than_days=older_than_days, everything=everything, now=now)
    return [_prune_one(root, entry, dry_run, now) for entry in entries]


def _prune_one(root: Path, entry: Entry, dry_run: bool, now: float) -> Outcome:
    if not _inside(root, entry.path):
        return Outcome(entry, "skipped", "outside the cache root")
    if entry.kind == "partial" and now - entry.last_used < PARTIAL_GRACE_S:
        owner = build_lock(entry.path)
        if owner is not None:  # an env build: whoever builds holds the env's lock
            return _prune_stale_build(entry, owner, dry_run)
        minutes = max(0, int((now - entry.last_used) // 60))
        return Outcome(entry, "skipped", f"work in progress (started {minutes} min ago)")
    if entry.lock is None:
        return _remove(entry, dry_run)
    lock = FileLock(str(entry.lock), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        return Outcome(entry, "skipped", "in use (its lock is held)")
    except OSError as exc:  # a lock planted as a symlink or a directory: skip it, prune the rest
        return Outcome(entry, "skipped", f"its lock cannot be taken ({exc.strerror or exc})")
    try:
        if entry.kind in _LEASED and _leased(entry.path):
            return Outcome(entry, "skipped", _LEASED[entry.kind])
        outcome = _remove(entry, dry_run)
        if entry.kind in _LEASED and not dry_run:
            _rmdir_quietly(entry.path.parent / f"{entry.path.name}.users")
        return outcome
    finally:
        lock.release()


def kind_of(entry: Entry) -> str:
    """The kind an entry belongs to: a leftover's is its directory's (``units/.build-*``: unit)."""
    if entry.kind not in ("partial", "trash"):
        return entry.kind
    return {d: k for k, d in KIND_DIRS.items()}.get(entry.path.parent.name, entry.kind)


def counts(entries: list[Entry]) -> dict[str, int]:
    """How many complete entries of each kind (`cache ls`: how many sweep units are kept)."""
    found: dict[str, int] = {}
    for entry in entries:
        if entry.complete:
            found[entry.kind] = found.get(entry.kind, 0) + 1
    return dict(sorted(found.items()))


def build_lock(path: Path) -> Path | None:
    """The lock an env build holds while it fills ``path`` (``envs/.build-<env>-<random>``,
    kvprobe.env.venv): ``envs/<env>.lock``; None for any other partial entry."""
    name = path.name
    if path.parent.name != KIND_DIRS["env"] or not name.startswith(".build-") or "-" not in name[7:]:
        return None
    return path.parent / f"{name[len('.build-') :].rsplit('-', 1)[0]}.lock"


def stale_builds(root: Path) -> list[Path]:
    """The env builds in ``root`` whose builder is gone (its lock is free): a build killed
    before it could remove its directory (SIGKILL, a power cut)."""
    envs = Path(root) / KIND_DIRS["env"]
    if envs.is_symlink() or not envs.is_dir():
        return []
    stale = []
    for path in sorted(envs.glob(".build-*")):
        lock = build_lock(path)
        if lock is not None and _lock_free(lock):
            stale.append(path)
    return stale


def _lock_free(path: Path) -> bool:
    lock = FileLock(str(path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        return False
    lock.release()
    return True


def _prune_stale_build(entry: Entry, owner: Path, dry_run: bool) -> Outcome:
    """A partial env build is removed, however young, once its builder is gone: under the
    env's lock, which its builder held for as long as it lived."""
    lock = FileLock(str(owner), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        return Outcome(entry, "skipped", "work in progress (an env build holds its lock)")
    try:
        return _remove(entry, dry_run)
    finally:
        lock.release()


def _inside(root: Path, path: Path) -> bool:
    """``path`` lies in ``root`` without passing through a symlink (its own name may be one)."""
    real_root, parent = os.path.realpath(root), os.path.realpath(path.parent)
    return parent == real_root or parent.startswith(real_root + os.sep)  # uv/ sits in the root itself


_LEASED = {
    "env": "in use by a run in progress or a kept fork server (kvprobe cache servers)",
    "tree": "in use by a run in progress",
    "uv": "in use by an env build in progress",
}


@contextlib.contextmanager
def lease(path: Path) -> Iterator[None]:
    """Hold ``<name>.users/<unique>.lock`` beside ``path`` while using it: prune skips a
    leased env, tree or uv cache. Take it under the entry's lock, as prune checks under it."""
    held = lease_file(path)
    lock = FileLock(str(held))
    lock.acquire()
    try:
        yield
    finally:
        lock.release()
        held.unlink(missing_ok=True)


def lease_file(path: Path) -> Path:
    """A new lease's file beside ``path``: whoever holds a lock on it (flock) holds the lease,
    as a kept fork server does on its env for as long as it lives."""
    users = path.parent / f"{path.name}.users"
    users.mkdir(exist_ok=True)
    return users / f"{os.getpid()}-{uuid.uuid4().hex[:12]}.lock"


def _leased(path: Path) -> bool:
    """True if a run holds a lease on the env (an env build on uv's cache); stale leases
    (lockable) are cleared."""
    users = path.parent / f"{path.name}.users"
    if users.is_symlink() or not users.is_dir():
        return False
    held = False
    for lease in sorted(users.glob("*.lock")):  # every one: a live lease listed first hid the stale
        probe = FileLock(str(lease), timeout=0)
        try:
            probe.acquire()
        except Timeout:
            held = True
            continue
        probe.release()
        lease.unlink(missing_ok=True)
    return held


def _rmdir_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()  # only if empty: leases are created under the env lock we hold


def _remove(entry: Entry, dry_run: bool) -> Outcome:
    """Rename to a trash name in the same directory (atomic), then delete the trash."""
    if dry_run:
        return Outcome(entry, "would-delete")
    trash = entry.path
    if entry.kind != "trash":
        trash = entry.path.with_name(f"{TRASH_PREFIX}{entry.path.name}-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(entry.path, trash)
        except FileNotFoundError:
            return Outcome(entry, "skipped", "already gone")
    _delete(trash)
    return Outcome(entry, "deleted")


def _delete(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        for dirpath, _dirs, _files in os.walk(path):  # a frozen tree's dirs are read-only
            os.chmod(dirpath, 0o755)
        shutil.rmtree(path, ignore_errors=True)  # rmtree never follows symlinks


def total_size(entries: list[Entry] | Iterator[Entry]) -> int:
    return sum(e.size for e in entries)


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"

"""Sweep units kept in the kvprobe cache, so that no sweep observes the same thing twice.

A unit (one experiment on one release, run/sweep_unit) that the driver accepted is kept as
the packed one-release bundle it came back as, under a key made of everything that decides
its observations (:func:`key_facts`). A later sweep that needs the same unit takes it from
the cache and hands it to the same :func:`~kvprobe.run.sweep_unit.accept_unit` a unit from
a Ray worker goes through: the cache is untrusted input. A cached unit that is refused is
removed, the reason goes to stderr, and the release is observed again.

Units are kept as they are accepted, so an interrupted sweep resumes from its finished
units; a new release on the index is the only unit a repeated sweep runs. ``--no-reuse``
observes every release again and still keeps what it observed.

Layout (kvprobe.env.cache lists and prunes it)::

    units/<exp>-<version>-<key>/unit.tar.gz         the unit's packed bundle, byte for byte
    units/<exp>-<version>-<key>/kvprobe-unit.json   written last: the entry is complete
    units/<exp>-<version>-<key>.lock                held while the entry is read or written

Only a unit that observed is kept: its wheel was had, every probe ran and wrote its output
(a probe that crashed or timed out may not do so next time), and repeated, every case read
the same in each run. Local units are looked up by the driver's env;
Ray units, which run fresh, by the env the driver's own cache holds for the profile (a worker
on the same kind of host builds the same), and kept keyed by the env they ran in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import stat
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from filelock import FileLock

from kvprobe import __version__
from kvprobe.env.cache import TRASH_PREFIX, UNIT_MARKER
from kvprobe.experiments.experiment import bundled_files
from kvprobe.files import json_bytes, sha256_file, write_atomic
from kvprobe.model.receipt import EnvRecord
from kvprobe.model.records import Experiment
from kvprobe.model.sweep_receipt import ReleaseRecord, ReusedUnit, SweepReceipt
from kvprobe.names import LOGS_DIR, MANIFEST, RAW_DIR
from kvprobe.progress import Reporter
from kvprobe.resources import probe_api_dir
from kvprobe.rules import sweep_classification as classify
from kvprobe.run.sweep_unit import Expected, UnitOutcome, UnitRequest, accept_unit

MARKER = UNIT_MARKER
ARCHIVE = "unit.tar.gz"
KEY_FORMAT = "kvprobe.unit-key/1"  # bump when what decides a unit's observations changes
MARKER_SCHEMA = "kvprobe.unit-cache/1"  # the marker's own format: display only, never trusted
# A unit's packed bundle is tens to hundreds of KiB; a cache entry past this is not read.
MAX_UNIT_BYTES = 64 << 20
# A sweep holds an entry's lock to read or write one archive (milliseconds). A lock held past
# this is held by something else (a stuck process, whoever can write the cache): the wait
# ends with filelock.Timeout, an OSError, which costs reuse (or keeping), never the sweep.
LOCK_TIMEOUT_S = 10.0


@functools.cache
def probe_api_sha256() -> str:
    """One digest of the code that runs inside every probe process (kvprobe/probe_api): this
    process's own installed files, hashed once."""
    files = sorted(p for p in probe_api_dir().glob("*.py") if p.is_file())
    return hashlib.sha256(json_bytes({p.name: sha256_file(p) for p in files})).hexdigest()


def experiment_files_sha256(exp: Experiment) -> dict[str, str]:
    """Each file a bundle carries of ``exp`` (experiment.toml, the probes and their helpers)."""
    return {p.name: sha256_file(p) for p in bundled_files(exp.directory)}


def key_facts(
    exp: Experiment,
    request: UnitRequest,
    env: EnvRecord,
    settings: Mapping[str, str],
    mode: str,
    repeat: int = 1,
    files: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Everything that decides what a unit records: the experiment and its files, the wheel,
    the env (its lock and interpreter), the profile's settings, kvprobe and the probe API,
    the platform, and the request's own fields (the per-probe timeout, a repeat count, and
    whatever a later request carries) but where the worker's cache lives; ``mode``: how the
    probes run ("forked" from a preloaded server, or "fresh"); ``files``: the experiment's
    files' digests when the caller has them (:func:`experiment_files_sha256`)."""
    asked = {f.name: getattr(request, f.name) for f in dataclasses.fields(request) if f.name != "cache_root"}
    return {
        "format": KEY_FORMAT,
        "kvprobe": __version__,
        "probe_api": probe_api_sha256(),
        "algorithm": classify.ALGORITHM,
        "experiment": {"id": exp.id, "sha256": exp.file_sha256, "files": dict(files or experiment_files_sha256(exp))},
        "request": json.loads(json.dumps(asked, default=_plain, sort_keys=True)),
        "env": {
            "key": env.key,
            "python": env.python,
            "profile": env.profile,
            "lock_sha256": env.lock_sha256,
            "torch_index": env.torch_index,
        },
        "settings": dict(sorted(settings.items())),
        "platform": {"system": platform.system(), "machine": platform.machine()},
        "probes_run": mode,
        "repeat": repeat,
    }


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def entry_name(facts: Mapping[str, Any]) -> str:
    """``<experiment>-<version>-<sha256 of the facts, 32 hex>``: readable in `cache ls`."""
    digest = hashlib.sha256(json_bytes(facts)).hexdigest()[:32]
    return f"{_entry_prefix(facts['experiment']['id'], str(facts['request']['pin']['version']))}{digest}"


def _entry_prefix(experiment: str, version: str) -> str:
    return f"{experiment}-{re.sub(r'[^A-Za-z0-9.+!-]', '_', version)}-"


def keepable(entry: ReleaseRecord) -> bool:
    """A unit worth keeping: its wheel was had and every probe ran and wrote its output, in
    every run (`sweep --repeat N`), and no case differed between those runs (an unstable
    reading is observed again by the next sweep, never handed back to it)."""
    return (
        entry.wheel is not None
        and not entry.classification.unstable
        and entry.problem is None
        and bool(entry.probes)
        and all(p.problem is None and p.raw is not None for p in entry.probes)
        and all(r.problem is None and r.raw is not None for p in entry.probes for r in p.repeats or ())
    )


def ran_as(entry: ReleaseRecord) -> str:
    """How a unit's probes ran, as its own record says: "forked" when every one was forked
    from a preloaded server, else "fresh" (a server that did not start, a Ray worker)."""
    modes = {p.mode for p in entry.execution.probes} if entry.execution else set()
    return "forked" if modes == {"forked"} else "fresh"


def _a_time(text: str) -> bool:
    try:
        datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return False
    return True


class UnitStore:
    """``cache_root/units``: one packed unit per entry name, written atomically under its lock."""

    def __init__(self, cache_root: Path) -> None:
        self.root = cache_root / "units"

    def _lock(self, name: str) -> FileLock:
        self.root.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.root / f"{name}.lock"), timeout=LOCK_TIMEOUT_S)

    def read(self, name: str) -> bytes | str | None:
        """The entry's archive; None when there is no complete entry; a string saying why the
        entry cannot be read (a symlink, not a regular file, too large)."""
        entry = self.root / name
        if not (entry / MARKER).exists() and not (entry / MARKER).is_symlink():
            return None
        with self._lock(name):
            try:
                if entry.is_symlink() or not entry.is_dir():
                    return "the entry is not a directory"
                fd = os.open(entry / ARCHIVE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as exc:
                return f"{ARCHIVE}: {exc.strerror or exc}"
            with os.fdopen(fd, "rb") as handle:
                info = os.fstat(handle.fileno())
                if not stat.S_ISREG(info.st_mode):
                    return f"{ARCHIVE} is not a regular file"
                if info.st_size > MAX_UNIT_BYTES:
                    return f"{ARCHIVE} holds {info.st_size} bytes > {MAX_UNIT_BYTES}"
                data = handle.read(MAX_UNIT_BYTES + 1)
            if len(data) > MAX_UNIT_BYTES:
                return f"{ARCHIVE} holds more than {MAX_UNIT_BYTES} bytes"
            with contextlib.suppress(OSError):  # last used, for `cache ls` / `prune --older-than`
                os.utime(entry / MARKER, follow_symlinks=False)
            return data

    def write(self, name: str, archive: bytes, about: Mapping[str, Any]) -> None:
        """Keep ``archive`` as entry ``name`` (replacing one there): built beside it, renamed
        into place whole, the marker written last inside it."""
        if len(archive) > MAX_UNIT_BYTES:
            return
        with self._lock(name):
            build = Path(tempfile.mkdtemp(dir=self.root, prefix=f".build-{name}-"))
            try:
                write_atomic(build / ARCHIVE, archive)
                write_atomic(build / MARKER, json_bytes({"schema": MARKER_SCHEMA, **about}))
                self._remove(name)
                os.rename(build, self.root / name)
            except BaseException:
                shutil.rmtree(build, ignore_errors=True)
                raise

    def discard(self, name: str) -> None:
        with self._lock(name):
            self._remove(name)

    def _remove(self, name: str) -> None:
        """Renamed to a trash name first (no reader sees half an entry), then deleted."""
        entry = self.root / name
        if not entry.exists() and not entry.is_symlink():
            return
        trash = self.root / f"{TRASH_PREFIX}{name}-{uuid.uuid4().hex[:8]}"
        os.rename(entry, trash)
        if trash.is_symlink() or not trash.is_dir():
            trash.unlink()
        else:
            shutil.rmtree(trash, ignore_errors=True)


class SweepUnits:
    """One sweep's use of the unit cache: each cached unit it needs, reused after the driver's
    checks; each unit it accepts, kept as it is accepted.

    ``settings``: the profile's environment for probes; ``mode``: "forked" or "fresh";
    ``reuse``: False observes every release again (what it observes is still kept)."""

    def __init__(
        self,
        exp: Experiment,
        cache_root: Path,
        settings: Mapping[str, str],
        mode: str,
        *,
        repeat: int = 1,
        reuse: bool = True,
        reporter: Reporter | None = None,
        began: str | None = None,
    ) -> None:
        self.exp = exp
        self.files = experiment_files_sha256(exp)  # the bytes this sweep runs and bundles, read once
        self.store = UnitStore(cache_root)
        self.settings = dict(settings)
        self.mode = mode
        self.repeat = repeat
        self.reuse_units = reuse
        self.reporter = reporter or Reporter()
        self.began = began  # the sweep's created_utc: verify refuses a unit observed later
        self.reused: list[str] = []
        self.kept: list[str] = []

    def name(self, request: UnitRequest, env: EnvRecord, mode: str | None = None) -> str:
        """The entry of ``request``'s unit run in ``env``, its probes run as ``mode`` (None: as
        this sweep asks for them)."""
        facts = key_facts(self.exp, request, env, self.settings, mode or self.mode, self.repeat, self.files)
        return entry_name(facts)

    def holds(self, request: UnitRequest, env: EnvRecord) -> bool:
        """Whether a complete entry for ``request`` is there to be checked and reused (reuse on):
        the units run ahead of the sweep, release by release, leave such a unit to it."""
        if not self.reuse_units:
            return False
        with contextlib.suppress(OSError):
            return (self.store.root / self.name(request, env) / MARKER).is_file()
        return False

    def may_hold_all(self, versions: Sequence[str]) -> bool:
        """Whether the cache has a complete entry of this experiment for every one of
        ``versions`` (reuse on), before their wheels are resolved: False means some unit will
        run (its fork server can start now); True only that each entry is to be looked up by
        its key, which needs the wheel (:meth:`holds`)."""
        if not self.reuse_units:
            return False
        try:
            names = {p.parent.name for p in self.store.root.glob(f"*/{MARKER}")}
        except OSError:
            return False
        return all(any(n.startswith(_entry_prefix(self.exp.id, v)) for n in names) for v in versions)

    def reuse(self, request: UnitRequest, expected: Expected, work: Path) -> ReleaseRecord | None:
        """The release's entry from a cached unit that passes :func:`accept_unit` (its raw
        outputs merged into the sweep), or None: nothing cached, reuse is off, the env is not
        known yet (Ray), or the cached unit was refused (removed; the reason on stderr)."""
        if not self.reuse_units or expected.env is None:
            return None
        name = self.name(request, expected.env)
        version = request.pin.version
        try:
            archive = self.store.read(name)
        except OSError as exc:  # a cache that cannot be read costs reuse, not the sweep
            self.reporter.note(f"{version}: the unit cache could not be read ({exc}); observing it")
            return None
        if archive is None:
            return None
        if isinstance(archive, str):
            self._refused(name, expected, version, f"unreadable: {archive}")
            return None
        seen: list[ReusedUnit] = []  # what the unit was, once accept_unit accepted it

        def accepted(root: Path, unit: SweepReceipt) -> None:
            seen.append(ReusedUnit(unit.created_utc, sha256_file(root / MANIFEST)))

        entry, _env = accept_unit(UnitOutcome(request, archive), expected, work, accepted)
        if not seen:
            self._refused(name, expected, version, entry.problem or "refused")
            return None
        if not keepable(entry):  # kvprobe keeps none such: this entry was made by hand
            self._refused(name, expected, version, "it is not a unit kvprobe keeps (a probe did not run)")
            return None
        observed = seen[0].observed_utc
        if not _a_time(observed):
            self._refused(name, expected, version, f"observed at {observed}: not a time")
            return None
        if self.began is not None and observed > self.began:  # text order is time order (one format)
            # kept since this sweep began (another sweep's, or planted): the claim would not verify
            self._refused(name, expected, version, f"observed at {observed}, after this sweep began")
            return None
        self.reused.append(version)
        return dataclasses.replace(entry, reused=seen[0])

    def _refused(self, name: str, expected: Expected, version: str, why: str) -> None:
        for top in (RAW_DIR, LOGS_DIR):  # whatever of it was merged leaves with it
            shutil.rmtree(expected.staging / top / version, ignore_errors=True)
        with contextlib.suppress(OSError):  # the unit observed again replaces it anyway
            self.store.discard(name)
        self.reporter.note(f"{version}: the cached unit was refused ({why}); observing it again")
        return None

    def keep(self, outcome: UnitOutcome, root: Path, unit: SweepReceipt) -> None:
        """Keep an accepted unit (``accept_unit``'s ``accepted`` hook): the archive as it came
        back, keyed by the env it ran in and how its probes ran."""
        entry = unit.releases[0]
        if outcome.archive is None or unit.env is None or not keepable(entry):
            return
        try:
            about = {
                "experiment": self.exp.id,
                "release": entry.version,
                "observed_utc": unit.created_utc,
                "unit_manifest_sha256": sha256_file(root / MANIFEST),
                "kept_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
            self.store.write(self.name(outcome.request, unit.env, ran_as(entry)), outcome.archive, about)
        except OSError as exc:  # a cache that cannot be written costs reuse, not the sweep
            self.reporter.note(f"{entry.version}: the unit could not be kept in the cache: {exc}")
            return
        self.kept.append(entry.version)

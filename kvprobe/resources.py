"""Where kvprobe's data lives: schemas/, probes/ and the probe API directory.

From a wheel they sit under ``kvprobe/_data`` (hatch force-include); from a checkout
or an editable install they are the repository's top-level folders.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_BUILTIN_ONLY: ContextVar[bool] = ContextVar("kvprobe_builtin_only", default=False)


def _data_dir(name: str) -> Path:
    installed = _PACKAGE / "_data" / name
    return installed if installed.is_dir() else _PACKAGE.parent / name


def schemas_dir() -> Path:
    return _data_dir("schemas")


def builtin_probes_dir() -> Path:
    return _data_dir("probes")


def probe_api_dir() -> Path:
    """Put on PYTHONPATH inside target envs: stdlib-only helpers for probes and pytest."""
    return _PACKAGE / "probe_api"


@contextmanager
def builtin_search_path() -> Iterator[None]:
    """Inside it, experiments and profiles come from kvprobe's own probes/ only: a rerun must
    not pick up a bundle's (or the current directory's) ./probes as if it were trusted."""
    token = _BUILTIN_ONLY.set(True)
    try:
        yield
    finally:
        _BUILTIN_ONLY.reset(token)


# Where an experiment folder comes from, as `list`, `show` and the receipt name it.
SOURCE_ENV, SOURCE_LOCAL, SOURCE_BUILTIN = "KVPROBE_PROBES_PATH", "./probes", "built-in"


def experiment_search_path() -> list[tuple[Path, str]]:
    """Search order, each folder with its source: $KVPROBE_PROBES_PATH entries, ./probes of
    a project, built-ins. A folder reached twice keeps its first (higher) place; the
    built-in folder is named built-in however it is reached (a checkout's ./probes is it)."""
    if _BUILTIN_ONLY.get():
        return [(builtin_probes_dir().resolve(), SOURCE_BUILTIN)]
    dirs = [(d, SOURCE_ENV) for d in _probes_path()[0]]
    local = Path.cwd() / "probes"
    if local.is_dir():
        dirs.append((local, SOURCE_LOCAL))
    dirs.append((builtin_probes_dir(), SOURCE_BUILTIN))
    builtin = builtin_probes_dir().resolve()
    unique: dict[Path, str] = {}
    for d, source in dirs:
        resolved = d.resolve()
        unique.setdefault(resolved, SOURCE_BUILTIN if resolved == builtin else source)
    return list(unique.items())


def _probes_path() -> tuple[list[Path], list[tuple[str, str]]]:
    """$KVPROBE_PROBES_PATH's entries kvprobe can search, and those it cannot, with why: a
    folder it may not list or look into, a symlink loop, a name too long, not a folder. An
    entry that does not exist is left out silently (nothing to find there)."""
    usable, skipped = [], []
    for entry in os.environ.get("KVPROBE_PROBES_PATH", "").split(os.pathsep):
        if not entry:
            continue
        try:
            os.listdir(entry)  # lists it: a folder this user may read
            with contextlib.suppress(FileNotFoundError):
                os.stat(os.path.join(entry, ".kvprobe-lookup"))  # may look names up in it
        except FileNotFoundError:
            continue
        except NotADirectoryError:
            skipped.append((entry, "not a directory"))
            continue
        except OSError as exc:
            skipped.append((entry, exc.strerror or str(exc)))
            continue
        usable.append(Path(entry))
    return usable, skipped


def probes_path_skipped() -> list[tuple[str, str]]:
    """The $KVPROBE_PROBES_PATH entries left out of the search, with why (the CLI warns)."""
    return [] if _BUILTIN_ONLY.get() else _probes_path()[1]


def experiment_dirs() -> list[Path]:
    """Search order: $KVPROBE_PROBES_PATH entries, ./probes of a project, built-ins."""
    return [d for d, _ in experiment_search_path()]

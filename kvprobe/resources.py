"""Where kvprobe's data lives: schemas/, probes/ and the probe API directory.

From a wheel they sit under ``kvprobe/_data`` (hatch force-include); from a checkout
or an editable install they are the repository's top-level folders.
"""

from __future__ import annotations

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


def experiment_dirs() -> list[Path]:
    """Search order: $KVPROBE_PROBES_PATH entries, ./probes of a project, built-ins."""
    if _BUILTIN_ONLY.get():
        return [builtin_probes_dir().resolve()]
    dirs = [Path(p) for p in os.environ.get("KVPROBE_PROBES_PATH", "").split(os.pathsep) if p]
    local = Path.cwd() / "probes"
    if local.is_dir():
        dirs.append(local)
    dirs.append(builtin_probes_dir())
    unique: list[Path] = []
    for d in dirs:
        resolved = d.resolve()
        if resolved not in unique:
            unique.append(resolved)
    return unique

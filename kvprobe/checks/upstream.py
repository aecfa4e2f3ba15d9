"""Run an upstream pytest file in a target env and read per-test outcomes from pytest itself.

Outcomes come from pytest's own report objects, recorded inside the target interpreter by
``probe_api/kvprobe_pytest_report.py`` (schema ``kvprobe.pytest-report/1``), never from
log text. The runner adds a ``runner`` block (exit code, timeout, where the report came
from) to that document, so :func:`results_from_report` can re-derive every result,
including timeouts and crashes, from the one JSON file on disk.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import tempfile
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path, PurePosixPath
from typing import Any

from kvprobe import proc
from kvprobe.checks.forkserver import Execution, ForkServer, run_check
from kvprobe.errors import CheckRunError, SchemaError, UsageError
from kvprobe.files import write_atomic
from kvprobe.model.records import TestResult
from kvprobe.names import PYTEST_REPORT_SCHEMA
from kvprobe.resources import probe_api_dir
from kvprobe.rules.pytest_results import check_report_schema, count_results, failure_kinds, results_from_report
from kvprobe.strict_json import load_document

REPORT_ENV = "KVPROBE_PYTEST_REPORT"
PLUGIN_MODULE = "kvprobe_pytest_report"
# Deterministic SGLang test behaviour: no retries (CustomTestCase), not "in CI".
PINNED_ENV = {
    "SGLANG_TEST_MAX_RETRY": "0",
    "SGLANG_IS_IN_CI": "false",
    "PYTHONDONTWRITEBYTECODE": "1",
}
_OWNED_ENV = ("PYTHONPATH", "HOME", REPORT_ENV)


class Overlay(str, Enum):
    """What head's test file did to the base tree."""

    REPLACED = "replaced"  # a different file was there
    IDENTICAL = "identical"  # the same bytes were there
    ADDED = "added"  # absent at this tree (the PR added it)


@dataclass(frozen=True)
class TestFileRun:
    """One upstream test file run on one side."""

    __test__ = False  # not a pytest test class

    path: str
    exit_code: int
    pytest_exit: int | None
    timed_out: bool
    results: tuple[TestResult, ...]
    overlay: str
    report_path: Path
    junit_path: Path | None
    stdout_path: Path
    stderr_path: Path
    duration_s: float
    counts: Mapping[str, int]
    rootdir: Path
    inifile: Path | None
    argv: tuple[str, ...]
    env_pinned: Mapping[str, str]
    execution: Execution  # fresh or forked, and why fresh when a server was there

    def failure_kinds(self) -> dict[str, int]:
        """E.g. {"assertion": 0, "AttributeError": 6, "ValueError": 1}."""
        return failure_kinds(self.results)


# --------------------------------------------------------------------------- running


def run_test_file(
    *,
    python: Path,
    tree: Path,
    rootdir_hint: str | None,
    test_rel: str,
    head_test_bytes: bytes,
    python_path: list[Path],
    out_dir: Path,
    log_dir: Path,
    timeout_s: float,
    env_extra: dict[str, str],
    server: ForkServer | None = None,
) -> TestFileRun:
    """Overlay head's test file into ``tree`` and run it with pytest in ``python`` (or in a
    child of ``server``'s preloaded ``python``).

    Failing tests, collection errors, timeouts and crashes are results, not exceptions.
    Raises UsageError for a bad ``test_rel``/``env_extra``, CheckRunError when the file
    cannot be placed in the tree or the fork server fails, ObserveError when the
    interpreter cannot start.
    """
    env_pinned = {**PINNED_ENV, **_checked_extra(env_extra)}
    target, overlay = overlay_test_file(tree, test_rel, head_test_bytes)
    rootdir, inifile = pytest_rootdir(tree, target, rootdir_hint)
    name = artifact_name(test_rel)
    out_dir.mkdir(parents=True, exist_ok=True)
    report_path = out_dir / f"{name}.pytest-report.json"
    junit_path = out_dir / f"{name}.junit.xml"
    _remove_stale(report_path, Path(f"{report_path}.journal"), junit_path)
    file_nodeid = Path(os.path.relpath(target, rootdir)).as_posix()
    argv = _pytest_argv(python, tree, rootdir, inifile, junit_path, file_nodeid)
    with tempfile.TemporaryDirectory(prefix="kvprobe-home-") as home:
        env = proc.clean_env(
            {
                **env_pinned,
                "PYTHONPATH": os.pathsep.join(_python_path(python_path)),
                REPORT_ENV: str(report_path),
            },
            home=Path(home),
        )
        stdout, stderr = log_dir / f"{name}.stdout", log_dir / f"{name}.stderr"
        result = run_check(
            argv,
            server=server,
            path=[Path(p) for p in _python_path(python_path)],
            env=env,
            cwd=rootdir,
            timeout_s=timeout_s,
            stdout_path=stdout,
            stderr_path=stderr,
            reset=lambda: _remove_stale(report_path, Path(f"{report_path}.journal"), junit_path),
        )
    doc = finalize_report(report_path, result, file_nodeid=file_nodeid, timeout_s=timeout_s)
    results = tuple(results_from_report(doc))
    return TestFileRun(
        path=test_rel,
        exit_code=result.returncode,
        pytest_exit=doc.get("exitstatus"),
        timed_out=result.timed_out,
        results=results,
        overlay=overlay.value,
        report_path=report_path,
        junit_path=junit_path if junit_path.exists() else None,
        stdout_path=result.stdout_path,
        stderr_path=result.stderr_path,
        duration_s=result.duration_s,
        counts=count_results(results),
        rootdir=rootdir,
        inifile=inifile,
        argv=result.argv,
        env_pinned=env_pinned,
        execution=result.execution,
    )


def overlay_test_file(tree: Path, test_rel: str, content: bytes) -> tuple[Path, Overlay]:
    """Write ``content`` at ``tree/test_rel`` (atomically, never through a symlink).

    Raises UsageError for a path that is absolute, climbs out or is not a .py file;
    CheckRunError when the tree would be left through a symlink or the path is a dir.
    """
    rel = PurePosixPath(test_rel)
    if rel.is_absolute() or ".." in rel.parts or rel.suffix != ".py" or "\\" in test_rel:
        raise UsageError(f"test path {test_rel!r} must be a relative POSIX path to a .py file")
    target = tree.joinpath(*rel.parts)
    _ensure_inside(tree, target.parent)
    target.parent.mkdir(parents=True, exist_ok=True)
    _ensure_inside(tree, target.parent)
    if target.is_dir():
        raise CheckRunError(f"test path {test_rel!r} is a directory in {tree}")
    before = target.read_bytes() if target.is_file() else None
    if before == content and not target.is_symlink():
        return target, Overlay.IDENTICAL
    write_atomic(target, content)
    if before is None:
        return target, Overlay.ADDED
    return target, Overlay.IDENTICAL if before == content else Overlay.REPLACED


def _ensure_inside(tree: Path, directory: Path) -> None:
    """Raise CheckRunError if the deepest existing part of ``directory`` leaves ``tree``."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.resolve().is_relative_to(tree.resolve()):
        raise CheckRunError(f"{directory} leaves the source tree {tree} (symlink?)")


def pytest_rootdir(tree: Path, target: Path, hint: str | None = None) -> tuple[Path, Path | None]:
    """The directory pytest should run from and the config file that makes it the rootdir.

    ``hint`` (a directory relative to ``tree``) wins; else the nearest directory above the
    test file, within the tree, holding a pytest config; else the tree root (no config).
    """
    if hint:
        rootdir = tree.joinpath(*PurePosixPath(hint).parts)
        _ensure_inside(tree, rootdir)
        return rootdir, _config_in(rootdir)
    directory = target.parent
    while True:
        inifile = _config_in(directory)
        if inifile or directory == tree or directory == directory.parent:
            return directory, inifile
        directory = directory.parent


def _config_in(directory: Path) -> Path | None:
    """The file in ``directory`` that pytest would take as its config, if any."""
    for name in ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini"):
        if (directory / name).is_file():
            return directory / name
    checks = (
        ("pyproject.toml", _pyproject_has_pytest),
        ("tox.ini", _ini_has("pytest")),
        ("setup.cfg", _ini_has("tool:pytest")),
    )
    for name, has_pytest in checks:
        if (directory / name).is_file() and has_pytest(directory / name):
            return directory / name
    return None


def _pyproject_has_pytest(path: Path) -> bool:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    return isinstance(data.get("tool"), dict) and "pytest" in data["tool"]


def _ini_has(section: str) -> Callable[[Path], bool]:
    def check(path: Path) -> bool:
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(path, encoding="utf-8")
        except (OSError, UnicodeDecodeError, configparser.Error):
            return False
        return parser.has_section(section)

    return check


def artifact_name(test_rel: str) -> str:
    """A flat, safe file stem for a test path: a/b/test_x.py -> a__b__test_x."""
    stem = test_rel[:-3] if test_rel.endswith(".py") else test_rel
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem.replace("/", "__")).strip("._") or "test"


def _pytest_argv(
    python: Path, tree: Path, rootdir: Path, inifile: Path | None, junit_path: Path, file_nodeid: str
) -> list[str]:
    """pytest pinned to our rootdir and config (``-c os.devnull`` stops a search above)."""
    argv = [
        str(python),
        "-m",
        "pytest",
        "-p",
        PLUGIN_MODULE,
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit_path}",
        "-q",
        f"--rootdir={rootdir}",
        "-c",
        str(inifile) if inifile else os.devnull,
    ]
    if inifile is None:
        argv.append(f"--confcutdir={tree}")
    return [*argv, file_nodeid]


def _checked_extra(env_extra: Mapping[str, str]) -> dict[str, str]:
    owned = sorted(set(env_extra) & set(_OWNED_ENV))
    if owned:
        raise UsageError(f"env_extra may not set {', '.join(owned)}: the runner owns them")
    return dict(env_extra)


def _python_path(entries: Iterable[Path]) -> list[str]:
    return [str(Path(p).absolute()) for p in entries] + [str(probe_api_dir())]


def _remove_stale(*paths: Path) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


# --------------------------------------------------------------------------- the report


def finalize_report(
    report_path: Path, result: proc.CommandResult, *, file_nodeid: str, timeout_s: float
) -> dict[str, Any]:
    """Load pytest's report (or rebuild a partial one from its journal), add the runner
    block, write it back atomically, and return it."""
    journal = Path(f"{report_path}.journal")
    doc, source = _load_complete(report_path), "pytest"
    if doc is None:
        doc, source = _from_journal(journal), "journal" if journal.exists() else "missing"
    doc["runner"] = {
        "returncode": result.returncode,
        "timed_out": result.timed_out,
        "timeout_s": timeout_s,
        "duration_s": round(result.duration_s, 3),
        "report_source": source,
        "file_nodeid": file_nodeid,
    }
    write_atomic(report_path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())
    journal.unlink(missing_ok=True)
    return doc


def load_report(path: Path) -> dict[str, Any]:
    """Read a report JSON; raises SchemaError on duplicate keys or an unknown schema."""
    doc = load_document(path.read_bytes(), str(path))
    check_report_schema(doc)
    return doc


def _load_complete(path: Path) -> dict[str, Any] | None:
    try:
        doc = load_report(path)
    except (OSError, ValueError, SchemaError):
        return None
    return doc if doc.get("complete") is True else None


def _from_journal(journal: Path) -> dict[str, Any]:
    """A partial report from the plugin's event journal; a torn last line is ignored."""
    doc: dict[str, Any] = {
        "schema": PYTEST_REPORT_SCHEMA,
        "complete": False,
        "exitstatus": None,
        "collected": None,
        "collection_errors": [],
        "tests": [],
        "running": None,
    }
    lines = journal.read_text(encoding="utf-8", errors="replace").splitlines() if journal.exists() else []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        _apply_event(doc, event.get("event"), event.get("data"))
    return doc


def _apply_event(doc: dict[str, Any], event: str | None, data: Any) -> None:
    if event == "meta" and isinstance(data, dict):
        doc.update({k: v for k, v in data.items() if k != "schema"})
    elif event == "collection_error":
        doc["collection_errors"].append(data)
    elif event == "collected":
        doc["collected"] = data
    elif event == "start":
        doc["running"] = data
    elif event == "finish":
        doc["running"] = None
    elif event == "test":
        doc["tests"].append(data)

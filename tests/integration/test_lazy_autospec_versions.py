"""The whole lazy-autospec comparison, on every CPython 3.10+ the machine has.

``tests/unit/probe_api/test_lazy_autospec.py`` compares a sample in the unit tier; run as a script it
compares every spec both ways. ``unittest.mock`` changes between CPython versions and a probe
runs under whatever interpreter the SGLang env was built with, so the script runs under this
test's interpreter (always) and under each other CPython 3.10-3.13 found on PATH or in pyenv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "unit" / "probe_api" / "test_lazy_autospec.py"
VERSIONS = ("3.10", "3.11", "3.12", "3.13")


def _interpreter(version: str) -> str | None:
    """pyenv's newest <version>, else a python<version> on PATH that is not a pyenv shim
    (a shim of a version pyenv does not select fails), else None."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = sorted(root.glob(f"{version}.*/bin/python{version}")) if root.is_dir() else []
    if candidates:
        return str(candidates[-1])
    found = shutil.which(f"python{version}")
    return found if found and "/shims/" not in found else None


def _interpreters() -> dict[str, str]:
    """{version: interpreter}; this test's own interpreter stands for its version."""
    own = f"{sys.version_info.major}.{sys.version_info.minor}"
    found = {v: p for v in VERSIONS if v != own and (p := _interpreter(v)) is not None}
    return {own: sys.executable, **found}


def test_the_whole_comparison_holds_on_each_cpython():
    interpreters = _interpreters()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    # all at once: each is one core's work for about half a minute
    running = {
        version: subprocess.Popen(
            [python, "-I", str(SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        for version, python in interpreters.items()
    }
    failed = {}
    for version, proc in running.items():
        out, _ = proc.communicate(timeout=600)
        if proc.returncode != 0 or "the lazy autospec matched create_autospec" not in out:
            failed[version] = out[-3000:]
    assert not failed, failed
    if len(interpreters) == 1:
        pytest.skip(f"only {next(iter(interpreters))} found: the comparison ran on this interpreter alone")

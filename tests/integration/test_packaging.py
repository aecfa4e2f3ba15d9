"""A non-editable install finds schemas/, probes/ and the probe API (not only a checkout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)],
        check=True,
        timeout=600,
    )
    (found,) = out.glob("kvprobe-*.whl")
    return found


def test_wheel_carries_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "kvprobe/_data/schemas/receipt.schema.json",
        "kvprobe/_data/schemas/experiment.schema.json",
        "kvprobe/_data/schemas/fix-markers.schema.json",
        "kvprobe/gates/fixmarkers.toml",
        "kvprobe/_data/probes/experiment-a/experiment.toml",
        "kvprobe/_data/probes/experiment-b/prefill_result_cleanup.py",
        "kvprobe/_data/probes/profiles/sglang-cpu.txt",
        "kvprobe/probe_api/kvprobe_probe.py",
        "kvprobe/probe_api/kvprobe_autospec.py",
        "kvprobe/probe_api/kvprobe_pytest_report.py",
    ):
        assert required in names, required
    assert not any(n.startswith("bundles/") or "/bundles/" in n for n in names)


def test_installed_tree_lists_experiments_from_anywhere(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("KVPROBE_PROBES_PATH", None)

    def python(*args: str) -> subprocess.CompletedProcess[str]:
        """The installed tree's kvprobe, run from a folder with no probes/ of its own."""
        return subprocess.run(
            [sys.executable, *args], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120
        )

    result = python("-m", "kvprobe", "list", "--json")
    assert result.returncode == 0, result.stderr
    assert {"experiment-a", "experiment-b", "model"} <= {e["id"] for e in json.loads(result.stdout)["experiments"]}
    where = python("-c", "import kvprobe.resources as r; print(r.schemas_dir())")
    assert where.stdout.strip() == str(site / "kvprobe" / "_data" / "schemas")
    markers = python("-c", "from kvprobe.gates import fixmarkers as f; print(f.MARKERS_FILE, len(f.markers()))")
    assert markers.stdout.strip() == f"{site / 'kvprobe' / 'gates' / 'fixmarkers.toml'} 5", markers.stderr

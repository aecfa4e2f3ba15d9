"""A sweep of real SGLang releases reuses its units (#26): experiment-a on 0.5.20 and 0.5.21,
observed once with --no-reuse, then swept again: both units come from the cache, their raw
outputs byte for byte the first sweep's, and the bundle verifies against the installed
experiment. The units go to a cache of the test's own whose envs, wheels, trees and uv cache
are the user's (symlinked): the user's cache gains no unit, and nothing is built twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from kvprobe.env.cache import default_cache_root

pytestmark = [pytest.mark.slow, pytest.mark.network]

SHARED = ("envs", "wheels", "trees", "git", "uv")


def _raw(bundle: Path) -> dict[str, bytes]:
    return {p.relative_to(bundle).as_posix(): p.read_bytes() for p in sorted((bundle / "raw").rglob("*.json"))}


def test_a_second_sweep_of_two_sglang_releases_reuses_both_units(tmp_path, monkeypatch):
    user = default_cache_root()
    cache = tmp_path / "cache"
    cache.mkdir()
    for name in SHARED:
        (user / name).mkdir(parents=True, exist_ok=True)
        (cache / name).symlink_to(user / name)
    monkeypatch.setenv("KVPROBE_CACHE_DIR", str(cache))

    def sweep(out: str, *flags: str):
        argv = ["sweep", "experiment-a", "--releases", "0.5.20,0.5.21", "--out", str(tmp_path / out), *flags]
        return CliRunner().invoke(main, argv, catch_exceptions=False)

    first = sweep("first", "--no-reuse")
    assert first.exit_code == 0, first.output
    second = sweep("second")
    assert second.exit_code == 0, second.output
    receipt = json.loads((tmp_path / "second" / "receipt.json").read_text())
    assert receipt["summary"] == {"affected": ["0.5.20"], "fixed": ["0.5.21"]}
    assert all(r["reused"]["observed_utc"] <= receipt["created_utc"] for r in receipt["releases"])
    assert _raw(tmp_path / "second") == _raw(tmp_path / "first")
    assert "(reused from " in second.stdout
    verified = CliRunner().invoke(main, ["verify", str(tmp_path / "second")])
    assert verified.exit_code == 0, verified.output
    assert sorted(p.name.split("-")[2] for p in (cache / "units").iterdir() if p.is_dir()) == ["0.5.20", "0.5.21"]

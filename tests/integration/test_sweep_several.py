"""`kvprobe sweep A B`: several experiments over one local index in one invocation, sharing the
listing, each release's wheel, the env and one fork server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_sweep_local_index import PROBE, _env, experiment_toml, sweep, world  # noqa: F401

pytestmark = pytest.mark.network  # the pytest-minimal env is built from its hash-pinned lock


@pytest.fixture
def two(world, monkeypatch, tmp_path):  # noqa: F811
    """scrub-sweep and a copy of it, scrub-again, on the search path."""
    folder = tmp_path / "probes" / "scrub-again"
    folder.mkdir(parents=True)
    text = (world["probes"] / "scrub-sweep" / "experiment.toml").read_text()
    (folder / "experiment.toml").write_text(text.replace('id = "scrub-sweep"', 'id = "scrub-again"'))
    (folder / "scrub.py").write_text(PROBE)
    monkeypatch.setenv("KVPROBE_PROBES_PATH", f"{tmp_path / 'probes'}:{world['probes']}")


def test_two_sweeps_share_the_listing_the_wheels_and_one_fork_server(world, sweep, two, tmp_path, monkeypatch):  # noqa: F811
    import kvprobe.run.session as session_mod
    from kvprobe.checks import releaseserver
    from kvprobe.checks.forkserver import ForkServer
    from kvprobe.checks.releaseserver import ReleaseServer
    from kvprobe.sources import releases

    _env(world, monkeypatch)
    started: list[ForkServer] = []
    listed: list[str] = []
    resolved: list[str] = []

    class Recorded(ForkServer):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            started.append(self)

    releases_started: list[ReleaseServer] = []

    class RecordedRelease(ReleaseServer):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            releases_started.append(self)

    monkeypatch.setattr(releaseserver, "ReleaseServer", RecordedRelease)

    real_versions, real_resolve = releases.index_versions, releases.resolve
    monkeypatch.setattr(session_mod, "ForkServer", Recorded)
    monkeypatch.setattr(releases, "index_versions", lambda p, *a: (listed.append(p), real_versions(p, *a))[1])
    monkeypatch.setattr(releases, "resolve", lambda p, v, *a: (resolved.append(v), real_resolve(p, v, *a))[1])
    out = tmp_path / "sweeps"
    result = sweep("sweep", "scrub-sweep", "scrub-again", "--releases", "1.0..2.1", "--out", str(out), "--json")
    document = json.loads(result.stdout)
    assert (result.exit_code, document["exit"]) == (3, 3), result.stderr  # 2.1: not present, in both
    assert [s["experiment"] for s in document["sweeps"]] == ["scrub-sweep", "scrub-again"]
    expected = {"affected": ["1.0", "1.1"], "fixed": ["2.0"], "not-present": ["2.1"]}
    assert all(s["summary"] == expected for s in document["sweeps"])
    assert len(started) == 1, "each sweep started its own fork server"
    assert listed == ["scrubkv"], "the index was listed once per sweep"
    assert sorted(resolved) == ["1.0", "1.1", "2.0", "2.1"], "a release was resolved once per sweep"
    receipts = []
    for entry, name in zip(document["sweeps"], ("scrub-sweep", "scrub-again"), strict=True):
        assert entry["bundle"] == str((out / name).resolve())
        receipts.append(json.loads((out / name / "receipt.json").read_text()))
        verified = sweep("verify", str(out / name), "--expect-manifest-sha256", entry["manifest_sha256"])
        assert verified.exit_code == 0, verified.stdout
    assert receipts[0]["listing"] == receipts[1]["listing"]
    modes = {p["mode"] for r in receipts for release in r["releases"] for p in release["execution"]["probes"]}
    assert modes == {"forked"}
    assert not started[0].running(), "the shared server outlived the invocation"
    # release by release: one release server per release, importing it once for both sweeps
    assert sorted(Path(r.path[0]).parent.name.split("-")[1] for r in releases_started) == ["1.0", "1.1", "2.0", "2.1"]
    assert all(r.parent is started[0] and not r.running() for r in releases_started)
    assert all(r.modules == ("scrubkv",) for r in releases_started)
    preloaded = [release["execution"]["preloaded"] for r in receipts for release in r["releases"]]
    assert preloaded == [{"scrubkv": None}] * 8


def test_sweep_usage_errors_with_several_are_exit_2_and_run_nothing(world, sweep, two, tmp_path):  # noqa: F811
    out = tmp_path / "taken"
    (out / "scrub-again").mkdir(parents=True)
    (out / "scrub-again" / "keep.txt").write_text("user data")
    result = sweep("sweep", "scrub-sweep", "scrub-again", "--releases", "1.0..2.1", "--out", str(out))
    assert result.exit_code == 2 and "refusing to overwrite" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["scrub-again"]
    assert sweep("sweep", "scrub-sweep", "scrub-sweep").exit_code == 2
    assert sweep("sweep", "--all", "scrub-sweep").exit_code == 2
    assert sweep("sweep").exit_code == 2


def test_units_the_cache_holds_are_not_run_release_by_release(world, sweep, two, tmp_path, monkeypatch):  # noqa: F811
    """A second `sweep A B` takes every unit from the cache through the sweep's checks: the
    release-by-release pass ahead of the sweeps runs none of them again."""
    from kvprobe.checks import releaseserver
    from kvprobe.checks.releaseserver import ReleaseServer

    _env(world, monkeypatch)
    args = ("sweep", "scrub-sweep", "scrub-again", "--releases", "1.0..2.0", "--json")
    first = sweep(*args, "--out", str(tmp_path / "first"))
    assert first.exit_code == 0, first.stderr
    opened: list[ReleaseServer] = []

    class Recorded(ReleaseServer):
        def __init__(self, *a, **k) -> None:
            super().__init__(*a, **k)
            opened.append(self)

    monkeypatch.setattr(releaseserver, "ReleaseServer", Recorded)
    second = sweep(*args, "--out", str(tmp_path / "second"))
    assert second.exit_code == 0, second.stderr
    assert opened == [], "a unit the cache holds was run again"
    for name in ("scrub-sweep", "scrub-again"):
        receipt = json.loads((tmp_path / "second" / name / "receipt.json").read_text())
        assert [r["version"] for r in receipt["releases"] if r.get("reused")] == ["1.0", "1.1", "2.0"]
    again = sweep(*args, "--out", str(tmp_path / "third"), "--no-reuse")
    assert again.exit_code == 0, again.stderr
    assert len(opened) == 3, "--no-reuse observes every release again, each release once for both sweeps"


def test_a_repeat_no_bundle_can_hold_runs_no_unit_ahead_of_the_sweeps(world, sweep, two, monkeypatch):  # noqa: F811
    """`sweep A B --repeat 5000`: every sweep refuses it (exit 2) before anything runs, the pass
    that runs units release by release ahead of the sweeps included."""
    import kvprobe.run.sweep_runner as runner

    _env(world, monkeypatch)
    produced: list[str] = []

    def produce_unit(request, *args, **kwargs):
        produced.append(request.pin.version)
        raise AssertionError("a unit ran")

    monkeypatch.setattr(runner, "produce_unit", produce_unit)
    result = sweep("sweep", "scrub-sweep", "scrub-again", "--releases", "1.0..2.1", "--repeat", "5000", "--json")
    assert result.exit_code == 2, result.stderr
    assert produced == []
    assert "past a bundle's 10000" in result.stderr

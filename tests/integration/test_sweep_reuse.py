"""Never observe the same thing twice (#26): a sweep keeps each unit it accepts in the kvprobe
cache and a later sweep reuses it after the driver's checks. Real sweeps on a local index of
our own (the pytest-minimal env, real probe processes): a second sweep reuses every unit and
its receipt and README say so, `--no-reuse` observes again and refreshes the cache, a release
new on the index is the only one observed, an interrupted sweep resumes from the units it
finished, and a cached unit that fails the checks is refused, said so and observed again."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from tests.integration.test_sweep_local_index import PROBE, RELEASES, experiment_toml, make_index

pytestmark = pytest.mark.network  # the pytest-minimal env's lock comes from PyPI

REPO = Path(__file__).resolve().parents[2]


def _held_release(flag: Path) -> str:
    """1.1's code, but its import waits while ``flag`` exists: a unit that is still running."""
    return f"import os, time\nwhile os.path.exists({str(flag)!r}):\n    time.sleep(0.05)\n" + RELEASES["1.1"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Three indexes of one package: ``early`` (1.0, 1.1), ``index`` (1.0..2.1 and 1.9, whose
    import waits while ``flag`` exists), and the env built once in ``cache``."""
    root = tmp_path_factory.mktemp("reuse-world")
    flag = root / "hold-1.9"
    wheels = make_index(root, {**RELEASES, "1.9": _held_release(flag)})
    make_index(root / "early", {v: RELEASES[v] for v in ("1.0", "1.1")})
    for exp_id in ("scrub-sweep", "scrub-again"):  # two experiments on one profile: a sweep of several
        folder = root / "probes" / exp_id
        folder.mkdir(parents=True)
        (folder / "experiment.toml").write_text(experiment_toml(wheels).replace('"scrub-sweep"', f'"{exp_id}"'))
        (folder / "scrub.py").write_text(PROBE)
    shutil.copytree(REPO / "probes" / "profiles", root / "probes" / "profiles")
    cache = root / "cache"
    saved = dict(os.environ)
    os.environ["KVPROBE_PROBES_PATH"] = str(root / "probes")
    try:
        from kvprobe.env.venv import EnvManager, load_profile

        EnvManager(cache).ensure(load_profile("pytest-minimal"))  # from PyPI
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return {"root": root, "flag": flag, "cache": cache, "probes": root / "probes"}


def _vars(world) -> dict[str, str]:
    return {
        "KVPROBE_PROBES_PATH": str(world["probes"]),
        "KVPROBE_CACHE_DIR": str(world["cache"]),
        "PIP_INDEX_URL": (world["root"] / "simple").as_uri(),
    }


@pytest.fixture
def sweep(world, monkeypatch):
    for name, value in _vars(world).items():
        monkeypatch.setenv(name, value)

    def invoke(*args: str):
        return CliRunner().invoke(main, list(args), catch_exceptions=False)

    return invoke


@pytest.fixture
def no_units(world):
    """Each test starts from a cache that holds the env and no unit."""
    shutil.rmtree(world["cache"] / "units", ignore_errors=True)


def _count_servers(monkeypatch) -> list[str]:
    """The python of every fork server the sweeps in this process start, from now on."""
    from kvprobe.checks.forkserver import ForkServer
    from kvprobe.run import session

    started: list[str] = []

    class Counted(ForkServer):
        def __init__(self, python: str, *args, **kwargs) -> None:
            started.append(python)
            super().__init__(python, *args, **kwargs)

    monkeypatch.setattr(session, "ForkServer", Counted)
    return started


def _receipt(bundle: Path) -> dict:
    return json.loads((bundle / "receipt.json").read_text())


def _raw(bundle: Path) -> dict[str, bytes]:
    return {p.relative_to(bundle).as_posix(): p.read_bytes() for p in sorted((bundle / "raw").rglob("*.json"))}


def _reused(bundle: Path) -> dict[str, dict | None]:
    return {r["version"]: r.get("reused") for r in _receipt(bundle)["releases"]}


def test_a_second_sweep_reuses_every_unit_and_no_reuse_observes_them_again(
    sweep, no_units, world, tmp_path, monkeypatch
):
    spec = "1.0..2.1"
    started = _count_servers(monkeypatch)
    first = sweep("sweep", "scrub-sweep", "--releases", spec, "--out", str(tmp_path / "first"))
    assert len(started) == 1 and "preload: fork server started" in first.stderr
    assert first.exit_code == 3, first.output  # 2.1: not present
    assert set(_reused(tmp_path / "first").values()) == {None}
    assert "reused" not in (tmp_path / "first" / "README.md").read_text()
    listed = json.loads(sweep("cache", "ls", "--json").stdout)
    assert listed["counts"]["unit"] == 5
    units = [e for e in listed["entries"] if e["kind"] == "unit"]
    assert sorted(e["label"].split()[1] for e in units) == ["1.0", "1.1", "1.9", "2.0", "2.1"]

    second = sweep("sweep", "scrub-sweep", "--releases", spec, "--out", str(tmp_path / "second"))
    assert second.exit_code == 3, second.output
    assert len(started) == 1 and "preload:" not in second.stderr  # every unit reused: no server started
    first_receipt, receipt = _receipt(tmp_path / "first"), _receipt(tmp_path / "second")
    reused = _reused(tmp_path / "second")
    assert set(reused) == {"1.0", "1.1", "1.9", "2.0", "2.1"} and None not in reused.values()
    for version, unit in reused.items():
        assert unit["observed_utc"] >= first_receipt["created_utc"] and unit["observed_utc"] <= receipt["created_utc"]
        assert f"{version}: reused from {unit['observed_utc']}" in (tmp_path / "second" / "README.md").read_text()
        assert any(line.startswith(version) and "(reused from " in line for line in second.stdout.splitlines())
    assert "the cached unit was refused" not in second.stderr
    assert [line for line in second.stderr.splitlines() if "/5 " in line and "reused from" in line]
    # nothing ran again: every raw output is the first sweep's, byte for byte (durations too)
    assert _raw(tmp_path / "second") == _raw(tmp_path / "first")
    assert [r["classification"] for r in receipt["releases"]] == [
        r["classification"] for r in first_receipt["releases"]
    ]
    verified = sweep("verify", str(tmp_path / "second"), "--json")
    assert verified.exit_code == 0, verified.stdout

    again = sweep("sweep", "scrub-sweep", "--releases", spec, "--out", str(tmp_path / "again"), "--no-reuse")
    assert again.exit_code == 3, again.output
    assert set(_reused(tmp_path / "again").values()) == {None}
    assert _raw(tmp_path / "again") != _raw(tmp_path / "first")  # observed again: new durations
    # and it refreshed the cache: the next sweep reuses the units --no-reuse observed
    third = sweep("sweep", "scrub-sweep", "--releases", spec, "--out", str(tmp_path / "third"))
    assert third.exit_code == 3
    assert _raw(tmp_path / "third") == _raw(tmp_path / "again")
    assert (
        min(u["observed_utc"] for u in _reused(tmp_path / "third").values())
        >= _receipt(tmp_path / "again")["created_utc"]
    )

    # verify --rerun observes again whatever the cache holds
    rerun = sweep("verify", str(tmp_path / "third"), "--rerun", "--trust-bundle-code", "--release", "2.0", "--json")
    assert rerun.exit_code == 0, rerun.stdout
    assert "re-ran scrub-sweep on 1 of 1 releases: 2.0 fixed" in json.loads(rerun.stdout)["steps"][5]["summary"]


def test_a_sweep_of_several_whose_units_are_all_cached_starts_no_fork_server(
    sweep, no_units, world, tmp_path, monkeypatch
):
    """The release-by-release pass and each sweep start the profile's server only for a unit
    that runs: none when the cache holds them all, one again when a release is new."""
    started = _count_servers(monkeypatch)
    both = ("sweep", "scrub-sweep", "scrub-again", "--releases")
    first = sweep(*both, "1.1,2.0", "--out", str(tmp_path / "first"))
    assert first.exit_code == 0, first.output
    assert len(started) == 1
    # the units ran ahead, release by release: their lines say so, and how long each took there
    ahead = [line for line in first.stderr.splitlines() if "(release by release, ahead of this sweep: " in line]
    assert len(ahead) == 4 and "(0 s)" not in first.stderr, first.stderr
    second = sweep(*both, "1.1,2.0", "--out", str(tmp_path / "second"))
    assert second.exit_code == 0, second.output
    assert len(started) == 1 and "preload:" not in second.stderr
    for name in ("scrub-sweep", "scrub-again"):
        assert None not in _reused(tmp_path / "second" / name).values()
    third = sweep(*both, "1.0,1.1,2.0", "--out", str(tmp_path / "third"))  # 1.0: not in the cache
    assert third.exit_code == 0, third.output
    assert len(started) == 2
    assert {name: _reused(tmp_path / "third" / name)["1.0"] for name in ("scrub-sweep", "scrub-again")} == {
        "scrub-sweep": None,
        "scrub-again": None,
    }


def test_a_release_new_on_the_index_is_the_only_one_observed(sweep, no_units, world, tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", (world["root"] / "early" / "simple").as_uri())
    early = sweep("sweep", "scrub-sweep", "--out", str(tmp_path / "early"))
    assert early.exit_code == 0, early.output
    assert _reused(tmp_path / "early") == {"1.0": None, "1.1": None}

    monkeypatch.setenv("PIP_INDEX_URL", (world["root"] / "simple").as_uri())  # 1.9, 2.0 and 2.1 published since
    later = sweep("sweep", "scrub-sweep", "--releases", "1.0..2.0", "--out", str(tmp_path / "later"))
    assert later.exit_code == 0, later.output
    reused = _reused(tmp_path / "later")
    assert reused["1.0"] is not None and reused["1.1"] is not None
    assert reused["2.0"] is None and reused["1.9"] is None
    assert sweep("verify", str(tmp_path / "later")).exit_code == 0


def test_an_interrupted_sweep_resumes_from_the_units_it_finished(no_units, world, tmp_path):
    world["flag"].write_text("hold")  # 1.9's unit stays running until the flag goes
    try:
        log = tmp_path / "stderr"
        argv = ["sweep", "scrub-sweep", "--releases", "1.0..1.9", "--jobs", "1", "--out", str(tmp_path / "cut")]
        with open(log, "wb") as stderr:
            child = subprocess.Popen(
                [sys.executable, "-m", "kvprobe", *argv],
                env={**os.environ, "PYTHONPATH": str(REPO), **_vars(world)},
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
        deadline = time.monotonic() + 300
        while "2/3 " not in log.read_text():  # 1.0 and 1.1 finished; 1.9 waits on the flag
            assert child.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        assert child.wait(120) == 130, log.read_text()[-3000:]
        assert "the same sweep run again resumes from them" in log.read_text()
        assert not (tmp_path / "cut").exists()
    finally:
        world["flag"].unlink(missing_ok=True)
    kept = [p.name for p in (world["cache"] / "units").iterdir() if p.is_dir()]
    assert sorted(name.split("-")[2] for name in kept) == ["1.0", "1.1"], kept  # stored as they finished

    result = CliRunner().invoke(main, [*argv[:-1], str(tmp_path / "resumed")], catch_exceptions=False, env=_vars(world))
    assert result.exit_code == 0, result.output
    reused = _reused(tmp_path / "resumed")
    assert reused["1.0"] is not None and reused["1.1"] is not None and reused["1.9"] is None
    assert CliRunner().invoke(main, ["verify", str(tmp_path / "resumed")], env=_vars(world)).exit_code == 0


def test_a_tampered_cached_unit_is_refused_said_so_and_observed_again(sweep, no_units, world, tmp_path):
    assert sweep("sweep", "scrub-sweep", "--releases", "1.1,2.0", "--out", str(tmp_path / "first")).exit_code == 0
    units = world["cache"] / "units"
    (one,) = [p for p in units.iterdir() if p.is_dir() and p.name.startswith("scrub-sweep-1.1-")]
    (two,) = [p for p in units.iterdir() if p.is_dir() and p.name.startswith("scrub-sweep-2.0-")]
    # 2.0's genuine unit filed under 1.1's key: it verifies, but it is not the release asked for
    (one / "unit.tar.gz").write_bytes((two / "unit.tar.gz").read_bytes())
    result = sweep("sweep", "scrub-sweep", "--releases", "1.1,2.0", "--out", str(tmp_path / "second"))
    assert result.exit_code == 0, result.output
    (line,) = [ln for ln in result.stderr.splitlines() if "the cached unit was refused" in ln]
    assert "1.1" in line and "releases ['2.0'], asked for 1.1" in line
    reused = _reused(tmp_path / "second")
    assert reused["1.1"] is None and reused["2.0"] is not None  # 1.1 observed again, 2.0 reused
    assert _receipt(tmp_path / "second")["summary"] == {"affected": ["1.1"], "fixed": ["2.0"]}
    assert sweep("verify", str(tmp_path / "second")).exit_code == 0
    # the refused entry was replaced by the unit observed again
    digest = hashlib.sha256((one / "unit.tar.gz").read_bytes()).hexdigest()
    assert digest != hashlib.sha256((two / "unit.tar.gz").read_bytes()).hexdigest()
    assert sweep("sweep", "scrub-sweep", "--releases", "1.1,2.0", "--out", str(tmp_path / "third")).exit_code == 0
    assert None not in _reused(tmp_path / "third").values()


class _Workers:
    """Stands in for a Ray cluster: each unit runs as a worker runs it (produce_unit alone, its
    env from the worker's own cache, its probes fresh) and the versions run are counted."""

    name = "ray"

    def __init__(self) -> None:
        self.ran: list[str] = []

    def run(self, requests):
        from kvprobe.run.sweep_unit import UnitOutcome, produce_unit

        for request in requests:
            self.ran.append(request.pin.version)
            yield UnitOutcome(request, produce_unit(request))


def test_a_sweep_on_workers_reuses_the_units_they_kept(no_units, world, tmp_path, monkeypatch):
    """The Ray path looks cached units up as the local one does (by the env this host's cache
    holds), through the same checks; a reused unit makes its env the sweep's."""
    from kvprobe.experiments import experiment
    from kvprobe.run.sweep_runner import SweepOptions, sweep_experiment

    for name, value in _vars(world).items():
        monkeypatch.setenv(name, value)
    exp = experiment.load("scrub-sweep")

    def swept(out: str, workers: _Workers, **options):
        opts = SweepOptions(releases="1.1,2.0", out=tmp_path / out, cache_root=world["cache"], executor="ray")
        return sweep_experiment(exp, SweepOptions(**{**vars(opts), **options}), executor=workers).receipt

    first_workers, second_workers = _Workers(), _Workers()
    first = swept("first", first_workers)
    assert sorted(first_workers.ran) == ["1.1", "2.0"] and first.summary == {"affected": ["1.1"], "fixed": ["2.0"]}
    assert {r.execution.probes[0].mode for r in first.releases if r.execution} == {"fresh"}
    second = swept("second", second_workers)
    assert second_workers.ran == []  # nothing went to the workers
    assert all(r.reused is not None for r in second.releases) and second.summary == first.summary
    assert second.env == first.env
    assert CliRunner().invoke(main, ["verify", str(tmp_path / "second")], env=_vars(world)).exit_code == 0
    swept("again", third := _Workers(), reuse=False)  # --no-reuse: the workers observe every release
    assert sorted(third.ran) == ["1.1", "2.0"]

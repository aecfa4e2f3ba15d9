"""A tampered sweep unit in the kvprobe cache (#26: never observe the same thing twice).

`kvprobe sweep` keeps every unit it accepts in the cache (units/) and reuses it in a later
sweep. Whoever can write the cache can put anything there, so a cached unit is untrusted
input, held to the checks a unit from a Ray worker passes (run/sweep_unit.accept_unit). Each
attack below edits one kept unit of release 1.1 and runs the sweep again through the CLI:
the unit is refused with the reason on stderr, 1.1 is observed again and classified as its
code behaves, and 2.0's genuine unit is still reused.

The sweeps run on a local index of our own package (tests/integration/test_sweep_local_index)
with the pytest-minimal env, built once per module from PyPI in a cache outside the sandbox.
What this tier cannot catch, like any self-consistent bundle: a unit whose raw outputs were
edited and everything derived from them re-derived and resealed (docs/sweep.md).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests import forge
from tests.attacks.harness import REPO, assert_outcome
from tests.integration.test_sweep_local_index import PROBE, RELEASES, experiment_toml, make_index

pytestmark = [pytest.mark.attack, pytest.mark.network]  # the env's lock comes from PyPI

ARGV = ("sweep", "scrub-sweep", "--releases", "1.1,2.0")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The index, the experiment, the env, and the units a genuine sweep kept (a copy of
    ``units/`` to restore before each attack)."""
    root = tmp_path_factory.mktemp("unit-cache-attacks")
    wheels = make_index(root, RELEASES)
    folder = root / "probes" / "scrub-sweep"
    folder.mkdir(parents=True)
    (folder / "experiment.toml").write_text(experiment_toml(wheels))
    (folder / "scrub.py").write_text(PROBE)
    shutil.copytree(REPO / "probes" / "profiles", root / "probes" / "profiles")
    env = {
        "KVPROBE_PROBES_PATH": str(root / "probes"),
        "KVPROBE_CACHE_DIR": str(root / "cache"),
        "PIP_INDEX_URL": (root / "simple").as_uri(),
    }
    saved = dict(os.environ)
    os.environ["KVPROBE_PROBES_PATH"] = env["KVPROBE_PROBES_PATH"]
    try:
        from kvprobe.env.venv import EnvManager, load_profile

        EnvManager(root / "cache").ensure(load_profile("pytest-minimal"))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    from kvprobe.cli import main

    made = CliRunner().invoke(main, [*ARGV, "--out", str(root / "genuine")], env=env, catch_exceptions=False)
    assert made.exit_code == 0, made.output
    shutil.copytree(root / "cache" / "units", root / "genuine-units")
    return {"root": root, "env": env}


def _unit(units: Path, version: str) -> Path:
    (entry,) = [p for p in units.iterdir() if p.is_dir() and p.name.startswith(f"scrub-sweep-{version}-")]
    return entry / "unit.tar.gz"


def _rewrite(archive: Path, change: Callable[[str, bytes], bytes]) -> None:
    """Each file member of the packed unit through ``change(name, bytes)``, hashes untouched."""
    buf = io.BytesIO()
    with tarfile.open(archive) as src, tarfile.open(fileobj=buf, mode="w:gz") as out:
        for member in src.getmembers():
            handle = src.extractfile(member) if member.isfile() else None
            if handle is None:
                out.addfile(member)
                continue
            data = change(member.name, handle.read())
            member.size = len(data)
            out.addfile(member, io.BytesIO(data))
    archive.write_bytes(buf.getvalue())


def _reseal(archive: Path, scratch: Path, edit: Callable[[Path], None]) -> None:
    """Unpack the unit, ``edit`` its bundle, re-hash it and pack it again: it still verifies."""
    from kvprobe.verify.pack import pack

    with tarfile.open(archive) as src:
        src.extractall(scratch, filter="data")
    (bundle,) = list(scratch.iterdir())
    edit(bundle)
    forge.rehash(bundle)
    archive.write_bytes(pack(bundle, scratch.parent / f"resealed-{scratch.name}.tar.gz").archive.read_bytes())


def _observed_as(version: str, scrubbed: bool):
    def change(name: str, data: bytes) -> bytes:
        if name.endswith(f"raw/{version}/probes/scrub.json"):
            doc = json.loads(data)
            next(c for c in doc["cases"] if c["name"] == "free.then_reuse")["observations"]["scrubbed"] = scrubbed
            return forge.dumps(doc)
        return data

    return change


def _symlinked(one: Path, two: Path, scratch: Path) -> None:
    shutil.copy(two, scratch / "outside.tar.gz")
    one.unlink()
    one.symlink_to(scratch / "outside.tar.gz")


def _other_kvprobe(bundle: Path) -> None:
    receipt = forge.load(bundle, "receipt.json")
    receipt["tool"]["version"] = "0.0.1"
    (bundle / "receipt.json").write_bytes(forge.dumps(receipt))


def _observed_when(when: str) -> Callable[[Path], None]:
    """The unit's receipt says it observed at ``when``; README.md and the timeline re-rendered."""

    def edit(bundle: Path) -> None:
        from kvprobe.evidence.sweep_view import TIMELINE, render_readme, timeline_svg
        from kvprobe.model.sweep_receipt import SweepReceipt

        receipt = forge.load(bundle, "receipt.json")
        receipt["created_utc"] = when
        (bundle / "receipt.json").write_bytes(forge.dumps(receipt))
        typed = SweepReceipt.from_json(receipt)
        (bundle / "README.md").write_text(render_readme(typed), encoding="utf-8")
        (bundle / TIMELINE).write_text(timeline_svg(typed), encoding="utf-8")

    return edit


ATTACKS: dict[str, tuple[Callable[[Path, Path, Path], None], tuple[str, ...]]] = {
    # 2.0's genuine, verifying unit filed under 1.1's key: another release's observations
    "another-release": (
        lambda one, two, scratch: one.write_bytes(two.read_bytes()),
        ("releases ['2.0'], asked for 1.1",),
    ),
    # 1.1's raw output says the block was scrubbed (1.1 would read 'fixed'), hashes left alone
    "raw-output-edited": (
        lambda one, two, scratch: _rewrite(one, _observed_as("1.1", True)),
        ("does not verify", "raw/1.1/probes/scrub.json"),
    ),
    # a unit another kvprobe made, resealed so that it verifies
    "made-by-another-kvprobe": (
        lambda one, two, scratch: _reseal(one, scratch, _other_kvprobe),
        ("made by kvprobe 0.0.1",),
    ),
    # a unit that verifies but says it observed after this sweep began, or at no time at all: the
    # sweep reused it, then its own bundle failed verify (a reused unit observed later), exit 1
    "observed-in-the-future": (
        lambda one, two, scratch: _reseal(one, scratch, _observed_when("2099-01-01T00:00:00Z")),
        ("observed at 2099-01-01T00:00:00Z, after this sweep began",),
    ),
    "observed-at-no-time": (
        lambda one, two, scratch: _reseal(one, scratch, _observed_when("0000-00-00T00:00:00Z")),
        ("observed at 0000-00-00T00:00:00Z: not a time",),
    ),
    # not an archive at all
    "garbage": (lambda one, two, scratch: one.write_bytes(b"\x1f\x8b not really gzip" * 50), ("unit bundle refused",)),
    # the archive a symlink to a file outside the cache (here: 2.0's genuine unit)
    "symlink": (
        lambda one, two, scratch: _symlinked(one, two, scratch),
        ("unreadable", "unit.tar.gz"),
    ),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_tampered_cached_unit_is_refused_and_its_release_observed_again(sandbox, world, attack):
    units = Path(world["env"]["KVPROBE_CACHE_DIR"]) / "units"
    shutil.rmtree(units)
    shutil.copytree(world["root"] / "genuine-units", units)
    tamper, words = ATTACKS[attack]
    scratch = sandbox.root.parent / f"scratch-{attack}"
    scratch.mkdir()
    tamper(_unit(units, "1.1"), _unit(units, "2.0"), scratch)

    result = sandbox.run(
        *ARGV, "--out", sandbox.out, env=world["env"], allow=(sandbox.out, sandbox.home / ".rustup"), timeout=300
    )
    line = assert_outcome(sandbox, result, 0, "1.1", "the cached unit was refused", *words)
    assert "observing it again" in line
    assert result.out.splitlines()[:2] == ["1.1  affected", f"2.0  fixed  (reused from {_observed(world, '2.0')})"]
    receipt = forge.load(sandbox.out, "receipt.json")
    reused = {r["version"]: r.get("reused") for r in receipt["releases"]}
    assert reused["1.1"] is None and reused["2.0"] is not None
    # the refused entry is gone; the unit observed again is kept (fresh: the sandbox's TMPDIR is too
    # deep for the fork server's socket, and a unit is keyed by how its probes ran)
    assert not _unit(units, "1.1").is_symlink()


def _observed(world, version: str) -> str:
    """When the genuine sweep observed ``version`` (its kept unit's own receipt says so too)."""
    marker = _unit(world["root"] / "genuine-units", version).parent / "kvprobe-unit.json"
    return json.loads(marker.read_text())["observed_utc"]


def test_a_held_unit_lock_costs_reuse_not_the_sweep(sandbox, world):
    """Attack: something holds 1.1's entry lock (units/<name>.lock) and never lets go: a stuck
    process, or anyone who can write the cache. The sweep waited on it for ever; now it waits a
    bounded time (unit_cache.LOCK_TIMEOUT_S), observes 1.1 again, and still reuses 2.0."""
    import fcntl

    units = Path(world["env"]["KVPROBE_CACHE_DIR"]) / "units"
    shutil.rmtree(units)
    shutil.copytree(world["root"] / "genuine-units", units)
    entry = _unit(units, "1.1").parent
    fd = os.open(entry.parent / f"{entry.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        result = sandbox.run(
            *ARGV, "--out", sandbox.out, env=world["env"], allow=(sandbox.out, sandbox.home / ".rustup"), timeout=180
        )
    finally:
        os.close(fd)
    line = assert_outcome(sandbox, result, 0, "1.1", "the unit cache could not be read")
    assert "observing it" in line
    assert result.out.splitlines()[:2] == ["1.1  affected", f"2.0  fixed  (reused from {_observed(world, '2.0')})"]
    reused = {r["version"]: r.get("reused") for r in forge.load(sandbox.out, "receipt.json")["releases"]}
    assert reused["1.1"] is None and reused["2.0"] is not None


def test_a_repeat_count_no_bundle_can_hold_is_refused_before_anything_runs(sandbox, world):
    """Careless operator: `sweep --repeat 2000` of 2 releases needs at least 12000 files in one
    bundle (raw output, stdout, stderr per run), past the 10000 a bundle holds. The sweep ran
    the probes 4000 times, then the merge refused what did not fit; now it stops at once."""
    result = sandbox.run(
        *ARGV, "--repeat", "2000", "--out", sandbox.out, env=world["env"], allow=(sandbox.home / ".rustup",), timeout=60
    )
    assert_outcome(sandbox, result, 2, "--repeat 2000", "past a bundle's 10000")
    assert not Path(sandbox.out).exists()

"""run/unit_cache: what keys a kept sweep unit, how it is stored and read, and how `cache ls`
and `cache prune` see it; verify step 4 and the README on a reused release. No subprocess:
the sweeps that keep and reuse real units are tests/integration/test_sweep_reuse.py."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from kvprobe.env import cache
from kvprobe.evidence.sweep_view import render_readme
from kvprobe.experiments.experiment import load_file
from kvprobe.model.receipt import EnvRecord
from kvprobe.model.records import WheelPin
from kvprobe.model.sweep_receipt import ReusedUnit, SweepReceipt
from kvprobe.progress import Reporter
from kvprobe.resources import builtin_probes_dir
from kvprobe.run import unit_cache
from kvprobe.run.sweep_unit import UnitRequest
from kvprobe.verify.sweep_reused import reused_defects

ROOT = Path(__file__).resolve().parents[3]
SHA = "ab" * 32


@pytest.fixture
def exp(tmp_path):
    """A copy of experiment-a whose files a test may change."""
    folder = tmp_path / "experiment-a"
    shutil.copytree(builtin_probes_dir() / "experiment-a", folder)
    return load_file(folder / "experiment.toml")


def _request(exp, **changes) -> UnitRequest:
    pin = WheelPin("sglang", "0.5.20", "sglang-0.5.20-py3-none-any.whl", SHA)
    return dataclasses.replace(UnitRequest(exp.id, exp.file_sha256, pin, 900.0, None, Path("/cache/a")), **changes)


ENV = EnvRecord("k" * 20, "3.11.2", "sglang-cpu", "sglang-cpu.txt", "cd" * 32, {}, None, None)


def _name(exp, request=None, env=ENV, settings=None, mode="forked", repeat=1) -> str:
    facts = unit_cache.key_facts(exp, request or _request(exp), env, settings or {"A": "1"}, mode, repeat)
    return unit_cache.entry_name(facts)


def test_everything_that_decides_a_units_observations_is_in_its_key(exp, monkeypatch):
    base = _name(exp)
    assert base.startswith("experiment-a-0.5.20-")
    other_pin = dataclasses.replace(_request(exp).pin, sha256="ef" * 32)
    changed = {
        "wheel": _name(exp, _request(exp, pin=other_pin)),
        "per-probe timeout": _name(exp, _request(exp, timeout_s=60.0)),
        "torch index": _name(exp, _request(exp, torch_index="https://example.invalid/whl")),
        "experiment sha256": _name(exp, _request(exp, experiment_sha256="0" * 64)),
        "env key": _name(exp, env=dataclasses.replace(ENV, key="other")),
        "lock": _name(exp, env=dataclasses.replace(ENV, lock_sha256="ef" * 32)),
        "python": _name(exp, env=dataclasses.replace(ENV, python="3.12.1")),
        "settings": _name(exp, settings={"A": "2"}),
        "how probes run": _name(exp, mode="fresh"),
        "repeat count": _name(exp, repeat=3),
    }
    monkeypatch.setattr(unit_cache, "__version__", "9.9.9")
    changed["kvprobe version"] = _name(exp)
    monkeypatch.undo()
    monkeypatch.setattr(unit_cache, "probe_api_sha256", lambda: "0" * 64)
    changed["probe api"] = _name(exp)
    monkeypatch.undo()
    probe = sorted(exp.directory.glob("*.py"))[0]
    probe.write_text(probe.read_text() + "\n# a probe file changed\n")
    changed["a probe file"] = _name(exp)
    assert base not in changed.values(), [k for k, v in changed.items() if v == base]
    assert len(set(changed.values())) == len(changed)


def test_where_the_worker_cache_lives_is_not_in_the_key(exp):
    assert _name(exp, _request(exp, cache_root=Path("/elsewhere"))) == _name(exp, _request(exp, cache_root=None))


def test_a_kept_unit_reads_back_and_a_bad_entry_says_why(tmp_path):
    store = unit_cache.UnitStore(tmp_path)
    assert store.read("exp-1.0-abc") is None
    store.write("exp-1.0-abc", b"packed unit", {"experiment": "exp", "release": "1.0", "observed_utc": "T"})
    assert store.read("exp-1.0-abc") == b"packed unit"
    store.write("exp-1.0-abc", b"observed again", {"experiment": "exp", "release": "1.0", "observed_utc": "T2"})
    assert store.read("exp-1.0-abc") == b"observed again"
    assert sorted(p.name for p in (tmp_path / "units").iterdir()) == ["exp-1.0-abc", "exp-1.0-abc.lock"]

    archive = tmp_path / "units" / "exp-1.0-abc" / unit_cache.ARCHIVE
    archive.unlink()
    (tmp_path / "elsewhere").write_bytes(b"a file outside the cache")
    os.symlink(tmp_path / "elsewhere", archive)
    assert "unit.tar.gz" in str(store.read("exp-1.0-abc"))  # a symlink is never followed
    archive.unlink()
    with open(archive, "wb") as big:
        big.truncate(unit_cache.MAX_UNIT_BYTES + 1)
    assert "bytes >" in str(store.read("exp-1.0-abc"))
    store.discard("exp-1.0-abc")
    assert store.read("exp-1.0-abc") is None and not (tmp_path / "units" / "exp-1.0-abc").exists()


def test_may_hold_all_is_false_once_a_release_has_no_complete_entry(exp, tmp_path):
    """The hint a sweep starts its fork server by, before the wheels are resolved: a release
    with no entry of the experiment at all will run."""
    units = unit_cache.SweepUnits(exp, tmp_path, {}, "forked")
    assert not units.may_hold_all(["0.5.20"])  # no units/ yet
    units.store.write(_name(exp), b"packed unit", {})
    units.store.write(
        unit_cache.entry_name({"experiment": {"id": "other"}, "request": {"pin": {"version": "0.5.21"}}}), b"x", {}
    )
    (tmp_path / "units" / "experiment-a-0.5.22-half").mkdir()  # no marker: not complete
    assert units.may_hold_all(["0.5.20"])
    assert not units.may_hold_all(["0.5.20", "0.5.21"])  # another experiment's entry for 0.5.21
    assert not units.may_hold_all(["0.5.20", "0.5.22"])
    assert not units.may_hold_all(["0.5.2"])  # 0.5.20's entry is not 0.5.2's
    units.reuse_units = False  # --no-reuse: every unit runs
    assert not units.may_hold_all(["0.5.20"])


def test_cache_ls_counts_units_and_prune_kind_unit_removes_only_them(tmp_path):
    store = unit_cache.UnitStore(tmp_path)
    for version in ("1.0", "1.1"):
        store.write(f"exp-{version}-abc", b"u" * 100, {"experiment": "exp", "release": version, "observed_utc": "T"})
    (tmp_path / "units" / ".build-exp-2.0-abc-x").mkdir()  # a unit being kept, or left by a kill
    env = tmp_path / "envs" / "prof-0123"
    env.mkdir(parents=True)
    (env / cache.ENV_MARKER).write_text("{}")
    entries = cache.scan(tmp_path)
    assert cache.counts(entries) == {"env": 1, "unit": 2}
    units = [e for e in entries if e.kind == "unit"]
    assert [e.label for e in units] == ["exp 1.0 T", "exp 1.1 T"]

    runner = CliRunner()
    env_vars = {"KVPROBE_CACHE_DIR": str(tmp_path)}
    listed = json.loads(runner.invoke(main, ["cache", "ls", "--json"], env=env_vars).stdout)
    assert listed["counts"] == {"env": 1, "unit": 2}
    human = runner.invoke(main, ["cache", "ls"], env=env_vars).stdout
    assert "sweep units: 2" in human

    dry = json.loads(
        runner.invoke(main, ["cache", "prune", "--kind", "unit", "--all", "--dry-run", "--json"], env=env_vars).stdout
    )
    assert sorted((o["kind"], o["action"]) for o in dry["outcomes"]) == [
        ("partial", "skipped"),  # young work in progress: left alone
        ("unit", "would-delete"),
        ("unit", "would-delete"),
    ]
    assert store.read("exp-1.0-abc") == b"u" * 100
    runner.invoke(main, ["cache", "prune", "--kind", "unit", "--all"], env=env_vars)
    assert cache.counts(cache.scan(tmp_path)) == {"env": 1}


def _committed_receipt() -> dict:
    (path,) = sorted((ROOT / "bundles").glob("experiment-a-sweep-*/receipt.json"))[:1]
    return json.loads(path.read_text())


def test_verify_holds_a_reused_release_to_the_rest_of_the_receipt():
    receipt = _committed_receipt()
    typed = SweepReceipt.from_json(receipt)
    release = typed.releases[0]
    assert reused_defects(typed) == []

    def with_reused(record, observed):
        changed = dataclasses.replace(record, reused=ReusedUnit(observed, "0" * 64))
        return dataclasses.replace(typed, releases=(changed, *typed.releases[1:]))

    assert reused_defects(with_reused(release, typed.created_utc)) == []
    (late,) = reused_defects(with_reused(release, "2099-01-01T00:00:00Z"))
    assert "after the sweep began" in late.message
    failed = dataclasses.replace(release, problem="wheel: not found", wheel=None, probes=())
    (unobserved,) = reused_defects(with_reused(failed, typed.created_utc))
    assert "its unit did not observe" in unobserved.message


def test_the_readme_names_each_reused_release_and_when_it_was_observed():
    receipt = SweepReceipt.from_json(_committed_receipt())
    assert "reused" not in render_readme(receipt).lower()
    release = receipt.releases[1]
    reused = dataclasses.replace(release, reused=ReusedUnit("2026-12-01T10:00:00Z", "0" * 64))
    releases = (receipt.releases[0], reused, *receipt.releases[2:])
    text = render_readme(dataclasses.replace(receipt, releases=releases))
    version = release.version
    assert f"Reused: 1 of {len(receipt.releases)} releases were not observed again" in text
    assert f"- {version}: reused from 2026-12-01T10:00:00Z" in text


class _Notes(Reporter):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def note(self, text: str) -> None:
        self.lines.append(text)


def test_a_cache_that_cannot_be_read_costs_reuse_not_the_sweep(exp, tmp_path, monkeypatch):
    from kvprobe.run.sweep_unit import Expected

    notes = _Notes()
    units = unit_cache.SweepUnits(exp, tmp_path, {}, "forked", reporter=notes)
    expected = Expected(exp, tmp_path / "staging", ENV)

    def unreadable(name):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(units.store, "read", unreadable)
    assert units.reuse(_request(exp), expected, tmp_path) is None
    assert notes.lines == ["0.5.20: the unit cache could not be read ([Errno 13] Permission denied); observing it"]
    # no env known yet (Ray), or reuse off: the cache is not even read (it would note again)
    assert units.reuse(_request(exp), Expected(exp, tmp_path, None), tmp_path) is None
    units.reuse_units = False
    assert units.reuse(_request(exp), expected, tmp_path) is None
    assert len(notes.lines) == 1


def test_a_unit_whose_repeat_left_no_output_is_not_kept():
    """sweep --repeat N: a probe whose run 2 crashed makes the release could-not-observe; such a
    unit is observed again next time, never kept and reused."""
    from kvprobe.model.receipt import FileRef, ProbeRepeat

    release = SweepReceipt.from_json(_committed_receipt()).releases[0]
    assert unit_cache.keepable(release)

    def run2(repeat):
        return dataclasses.replace(
            release, probes=tuple(dataclasses.replace(p, repeats=(repeat,)) for p in release.probes)
        )

    ran = ProbeRepeat(FileRef("raw/x/probes/p.repeat-2.json", "0" * 64), 0, None)
    assert unit_cache.keepable(run2(ran))
    assert not unit_cache.keepable(run2(ProbeRepeat(None, -9, "crashed (signal 9)")))
    assert not unit_cache.keepable(run2(dataclasses.replace(ran, problem="timed out")))


def test_an_unstable_unit_is_not_kept():
    """sweep --repeat N: a release whose cases differed between runs is observed again by the
    next sweep (which may read it stably), never handed back from the cache."""
    release = SweepReceipt.from_json(_committed_receipt()).releases[0]
    unstable = dataclasses.replace(
        release.classification, unstable={"p/c": "unstable across repeats: observation 'x' was 1 in run 1, 2 in run 2"}
    )
    assert unit_cache.keepable(
        dataclasses.replace(release, classification=dataclasses.replace(release.classification, unstable={}))
    )
    assert not unit_cache.keepable(dataclasses.replace(release, classification=unstable))

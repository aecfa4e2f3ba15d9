"""A sweep's progress line per release says what its unit was: reused from the cache, run ahead
by the release-by-release pass (and the time it took there), not observed, or run now; never a
"(0 s)" for a unit that ran in a fraction of a second or did not run here at all."""

from __future__ import annotations

import dataclasses
import json
from io import StringIO
from pathlib import Path

from rich.console import Console

from kvprobe.cli.console import PlainReporter
from kvprobe.model.load import load
from kvprobe.model.records import WheelPin
from kvprobe.model.sweep_receipt import ReleaseRecord, ReusedUnit, SweepReceipt
from kvprobe.run.sweep_runner import progress_line
from kvprobe.run.sweep_unit import UnitOutcome, UnitRequest

ROOT = Path(__file__).resolve().parents[3]


def _entry() -> ReleaseRecord:
    path = next(p for p in sorted((ROOT / "bundles").glob("*-sweep-*/receipt.json")))
    receipt = load(json.loads(path.read_bytes()))
    assert isinstance(receipt, SweepReceipt)
    return next(r for r in receipt.releases if r.probes and r.problem is None)


def _outcome(entry: ReleaseRecord, ran_ahead_s: float | None) -> UnitOutcome:
    pin = WheelPin("sglang", entry.version, f"sglang-{entry.version}-py3-none-any.whl", "ab" * 32)
    return UnitOutcome(UnitRequest("experiment-a", "cd" * 32, pin, 60.0), b"packed", ran_ahead_s=ran_ahead_s)


def _printed(line: str) -> str:
    """The line as `kvprobe sweep` shows it on stderr."""
    err = StringIO()
    PlainReporter(Console(file=err, width=200)).note(line)
    return err.getvalue().strip()


def test_a_unit_run_ahead_release_by_release_says_so_and_the_time_it_took_there():
    entry = dataclasses.replace(_entry(), duration_s=0.31)
    line = progress_line(3, 12, entry, _outcome(entry, 2.46))
    cls = entry.classification.overall
    assert line == f"3/12 {entry.version} {cls} (release by release, ahead of this sweep: 2.5 s)"
    assert _printed(line) == f"· {line}"


def test_a_unit_run_now_gives_its_own_time_in_tenths_under_ten_seconds():
    entry = dataclasses.replace(_entry(), duration_s=0.31)
    assert progress_line(1, 2, entry, _outcome(entry, None)).endswith(" (0.3 s)")
    assert progress_line(1, 2, dataclasses.replace(entry, duration_s=42.4)).endswith(" (42 s)")


def test_a_reused_unit_says_when_it_observed_and_no_time():
    entry = dataclasses.replace(_entry(), duration_s=0.0, reused=ReusedUnit("2026-12-02T01:55:06Z", "ef" * 32))
    assert progress_line(2, 2, entry).endswith(f" {entry.classification.overall} (reused from 2026-12-02T01:55:06Z)")


def test_a_unit_that_left_nothing_says_why_not_a_time():
    entry = dataclasses.replace(_entry(), probes=(), duration_s=0.0, problem="the unit failed on the cluster: x\ny")
    assert progress_line(1, 1, entry).endswith(" (the unit failed on the cluster: x y)")

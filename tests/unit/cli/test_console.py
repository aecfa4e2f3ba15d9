"""cli/console: plain progress for a log, and data that never becomes markup."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console
from rich.table import Table

from kvprobe.cli.console import PlainReporter, data, emit, make_console
from tests.typed import run_receipt


def test_plain_progress_says_start_heartbeat_and_end():
    buffer = io.StringIO()
    reporter = PlainReporter(make_console(buffer), heartbeat_s=0.05)
    with reporter.step("building env [/] \x1b[2J"):
        reporter.update("pip: torch")
        deadline = time.monotonic() + 10  # the first beat is due after 0.05 s; a loaded machine may lag
        while "still running" not in buffer.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    lines = buffer.getvalue().splitlines()
    assert lines[0] == "… building env [/] \\x1b[2J"
    beats = [line for line in lines if "still running" in line]
    assert beats and all("pip: torch" in line for line in beats), lines
    assert lines[-1].startswith("✓ building env [/] \\x1b[2J (") and lines[-1].endswith("s)")


def test_plain_progress_marks_a_failed_step():
    buffer = io.StringIO()
    reporter = PlainReporter(make_console(buffer), heartbeat_s=10)
    with pytest.raises(RuntimeError), reporter.step("fetch"):
        raise RuntimeError("boom")
    assert buffer.getvalue().splitlines()[-1].startswith("✗ fetch (")


def test_quiet_plain_progress_prints_nothing():
    buffer = io.StringIO()
    reporter = PlainReporter(make_console(buffer), quiet=True, heartbeat_s=0.01)
    with reporter.step("x"):
        reporter.note("y")
    assert buffer.getvalue() == ""


def test_data_is_printed_literally():
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, force_terminal=True, color_system="truecolor", highlight=False)
    console.print(f"title: {data('[/] [link=https://evil.example]x[/link] [bold]b')}")
    text = buffer.getvalue()
    assert "[/] [link=https://evil.example]x[/link] [bold]b" in text
    assert "\x1b]8;" not in text


def test_a_piped_table_is_one_line_per_row():
    buffer = io.StringIO()
    table = Table(title="t")
    table.add_column("id")
    table.add_column("digest")
    digest = "ab" * 32
    table.add_row("later-release", digest)
    emit(make_console(buffer), table)
    lines = buffer.getvalue().splitlines()
    assert any("later-release" in line and digest in line for line in lines), lines
    assert all(line == line.rstrip() for line in lines)


def _comparison():
    from kvprobe.rules.compare import compare

    def doc(obs):
        return {"probe": "p", "cases": [{"name": "c", "status": "ok", "observations": obs, "error": None}]}

    expect = {"base": {"p/c": {"enqueued": True, "valid": True}}, "head": {"p/c": {"enqueued": False, "valid": True}}}
    return compare(
        expect=expect,
        probe_docs={
            "base": {"p": doc({"enqueued": True, "valid": True, "extra": 1})},
            "head": {"p": doc({"enqueued": False, "valid": True, "extra": 2})},
        },
        probe_problems={},
        test_runs={},
    )


def test_the_headline_counts_flips_and_controls_apart_and_no_row_without_expectation_gets_a_tick():
    from kvprobe.cli.console import print_run_summary

    buffer = io.StringIO()
    comp = _comparison()
    print_run_summary(make_console(buffer), run_receipt(comp), "b", "0" * 64, verbosity=1)
    out = buffer.getvalue()
    assert "observations: 1/1 changed as expected, 1/1 controls held, 1 recorded unchecked" in out
    [extra] = [line for line in out.splitlines() if "extra" in line]
    assert "unchecked" in extra and "✓" not in extra


def test_a_row_that_differed_between_repeats_is_marked_unstable_not_a_cross():
    from kvprobe.cli.console import print_run_summary
    from kvprobe.rules.compare import compare

    def doc(enqueued):
        return {"probe": "p", "cases": [{"name": "c", "status": "ok", "observations": {"enqueued": enqueued}}]}

    expect = {"base": {"p/c": {"enqueued": True}}, "head": {"p/c": {"enqueued": False}}}
    comp = compare(
        expect=expect,
        probe_docs={"base": {"p": doc(True)}, "head": {"p": doc(False)}},
        probe_problems={},
        test_runs={},
        repeats={"base": {"p": [doc(True)]}, "head": {"p": [doc(True)]}},
    )
    buffer = io.StringIO()
    print_run_summary(make_console(buffer), run_receipt(comp), "b", "0" * 64, verbosity=1)
    [row] = [line for line in buffer.getvalue().splitlines() if line.startswith("p/c ")]
    assert "unstable" in row and "✗" not in row and "✓" not in row


def _terminal(width: int) -> tuple[io.StringIO, Console]:
    """A console as make_console builds it for a terminal (rich's layout), into a buffer."""
    buffer = io.StringIO()
    console = Console(
        file=buffer, force_terminal=True, color_system=None, width=width, highlight=False, soft_wrap=False
    )
    return buffer, console


def test_verify_on_a_terminal_never_splits_the_digest(bundle):
    from kvprobe.cli.console import print_verify_report
    from kvprobe.verify.steps import verify

    report = verify(bundle)
    digest = report.manifest_sha256
    buffer, console = _terminal(80)
    print_verify_report(console, report)
    lines = buffer.getvalue().splitlines()
    assert f"manifest sha256: {digest}" in lines  # whole, on one line (the terminal may wrap it on screen)
    table = [line for line in lines if line.startswith("│")]
    assert table and all(len(line) <= 80 for line in table)
    assert any(f"{digest[:12]}…" in line for line in table)
    assert not any(digest[12:24] in line for line in table)  # no fragment of it folded onto a row


def test_a_run_on_a_terminal_shows_the_rows_that_matter_and_never_folds_ids():
    """`kvprobe run model` on a 120-column terminal printed ~520 lines, case ids folded
    mid-word (#25): the rows that matter by default, every row with -v, each id whole."""
    import json
    from pathlib import Path

    from kvprobe.cli.console import print_run_summary
    from kvprobe.model.receipt import Receipt

    root = Path(__file__).resolve().parents[3]
    receipt = json.loads(next((root / "bundles").glob("model-model-*/receipt.json")).read_text())
    rows = receipt["comparison"]["observations"]
    shown = [r for r in rows if r["expected_base_declared"] or r["expected_head_declared"] or r["changed"]]
    matter = [r for r in shown if r["changed"] and not (r["expected_base_declared"] or r["expected_head_declared"])]
    outputs = {}
    for verbosity in (0, 1):
        buffer, console = _terminal(120)
        print_run_summary(console, Receipt.from_json(receipt), "b", "0" * 64, verbosity=verbosity)
        outputs[verbosity] = buffer.getvalue().splitlines()
        assert all(len(line) <= 120 for line in outputs[verbosity])
    assert len(outputs[0]) < len(outputs[1]) and len(outputs[0]) < 150
    assert all(any(line.strip() == r["case"] for line in outputs[0]) for r in matter)  # the id whole, on its line
    full = "\n".join(outputs[1])
    assert all(any(line.strip() == r["case"] for line in outputs[1]) for r in shown)
    assert all(r["observation"] in full for r in shown)


def test_sweep_results_name_every_selected_release_a_profile_does_not_serve():
    """A range reaching below the profile's floor: each release not run has its own line and
    why, in version order with the observed ones (never left off stdout)."""
    from kvprobe.cli.console import print_sweep_summary
    from kvprobe.model.sweep_receipt import SweepReceipt
    from tests.unit.evidence import test_sweep

    doc = test_sweep.receipt(
        [("0.5.13", "affected"), ("0.5.14", "fixed")], spec="0.5.11..0.5.14", unserved=["0.5.11", "0.5.12"]
    )
    buffer = io.StringIO()
    print_sweep_summary(Console(file=buffer, width=300), SweepReceipt.from_json(doc), "out", "d" * 64)
    floor = "older than the profile's floor: profile sglang-cpu serves >=0.5.13"
    assert buffer.getvalue().splitlines()[:4] == [
        f"0.5.11  not-served  {floor}",
        f"0.5.12  not-served  {floor}",
        "0.5.13  affected",
        "0.5.14  fixed",
    ]

"""Every timing figure in README.md comes from a committed bench figures file: the prose's
figures (between ``<!-- figure:KEY -->`` markers) and the performance table are what
bench/readme_figures.py renders from bench/figures-*.json, and no other duration is stated
in the prose but the limits kvprobe sets."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

import readme_figures  # noqa: E402  (bench/readme_figures.py, a script)

README = (ROOT / "README.md").read_text(encoding="utf-8")

# Durations the prose states that are settings of kvprobe's, not measurements.
LIMITS = (
    "The server exits after 10 minutes",
    "every 15 s, and an end line",
    "(30 s once connected; 5 s for `cache servers`)",
    "running 5 s after the request",
)
DURATION = re.compile(r"\b\d+(?:\.\d+)?\s?(?:s|ms|seconds|minutes|min)\b|\b\d+m\d+s\b")


def test_the_readme_figures_are_what_the_committed_bench_files_render():
    docs = readme_figures.load()
    assert readme_figures.rewrite(README, docs) == README, "run: python bench/readme_figures.py"


def test_every_figure_the_generator_knows_is_in_the_readme():
    shown = {key for key, _ in readme_figures.MARKER.findall(README)}
    assert shown == set(readme_figures.FIGURES)


def test_no_timing_in_the_readme_prose_is_written_by_hand():
    prose = readme_figures.MARKER.sub("FIGURE", README)
    prose = re.sub(r"<!-- bench-table:begin -->.*?<!-- bench-table:end -->", "TABLE", prose, flags=re.S)
    prose = re.sub(r"^```.*?^```", "CODE", prose, flags=re.S | re.M)  # real output, held to its shape elsewhere
    for limit in LIMITS:
        assert limit in prose, f"stale allow-list entry: {limit!r}"
        prose = prose.replace(limit, "LIMIT")
    assert DURATION.findall(prose) == []


@pytest.mark.parametrize(
    "seconds,shown", [(3.27, "3.3 s"), (19.96, "20 s"), (46.4, "46 s"), (156.0, "2m36s"), (119.6, "120 s")]
)
def test_durations_are_written_as_the_prose_writes_them(seconds, shown):
    assert readme_figures._s(seconds) == shown


def test_a_figure_the_files_lack_is_refused_not_guessed():
    docs = readme_figures.load()
    docs["figures-warm.json"] = {**docs["figures-warm.json"], "figures": []}
    with pytest.raises(SystemExit, match="0 figures named"):
        readme_figures.rewrite(README, docs)

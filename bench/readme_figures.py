#!/usr/bin/env python3
"""Rewrite the timing figures in README.md's prose from the committed bench figures files
(never edited by hand).

    python bench/bench.py --quick --json --only warm > bench/figures-warm.json   # and so on
    python bench/readme_figures.py

Each figure in the prose sits between ``<!-- figure:KEY -->`` and ``<!-- /figure -->``
(invisible when rendered); KEY names one entry of :data:`FIGURES`: the figures file it comes
from, the figure and what of it is shown. The performance table between the bench-table
markers is readme_table.py's, from the files :data:`TABLE_FILES` names.
tests/unit/test_readme_figures.py holds the README to what both render.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import readme_table  # a script beside this one

BENCH = Path(__file__).resolve().parent
README = BENCH.parent / "README.md"
MARKER = re.compile(r"<!-- figure:([a-z0-9-]+) -->(.*?)<!-- /figure -->", re.S)
TABLE_FILES = (
    "figures-env.json",
    "figures-startup.json",
    "figures-warm.json",
    "figures-sweep-goal.json",
    "figures-first-run.json",
)

WARM_A = "kvprobe run experiment-a --jobs 2 (goal 1, vs today's floor (source trees))"
KEPT_A = (
    "kvprobe run experiment-a --jobs 2 --keep-server (goal 1 with a server kept from an earlier run, vs today's floor)"
)
ENV_SGLANG = "cold env build, lock sglang-cpu: uv vs pip"
FIRST_RUN = "first run from a fresh clone, empty caches: pip install . + kvprobe run experiment-a"
FIRST_ENV = "env build, whole (sglang-cpu, from virtualenv to its marker)"
FIRST_TREES = "run phase materialize (the two SGLang wheels: download, unpack, byte-compile)"
SEVERAL_RUN = "kvprobe run experiment-c experiment-d experiment-e: one command vs the runs one after the other"
SEVERAL_SWEEP = (
    "kvprobe sweep experiment-c experiment-d experiment-e --releases 0.5.20,0.5.21: one command vs the sweeps one "
    "after the other"
)

Docs = dict[str, dict]


def _figure(docs: Docs, file: str, name: str) -> dict:
    found = [f for f in docs[file]["figures"] if f["name"] == name]
    if len(found) != 1:
        raise SystemExit(f"bench/{file}: {len(found)} figures named {name!r}, expected one")
    return found[0]


def _noted(fig: dict, key: str) -> list[float]:
    """Numbers the figure's note gives for ``key`` (``preload_s 9.06``, ``uv 94.48``, ``apart: 1.0, 2.0 s``)."""
    number = r"\d+(?:\.\d+)?\b(?!\.)"
    match = re.search(rf"{re.escape(key)}:? ({number}(?:, {number})*)", fig["note"])
    if match is None:
        raise SystemExit(f"bench figure {fig['name']!r}: its note has no {key!r}")
    return [float(x) for x in match.group(1).split(", ")]


def _s(seconds: float) -> str:
    """A duration as the README prose gives it: 3.3 s, 46 s, 2m36s."""
    if seconds >= 120:
        return f"{int(seconds // 60)}m{round(seconds % 60):02d}s"
    return f"{seconds:.1f} s" if round(seconds, 1) < 20 else f"{seconds:.0f} s"


def _span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return _s(low) if round(low) == round(high) else f"{low:.0f}-{high:.0f} s"


def _with_floor(docs: Docs, file: str, name: str) -> str:
    """A figure and its floor as one span (before and after a change, both measured)."""
    fig = _figure(docs, file, name)
    return _span([fig["median"], fig["floor"]["median"]])


def _load(doc: dict) -> str:
    """The machine's load when the figures were taken: they move with it (2 cores, shared)."""
    return f"load average {doc['machine']['load_average_at_end'][0]:.0f} at the bench's end"


def _median_of(file: str, name: str) -> Callable[[Docs], str]:
    def render(docs: Docs) -> str:
        fig = _figure(docs, file, name)
        runs = f"median of {fig['n']}, " if fig["n"] > 1 else ""
        return f"{_s(fig['median'])} ({runs}{_load(docs[file])})"

    return render


FIGURES: dict[str, Callable[[Docs], str]] = {
    # the warm run of experiment A with its own fork server, and the preload it waited for
    "warm-run-a": _median_of("figures-warm.json", WARM_A),
    "preload-a": lambda d: _s(_noted(_figure(d, "figures-warm.json", WARM_A), "preload_s")[0]),
    # the same run forking from a server kept from an earlier run (--keep-server)
    "kept-run-a": _median_of("figures-warm.json", KEPT_A),
    # the sglang-cpu env built with uv into an empty cache, against pip, and their CPU time
    "env-build-sglang": _median_of("figures-env.json", ENV_SGLANG),
    "env-build-sglang-pip": lambda d: _s(_figure(d, "figures-env.json", ENV_SGLANG)["floor"]["median"]),
    "env-ratio-sglang": lambda d: f"{_figure(d, 'figures-env.json', ENV_SGLANG)['ratio']:.2f}x",
    "env-cpu-sglang": lambda d: "uv {:.0f}, pip {:.0f}".format(
        *(_noted(_figure(d, "figures-env.json", ENV_SGLANG), k)[0] for k in ("CPU s (median) uv", "pip"))
    ),
    # a newcomer's first run (bench/first_run.py), and the same before the env overlapped the trees
    "first-run": _median_of("figures-first-run.json", FIRST_RUN),
    "first-run-before": lambda d: _s(_figure(d, "figures-first-run.json", FIRST_RUN)["floor"]["median"]),
    "first-run-env": lambda d: _with_floor(d, "figures-first-run.json", FIRST_ENV),
    "first-run-trees": lambda d: _with_floor(d, "figures-first-run.json", FIRST_TREES),
    # several experiments in one invocation against the same ones one after the other
    "several-run": _median_of("figures-several.json", SEVERAL_RUN),
    "several-run-apart": lambda d: _s(_figure(d, "figures-several.json", SEVERAL_RUN)["floor"]["median"]),
    "several-run-preload": lambda d: _span(_noted(_figure(d, "figures-several.json", SEVERAL_RUN), "waits apart")),
    "several-sweep": _median_of("figures-several.json", SEVERAL_SWEEP),
    "several-sweep-apart": lambda d: _s(_figure(d, "figures-several.json", SEVERAL_SWEEP)["floor"]["median"]),
    # what a start without kvprobe's bytecode costs (a source checkout, PYTHONDONTWRITEBYTECODE=1)
    "no-bytecode-extra": lambda d: "{:.0f} ms".format(
        1000
        * (
            _figure(d, "figures-startup.json", "kvprobe list (no bytecode)")["median"]
            - _figure(d, "figures-startup.json", "kvprobe list")["median"]
        )
    ),
}


def load() -> Docs:
    """Every committed bench figures file a figure or the table reads."""
    return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in sorted(BENCH.glob("figures-*.json"))}


def rewrite(text: str, docs: Docs) -> str:
    """``text`` with every figure marker's content and the bench table rendered from ``docs``."""

    def one(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in FIGURES:
            raise SystemExit(f"README.md: unknown figure {key!r} (known: {', '.join(FIGURES)})")
        return f"<!-- figure:{key} -->{FIGURES[key](docs)}<!-- /figure -->"

    text = MARKER.sub(one, text)
    begin, end = readme_table.BEGIN, readme_table.END
    head, rest = text.split(begin, 1)
    return head + readme_table.table([docs[name] for name in TABLE_FILES]) + rest.split(end, 1)[1]


def main() -> int:
    text = README.read_text(encoding="utf-8")
    README.write_text(rewrite(text, load()), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

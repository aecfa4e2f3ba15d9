#!/usr/bin/env python3
"""Rewrite README.md's performance table from real bench runs (never edited by hand).

    python bench/bench.py --quick --json > bench/figures.json
    python bench/readme_table.py bench/figures.json [more.json ...]

Every figure with a target becomes one row (figure, floor, ratio, target, met or missed),
between the ``<!-- bench-table:begin -->`` and ``<!-- bench-table:end -->`` markers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import _fmt  # bench.py is a script beside this one

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN, END = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"


def rows(doc: dict) -> list[str]:
    out = []
    for fig in doc["figures"]:
        if not fig["target"]:
            continue
        unit = fig["unit"]
        floor = _fmt(fig["floor"]["median"], unit) if "floor" in fig else ""
        ratio = f"{fig['ratio']:.2f}x" if "ratio" in fig else ""
        verdict = "met" if fig["met"] else "**missed**"
        out.append(f"| {fig['name']} | {_fmt(fig['median'], unit)} | {floor} | {ratio} | {fig['target']} | {verdict} |")
    return out


def table(docs: list[dict]) -> str:
    lines = [BEGIN, "| figure | kvprobe | floor | ratio | target | |", "| --- | --- | --- | --- | --- | --- |"]
    for doc in docs:
        lines += rows(doc)
    for doc in docs:
        m = doc["machine"]
        lines.append(
            f"\n`{doc.get('script', 'bench.py')}{' --quick' if doc['quick'] else ''}` run of {doc['seconds']:.0f} s on {m['cpus']} cores, "
            f"{m['memory_gib']} GiB, Python {m['python']}; load average at its end {m['load_average_at_end']}."
        )
    lines.append(END)
    return "\n".join(lines)


def main(paths: list[str]) -> int:
    docs = [json.loads(Path(p).read_text()) for p in paths]
    text = README.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{README}: no {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    README.write_text(head + table(docs) + tail, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

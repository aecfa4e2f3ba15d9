#!/usr/bin/env python3
"""Rewrite README.md's release table from the committed sweep bundles (never edited by hand).

    python bench/readme_sweeps.py

The sweep bundles are the ones the README's sweep-bundle table publishes (rows
``| `bundles/<id>-sweep-<UTC>` | ... | `<sha256>` |``). Between the
``<!-- sweep-table:begin -->`` and ``<!-- sweep-table:end -->`` markers it writes one row per
release any of them observed, a column per experiment (its class and case counts), and a
first row for the versions no sweep observed, with why. tests/integration/test_committed_sweeps.py
holds the README to what this renders.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BEGIN, END = "<!-- sweep-table:begin -->", "<!-- sweep-table:end -->"
ROW = re.compile(r"\| `bundles/([^`]+-sweep-[^`]+)` \| [^|]+ \| `([0-9a-f]{64})` \|")


def published(text: str) -> list[Path]:
    return [ROOT / "bundles" / name for name, _digest in ROW.findall(text)]


def _counts(classification: dict) -> str:
    counts = Counter(case["class"] for case in classification["cases"].values())
    return ", ".join(f"{n} {cls}" for cls, n in sorted(counts.items()))


def _header(receipt: dict) -> str:
    exp = receipt["experiment"]
    prs = ", ".join(f"#{n}" for n in exp["fix"]["prs"])
    release = exp["fix"].get("release")
    return f"{exp['id']} ({prs}" + (f", fix in {release})" if release else ")")


def table(bundles: list[Path]) -> list[str]:
    receipts = [json.loads((b / "receipt.json").read_text()) for b in bundles]
    by_exp = [{r["version"]: r for r in receipt["releases"]} for receipt in receipts]
    versions = sorted({v for releases in by_exp for v in releases}, key=Version)
    lines = [
        "| release | " + " | ".join(_header(r) for r in receipts) + " | wheel sha256 |",
        "| --- | " + " | ".join("---" for _ in receipts) + " | --- |",
    ]
    older = sorted({v for r in receipts for v in r["observed"]["not_observed"]}, key=Version)
    if older:
        reasons = sorted(
            {r["observed"]["not_observed_reason"] for r in receipts if r["observed"]["not_observed_reason"]}
        )
        cells = " | ".join("not observed" for _ in receipts)
        lines.append(f"| {older[0]} .. {older[-1]} ({len(older)} versions) | {cells} | {'; '.join(reasons)} |")
    for version in versions:
        cells, digest = [], ""
        for releases in by_exp:
            entry = releases.get(version)
            if entry is None:
                cells.append("—")
                continue
            cls = entry["classification"]
            cells.append(f"**{cls['overall']}** ({_counts(cls)})")
            digest = digest or (entry.get("wheel") or {}).get("sha256", "")
        lines.append(f"| {version} | " + " | ".join(cells) + f" | `{digest[:16]}…` |")
    return lines


def render(text: str) -> str:
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + "\n".join(table(published(text))) + "\n" + text[end:]


def main() -> int:
    text = README.read_text()
    README.write_text(render(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())

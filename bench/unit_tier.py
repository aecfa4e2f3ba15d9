#!/usr/bin/env python3
"""The unit tier's wall time, this checkout against another revision, measured in pairs.

    python bench/unit_tier.py [--against REV] [--rounds N] [--json]

REV (default 81695ab, where issue #24 measured the tier) is checked out in a temporary git
worktree; both trees then run ``python -m pytest tests/unit -q -p no:cacheprovider`` with
this interpreter, alternately, N rounds (default 3), so a load that comes and goes weighs on
both alike. Each run's wall, user and sys seconds and test count are printed, then the
medians. The load average before and after is in the note: on this 2-core machine a busy
neighbour moves the wall time by half, so compare figures taken in one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
COMMAND = [sys.executable, "-m", "pytest", "tests/unit", "-q", "-p", "no:cacheprovider"]
PASSED = re.compile(r"(\d+) passed")


def _load() -> float:
    return os.getloadavg()[0]


def _tier(tree: Path) -> dict[str, Any]:
    """One run of the unit tier in ``tree``: wall, CPU of the pytest process, tests passed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(COMMAND, cwd=tree, capture_output=True, text=True, timeout=900, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    found = PASSED.search(done.stdout.splitlines()[-1] if done.stdout else "")
    if done.returncode != 0 or found is None:
        raise SystemExit(f"unit tier failed in {tree} (exit {done.returncode}):\n{done.stdout[-2000:]}")
    return {
        "wall_s": round(wall, 2),
        "user_s": round(after.ru_utime - before.ru_utime, 2),
        "sys_s": round(after.ru_stime - before.ru_stime, 2),
        "tests": int(found[1]),
    }


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {key: round(statistics.median(r[key] for r in runs), 2) for key in ("wall_s", "user_s", "sys_s")} | {
        "tests": runs[0]["tests"],
        "runs": runs,
    }


def measure(against: str, rounds: int) -> dict[str, Any]:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
    with tempfile.TemporaryDirectory(prefix="kvprobe-unit-tier-") as tmp:
        other = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(other), against], cwd=REPO, check=True)
        try:
            load_before = _load()
            runs: dict[str, list[dict[str, Any]]] = {"this": [], "against": []}
            for _ in range(rounds):
                for name, tree in (("against", other), ("this", REPO)):
                    runs[name].append(_tier(tree))
                    print(f"{name:8} {runs[name][-1]}", file=sys.stderr)
            load_after = _load()
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=REPO, check=False)
    return {
        "this": {"revision": head.stdout.strip(), **_summary(runs["this"])},
        "against": {"revision": against, **_summary(runs["against"])},
        "note": f"{rounds} rounds in pairs; load average {load_before:.1f} before, {load_after:.1f} after",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="81695ab")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = measure(args.against, args.rounds)
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for name in ("against", "this"):
        f = figures[name]
        per_test = 1000 * f["wall_s"] / f["tests"]
        print(
            f"{f['revision']:>10}: {f['tests']} tests, median {f['wall_s']} s wall "
            f"({f['user_s']} s user, {f['sys_s']} s sys), {per_test:.1f} ms per test"
        )
    print(figures["note"])


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Sweep units reused from the cache (#26 "never observe the same thing twice"): what a warm
sweep costs when every unit is reused, against the same sweep with --no-reuse, and what a
sweep costs when the index has one release more than the cache holds units for.

    python bench/sweep_reuse.py [EXP] [--first 0.5.13] [--last 0.5.22] [--new 0.5.23] [--json]

Four `kvprobe sweep EXP` invocations, one after the other, in a cache of their own whose
envs, wheels, trees and uv cache are the user's (symlinked: nothing is rebuilt or fetched
again) and whose units/ starts empty (so the user's cache gains and loses no unit):

  observed   --releases FIRST..LAST --no-reuse    every unit observed (and kept)
  reused     --releases FIRST..LAST               every unit reused from the cache
  one-new    --releases FIRST..NEW                NEW is new: only it is observed
  one-alone  --releases NEW --no-reuse            what one release costs alone

Figures: each invocation's wall time (the whole process) and the receipt's units_s (the
units' part: resolving the wheels and the units themselves), reused / observed, and one-new
/ one-alone. Run it alone on the machine: other load moves every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from kvprobe.env.cache import default_cache_root  # noqa: E402

SHARED = ("envs", "wheels", "trees", "git", "uv")


def bench_cache(work: Path) -> Path:
    """A cache root whose envs, wheels, trees, git stores and uv cache are the user's own."""
    user = default_cache_root()
    root = work / "cache"
    root.mkdir()
    for name in SHARED:
        if (user / name).is_dir():
            (root / name).symlink_to(user / name)
    return root


def sweep(exp: str, spec: str, out: Path, cache: Path, *flags: str) -> dict:
    argv = [sys.executable, "-m", "kvprobe", "sweep", exp, "--releases", spec, "--out", str(out), "--json", *flags]
    clock = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        argv, env={**os.environ, "KVPROBE_CACHE_DIR": str(cache)}, capture_output=True, text=True, timeout=3600
    )
    wall = time.monotonic() - clock
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 3):
        raise SystemExit(f"sweep {spec} {flags} exited {done.returncode}:\n{done.stderr[-3000:]}")
    receipt = json.loads((out / "receipt.json").read_text())
    releases = receipt["releases"]
    return {
        "spec": spec,
        "flags": list(flags),
        "releases": len(releases),
        "reused": sum(1 for r in releases if r.get("reused")),
        "wall_s": round(wall, 2),
        "units_s": receipt["timings"]["units_s"],
        "resolve_s": receipt["timings"]["resolve_s"],
        "cpu_s": round((after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), 2),
        "summary": receipt["summary"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", nargs="?", default="experiment-a")
    parser.add_argument("--first", default="0.5.13")
    parser.add_argument("--last", default="0.5.22")
    parser.add_argument("--new", default="0.5.23")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvprobe-bench-reuse-") as tmp:
        work = Path(tmp)
        cache = bench_cache(work)
        exp, span = args.experiment, f"{args.first}..{args.last}"
        runs = {
            "observed": sweep(exp, span, work / "observed", cache, "--no-reuse"),
            "reused": sweep(exp, span, work / "reused", cache),
            "one-new": sweep(exp, f"{args.first}..{args.new}", work / "one-new", cache),
            "one-alone": sweep(exp, args.new, work / "one-alone", cache, "--no-reuse"),
        }
    same = runs["observed"]["summary"] == runs["reused"]["summary"]
    figures = {
        "experiment": exp,
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg()[0],
        "runs": runs,
        "reused_over_observed_wall": round(runs["reused"]["wall_s"] / runs["observed"]["wall_s"], 3),
        "reused_over_observed_units": round(runs["reused"]["units_s"] / runs["observed"]["units_s"], 3),
        "one_new_over_one_alone_wall": round(runs["one-new"]["wall_s"] / runs["one-alone"]["wall_s"], 3),
        "same_classes": same,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for name, run in runs.items():
            print(
                f"{name:10} {run['spec']:16} {run['releases']:3} releases, {run['reused']:3} reused: "
                f"{run['wall_s']:7.1f} s wall, units {run['units_s']:7.1f} s, cpu {run['cpu_s']:7.1f} s"
            )
        print(
            f"reused / observed: {figures['reused_over_observed_wall']} (wall), "
            f"{figures['reused_over_observed_units']} (units); one new / one alone: "
            f"{figures['one_new_over_one_alone_wall']} (wall); same classes: {same}"
        )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())

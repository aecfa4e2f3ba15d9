#!/usr/bin/env python3
"""Sweep cost: is a warm sweep of N releases close to N x the per-release floor / jobs?

    python bench/sweep.py BUNDLE [--reps 2] [--json]

BUNDLE is a sweep bundle made warm (env and wheels cached). Run it alone: other load on the
cores inflates both sides. The figures and the floor: docs/design/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from kvprobe.env.cache import default_cache_root  # noqa: E402
from kvprobe.resources import probe_api_dir  # noqa: E402


def floor_once(receipt: dict, bundle: Path, release: dict, work: Path) -> float:
    """Wall time of one release's probes run the way kvprobe runs them, minus kvprobe."""
    cache = default_cache_root()
    wheel = cache / "wheels" / release["wheel"]["sha256"] / release["wheel"]["file"]
    tree = work / "tree"
    if not tree.is_dir():
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(tree)
    env_dir = cache / "envs" / receipt["env"]["key"]
    probe_dir = bundle / "probes" / receipt["experiment"]["id"]
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(work),
        "PYTHONPATH": ":".join([str(tree), str(probe_dir), str(probe_api_dir())]),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "KVPROBE_SIDE_CONFIG": json.dumps({"release": release["version"], "side": "release"}, sort_keys=True),
        **receipt["settings"],
    }
    clock = time.monotonic()
    for probe in release["probes"]:
        out = work / f"{probe['name']}.json"
        subprocess.run(
            [str(env_dir / "bin" / "python"), str(bundle / probe["source"]["path"]), "--out", str(out)],
            env=env,
            cwd=work,
            check=True,
            capture_output=True,
            timeout=900,
        )
    return time.monotonic() - clock


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.bundle = args.bundle.resolve()
    receipt = json.loads((args.bundle / "receipt.json").read_text())
    ran = [r for r in receipt["releases"] if r["wheel"] is not None]
    n, jobs = len(ran), receipt["host"]["jobs"]
    units_s = receipt["timings"]["units_s"]
    with tempfile.TemporaryDirectory(prefix="kvprobe-bench-sweep-") as tmp:
        floors = [floor_once(receipt, args.bundle, ran[-1], Path(tmp)) for _ in range(args.reps)]
    floor = min(floors)
    figures = {
        "experiment": receipt["experiment"]["id"],
        "releases": n,
        "jobs": jobs,
        "cpus": os.cpu_count(),
        "sweep_units_s": units_s,
        "marginal_per_release_s": round(units_s / n, 2),
        "floor_per_release_s": round(floor, 2),
        "floor_samples_s": [round(f, 2) for f in floors],
        "ratio_to_floor": round(units_s / (n * floor / min(jobs, os.cpu_count() or 1)), 2),
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(
            f"sweep {figures['experiment']}: {n} releases, jobs {jobs}: {units_s:.0f} s "
            f"({figures['marginal_per_release_s']} s/release); floor {figures['floor_per_release_s']} s/release; "
            f"ratio {figures['ratio_to_floor']}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Sweeps of many experiments: what one more experiment on a release costs (issue #26).

    python bench/releases.py [--releases 0.5.13..0.5.23] [--json]

Two warm sweeps through the CLI, one after the other (env, wheels and trees in the kvprobe
cache): experiment-a alone, then every shipped experiment (`--all`), over the same releases.
Each runs as its own process; its peak RSS (VmHWM, the driver alone: the fork server and
the probes are other processes) is read from /proc while it runs. Figures:

  all_s        the --all sweep's wall time (target <= 60 s on this 2-core machine)
  ratio        all_s / one_s (target <= 1.5x: sweeping every experiment costs at most 1.5x
               sweeping one)
  marginal     per release and experiment of the --all sweep: the unit's time on a release
               whose tree and imports are already there (its receipt's duration_s), against
               the probe's own run time after its imports (the sum of its cases' duration_s)
  driver RSS   peak RSS of each sweep's driver process

The load average before and after is recorded: other work on the cores inflates every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KVPROBE = Path(sys.executable).with_name("kvprobe")


def _hwm_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def sweep(args: list[str], out: Path, checkout: Path | None = None) -> dict:
    """One `kvprobe sweep` run: wall time, the driver's peak RSS, its JSON result. With
    ``checkout``, that checkout's kvprobe (``python -m kvprobe`` there) instead of this one."""
    argv = [str(KVPROBE), "sweep", *args, "--out", str(out), "--json"]
    env = None
    if checkout is None:  # every unit observed, none taken from the unit cache (a checkout before it has none)
        argv.append("--no-reuse")
    if checkout is not None:
        argv = [sys.executable, "-m", "kvprobe", *argv[1:]]
        env = {**os.environ, "PYTHONPATH": str(checkout)}
    clock = time.monotonic()
    with open(out.parent / f"{out.name}.stderr", "w") as err:
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=err, text=True, cwd=checkout or REPO, env=env
        )
        peak = 0
        while process.poll() is None:
            peak = max(peak, _hwm_kib(process.pid) or 0)
            time.sleep(0.2)
        stdout = process.stdout.read() if process.stdout else ""
    wall = time.monotonic() - clock
    log = (out.parent / f"{out.name}.stderr").read_text(errors="replace")
    if process.returncode not in (0, 3):
        raise SystemExit(f"{' '.join(argv)}: exit {process.returncode}:\n{log[-3000:]}")
    # the driver's steps as its progress lines say them: "✓ STEP (12.3s)"
    steps = [line[2:] for line in log.splitlines() if line.startswith("✓ ")]
    return {
        "wall_s": round(wall, 2),
        "driver_peak_rss_mib": round(peak / 1024, 1),
        "result": json.loads(stdout),
        "steps": steps,
    }


def bundles(result: dict) -> list[Path]:
    if "sweeps" in result:
        return [Path(s["bundle"]) for s in result["sweeps"]]
    return [Path(result["bundle"])]


def marginal(bundle: Path) -> list[dict]:
    """Per release of one sweep bundle: the unit's time and its probes' own time."""
    receipt = json.loads((bundle / "receipt.json").read_text())
    rows = []
    for release in receipt["releases"]:
        own = 0.0
        for probe in release["probes"]:
            if probe.get("raw"):
                doc = json.loads((bundle / probe["raw"]["path"]).read_text())
                own += sum(case.get("duration_s", 0.0) for case in doc["cases"])
        rows.append(
            {
                "experiment": receipt["experiment"]["id"],
                "release": release["version"],
                "unit_s": release["duration_s"],
                "probes_own_s": round(own, 3),
                "modes": sorted({p["mode"] for p in (release.get("execution") or {}).get("probes", [])}),
            }
        )
    return rows


def figure(name: str, unit: str, value: float, *, target: str = "", met: bool | None = None, **extra) -> dict:
    fig = {"section": "releases", "name": name, "unit": unit, "n": 1, "min": value, "median": value, "max": value}
    fig.update(samples=[value], target=target, met=bool(met) if target else None, **extra)
    return fig


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--releases", default="0.5.13..0.5.23")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="also run both sweeps with this checkout's kvprobe (one without shared release imports), "
        "alternating with this one's",
    )
    parser.add_argument("--baseline-label", help="what the baseline is (default: its git commit)")
    args = parser.parse_args()
    started, load_before = time.monotonic(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kvprobe-bench-releases-") as tmp:
        one = sweep(["experiment-a", "--releases", args.releases], Path(tmp) / "one")
        load_mid = os.getloadavg()
        every = sweep(["--all", "--releases", args.releases], Path(tmp) / "all")
        rows = [row for bundle in bundles(every["result"]) for row in marginal(bundle)]
        if args.baseline:
            base_one = sweep(["experiment-a", "--releases", args.releases], Path(tmp) / "base-one", args.baseline)
            base_all = sweep(["--all", "--releases", args.releases], Path(tmp) / "base-all", args.baseline)
    experiments = sorted({r["experiment"] for r in rows})
    releases = sorted({r["release"] for r in rows}, key=lambda v: [int(p) if p.isdigit() else p for p in v.split(".")])
    first = {r["release"]: r for r in rows if r["experiment"] == experiments[0]}
    later = [r for r in rows if r["experiment"] != experiments[0] and r["probes_own_s"] > 0]
    over = [r["unit_s"] - r["probes_own_s"] for r in later]
    times = [r["unit_s"] / r["probes_own_s"] for r in later]
    ratio = every["wall_s"] / one["wall_s"]
    note_load = f"load average before {load_before}, between {load_mid}, after {os.getloadavg()}"
    figures = [
        figure(
            f"--all ({len(experiments)} experiments) over {args.releases} ({len(releases)} releases), warm",
            "s",
            every["wall_s"],
            target="<= 60 s",
            met=every["wall_s"] <= 60,
            note=note_load,
        ),
        figure(
            "--all sweep / experiment-a sweep, same releases (no unit reuse)",
            "x",
            round(ratio, 2),
            target="<= 1.5x",
            met=ratio <= 1.5,
            note=f"experiment-a alone: {one['wall_s']} s; --all: {every['wall_s']} s; {note_load}",
        ),
        figure(
            "one more experiment on a release: unit time minus its probes' own run time (median)",
            "s",
            round(statistics.median(over), 3) if over else 0.0,
            note=(
                f"{len(later)} units after the first experiment on each release; unit time "
                f"{statistics.median([r['unit_s'] for r in later]):.2f} s median, probes' own "
                f"{statistics.median([r['probes_own_s'] for r in later]):.2f} s median"
            )
            if later
            else "no units",
        ),
        figure(
            "one more experiment on a release: unit time / its probes' own run time (median)",
            "x",
            round(statistics.median(times), 2) if times else 0.0,
            note="the probes' own run time: the sum of their cases' duration_s, after their imports",
        ),
        figure("driver peak RSS, --all sweep", "MiB", every["driver_peak_rss_mib"]),
        figure("driver peak RSS, experiment-a sweep", "MiB", one["driver_peak_rss_mib"]),
    ]
    if args.baseline:
        commit = args.baseline_label or subprocess.run(
            ["git", "-C", str(args.baseline), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        for name, mine, base in (("experiment-a", one, base_one), ("--all", every, base_all)):
            figures.append(
                figure(
                    f"sweep {name} over {args.releases}: this checkout / {args.baseline} ({commit})",
                    "x",
                    round(mine["wall_s"] / base["wall_s"], 2),
                    note=f"{mine['wall_s']} s vs {base['wall_s']} s, run one after the other; {note_load}",
                    baseline_steps=base["steps"],
                )
            )
    doc = {
        "schema": "kvprobe.bench/1",
        "script": "releases.py",
        "quick": False,
        "seconds": round(time.monotonic() - started, 1),
        "machine": {
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "python": platform.python_version(),
            "load_average_at_start": [round(x, 2) for x in load_before],
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        "figures": figures,
        "per_release": {
            release: {r["experiment"]: {k: r[k] for k in ("unit_s", "probes_own_s", "modes")} for r in rows if r["release"] == release}
            for release in releases
        },
        "first_experiment_per_release_s": {v: r["unit_s"] for v, r in first.items()},
        "steps": {"experiment-a": one["steps"], "all": every["steps"]},
    }
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        for fig in figures:
            print(f"{fig['name']}: {fig['median']} {fig['unit']}  {fig.get('target', '')}  {fig.get('note', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

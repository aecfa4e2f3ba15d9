#!/usr/bin/env python3
"""A newcomer's first run: fresh clone, fresh venv, `pip install .`, `kvprobe run experiment-a`,
with every cache empty, and where its time goes.

    python bench/first_run.py [--source REPO] [--label before|after] [--json] [--keep]

Everything is made under one temp dir in /tmp (the clone, the venv, pip's cache, the
kvprobe cache via KVPROBE_CACHE_DIR, and UV_CACHE_DIR for any uv that would look past
kvprobe's ``--cache-dir``) and deleted at the end unless --keep: the shared kvprobe cache
and ~/.cache/uv are never read. The cold cache takes ~12 GB of disk while it lasts.

Phases (seconds, wall):
  clone       git clone of --source (a local path: no network)
  install     ``pip install .`` into the fresh venv (pip's own cache empty)
  run         ``kvprobe run experiment-a``, split by the receipt's own timings:
    materialize   the two SGLang wheels: download, hash check, unpack, byte-compile
    environment   the sglang-cpu env build that did not overlap the trees, and uv's phases
                  from kvprobe's note: Prepared (download + unzip into uv's cache, hashes
                  checked), Installed (linked into the env), Bytecode compiled
    preload       waiting for the fork server's imports
    checks        both sides' checks
Each figure is one measurement (a cold run downloads ~3 GB and writes ~12 GB: run it alone,
rarely); the load average before and after is in the note, since it moves the figure a lot.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = "experiment-a"
GiB = 1024**3
_UV_PHASE = re.compile(r"(Resolved|Prepared|Installed|Bytecode compiled) (\d+) (\w+) in ([\w. ]+)")


def _log(text: str) -> None:
    print(f"[first_run] {text}", file=sys.stderr, flush=True)


def _seconds(text: str) -> float:
    """uv's durations: "41.23s", "1m 02s", "830ms"."""
    total = 0.0
    for number, unit in re.findall(r"([\d.]+)(ms|m|s)", text):
        total += float(number) * {"ms": 0.001, "m": 60.0, "s": 1.0}[unit]
    return total


def uv_phases(stderr: str) -> dict[str, float]:
    """uv's phase times from kvprobe's ``env sglang-cpu: Resolved ...; Prepared ...`` note."""
    found: dict[str, float] = {}
    for line in stderr.splitlines():
        if "sglang-cpu" not in line:
            continue
        for phase, _count, _what, took in _UV_PHASE.findall(line):
            found[phase.lower().replace(" ", "_")] = _seconds(took)
    return found


def env_build_seconds(stderr: str) -> float | None:
    """The whole env build ("✓ building env sglang-cpu ... (135.8s)"), overlap included."""
    found = re.findall(r"^✓ building env sglang-cpu .*\(([\d.]+)s\)$", stderr, re.MULTILINE)
    return float(found[-1]) if found else None


def _timed(argv: list[str], env: dict[str, str], log: Path, cwd: Path | None = None) -> tuple[float, str]:
    started = time.monotonic()
    with open(log, "w") as err:
        result = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=err, text=True, timeout=3600)
    took = time.monotonic() - started
    if result.returncode not in (0, 1):  # 1: the experiment did not reproduce, still a run
        raise SystemExit(f"{argv[0]} ... exited {result.returncode}; see {log}")
    return took, log.read_text(errors="replace")


def measure(source: Path, work: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPROBE_", "UV_", "VIRTUAL_ENV"))}
    env |= {
        "KVPROBE_CACHE_DIR": str(work / "kvprobe-cache"),
        "UV_CACHE_DIR": str(work / "uv-global"),
        "PIP_CACHE_DIR": str(work / "pip-cache"),
    }
    load_before = os.getloadavg()
    clone_s, _ = _timed(["git", "clone", "--quiet", str(source), str(work / "clone")], env, work / "clone.log")
    subprocess.run([sys.executable, "-m", "venv", str(work / "venv")], check=True, timeout=300)
    _log("pip install . (cold pip cache)")
    install_s, _ = _timed(
        [str(work / "venv/bin/python"), "-m", "pip", "install", "-q", "."], env, work / "install.log", work / "clone"
    )
    _log(f"kvprobe run {EXPERIMENT} (empty kvprobe cache)")
    run_s, stderr = _timed(
        [str(work / "venv/bin/kvprobe"), "run", EXPERIMENT, "--out", str(work / "bundle"), "--json"],
        env,
        work / "run.log",
    )
    receipt = json.loads((work / "bundle" / "receipt.json").read_text())
    return {
        "clone_s": clone_s,
        "install_s": install_s,
        "run_s": run_s,
        "timings": receipt.get("timings", {}),
        "uv": uv_phases(stderr),
        "env_build_s": env_build_seconds(stderr),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "stderr_tail": stderr.splitlines()[-40:],
    }


def _figure(name: str, value: float, *, target: str = "", note: str = "", met: bool | None = None) -> dict[str, Any]:
    fig: dict[str, Any] = {
        "section": "first-run",
        "name": name,
        "unit": "s",
        "n": 1,
        "min": value,
        "median": value,
        "max": value,
        "samples": [round(value, 3)],
        "target": target,
        "note": note,
    }
    if target:
        fig["met"] = bool(met)
    return fig


TOTAL = f"first run from a fresh clone, empty caches: pip install . + kvprobe run {EXPERIMENT}"
# the figures shown in the README, compared with the same figures measured before #26's cuts
SHOWN = {
    TOTAL: "",
    "pip install . into a fresh venv": "",
    f"kvprobe run {EXPERIMENT}, empty kvprobe cache": "",
    "run phase materialize": " (the two SGLang wheels: download, unpack, byte-compile)",
    "run phase environment": " (env build, beyond what overlapped the trees)",
    "env build, whole": " (sglang-cpu, from virtualenv to its marker)",
    "env build prepared": " (uv: download + unzip into its cache, hashes checked)",
    "env build bytecode_compiled": " (the env's bytecode)",
    "run phase preload": "",
    "run phase checks": "",
}


def figures(m: dict[str, Any]) -> list[dict[str, Any]]:
    t, uv = m["timings"], m["uv"]
    total = m["install_s"] + m["run_s"]
    load = f"load average before {m['load_before']}, after {m['load_after']}"
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in uv.items())
    steps = ", ".join(f"{k[:-2]} {v:.1f} s" for k, v in t.items() if k.endswith("_s"))
    return [
        _figure(
            TOTAL, total, note=f"install {m['install_s']:.1f} s, run {m['run_s']:.1f} s ({steps}); uv: {phases}; {load}"
        ),
        _figure("pip install . into a fresh venv", m["install_s"], note=load),
        _figure(f"kvprobe run {EXPERIMENT}, empty kvprobe cache", m["run_s"], note=steps),
        *[_figure(f"run phase {k[:-2]}", v) for k, v in t.items() if k.endswith("_s")],
        # the whole build; before the env was built beside the trees, the run's environment phase
        _figure("env build, whole", m.get("env_build_s") or t.get("environment_s", 0.0)),
        *[_figure(f"env build {k}", v) for k, v in uv.items()],
    ]


def compared(doc: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with the README's figures given a floor: the same figure in ``before`` (a run
    of this script on the tree before #26's cuts), and their ratio."""
    old = {f["name"]: f for f in figures(before["raw"])}
    for fig in doc["figures"]:
        name = fig["name"]
        if name in SHOWN and name in old:
            fig["floor"] = {k: old[name][k] for k in ("n", "min", "median", "max", "samples")}
            fig["ratio"] = round(fig["median"] / old[name]["median"], 3) if old[name]["median"] else 0.0
            fig["target"] = "reported (floor: before #26)"
            fig["met"] = True
            fig["name"] = name + SHOWN[name]
    doc["before"] = {"machine": before["machine"], "raw": before.get("raw"), "seconds": before["seconds"]}
    return doc


def _machine() -> dict[str, Any]:
    return {
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB, 1),
        "python": platform.python_version(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=REPO, help="the repository to clone (default: this one)")
    parser.add_argument("--before", type=Path, help="a JSON of this script run before the cuts: its figures' floor")
    parser.add_argument(
        "--combine", type=Path, help="no measurement: the JSON of an earlier run, compared with --before"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as kvprobe.bench/1 JSON")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (clone, venv, ~12 GB cache)")
    args = parser.parse_args()
    if args.combine:  # the figures again from an earlier run's raw measurement
        doc = json.loads(args.combine.read_text())
        doc["figures"] = figures(doc["raw"])
    else:
        doc = run(args.source.resolve(), keep=args.keep)
    if args.before:
        doc = compared(doc, json.loads(args.before.read_text()))
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        for fig in doc["figures"]:
            print(f"{fig['name']}: {fig['median']:.1f} s  {fig['note']}")
    return 0


def run(source: Path, *, keep: bool) -> dict[str, Any]:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="kvcold-", dir="/tmp"))
    _log(f"working in {work}")
    try:
        m = measure(source, work)
        seconds = time.monotonic() - started
    finally:
        if not keep:
            _log(f"deleting {work}")
            shutil.rmtree(work, ignore_errors=True)
    _log("\n".join(m.pop("stderr_tail")))
    return {
        "schema": "kvprobe.bench/1",
        "quick": False,
        "seconds": round(seconds, 1),
        "machine": _machine(),
        "figures": figures(m),
        "raw": m,
    }


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""`--executor ray` scaling on a local multi-process Ray cluster, loopback only (issue #26).

    python bench/ray_scaling.py [--experiment experiment-a] [--releases 0.5.20..0.5.23] [--json]

The driver's part outside: each release's wheel pin resolved on the index (as a sweep
does), the unit requests written to a file. Then, for 1 and then 2 worker CPUs, a helper
runs in a new network namespace (``unshare --net``: loopback is its only interface, so
nothing Ray opens can be reached from elsewhere; on this machine's own network Ray binds
some servers to every interface even with ``--node-ip-address 127.0.0.1``): it starts a
Ray head with ``ray start --head --node-ip-address 127.0.0.1 --num-cpus N`` (a raylet and
its worker processes), hands it the units through kvprobe's RayExecutor, and times them
from the first submission to the last returned bundle. Units on Ray workers run their
probes in fresh interpreters (each worker builds its own env from its node's cache: warm
here, the same machine). Ray's own start is timed apart.

On a 2-core machine shared with other work, 2 workers cannot show the ideal 2x: the load
average is recorded before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _out(argv: list[str], timeout: float, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kw)


def inner(requests_path: Path, cpus: int, result_path: Path) -> None:
    """In the namespace: a Ray head on 127.0.0.1 with ``cpus`` CPUs, the units through it."""
    from kvprobe.run.ray_executor import RayExecutor

    requests = pickle.loads(requests_path.read_bytes())
    _out(["ip", "link", "set", "lo", "up"], 10)
    interfaces = _out(["ip", "-o", "addr"], 10).stdout
    ray_bin = str(Path(sys.executable).parent / "ray")
    address = f"127.0.0.1:{_free_port()}"
    ray_tmp = tempfile.mkdtemp(prefix="kvray-", dir="/tmp")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    clock = time.monotonic()
    with open(result_path.with_suffix(".ray.log"), "w") as log:
        cluster = subprocess.Popen(
            [ray_bin, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", address.split(":")[1],
             "--num-cpus", str(cpus), "--include-dashboard", "false", "--disable-usage-stats",
             "--object-store-memory", "200000000", "--temp-dir", ray_tmp],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    result: dict = {"cpus": cpus, "interfaces": interfaces}
    try:
        while _out([ray_bin, "status", "--address", address], 30, env=env).returncode != 0:
            if time.monotonic() - clock > 180:
                raise RuntimeError("the Ray head did not come up in 180 s")
            time.sleep(1)
        result["ray_start_s"] = round(time.monotonic() - clock, 2)
        with RayExecutor(address, 1800.0) as executor:
            clock = time.monotonic()
            outcomes = list(executor.run(requests))
            result["units_s"] = round(time.monotonic() - clock, 2)
        result["units"] = len(outcomes)
        result["returned"] = sum(1 for o in outcomes if o.archive is not None)
        result["problems"] = [o.problem for o in outcomes if o.problem]
        result["listening"] = _out(["ss", "-ltn"], 10).stdout
    finally:
        os.killpg(cluster.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            cluster.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(cluster.pid, signal.SIGKILL)
        result_path.write_text(json.dumps(result))


def requests_for(experiment_id: str, spec: str) -> list:
    """The unit requests a sweep of ``experiment_id`` over ``spec`` hands its executor."""
    from kvprobe.experiments import experiment
    from kvprobe.model.records import WheelPin
    from kvprobe.run.sweep import _resolve
    from kvprobe.run.sweep_unit import UnitRequest, wheel_pin_set
    from kvprobe.sources import releases
    from kvprobe.sources.wheel import platform_args

    exp = experiment.load(experiment_id)
    head = wheel_pin_set(exp).head
    assert isinstance(head, WheelPin)
    flags = platform_args(head.filename)
    with tempfile.TemporaryDirectory() as tmp:
        available = releases.index_versions(head.package, flags, Path(tmp) / "index")
        chosen = releases.select(spec, available)
        pins = _resolve(head.package, flags, chosen, Path(tmp), 2)
    return [UnitRequest(exp.id, exp.file_sha256, pin, 900.0) for pin in pins.values() if isinstance(pin, WheelPin)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", default="experiment-a")
    parser.add_argument("--releases", default="0.5.20..0.5.23")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--inner", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(Path(args.inner[0]), int(args.inner[1]), Path(args.inner[2]))
        return 0
    started, load_before = time.monotonic(), os.getloadavg()
    requests = requests_for(args.experiment, args.releases)
    runs = []
    with tempfile.TemporaryDirectory(prefix="kvprobe-bench-ray-") as tmp:
        path = Path(tmp) / "requests.pkl"
        path.write_bytes(pickle.dumps(requests))
        for cpus in (1, 2):
            result_path = Path(tmp) / f"result-{cpus}.json"
            helper = subprocess.Popen(
                ["unshare", "--net", "--", sys.executable, __file__, "--inner", str(path), str(cpus), str(result_path)],
                start_new_session=True,
            )
            try:
                helper.wait(timeout=1800)
            finally:
                if helper.poll() is None:
                    os.killpg(helper.pid, signal.SIGKILL)
            runs.append({**json.loads(result_path.read_text()), "load_average_after": os.getloadavg()})
    one, two = runs
    speedup = one["units_s"] / two["units_s"] if two.get("units_s") else 0.0
    figures = [
        {
            "section": "ray",
            "name": f"--executor ray, {len(requests)} units of {args.experiment}: 1 worker CPU vs 2 (loopback cluster)",
            "unit": "x",
            "n": 1,
            "min": round(speedup, 2),
            "median": round(speedup, 2),
            "max": round(speedup, 2),
            "samples": [round(speedup, 2)],
            "target": "",
            "met": None,
            "note": (
                f"units_s 1 CPU: {one.get('units_s')} s, 2 CPUs: {two.get('units_s')} s (speedup, ideal 2.0 on "
                f"2 free cores); ray start {one.get('ray_start_s')} / {two.get('ray_start_s')} s; load average "
                f"before {[round(x, 2) for x in load_before]}, after {[round(x, 2) for x in os.getloadavg()]}"
            ),
        }
    ]
    doc = {
        "schema": "kvprobe.bench/1",
        "script": "ray_scaling.py",
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
        "runs": [{k: v for k, v in r.items() if k not in ("interfaces", "listening")} for r in runs],
        "interfaces": runs[0].get("interfaces"),
        "listening": runs[-1].get("listening"),
    }
    print(json.dumps(doc, indent=2) if args.json else figures[0]["note"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

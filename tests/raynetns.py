"""A real local Ray cluster and sweeps through it, inside a private network namespace.

Run as ``unshare --net -- python tests/raynetns.py CONFIG.json`` by
tests/integration/test_sweep_ray.py. On this machine's own network, Ray 2.60.0 binds its
GCS and raylet servers to every interface (``*``) and its runtime-env agent to the host's
address even with ``--node-ip-address 127.0.0.1``. In a namespace whose only interface is
loopback, it binds 127.0.0.1 (``ss -ltnp`` is recorded to show it), and nothing it opens
could be reached from anywhere else in any case. The cluster is started with ``--block`` in its own
process group and ended by that group's id.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _out(argv: list[str], timeout: float, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kw)


def _wait_ready(ray_bin: str, address: str, env: dict[str, str], deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if _out([ray_bin, "status", "--address", address], 30, env=env).returncode == 0:
            return
        time.sleep(2)
    raise RuntimeError(f"the Ray cluster at {address} did not come up in {deadline_s} s")


class TamperOne:
    """A compromised worker, as the driver sees it: one release's returned bundle is changed
    (its classification flipped, manifest and SHA256SUMS re-hashed to match)."""

    def __init__(self, inner, version: str, scratch: Path) -> None:
        self.inner, self.version, self.scratch, self.name = inner, version, scratch, inner.name

    def run(self, requests):
        from kvprobe.run.sweep_unit import UnitOutcome

        for outcome in self.inner.run(requests):
            if outcome.request.pin.version == self.version and outcome.archive is not None:
                outcome = UnitOutcome(outcome.request, self._tamper(outcome.archive))
            yield outcome

    def _tamper(self, archive: bytes) -> bytes:
        import tarfile

        from kvprobe.evidence import manifest
        from kvprobe.files import write_json

        source = self.scratch / "unit.tar.gz"
        source.write_bytes(archive)
        root = self.scratch / "unpacked"
        with tarfile.open(source) as tar:
            tar.extractall(root, filter="data")
        (top,) = list(root.iterdir())
        receipt = json.loads((top / "receipt.json").read_text())
        release = receipt["releases"][0]["classification"]
        release["overall"] = "fixed" if release["overall"] != "fixed" else "affected"
        write_json(top / "receipt.json", receipt)
        manifest.write(top)
        forged = self.scratch / "forged.tar.gz"
        with tarfile.open(forged, "w:gz") as tar:
            tar.add(top, arcname=top.name)
        return forged.read_bytes()


def main(config_path: str) -> None:
    config = json.loads(Path(config_path).read_text())
    results: dict = {}
    _out(["ip", "link", "set", "lo", "up"], 10)
    results["interfaces"] = _out(["ip", "-o", "addr"], 10).stdout
    ray_bin = str(Path(sys.executable).parent / "ray")
    port = _free_port()
    address = f"127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # workers import this checkout's kvprobe
    env.pop("RAY_ADDRESS", None)
    with open(config["ray_log"], "w") as log:
        cluster = subprocess.Popen(
            [ray_bin, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(port),
             "--num-cpus", "2", "--include-dashboard", "false", "--disable-usage-stats",
             "--object-store-memory", "200000000", "--temp-dir", config["ray_tmp"]],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        _wait_ready(ray_bin, address, env, 120)

        def sweep(releases: str, out: str) -> dict:
            done = _out(
                [sys.executable, "-m", "kvprobe", "sweep", "scrub-sweep", "--releases", releases,
                 "--executor", "ray", "--address", address, "--unit-timeout", str(config["unit_timeout"]),
                 "--out", out, "--json"],
                600, env=env,
            )  # fmt: skip
            return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr[-4000:]}

        results["cli"] = sweep("1.0..2.1", config["out_cli"])
        # the units the first sweep kept: looked up, checked and reused, none sent
        results["again"] = sweep("1.0,1.1,2.0,2.1", config["out_again"])
        results["ss"] = _out(["ss", "-ltnp"], 10).stdout
        results["tampered"] = _tampered_sweep(address, config)
    finally:
        os.killpg(cluster.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            cluster.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(cluster.pid, signal.SIGKILL)  # whatever of this cluster is left
        Path(config["results"]).write_text(json.dumps(results))


def _tampered_sweep(address: str, config: dict) -> dict:
    from kvprobe.experiments import experiment
    from kvprobe.run.ray_executor import RayExecutor
    from kvprobe.run.sweep_runner import SweepOptions, sweep_experiment

    scratch = Path(config["scratch"])
    scratch.mkdir(parents=True, exist_ok=True)
    # --no-reuse: the cached units of 1.1 and 2.0 would never reach the tampering worker
    opts = SweepOptions(releases="1.1,2.0", out=Path(config["out_api"]), executor="ray", address=address, reuse=False)
    with RayExecutor(address, config["unit_timeout"]) as ray_exec:
        result = sweep_experiment(experiment.load("scrub-sweep"), opts, executor=TamperOne(ray_exec, "1.1", scratch))
    receipt = result.receipt.to_json()  # the typed sweep receipt, as written
    return {"summary": receipt["summary"], "releases": receipt["releases"]}


if __name__ == "__main__":
    main(sys.argv[1])

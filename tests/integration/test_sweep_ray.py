"""`kvprobe sweep --executor ray` on a real local Ray cluster: a small sweep over the local
fake index (tests/integration/test_sweep_local_index.py's package), one unit that runs past
its limit on a worker (could-not-observe, the sweep completes), the same sweep again (every
unit the first kept reused from the driver's cache, none sent), one unit whose returned
bundle is tampered (refused by the driver), and every sweep bundle verified.

The cluster and the driver run in a private network namespace whose only interface is
loopback (tests/raynetns.py says why): Ray 2.60.0 listens on every interface otherwise."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from tests.integration.test_sweep_local_index import PROBE, RELEASES, experiment_toml
from tests.wheelfactory import build_wheel

if os.environ.get("CI"):
    import ray  # noqa: F401 - CI installs the `ray` extra: a missing Ray fails there, never skips
else:
    pytest.importorskip("ray", reason="the `ray` extra is not installed (the README's test command installs it)")
pytestmark = [pytest.mark.slow, pytest.mark.network]  # network: the env's lock comes from PyPI

HELPER = Path(__file__).resolve().parents[1] / "raynetns.py"
UNIT_TIMEOUT = 45
LOOPBACK = {"127.0.0.1", "[::ffff:127.0.0.1]", "[::1]"}
# 1.5 hangs at import for longer than a unit may take on the cluster
HANGS = {"1.5": "import time\ntime.sleep(75)\n"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray-world")
    simple = root / "simple" / "scrubkv"
    simple.mkdir(parents=True)
    wheels = {
        version: build_wheel(simple, "scrubkv", version, {"scrubkv/__init__.py": code})
        for version, code in {**RELEASES, **HANGS}.items()
    }
    links = "".join(
        f'<a href="{p.name}#sha256={hashlib.sha256(p.read_bytes()).hexdigest()}">{p.name}</a>\n'
        for p in wheels.values()
    )
    (simple / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    (root / "simple" / "index.html").write_text('<html><body><a href="scrubkv/">scrubkv</a></body></html>\n')
    folder = root / "probes" / "scrub-sweep"
    folder.mkdir(parents=True)
    (folder / "experiment.toml").write_text(experiment_toml(wheels))
    (folder / "scrub.py").write_text(PROBE)
    shutil.copytree(Path(__file__).resolve().parents[2] / "probes" / "profiles", root / "probes" / "profiles")
    return root


def _in_namespace(world: Path, tmp_path: Path) -> dict:
    """Run tests/raynetns.py in a new network namespace (its own process group, ended by id)."""
    if shutil.which("unshare") is None or shutil.which("ss") is None:
        pytest.fail("this test needs unshare (util-linux) and ss (iproute2)")
    ray_tmp = tempfile.mkdtemp(prefix="kvray-", dir="/tmp")  # Ray's socket paths must stay short
    config = {
        "ray_tmp": ray_tmp,
        "ray_log": str(tmp_path / "ray-start.log"),
        "unit_timeout": UNIT_TIMEOUT,
        "out_cli": str(tmp_path / "sweep-cli"),
        "out_api": str(tmp_path / "sweep-tampered"),
        "out_again": str(tmp_path / "sweep-again"),
        "scratch": str(tmp_path / "tamper"),
        "results": str(tmp_path / "results.json"),
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    env = {
        **os.environ,
        "KVPROBE_PROBES_PATH": str(world / "probes"),
        "KVPROBE_CACHE_DIR": str(world / "cache"),
        "PIP_INDEX_URL": (world / "simple").as_uri(),
    }
    helper = subprocess.Popen(
        ["unshare", "--net", "--", sys.executable, str(HELPER), str(tmp_path / "config.json")],
        env=env,
        start_new_session=True,
    )
    try:
        helper.wait(timeout=900)
    finally:
        if helper.poll() is None:
            os.killpg(helper.pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert helper.returncode == 0, (tmp_path / "ray-start.log").read_text()[-3000:]
    return json.loads((tmp_path / "results.json").read_text())


def test_sweep_on_a_real_ray_cluster(world, tmp_path, monkeypatch):
    from kvprobe.env.venv import EnvManager, load_profile

    monkeypatch.setenv("KVPROBE_PROBES_PATH", str(world / "probes"))
    EnvManager(world / "cache").ensure(load_profile("pytest-minimal"))  # from PyPI, before the namespace
    results = _in_namespace(world, tmp_path)

    # loopback is the namespace's only interface, and Ray listened there
    assert [line.split()[1] for line in results["interfaces"].splitlines()] == ["lo", "lo"]
    listeners = [line.split()[3] for line in results["ss"].splitlines()[1:] if line.strip()]
    assert any(name in results["ss"] for name in ("gcs_server", "raylet")), results["ss"]
    assert all(a.rsplit(":", 1)[0] in LOOPBACK for a in listeners), results["ss"]

    cli = results["cli"]
    assert cli["rc"] == 3, cli["stderr"]  # some releases could not be observed; the sweep completed
    summary = json.loads(cli["stdout"])["summary"]
    assert summary == {
        "affected": ["1.0", "1.1"],
        "could-not-observe": ["1.5"],
        "fixed": ["2.0"],
        "not-present": ["2.1"],
    }
    out = Path(tmp_path / "sweep-cli")
    receipt = json.loads((out / "receipt.json").read_text())
    hung = next(r for r in receipt["releases"] if r["version"] == "1.5")
    assert hung["problem"] == f"the unit ran past its {UNIT_TIMEOUT} s limit on the cluster"
    assert receipt["host"]["executor"] == "ray"
    assert receipt["env"]["lock_name"]  # the env the workers ran in, from their unit bundles

    again = results["again"]  # every unit the first sweep kept, reused from the driver's cache
    assert again["rc"] == 3, again["stderr"]
    reused = json.loads((tmp_path / "sweep-again" / "receipt.json").read_text())
    assert {r["version"]: bool(r.get("reused")) for r in reused["releases"]} == dict.fromkeys(
        ["1.0", "1.1", "2.0", "2.1"], True
    )
    assert reused["env"] == receipt["env"] and json.loads(again["stdout"])["summary"] == {
        "affected": ["1.0", "1.1"],
        "fixed": ["2.0"],
        "not-present": ["2.1"],
    }

    tampered = results["tampered"]
    assert tampered["summary"] == {"could-not-observe": ["1.1"], "fixed": ["2.0"]}
    refused = tampered["releases"][0]
    assert refused["problem"].startswith("unit bundle refused: does not verify: forged-verdict: "), refused
    assert "release 1.1 is stated 'fixed'; its raw outputs give 'affected'" in refused["problem"]

    runner = CliRunner()
    for bundle in (out, tmp_path / "sweep-again", tmp_path / "sweep-tampered"):
        verified = runner.invoke(main, ["verify", str(bundle)], catch_exceptions=False)
        assert verified.exit_code == 0, verified.stdout

"""A bundle written by the real runner verifies: directory, archive, `sha256sum -c --strict`,
and `--rerun` (a synthetic experiment: the probe runs as a real subprocess, no network)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from kvprobe.experiments import experiment
from kvprobe.run.runner import RunOptions, run_experiment

TOML = """schema = "kvprobe.experiment/1"
id = "verify-synth"
title = "A tiny synthetic experiment for the verifier"
layer = "synthetic-model"
profile = "pytest-minimal"

[fix]
summary = "the switch turns the bug off"

[pins.model]
kind = "synthetic"
[pins.model.base]
switches = { fixed = false }
[pins.model.head]
switches = { fixed = true }

[checks]
probes = [{ path = "switch.py" }]

[scope]
shows = "that the model's switch changes one observation"
does_not_show = ["anything about real code"]

[expect.base."switch/door"]
enqueued = true
[expect.head."switch/door"]
enqueued = false
"""

PROBE = """import kvprobe_probe as kp

probe = kp.Probe("switch", mocks={"door": "a boolean standing in for the admission door"})


@probe.case("door", "a rejected request at the door")
def _(obs):
    obs.record("enqueued", not kp.side_config()["switches"]["fixed"])


if __name__ == "__main__":
    probe.main()
"""


@pytest.fixture
def real_bundle(tmp_path) -> Path:
    exp_dir = tmp_path / "probes" / "verify-synth"
    exp_dir.mkdir(parents=True)
    (exp_dir / "experiment.toml").write_text(TOML)
    (exp_dir / "switch.py").write_text(PROBE)
    exp = experiment.load_file(exp_dir / "experiment.toml")
    result = run_experiment(exp, RunOptions(out=tmp_path / "bundle", cache_root=tmp_path / "cache", timeout_s=120))
    assert result.receipt.verdict == "reproduced", result.receipt.comparison.reasons
    return result.bundle


def cli(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    return result.exit_code, json.loads(result.stdout) if result.stdout else {}


def test_runner_bundle_verifies_packs_and_reruns(real_bundle, tmp_path):
    code, doc = cli("verify", str(real_bundle))
    assert code == 0, doc
    digest = doc["manifest_sha256"]
    code, doc = cli("verify", str(real_bundle), "--expect-manifest-sha256", digest)
    assert code == 0

    code, packed = cli("bundle", "pack", str(real_bundle), "-o", str(tmp_path / "b.tar.gz"))
    assert code == 0 and packed["manifest_sha256"] == digest
    code, doc = cli("verify", str(tmp_path / "b.tar.gz"), "--expect-manifest-sha256", digest)
    assert code == 0, doc

    code, doc = cli("verify", str(real_bundle), "--rerun")  # not a shipped experiment, no consent
    assert code == 3 and doc["steps"][5]["status"] == "could-not-run", doc
    code, doc = cli("verify", str(real_bundle), "--rerun", "--trust-bundle-code")
    assert code == 0, doc
    assert doc["steps"][5]["status"] == "pass"


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="needs coreutils sha256sum")
def test_runner_bundle_passes_sha256sum_strict(real_bundle):
    done = subprocess.run(
        ["sha256sum", "-c", "--strict", "--quiet", "SHA256SUMS"],
        cwd=real_bundle,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr

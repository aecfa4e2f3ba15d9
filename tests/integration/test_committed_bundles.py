"""The evidence bundles committed under bundles/ verify clean, with kvprobe and with sha256sum."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe.cli import main

BUNDLES = sorted(p for p in (Path(__file__).resolve().parents[2] / "bundles").iterdir()
                 if p.is_dir() and not p.name.startswith("."))


def test_the_published_experiments_are_committed():
    ids = {json.loads((b / "receipt.json").read_text())["experiment"]["id"] for b in BUNDLES}
    assert {"experiment-a", "experiment-b"} <= ids


@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.name for b in BUNDLES])
def test_committed_bundle_verifies(bundle):
    result = CliRunner().invoke(main, ["verify", str(bundle), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stdout
    receipt = json.loads((bundle / "receipt.json").read_text())
    assert receipt["verdict"] == "reproduced"
    subprocess.run(["sha256sum", "-c", "--strict", "--quiet", "SHA256SUMS"], cwd=bundle, check=True)

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


def _readme_digests() -> dict[str, str]:
    """The manifest digests the README publishes for the committed bundles."""
    import re

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    return dict(re.findall(r"\| `bundles/([^`]+)` \| `([0-9a-f]{64})` \|", text))


@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.name for b in BUNDLES])
def test_committed_bundle_matches_the_digest_the_readme_publishes(bundle):
    digest = _readme_digests().get(bundle.name)
    assert digest, f"README publishes no digest for {bundle.name}"
    result = CliRunner().invoke(main, ["verify", str(bundle), "--expect-manifest-sha256", digest],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.stderr


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.name for b in BUNDLES])
def test_committed_bundle_reproduces_on_rerun(bundle):
    result = CliRunner().invoke(main, ["verify", str(bundle), "--rerun", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stdout
    steps = {s["name"]: s["status"] for s in json.loads(result.stdout)["steps"]}
    assert steps["rerun"] == "pass"

"""The evidence bundles committed under bundles/ verify clean, with kvprobe and with sha256sum."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _readme_digests() -> dict[str, str]:
    """The committed bundles are the ones the README publishes, with their manifest digests
    (a bundle a developer just wrote into bundles/ is not part of the published evidence)."""
    import re

    text = (ROOT / "README.md").read_text()
    return dict(re.findall(r"\| `bundles/([^`]+)` \| `([0-9a-f]{64})` \|", text))


BUNDLES = [ROOT / "bundles" / name for name in sorted(_readme_digests())]


def test_the_published_experiments_are_committed():
    assert all(b.is_dir() for b in BUNDLES), "README lists a bundle that is not in bundles/"
    ids = {json.loads((b / "receipt.json").read_text())["experiment"]["id"] for b in BUNDLES}
    shipped = {"experiment-a", "experiment-b", "experiment-c", "experiment-d", "experiment-e", "experiment-f"}
    assert shipped <= ids


@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.name for b in BUNDLES])
def test_committed_bundle_verifies(bundle):
    result = CliRunner().invoke(main, ["verify", str(bundle), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stdout
    receipt = json.loads((bundle / "receipt.json").read_text())
    assert receipt["verdict"] == "reproduced"
    subprocess.run(["sha256sum", "-c", "--strict", "--quiet", "SHA256SUMS"], cwd=bundle, check=True)
    summary = (bundle / "README.md").read_text()
    assert "| case | base | head | expected observations held |" in summary
    for key, case in receipt["comparison"]["cases"]["base"].items():
        state = f"raised {case['error_type']}" if case["status"] == "raised" else "behaviour"
        if case.get("observation") == "not-present":  # a feature the head adds (experiment-f)
            state = f"not present ({', '.join(case['missing'])})"
        assert f"| `{key}` | {state} |" in summary  # a reader sees behaviour vs exception at a glance


@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.name for b in BUNDLES])
def test_committed_bundle_matches_the_digest_the_readme_publishes(bundle):
    digest = _readme_digests()[bundle.name]
    result = CliRunner().invoke(
        main, ["verify", str(bundle), "--expect-manifest-sha256", digest], catch_exceptions=False
    )
    assert result.exit_code == 0, result.stderr


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.name for b in BUNDLES])
def test_committed_bundle_reproduces_on_rerun(bundle):
    result = CliRunner().invoke(main, ["verify", str(bundle), "--rerun", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stdout
    steps = {s["name"]: s["status"] for s in json.loads(result.stdout)["steps"]}
    assert steps["rerun"] == "pass"

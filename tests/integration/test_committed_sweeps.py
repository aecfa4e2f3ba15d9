"""The sweep bundles committed under bundles/ verify clean (offline, seconds), match the
digests the README publishes, and say what the README's release table says."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _published() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    return dict(re.findall(r"\| `bundles/([^`]+-sweep-[^`]+)` \| [^|]+ \| `([0-9a-f]{64})` \|", text))


SWEEPS = {name: digest for name, digest in sorted(_published().items())}


def _receipt(name: str) -> dict:
    return json.loads((ROOT / "bundles" / name / "receipt.json").read_text())


def test_every_shipped_experiment_has_a_published_sweep():
    from kvprobe.resources import builtin_probes_dir

    shipped = {d.name for d in builtin_probes_dir().iterdir() if (d / "experiment.toml").is_file()} - {"model"}
    assert {_receipt(name)["experiment"]["id"] for name in SWEEPS} == shipped


def test_the_readme_release_table_is_what_the_sweeps_say():
    """bench/readme_sweeps.py renders it from the published sweeps; nobody edits it by hand."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_sweeps", ROOT / "bench" / "readme_sweeps.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (ROOT / "README.md").read_text()
    assert module.render(text) == text, "README's release table is stale: run python bench/readme_sweeps.py"


def test_experiment_c_observed_where_its_affected_range_starts():
    (name,) = [n for n in SWEEPS if _receipt(n)["experiment"]["id"] == "experiment-c"]
    observed = _receipt(name)["observed"]
    assert (observed["introduced"], observed["first_fixed"]) == ("0.5.19", "0.5.21")


@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_committed_sweep_verifies_against_its_published_digest(name):
    bundle = ROOT / "bundles" / name
    result = CliRunner().invoke(
        main, ["verify", str(bundle), "--json", "--expect-manifest-sha256", SWEEPS[name]], catch_exceptions=False
    )
    assert result.exit_code == 0, result.stdout
    assert json.loads(result.stdout)["outcome"] == "verified"


@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_the_newest_release_is_fixed_and_the_first_fixed_is_the_fix_release(name):
    receipt = _receipt(name)
    classes = {r["version"]: r["classification"]["overall"] for r in receipt["releases"]}
    assert classes["0.5.23"] == "fixed"
    fix = receipt["experiment"]["fix"]["release"]
    assert min((v for v, c in classes.items() if c == "fixed"), key=lambda v: [int(x) for x in v.split(".")[:3]]) == fix
    assert "could-not-observe" not in classes.values()


def test_experiment_b_osv_record_ranges_from_the_sweep():
    (name,) = [n for n in SWEEPS if _receipt(n)["experiment"]["id"] == "experiment-b"]
    bundle = str(ROOT / "bundles" / name)
    refused = CliRunner().invoke(main, ["report", bundle, "--format", "osv"])
    assert refused.exit_code == 2 and "no OSV id for KVPROBE-2026-0001" in refused.stderr
    result = CliRunner().invoke(main, ["report", bundle, "--format", "osv", "--osv-id", "GHSA-xxxx-xxxx-xxxx"])
    assert result.exit_code == 0, result.output
    affected = json.loads(result.stdout)["affected"][0]
    # 0.5.13, the oldest release swept, is affected: nothing older was observed unaffected
    assert affected["ranges"] == [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "0.5.20"}]}]

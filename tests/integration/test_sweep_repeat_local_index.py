"""`kvprobe sweep --repeat N` end to end on the local fake index: a release whose code answers
differently on its second call is affected after one run, and could-not-observe (unstable)
after two; the bundle records both runs, verify recomputes the stability, and `verify --rerun`
repeats as often as the published sweep did."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_sweep_local_index import (  # noqa: F401  (the sweep fixture)
    PROBE,
    RELEASES,
    _env,
    experiment_toml,
    make_index,
    sweep,
)

pytestmark = pytest.mark.network  # the env's lock comes from PyPI

# free() scrubs on every other call: a probe's cwd is its unit's scratch, the same for each run
FLAKY = (
    "import pathlib\n\n"
    "def alloc(n):\n    return [0] * n\n\n"
    "def free(block):\n"
    "    calls = pathlib.Path('scrubkv-free-calls')\n"
    "    n = len(calls.read_text()) if calls.exists() else 0\n"
    "    calls.write_text('x' * (n + 1))\n"
    "    return list(block) if n % 2 == 0 else [0] * len(block)\n"
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    import shutil
    from pathlib import Path

    root = tmp_path_factory.mktemp("sweep-repeat-world")
    wheels = make_index(root, {"1.1": RELEASES["1.1"], "1.5": FLAKY, "2.0": RELEASES["2.0"]})
    folder = root / "probes" / "scrub-sweep"
    folder.mkdir(parents=True)
    (folder / "experiment.toml").write_text(experiment_toml(wheels))
    (folder / "scrub.py").write_text(PROBE)
    shutil.copytree(Path(__file__).resolve().parents[2] / "probes" / "profiles", root / "probes" / "profiles")
    return {"root": root, "index": (root / "simple").as_uri(), "probes": root / "probes", "cache": root / "cache"}


def test_a_release_that_differs_between_repeats_is_unstable_never_affected(world, sweep, tmp_path, monkeypatch):  # noqa: F811
    _env(world, monkeypatch)
    once = sweep("sweep", "scrub-sweep", "--releases", "1.5", "--out", str(tmp_path / "once"), "--json")
    assert json.loads(once.stdout)["summary"] == {"affected": ["1.5"]}  # one run: a verdict it cannot back

    out = tmp_path / "twice"
    result = sweep("sweep", "scrub-sweep", "--releases", "1.1,1.5", "--repeat", "2", "--out", str(out))
    assert result.exit_code == 3, result.output  # a release could not be observed
    why = "unstable across repeats: observation 'scrubbed' was False in run 1, True in run 2"
    assert result.stdout.splitlines()[:2] == [
        "1.1  affected",
        f"1.5  could-not-observe  scrub/free.then_reuse: {why}",
    ]
    receipt = json.loads((out / "receipt.json").read_text())
    assert receipt["repeats"] == 2
    stable, shaky = receipt["releases"]
    assert stable["classification"]["unstable"] == {}
    assert shaky["classification"]["unstable"] == {"scrub/free.then_reuse": why}
    assert shaky["classification"]["cases"]["scrub/alloc.control"] == {"class": "control"}
    assert [r["raw"]["path"] for r in shaky["probes"][0]["repeats"]] == ["raw/1.5/probes/scrub.repeat-2.json"]
    assert (out / "logs" / "1.5" / "probes" / "repeat-2" / "scrub.stdout").is_file()
    assert "Each release's probes ran 2 times" in (out / "README.md").read_text()

    assert sweep("verify", str(out)).exit_code == 0
    rerun = sweep("verify", str(out), "--rerun", "--trust-bundle-code", "--json")
    assert rerun.exit_code == 0, rerun.stdout  # repeated twice again: 1.5 unstable again, no difference
    assert "1.1 affected, 1.5 could-not-observe" in json.loads(rerun.stdout)["steps"][5]["summary"]

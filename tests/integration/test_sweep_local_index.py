"""`kvprobe sweep` end to end on a package of our own: a local PEP 503 index of three releases
(two before a fix, one with it), the pytest-minimal env, real probe processes, the sweep
bundle verified, and a forged classification caught by verify."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from kvprobe.files import json_bytes, write_json
from kvprobe.model.sweep_receipt import SweepReceipt
from tests.wheelfactory import build_wheel

# Builds (or reuses) the pytest-minimal env from its hash-pinned lock: pip needs the index.
pytestmark = pytest.mark.network

PROBE = '''"""Does the pool scrub a freed block before it is reused?"""
import kvprobe_probe as kp
import scrubkv

probe = kp.Probe("scrub", mocks={"nothing": "scrubkv has nothing to mock"})


@probe.case("free.then_reuse", decision="scrubkv.free")
def _(obs):
    free = kp.require(scrubkv, "free")
    with obs.decision():
        obs.record("scrubbed", free([7, 7]) == [0, 0])


@probe.case("alloc.control")
def _(obs):
    obs.record("alloc_len", len(scrubkv.alloc(2)))


if __name__ == "__main__":
    probe.main()
'''

RELEASES = {
    "1.0": "def alloc(n):\n    return [0] * n\n\ndef free(block):\n    return block\n",
    "1.1": "def alloc(n):\n    return [0] * n\n\ndef free(block):\n    return list(block)\n",
    "2.0": "def alloc(n):\n    return [0] * n\n\ndef free(block):\n    return [0] * len(block)\n",
    "2.1": "def alloc(n):\n    return [0] * n\n",  # free() removed: not present
}


def experiment_toml(wheels: dict[str, Path]) -> str:
    def pin(version: str) -> str:
        path = wheels[version]
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        return f'package = "scrubkv"\nversion = "{version}"\nfile = "{path.name}"\nsha256 = "{digest}"\n'

    return f"""schema = "kvprobe.experiment/1"
id = "scrub-sweep"
title = "scrubkv scrubs freed blocks"
layer = "diff-probe"
upstream = "https://github.com/example/scrubkv"
profile = "pytest-minimal"
default_pins = "release"

[fix]
prs = [1]
release = "2.0"
summary = "free() zeroes the block"

[vulnerability]
id = "KVPROBE-2026-0001"
aliases = []
fix_kind = "security"

[pins.release]
kind = "wheel"
[pins.release.base]
{pin("1.1")}
[pins.release.head]
{pin("2.0")}

[checks]
probes = [{{ path = "scrub.py" }}]

[scope]
shows = "whether free() zeroes a block"
does_not_show = ["anything else"]

[expect.base."scrub/free.then_reuse"]
scrubbed = false
[expect.head."scrub/free.then_reuse"]
scrubbed = true
[expect.base."scrub/alloc.control"]
alloc_len = 2
[expect.head."scrub/alloc.control"]
alloc_len = 2
"""


def make_index(root: Path, releases: dict[str, str]) -> dict[str, Path]:
    """A PEP 503 index at ``root/simple`` of one wheel per release, each link with its sha256."""
    simple = root / "simple" / "scrubkv"
    simple.mkdir(parents=True)
    wheels = {}
    for version, code in releases.items():
        wheels[version] = build_wheel(simple, "scrubkv", version, {"scrubkv/__init__.py": code})
    links = "".join(
        f'<a href="{p.name}#sha256={hashlib.sha256(p.read_bytes()).hexdigest()}">{p.name}</a>\n'
        for p in wheels.values()
    )
    (simple / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    (root / "simple" / "index.html").write_text('<html><body><a href="scrubkv/">scrubkv</a></body></html>\n')
    return wheels


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep-world")
    wheels = make_index(root, RELEASES)
    probes = root / "probes"
    folder = probes / "scrub-sweep"
    folder.mkdir(parents=True)
    (folder / "experiment.toml").write_text(experiment_toml(wheels))
    (folder / "scrub.py").write_text(PROBE)
    shutil.copytree(Path(__file__).resolve().parents[2] / "probes" / "profiles", probes / "profiles")
    return {"root": root, "index": (root / "simple").as_uri(), "probes": probes, "cache": root / "cache"}


@pytest.fixture
def sweep(world, monkeypatch, tmp_path):
    monkeypatch.setenv("KVPROBE_PROBES_PATH", str(world["probes"]))
    monkeypatch.setenv("KVPROBE_CACHE_DIR", str(world["cache"]))
    monkeypatch.setenv("PIP_INDEX_URL", world["index"])

    def invoke(*args: str):
        return CliRunner().invoke(main, list(args), catch_exceptions=False)

    return invoke


def _env(world, monkeypatch) -> None:
    from kvprobe.env.venv import EnvManager, load_profile

    monkeypatch.delenv("PIP_INDEX_URL")  # the env's lock comes from PyPI
    EnvManager(world["cache"]).ensure(load_profile("pytest-minimal"))
    monkeypatch.setenv("PIP_INDEX_URL", world["index"])


def test_sweep_classifies_each_release_and_verify_recomputes_it(world, sweep, tmp_path, monkeypatch):
    _env(world, monkeypatch)
    out = tmp_path / "sweep"
    result = sweep("sweep", "scrub-sweep", "--releases", "1.0..2.1", "--out", str(out), "--json")
    summary = json.loads(result.stdout)["summary"]
    assert summary == {"affected": ["1.0", "1.1"], "fixed": ["2.0"], "not-present": ["2.1"]}
    assert result.exit_code == 3  # a release could not be observed as affected or fixed
    receipt = json.loads((out / "receipt.json").read_text())
    # the typed model reads a fresh sweep receipt and writes it back byte for byte
    assert json_bytes(SweepReceipt.from_json(receipt).to_json()) == (out / "receipt.json").read_bytes()
    wheel = receipt["releases"][0]["wheel"]
    assert wheel["file"] == "scrubkv-1.0-py3-none-any.whl"
    assert (
        wheel["sha256"]
        == hashlib.sha256((world["root"] / "simple" / "scrubkv" / wheel["file"]).read_bytes()).hexdigest()
    )
    assert sorted(p.name for p in (out / "raw").iterdir()) == ["1.0", "1.1", "2.0", "2.1"]
    assert "timeline.svg" in (out / "README.md").read_text()

    verified = sweep("verify", str(out))
    assert verified.exit_code == 0, verified.stdout

    # KVPROBE- ids name no OSV database: the record is published under the id given
    osv = json.loads(
        sweep("report", str(out), "--format", "osv", "--osv-id", "GHSA-xxxx-xxxx-xxxx", "--allow-unanchored").stdout
    )
    # 1.0 is the oldest release on the index and it is affected: where the bug came in is unknown
    assert osv["affected"][0]["ranges"] == [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "2.0"}]}]
    assert osv["affected"][0]["versions"] == ["1.0", "1.1"]
    assert "2.1" in osv["affected"][0]["database_specific"]["kvprobe_not_observed"]

    # a forged classification (receipt and manifest re-hashed consistently) is caught in step 4
    forged = tmp_path / "forged"
    shutil.copytree(out, forged)
    receipt["releases"][1]["classification"]["overall"] = "fixed"
    write_json(forged / "receipt.json", receipt)
    from kvprobe.evidence import manifest

    manifest.write(forged)
    caught = sweep("verify", str(forged), "--json")
    assert caught.exit_code == 1
    assert "release 1.1 is stated 'fixed'" in caught.stdout


def _observations(bundle: Path) -> dict[str, object]:
    """Each raw probe document, but for durations (the only thing a forked run may change)."""

    def normal(value):
        if isinstance(value, dict):
            return {k: normal(v) for k, v in value.items() if k != "duration_s"}
        return [normal(v) for v in value] if isinstance(value, list) else value

    return {
        p.relative_to(bundle).as_posix(): normal(json.loads(p.read_text())) for p in (bundle / "raw").rglob("*.json")
    }


def test_sweep_probes_forked_from_the_sweeps_server_observe_what_fresh_ones_do(world, sweep, tmp_path, monkeypatch):
    _env(world, monkeypatch)
    receipts, docs = {}, {}
    for name, flags in (("forked", ()), ("fresh", ("--no-preload",))):
        out = tmp_path / name
        result = sweep("sweep", "scrub-sweep", "--releases", "1.0..2.1", "--out", str(out), "--json", *flags)
        assert result.exit_code == 3, result.output  # 2.1 is not present, as above
        receipts[name], docs[name] = json.loads((out / "receipt.json").read_text()), _observations(out)
        assert sweep("verify", str(out)).exit_code == 0
    runs = {name: [r["execution"] for r in receipt["releases"]] for name, receipt in receipts.items()}
    assert {(p["mode"], p["reason"]) for e in runs["forked"] for p in e["probes"]} == {("forked", None)}
    assert {(p["mode"], p["reason"]) for e in runs["fresh"] for p in e["probes"]} == {("fresh", "--no-preload")}
    # pytest-minimal has none of torch, transformers, torchvision: the server imported nothing
    assert all(e["preloaded"] == {} for e in runs["forked"])
    assert all(e["preloaded"] == {} for e in runs["fresh"])
    assert sorted(docs["forked"]) == sorted(docs["fresh"]) and docs["forked"]
    for rel, doc in docs["forked"].items():
        assert doc == docs["fresh"][rel], rel
    assert [r["classification"] for r in receipts["forked"]["releases"]] == [
        r["classification"] for r in receipts["fresh"]["releases"]
    ]


def test_sweep_trees_are_byte_compiled_once_with_checked_hashes(world, sweep, tmp_path, monkeypatch):
    """A release's tree comes from the tree cache compiled for the env's python, like a run's."""
    _env(world, monkeypatch)
    out = tmp_path / "sweep"
    sweep("sweep", "scrub-sweep", "--releases", "2.0", "--out", str(out), "--json")
    digest = json.loads((out / "receipt.json").read_text())["releases"][0]["wheel"]["sha256"]
    trees = (world["cache"] / "trees").iterdir()
    (entry,) = [p for p in trees if p.is_dir() and p.name.startswith(digest) and not p.name.endswith(".users")]
    assert entry.name != f"{digest}-source"  # keyed by the interpreter's bytecode tag
    (pyc,) = (entry / "tree" / "scrubkv" / "__pycache__").glob("__init__.*.pyc")
    assert pyc.read_bytes()[:4] == importlib.util.MAGIC_NUMBER
    assert int.from_bytes(pyc.read_bytes()[4:8], "little") == 0b11  # hash-based, checked


def _forge_observation(bundle: Path, version: str, case: str, name: str, value) -> None:
    """A self-consistent forgery: one raw observation changed, and everything derived from it
    (citation digest, the release's classification, the summary, README, timeline, hashes)
    re-derived, so steps 1-4 pass and only a rerun can tell."""
    from kvprobe.evidence import manifest
    from kvprobe.evidence.sweep_view import recomputed_range, render_readme, timeline_svg
    from kvprobe.model.sweep_receipt import ReleaseRecord, SweepReceipt
    from kvprobe.rules import sweep_classification as classify

    rel = f"raw/{version}/probes/scrub.json"
    doc = json.loads((bundle / rel).read_text())
    next(c for c in doc["cases"] if c["name"] == case)["observations"][name] = value
    write_json(bundle / rel, doc)
    receipt = json.loads((bundle / "receipt.json").read_text())
    release = next(r for r in receipt["releases"] if r["version"] == version)
    release["probes"][0]["raw"]["sha256"] = hashlib.sha256((bundle / rel).read_bytes()).hexdigest()
    typed = ReleaseRecord.from_json(release)
    problems = classify.release_problems(typed.problem, typed.probes)
    release["classification"] = classify.classify_release(receipt["expectations"], {"scrub": doc}, problems)
    receipt["summary"] = classify.summary([ReleaseRecord.from_json(r) for r in receipt["releases"]])
    receipt["observed"] = recomputed_range(SweepReceipt.from_json(receipt)).to_json()
    write_json(bundle / "receipt.json", receipt)
    forged = SweepReceipt.from_json(receipt)
    (bundle / "README.md").write_text(render_readme(forged))
    (bundle / "timeline.svg").write_text(timeline_svg(forged))
    for name in ("manifest.json", "SHA256SUMS"):
        (bundle / name).unlink()
    manifest.write(bundle)


def test_verify_rerun_of_a_sweep_reruns_its_releases_and_names_what_differs(world, sweep, tmp_path, monkeypatch):
    _env(world, monkeypatch)
    out = tmp_path / "sweep"
    sweep("sweep", "scrub-sweep", "--releases", "1.1,2.0", "--out", str(out), "--json")

    same = sweep("verify", str(out), "--rerun", "--trust-bundle-code", "--json")
    assert same.exit_code == 0, same.stdout
    step6 = json.loads(same.stdout)["steps"][5]
    assert step6["status"] == "pass" and "on 2 of 2 releases: 1.1 affected, 2.0 fixed" in step6["summary"]
    # consent lists what the experiment file fetches and runs too: each release's wheel (#28)
    receipt = json.loads((out / "receipt.json").read_text())
    for release in receipt["releases"]:
        wheel = release["wheel"]
        assert f"sha256 {wheel['sha256']}  scrubkv {wheel['version']} from the package index" in same.stderr

    # a bundle's own code never runs without consent
    assert sweep("verify", str(out), "--rerun").exit_code == 3

    wrong = sweep("verify", str(out), "--rerun", "--trust-bundle-code", "--release", "2.1")
    assert wrong.exit_code == 2
    assert "--release: 2.1 is not a release this sweep ran (1.1, 2.0)" in wrong.stderr

    forged = tmp_path / "forged"
    shutil.copytree(out, forged)
    _forge_observation(forged, "2.0", "alloc.control", "alloc_len", 3)
    assert sweep("verify", str(forged)).exit_code == 0  # self-consistent: steps 1-4 cannot tell
    caught = sweep("verify", str(forged), "--rerun", "--trust-bundle-code", "--release", "2.0", "--json")
    assert caught.exit_code == 1
    details = [d["detail"] for d in json.loads(caught.stdout)["steps"][5]["defects"]]
    assert "release 2.0 scrub/alloc.control alloc_len: published int:3, rerun int:2" in details
    assert "release 2.0 case scrub/alloc.control: published 'neither', rerun 'control'" in details
    assert "release 2.0: published 'mixed', rerun 'fixed'" in details
    assert "1 of 1 releases" in json.loads(caught.stdout)["steps"][5]["summary"]


def test_verify_rerun_refuses_a_release_the_index_now_serves_as_other_bytes(world, sweep, tmp_path, monkeypatch):
    _env(world, monkeypatch)
    out = tmp_path / "sweep"
    sweep("sweep", "scrub-sweep", "--releases", "1.1", "--out", str(out), "--json")
    swapped = make_index(tmp_path / "swapped", {**RELEASES, "1.1": RELEASES["1.1"] + "# re-uploaded\n"})
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "swapped" / "simple").as_uri())
    result = sweep("verify", str(out), "--rerun", "--trust-bundle-code", "--json")
    assert result.exit_code == 1
    (defect,) = json.loads(result.stdout)["steps"][5]["defects"]
    assert (defect["code"], defect["step"]) == ("index-serves-other-bytes", 6)
    now = hashlib.sha256(swapped["1.1"].read_bytes()).hexdigest()
    assert defect["detail"].startswith(f"release 1.1: the index now serves scrubkv-1.1-py3-none-any.whl sha256 {now}")
    assert defect["detail"].endswith("so it was not re-run")


def test_sweep_results_go_to_stdout_and_a_progress_line_per_release_to_stderr(world, sweep, tmp_path, monkeypatch):
    """The stream rule, as `run` follows it: results on stdout, progress on stderr, -q honoured."""
    _env(world, monkeypatch)
    out = tmp_path / "sweep"
    # --no-reuse: units earlier tests of this module kept would add "(reused from ...)" to each line
    result = sweep("sweep", "scrub-sweep", "--releases", "1.1,2.0", "--out", str(out), "--no-reuse")
    assert result.exit_code == 0, result.output
    digest = hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
    lines = result.stdout.splitlines()
    assert lines[:2] == ["1.1  affected", "2.0  fixed"]
    assert lines[2:] == [f"bundle: {out}", f"manifest sha256: {digest}"]
    progress = [line.split(" (")[0].split() for line in result.stderr.splitlines() if "/2 " in line]
    assert sorted(p[1] for p in progress) == ["1/2", "2/2"]  # units finish in any order
    assert sorted(" ".join(p[2:]) for p in progress) == ["1.1 affected", "2.0 fixed"]
    quiet = sweep("sweep", "scrub-sweep", "--releases", "2.0", "--out", str(tmp_path / "quiet"), "-q", "--no-reuse")
    assert quiet.exit_code == 0 and quiet.stderr == "" and quiet.stdout.splitlines()[0] == "2.0  fixed"


def test_sweep_records_its_listing_and_rerun_finds_a_release_the_listing_lacks(world, sweep, tmp_path, monkeypatch):
    """The receipt records the index's listing (every version, each selected one's file and
    sha256); `verify --rerun` reads it again: a release older than the newest listed that the
    bundle's listing lacks fails step 6 before anything runs, a newer one is a note."""
    _env(world, monkeypatch)
    out = tmp_path / "sweep"
    sweep("sweep", "scrub-sweep", "--releases", "1.1..2.0", "--out", str(out), "--json")
    listing = json.loads((out / "receipt.json").read_text())["listing"]
    assert listing["versions"] == ["1.0", "1.1", "2.0", "2.1"] and listing["read_utc"]
    assert [(e["version"], e["file"], e["not_run"]) for e in listing["selected"]] == [
        ("1.1", "scrubkv-1.1-py3-none-any.whl", None),
        ("2.0", "scrubkv-2.0-py3-none-any.whl", None),
    ]
    wheels = {v: world["root"] / "simple" / "scrubkv" / f"scrubkv-{v}-py3-none-any.whl" for v in ("1.1", "2.0")}
    assert [e["sha256"] for e in listing["selected"]] == [
        hashlib.sha256(p.read_bytes()).hexdigest() for p in wheels.values()
    ]

    later = make_index(tmp_path / "later", {**RELEASES, "1.5": RELEASES["1.1"], "3.0": RELEASES["2.0"]})
    assert later
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "later" / "simple").as_uri())
    result = sweep("verify", str(out), "--rerun", "--trust-bundle-code", "--json")
    assert result.exit_code == 1, result.stdout
    step6 = json.loads(result.stdout)["steps"][5]
    (defect,) = step6["defects"]
    assert defect["code"] == "listing-changed"
    assert defect["detail"].startswith("the index lists 1.5, older than 2.1, and the sweep's range 1.1..2.0 selects it")
    assert any("the index lists 3.0, published since the sweep" in note for note in step6["notes"])
    assert step6["summary"].startswith("not re-run")

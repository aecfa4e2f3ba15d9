"""Upstream tests as evidence (issue #14), end to end through the CLI on a fake upstream:
a tests-only PR pair from `kvprobe new` to `reproduced` (the README walk-through), a base
that cannot collect the head's tests, named FAIL_TO_PASS/PASS_TO_PASS sets recorded and then
violated, a mirror apart from the canonical URL, and release-wheel code with git tests."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from kvprobe.experiments.experiment import load_file
from kvprobe.files import sha256_file
from tests.fakeupstream import COLLECT_TEST_PATH, build_fake_upstream, git_pins, package_files
from tests.wheelfactory import build_wheel

# Builds the pytest-minimal env from its hash-pinned lock: pip needs the package index.
pytestmark = pytest.mark.network

CANONICAL = "https://example.invalid/minikv"
EVERY_SLOT = "tests/test_minikv.py::FreeClearsEverySlot::test_every_slot"
SCRUB = "tests/test_minikv.py::test_scrub_clears_block"
FREED = "tests/test_minikv.py::test_freed_block_is_zeroed_for_next_owner"
ROUNDTRIP = "tests/test_minikv.py::test_alloc_write_read_roundtrip"
# head's test file of PR 1, as the run names its results (pytest's nodeids, subtests apart;
# pytest 9 passes a unittest parent whose subtests failed, but it has not passed (compare/5):
# it fails to pass with no kind of its own, its subtests carry the failures)
FAIL_TO_PASS = [EVERY_SLOT, f"{EVERY_SLOT} [slot=0]", f"{EVERY_SLOT} [slot=2]", FREED, SCRUB]
PASS_TO_PASS = [f"{EVERY_SLOT} [slot=1]", f"{EVERY_SLOT} [slot=3]", ROUNDTRIP]
BASE_KINDS = {
    SCRUB: "AttributeError",
    FREED: "assertion",
    f"{EVERY_SLOT} [slot=0]": "assertion",
    f"{EVERY_SLOT} [slot=2]": "assertion",
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("tests-evidence")
    return {"fake": build_fake_upstream(root), "cache": root / "cache", "root": root}


@pytest.fixture
def probes_dir(tmp_path) -> Path:
    return tmp_path / "probes"


@pytest.fixture
def cli(world, probes_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVPROBE_PROBES_PATH", str(probes_dir))
    monkeypatch.setenv("KVPROBE_CACHE_DIR", str(world["cache"]))
    monkeypatch.setenv("COLUMNS", "240")

    def invoke(*args: str):
        return CliRunner().invoke(main, list(args), catch_exceptions=False)

    return invoke


def run_json(cli, *args: str) -> tuple[int, dict]:
    result = cli("run", *args, "--json")
    return result.exit_code, json.loads(result.stdout)


def verified(cli, bundle: Path) -> bool:
    result = cli("verify", str(bundle), "--json")
    return result.exit_code == 0 and json.loads(result.stdout)["outcome"] == "self-consistent"


def test_readme_walkthrough_tests_only(world, cli, probes_dir, tmp_path):
    fake = world["fake"]
    mirror = ["--repo", fake.url]
    # kvprobe new: pins checked against the mirror; the canonical URL is what is written
    result = cli(
        "new",
        "pr-1-scrub",
        "--base",
        fake.base_sha,
        "--head",
        fake.head_sha,
        "--pr",
        "1",
        "--test",
        fake.test_path,
        "--tests-only",
        "--upstream",
        CANONICAL,
        *mirror,
        "--package",
        "minikv",
        "--profile",
        "pytest-minimal",
    )
    assert result.exit_code == 0, result.stderr
    folder = probes_dir / "pr-1-scrub"
    assert sorted(p.name for p in folder.iterdir()) == ["experiment.toml"]  # no probe to write
    toml_path = folder / "experiment.toml"
    exp = load_file(toml_path)
    assert exp.upstream == CANONICAL and exp.probes == () and exp.layer.value == "upstream-tests"
    assert str(fake.path) not in toml_path.read_text()  # the mirror is never written
    assert f"kvprobe run pr-1-scrub --repo {fake.url} --record-expectations" in result.stderr

    # kvprobe run: the tests ran on both sides; nothing declared yet
    code, summary = run_json(cli, "pr-1-scrub", *mirror, "--out", str(tmp_path / "b1"))
    assert (code, summary["verdict"]) == (1, "no-expectations"), summary["reasons"]
    assert "FAIL_TO_PASS/PASS_TO_PASS" in summary["reasons"][0]
    receipt = json.loads((tmp_path / "b1" / "receipt.json").read_text())
    assert receipt["experiment"]["upstream"] == CANONICAL
    assert receipt["sides"]["head"]["source"]["url"] == fake.url  # where it really came from

    # kvprobe run --record-expectations --yes: the sets, with each base failure kind
    before = toml_path.read_text()
    result = cli("run", "pr-1-scrub", *mirror, "--out", str(tmp_path / "b2"), "--record-expectations", "--yes")
    assert result.exit_code == 0, result.stderr
    assert "FAIL_TO_PASS 5 (on base: 1 AttributeError, 3 assertion), PASS_TO_PASS 3" in result.stderr
    text = toml_path.read_text()
    assert text.startswith(before.rstrip("\n"))  # comments and every other table kept
    assert f"FAIL_TO_PASS {SCRUB}  (AttributeError)" in result.stderr
    sets = tomllib.loads(text)["expect"]["tests"][fake.test_path]
    assert sets == {"FAIL_TO_PASS": FAIL_TO_PASS, "PASS_TO_PASS": PASS_TO_PASS, "base_failure_kind": BASE_KINDS}

    # kvprobe run: reproduced; kvprobe verify: verified
    code, summary = run_json(cli, "pr-1-scrub", *mirror, "--out", str(tmp_path / "b3"))
    assert (code, summary["verdict"]) == (0, "reproduced"), summary["reasons"]
    assert verified(cli, tmp_path / "b3")

    # the same sets against a base that already has the fix: every test that moved is named
    with toml_path.open("a") as handle:
        handle.write(
            f'\n[pins.already-fixed]\nkind = "git"\npr = 1\n[pins.already-fixed.base]\ncommit = "{fake.head_sha}"\n'
            f'[pins.already-fixed.head]\ncommit = "{fake.head_sha}"\n'
        )
    code, summary = run_json(cli, "pr-1-scrub", *mirror, "--pins", "already-fixed", "--out", str(tmp_path / "b4"))
    assert (code, summary["verdict"]) == (1, "not-reproduced")
    moved = [r for r in summary["reasons"] if "expected FAIL_TO_PASS, got PASS_TO_PASS" in r]
    assert sorted(r.split(": ")[1] for r in moved) == sorted(FAIL_TO_PASS)
    assert verified(cli, tmp_path / "b4")  # an honest not-reproduced bundle verifies


def test_base_that_cannot_collect_the_head_tests(world, cli, probes_dir, tmp_path):
    fake = world["fake"]
    folder = probes_dir / "collect"
    folder.mkdir(parents=True)
    (folder / "experiment.toml").write_text(
        experiment_text("collect", fake.url, fake.base_sha, fake.collect_sha, 3, COLLECT_TEST_PATH)
    )
    result = cli("run", "collect", "--out", str(tmp_path / "c1"), "--json")
    code, summary = result.exit_code, json.loads(result.stdout)
    assert (code, summary["verdict"]) == (1, "no-expectations"), summary["reasons"]
    said = "ImportError: cannot import name 'scrub_all'"
    assert f"base could not collect {COLLECT_TEST_PATH}: {said}" in result.stderr
    readme = (tmp_path / "c1" / "README.md").read_text()
    assert f"The base could not collect `{COLLECT_TEST_PATH}`: {said}" in readme and "6 error-to-pass" in readme
    file_summary = summary["test_summary"][COLLECT_TEST_PATH]
    [error] = file_summary["base"]["collection_errors"]
    assert error["exc_type"] == "ImportError" and "scrub_all" in error["message"]
    assert file_summary["head"]["tests"] == {"passed": 3} and file_summary["head"]["subtests"] == {"passed": 3}
    assert file_summary["transitions"] == {"ERROR_TO_PASS": 6}
    assert {(r["base_kind"], r["base_exc_type"], r["head"]) for r in summary["tests"]} == {
        ("collection", "ImportError", "passed")
    }

    result = cli("run", "collect", "--out", str(tmp_path / "c2"), "--record-expectations", "--yes")
    assert result.exit_code == 0, result.stderr
    sets = tomllib.loads((folder / "experiment.toml").read_text())["expect"]["tests"][COLLECT_TEST_PATH]
    assert len(sets["FAIL_TO_PASS"]) == 6 and sets["PASS_TO_PASS"] == []
    assert set(sets["base_failure_kind"].values()) == {"collection:ImportError"}
    code, summary = run_json(cli, "collect", "--out", str(tmp_path / "c3"))
    assert (code, summary["verdict"]) == (0, "reproduced"), summary["reasons"]
    assert verified(cli, tmp_path / "c3")


def experiment_text(exp_id: str, url: str, base: str, head: str, pr: int, test: str, pins: str = "") -> str:
    return f'''schema = "kvprobe.experiment/1"
id = "{exp_id}"
title = "fake upstream: tests only"
layer = "upstream-tests"
upstream = "{url}"
profile = "pytest-minimal"
default_pins = "commits"
[fix]
prs = [{pr}]
summary = "scrub blocks"
{git_pins("commits", base, head, pr=pr)}{pins}
[checks]
tests = [{{ path = "{test}" }}]
[scope]
shows = "head's tests on both sides"
does_not_show = ["anything about a real inference engine"]
'''


# --- code from release wheels, tests from git ---------------------------------------------


def _wheel_pins(world) -> str:
    wheels = world["root"] / "index"
    lines = ['[pins.release-tests]\nkind = "wheel"\npr = 1', f'tests_commit = "{world["fake"].head_sha}"']
    for side, version in (("base", "1.0"), ("head", "1.1")):
        wheel = build_wheel(wheels, "minikv", version, files=package_files(side))
        digest = sha256_file(wheel)
        cached = world["cache"] / "wheels" / digest / wheel.name  # as if downloaded and checked before
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_bytes(wheel.read_bytes())
        lines += [
            f"[pins.release-tests.{side}]",
            f'package = "minikv"\nversion = "{version}"\nfile = "{wheel.name}"\nsha256 = "{digest}"',
        ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def wheel_experiment(world, probes_dir):
    fake = world["fake"]
    folder = probes_dir / "wheel-tests"
    folder.mkdir(parents=True)
    text = experiment_text("wheel-tests", fake.url, fake.base_sha, fake.head_sha, 1, fake.test_path, _wheel_pins(world))
    (folder / "experiment.toml").write_text(text.replace('default_pins = "commits"', 'default_pins = "release-tests"'))
    return folder


def test_release_wheel_code_with_the_head_commits_tests(world, cli, wheel_experiment, tmp_path):
    fake = world["fake"]
    code, summary = run_json(cli, "wheel-tests", "--out", str(tmp_path / "w1"))
    assert (code, summary["verdict"]) == (1, "no-expectations"), summary["reasons"]
    receipt = json.loads((tmp_path / "w1" / "receipt.json").read_text())
    assert receipt["pin_set"]["kind"] == "wheel"
    assert receipt["sides"]["base"]["source"]["filename"] == "minikv-1.0-py3-none-any.whl"
    tests_from = receipt["pin_set"]["tests_from"]
    assert (tests_from["commit"], tests_from["url"]) == (fake.head_sha, fake.url) and len(tests_from["tree"]) == 40
    assert {t["overlay"] for s in ("base", "head") for t in receipt["sides"][s]["tests"]} == {"added"}
    rows = {r["test"]: r for r in summary["tests"]}
    assert (rows[SCRUB]["transition"], rows[SCRUB]["base_exc_type"]) == ("FAIL_TO_PASS", "AttributeError")
    assert rows[ROUNDTRIP]["transition"] == "PASS_TO_PASS"
    assert any("test files from upstream commit" in limit for limit in receipt["evidence"]["limits"])

    result = cli("run", "wheel-tests", "--out", str(tmp_path / "w2"), "--record-expectations", "--yes")
    assert result.exit_code == 0, result.stderr
    code, summary = run_json(cli, "wheel-tests", "--out", str(tmp_path / "w3"))
    assert (code, summary["verdict"]) == (0, "reproduced"), summary["reasons"]
    assert verified(cli, tmp_path / "w3")


def test_unreachable_tests_repository_fails_before_any_wheel(world, cli, wheel_experiment, tmp_path, monkeypatch):
    monkeypatch.setenv("KVPROBE_CACHE_DIR", str(tmp_path / "empty-cache"))  # no wheel cached
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    gone = (tmp_path / "no-such-repo").as_uri()
    result = cli("run", "wheel-tests", "--repo", gone, "--out", str(tmp_path / "never"))
    assert result.exit_code == 3, result.stderr
    assert world["fake"].head_sha in result.stderr and "--repo" in result.stderr
    assert "could not download" not in result.stderr
    assert not (tmp_path / "never").exists()
    assert not (tmp_path / "empty-cache" / "wheels").exists()


@pytest.mark.parametrize("experiment", ["experiment-a", "experiment-b"])
def test_published_release_tests_pin_sets_fail_fast_without_the_repository(cli, tmp_path, monkeypatch, experiment):
    monkeypatch.setenv("KVPROBE_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    gone = (tmp_path / "no-such-mirror").as_uri()
    result = cli("run", experiment, "--pins", "release-tests", "--repo", gone, "--out", str(tmp_path / "never"))
    assert result.exit_code == 3, result.stderr
    commit = load_file(Path(__file__).resolve().parents[2] / "probes" / experiment / "experiment.toml")
    assert commit.pin_sets["release-tests"].tests_commit.commit in result.stderr
    assert not (tmp_path / "empty-cache" / "wheels").exists()  # no wheel was fetched


def test_tests_only_needs_a_test_and_git_pins(world, cli, probes_dir):
    fake = world["fake"]
    base = ["new", "x-tests", "--upstream", CANONICAL, "--repo", fake.url, "--tests-only"]
    result = cli(*base, "--base", fake.base_sha, "--head", fake.head_sha, "--pr", "1")
    assert result.exit_code == 2 and "--tests-only needs" in result.stderr
    assert not probes_dir.exists() or not os.listdir(probes_dir)

"""`kvprobe new` and `run --record-expectations`: the README walk-through on a fake upstream."""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from kvprobe.experiments.experiment import load_file
from tests.fakeupstream import build_fake_upstream
from tests.wheelfactory import build_wheel

# Builds the pytest-minimal env from its hash-pinned lock: pip needs the package index.
pytestmark = pytest.mark.network

EXP_ID = "scrub-on-free"
PROBE_NAME = "probe_scrub_on_free"
MISSING_SHA = "0123456789abcdef0123456789abcdef01234567"

# What an author writes in place of the template's case (like test_run_fake_upstream's PROBE).
PROBE = f'''"""Observes whether a freed block's data is visible to the next owner (fake upstream)."""
import kvprobe_probe as kp
from minikv import BlockPool

probe = kp.Probe("{PROBE_NAME}", mocks={{"nothing": "minikv has no transport to mock"}})


@probe.case("reuse.after_free")
def _(obs):
    pool = BlockPool(1)
    idx = pool.alloc("victim")
    pool.write(idx, "victim", [7, 7, 7, 7])
    pool.free(idx)
    again = pool.alloc("attacker")
    obs.record("same_block", again == idx)
    obs.record("data_seen", pool.read(again, "attacker"))
    obs.record("previous_data_visible", pool.read(again, "attacker") != [0, 0, 0, 0])
    obs.record("owner_note", None)


@probe.case("scrub.exists")
def _(obs):
    obs.record("has_scrub", hasattr(BlockPool, "scrub"))
    BlockPool(1).scrub(0)


if __name__ == "__main__":
    probe.main()
'''


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("new-world")
    return {"fake": build_fake_upstream(root), "cache": root / "cache"}


@pytest.fixture
def probes_dir(tmp_path) -> Path:
    return tmp_path / "probes"


@pytest.fixture
def cli(world, probes_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # ./probes of the test, never the repository's
    monkeypatch.setenv("KVPROBE_PROBES_PATH", str(probes_dir))
    monkeypatch.setenv("KVPROBE_CACHE_DIR", str(world["cache"]))
    monkeypatch.setenv("COLUMNS", "240")  # rich tables unwrapped, so names can be asserted

    def invoke(*args: str, input: str | None = None):
        return CliRunner().invoke(main, list(args), catch_exceptions=False, input=input)

    return invoke


def new_args(fake, *extra: str, experiment_id: str = EXP_ID, **override: str) -> list[str]:
    opts = {
        "--base": fake.base_sha,
        "--head": fake.head_sha,
        "--pr": str(fake.fix_pr),
        "--upstream": fake.url,
        "--repo": fake.url,
        "--package": "minikv",
        "--profile": "pytest-minimal",
        **override,
    }
    return ["new", experiment_id, *[x for kv in opts.items() for x in kv], *extra]


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".")) if directory.is_dir() else []


def test_readme_walkthrough_new_run_record_run(world, cli, probes_dir, tmp_path):
    fake = world["fake"]
    # 1. scaffold: pins checked against the repository, files written and loadable
    result = cli(*new_args(fake, "--test", fake.test_path))
    assert result.exit_code == 0, result.stderr
    folder = probes_dir / EXP_ID
    toml_path, probe_path = folder / "experiment.toml", folder / f"{PROBE_NAME}.py"
    assert sorted(p.name for p in folder.iterdir()) == ["experiment.toml", f"{PROBE_NAME}.py"]
    exp = load_file(toml_path)
    pins = exp.pin_sets["commits"]
    assert (pins.base.commit, pins.head.commit, pins.pr) == (fake.base_sha, fake.head_sha, 1)
    assert pins.python_path == (".",)
    assert [t.path for t in exp.tests] == [fake.test_path]
    assert exp.upstream == fake.url and exp.expectations == {} and exp.fix.prs == (1,)
    assert "none yet" in probe_path.read_text()
    assert leftovers(probes_dir) == []

    # 2. it runs at once: upstream tests on both sides, the template probe, no expectations
    result = cli("run", EXP_ID, "--out", str(tmp_path / "b1"), "--json")
    summary = json.loads(result.stdout)
    assert result.exit_code == 1, summary["reasons"]
    assert summary["verdict"] == "no-expectations"
    rows = {r["test"]: r for r in summary["tests"]}
    assert rows["tests/test_minikv.py::test_scrub_clears_block"]["transition"] == "FAIL_TO_PASS"
    receipt = json.loads((tmp_path / "b1" / "receipt.json").read_text())
    for side in ("base", "head"):
        case = receipt["comparison"]["cases"][side][f"{PROBE_NAME}/template.import"]
        assert case["observations"]["module_file"] == "minikv/__init__.py"
        assert case["observations"]["from_pinned_tree"] is True

    # 3. the template's observations are not recorded as expectations
    before = toml_path.read_bytes()
    result = cli("run", EXP_ID, "--out", str(tmp_path / "b2"), "--record-expectations", "--yes")
    assert result.exit_code == 2 and "template" in result.stderr
    assert toml_path.read_bytes() == before

    # 4. write the probe; record, declining first (nothing written), then accepting
    probe_path.write_text(PROBE)
    result = cli("run", EXP_ID, "--out", str(tmp_path / "b3"), "--record-expectations", input="n\n")
    assert result.exit_code == 1 and "previous_data_visible" in result.stderr
    assert toml_path.read_bytes() == before
    result = cli("run", EXP_ID, "--out", str(tmp_path / "b4"), "--record-expectations", "--yes", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["verdict"] == "no-expectations"  # stdout stays one JSON document
    assert "owner_note is None" in result.stderr
    after = toml_path.read_bytes()
    assert after.startswith(before)  # everything before the new [expect] tables, byte for byte
    expect = tomllib.loads(after.decode())["expect"]
    case = f"{PROBE_NAME}/reuse.after_free"
    assert expect["base"][case] == {
        "same_block": True,
        "data_seen": [7, 7, 7, 7],
        "previous_data_visible": True,
        "raised": False,
    }
    assert expect["head"][case]["previous_data_visible"] is False
    assert expect["base"][f"{PROBE_NAME}/scrub.exists"] == {"has_scrub": False, "raised": "AttributeError"}
    assert expect["head"][f"{PROBE_NAME}/scrub.exists"] == {"has_scrub": True, "raised": False}
    assert "owner_note" not in expect["base"][case]
    assert leftovers(folder) == []

    # 5. the recorded experiment reproduces; the TODOs it still has, quoted by the bundle, are named
    result = cli("run", EXP_ID, "--out", str(tmp_path / "b5"), "--json")
    summary = json.loads(result.stdout)
    assert result.exit_code == 0, summary["reasons"]
    assert summary["verdict"] == "reproduced"
    said = " ".join(result.stderr.split())
    assert "reproduced, but its title, fix.summary, scope.shows, scope.does_not_show still say TODO" in said

    # 6. recording again replaces the [expect] tables instead of adding to them
    result = cli("run", EXP_ID, "--out", str(tmp_path / "b6"), "--record-expectations", "--yes")
    assert result.exit_code == 0, result.stderr
    again = toml_path.read_text()
    assert again.count(f'[expect.base."{case}"]') == 1
    assert tomllib.loads(again)["expect"] == expect
    assert again.startswith(before.decode())

    # 7. written in, nothing left to warn about
    written = again.replace("TODO one line on what the fix changes", "scrub freed blocks")
    written = written.replace('"TODO: what the fix changes, where', '"BlockPool.free scrubs; was: where')
    written = written.replace('"TODO: what the evidence shows', '"The probe shows the scrub')
    toml_path.write_text(written.replace('"TODO: what the evidence does not show', '"Not shown: anything'))
    result = cli("run", EXP_ID, "--out", str(tmp_path / "b7"))
    assert result.exit_code == 0 and "TODO" not in result.stderr, result.stderr


def test_unknown_sha_is_bad_input_and_writes_nothing(world, cli, probes_dir):
    result = cli(*new_args(world["fake"], **{"--head": MISSING_SHA}))
    assert result.exit_code == 2
    assert MISSING_SHA in result.stderr and "--head" in result.stderr
    assert not (probes_dir / EXP_ID).exists() and leftovers(probes_dir) == []


def test_a_local_repository_that_is_not_there_is_bad_input(world, cli, tmp_path, probes_dir):
    """A file:// URL is a local path: one that does not exist is a bad argument (exit 2, as
    a bare path is), refused before git runs or a store is made (#28; it was exit 3)."""
    result = cli(*new_args(world["fake"], **{"--repo": (tmp_path / "no-such-repo").as_uri()}))
    assert result.exit_code == 2, result.stderr
    assert "no-such-repo" in result.stderr and "no such file or directory" in result.stderr
    assert not (probes_dir / EXP_ID).exists()


def test_test_path_absent_at_head(world, cli, probes_dir):
    fake = world["fake"]
    result = cli(*new_args(fake, "--test", "tests/test_nothing_here.py"))
    assert result.exit_code == 2
    assert "tests/test_nothing_here.py" in result.stderr and fake.head_sha in result.stderr
    assert not (probes_dir / EXP_ID).exists()


def test_id_already_taken_is_never_overwritten(world, cli, probes_dir):
    taken = probes_dir / "taken"
    taken.mkdir(parents=True)
    (taken / "experiment.toml").write_text("# someone's work\n")
    result = cli(*new_args(world["fake"], experiment_id="taken"))
    assert result.exit_code == 2 and "already taken" in result.stderr and str(taken) in result.stderr
    assert (taken / "experiment.toml").read_text() == "# someone's work\n"
    assert sorted(p.name for p in taken.iterdir()) == ["experiment.toml"]
    # a built-in experiment's id is taken too, wherever the new one would go
    result = cli(*new_args(world["fake"], experiment_id="experiment-a"))
    assert result.exit_code == 2 and "already taken" in result.stderr


@pytest.fixture
def git_calls(monkeypatch):
    import kvprobe.proc as proc

    calls = []
    real_run = proc.run
    monkeypatch.setattr(proc, "run", lambda argv, **kw: (calls.append(list(map(str, argv))), real_run(argv, **kw))[1])
    return calls


@pytest.mark.parametrize("bad_id", ["Scrub", "scrub_on_free", "scrub on free", "9lives", "x", "profiles"])
def test_bad_id_is_exit_2_before_any_git(world, cli, probes_dir, git_calls, bad_id):
    result = cli(*new_args(world["fake"], experiment_id=bad_id))
    assert result.exit_code == 2 and result.stderr.startswith("kvprobe: error:")
    assert repr(bad_id) in result.stderr
    assert git_calls == [] and not probes_dir.exists()


def test_bad_id_message_names_the_characters(world, cli):
    result = cli(*new_args(world["fake"], experiment_id="scrub_On-free"))
    assert "'O'" in result.stderr and "'_'" in result.stderr


@pytest.mark.parametrize(
    "url",
    [
        "ext::sh -c touch% /tmp/kvprobe-pwned",
        "-uhttps://x",
        "http://example.org/x",
        "https://user:pw@example.org/x",
        "https://example.org/x\nmore",
    ],
)
def test_bad_url_is_exit_2_and_runs_no_git(world, cli, probes_dir, git_calls, url):
    result = cli(*new_args(world["fake"], **{"--repo": url}))
    assert result.exit_code == 2
    assert git_calls == [] and not (probes_dir / EXP_ID).exists()


@pytest.mark.parametrize("flag,value", [("--base", "main"), ("--head", "f4d01a7"), ("--base", "A" * 40), ("--pr", "0")])
def test_bad_pins_are_exit_2_and_run_no_git(world, cli, git_calls, flag, value):
    result = cli(*new_args(world["fake"], **{flag: value}))
    assert result.exit_code == 2, result.stderr
    assert git_calls == []
    if flag != "--pr":  # the flag named, and how to get a full SHA
        assert result.stderr.startswith(f"kvprobe: error: {flag} '{value}' is not a full 40-hex"), result.stderr
        assert f"git rev-parse '{value}^{{commit}}'" in result.stderr


def test_release_pins_are_looked_up_exactly(world, cli, probes_dir, tmp_path, monkeypatch):
    index = tmp_path / "index"
    base_wheel = build_wheel(index, "minipkg", "1.0")
    head_wheel = build_wheel(index, "minipkg", "1.1", files={"minipkg/__init__.py": "FIXED = True\n"})
    build_wheel(index, "minipkg", "1.2")  # a later release must not be picked
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    fake = world["fake"]
    result = cli(
        *new_args(
            fake, "--test", fake.test_path, "--release-base", "1.0", "--release-head", "1.1", **{"--package": "minipkg"}
        )
    )
    assert result.exit_code == 0, result.stderr
    data = tomllib.loads((probes_dir / EXP_ID / "experiment.toml").read_text())
    release = data["pins"]["release"]
    assert release["kind"] == "wheel"
    for side, wheel, version in (("base", base_wheel, "1.0"), ("head", head_wheel, "1.1")):
        assert release[side] == {
            "package": "minipkg",
            "version": version,
            "file": wheel.name,
            "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        }
    assert data["checks"]["tests"] == [{"path": fake.test_path, "pins": ["commits"]}]
    assert data["fix"]["release"] == "1.1" and data["default_pins"] == "commits"
    exp = load_file(probes_dir / EXP_ID / "experiment.toml")
    assert exp.pin_sets["release"].head.filename == "minipkg-1.1-py3-none-any.whl"
    said = header(probes_dir / EXP_ID / "experiment.toml")
    assert "each test file read at head" in said and "each wheel's file name and sha256 computed" in said


def test_release_version_that_does_not_exist_is_exit_3_and_writes_nothing(
    world, cli, probes_dir, tmp_path, monkeypatch
):
    index = tmp_path / "index"
    build_wheel(index, "minipkg", "1.0")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    result = cli(*new_args(world["fake"], "--release-base", "1.0", "--release-head", "9.9", **{"--package": "minipkg"}))
    assert result.exit_code == 3 and "9.9" in result.stderr
    assert not (probes_dir / EXP_ID).exists() and leftovers(probes_dir) == []


def test_release_flags_go_together(world, cli, git_calls):
    result = cli(*new_args(world["fake"], "--release-base", "1.0"))
    assert result.exit_code == 2 and "--release-head" in result.stderr
    assert git_calls == []


# --- wheel-only: release pins without --base/--head (hosts that reach PyPI but not git) ----

WHEEL_ID = "clamp-upper"
WHEEL_PROBE_NAME = "probe_clamp_upper"
BUGGY = "def clamp(x, lo, hi):\n    return max(lo, x)\n"  # 1.0: the upper bound is ignored
FIXED = "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n"  # 1.1: the fix

WHEEL_PROBE = f'''"""Observes whether minipkg.clamp honours the upper bound (release wheels)."""
import kvprobe_probe as kp
from minipkg import clamp


probe = kp.Probe("{WHEEL_PROBE_NAME}", mocks={{"nothing": "clamp is a pure function"}})


@probe.case("clamp.above_upper")
def _(obs):
    obs.record("value", clamp(15, 0, 10))
    obs.record("within_bounds", 0 <= clamp(15, 0, 10) <= 10)


if __name__ == "__main__":
    probe.main()
'''


@pytest.fixture
def wheel_index(world, tmp_path, monkeypatch) -> dict[str, Path]:
    """minipkg 1.0 (bug) and 1.1 (fix) in a local find-links dir; pip sees nothing else.

    The pytest-minimal env is built (or reused) in the test cache first, while pip can still
    reach its index; the runner then only downloads the two wheels from the local dir."""
    from kvprobe.env.venv import EnvManager, load_profile

    EnvManager(world["cache"]).ensure(load_profile("pytest-minimal"))
    index = tmp_path / "wheel-index"
    wheels = {
        "1.0": build_wheel(index, "minipkg", "1.0", files={"minipkg/__init__.py": BUGGY}),
        "1.1": build_wheel(index, "minipkg", "1.1", files={"minipkg/__init__.py": FIXED}),
    }
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    return wheels


@pytest.fixture
def process_calls(monkeypatch):
    """Every argv given to kvprobe.proc.run / proc.capture (git goes through these)."""
    import kvprobe.proc as proc

    calls: list[list[str]] = []
    for name in ("run", "capture"):
        real = getattr(proc, name)
        monkeypatch.setattr(
            proc, name, lambda argv, _real=real, **kw: (calls.append(list(map(str, argv))), _real(argv, **kw))[1]
        )
    return calls


def no_git(calls: list[list[str]]) -> bool:
    return not any(Path(argv[0]).name == "git" for argv in calls if argv)


def wheel_args(*extra: str, experiment_id: str = WHEEL_ID) -> list[str]:
    return [
        "new",
        experiment_id,
        "--release-base",
        "1.0",
        "--release-head",
        "1.1",
        "--package",
        "minipkg",
        "--profile",
        "pytest-minimal",
        *extra,
    ]


def test_wheel_only_walkthrough_new_run_record_run(world, cli, probes_dir, tmp_path, wheel_index, process_calls):
    # 1. scaffold from release wheels alone: only the `release` pin set, exact files and digests
    result = cli(*wheel_args())
    assert result.exit_code == 0, result.stderr
    folder = probes_dir / WHEEL_ID
    toml_path, probe_path = folder / "experiment.toml", folder / f"{WHEEL_PROBE_NAME}.py"
    assert sorted(p.name for p in folder.iterdir()) == ["experiment.toml", f"{WHEEL_PROBE_NAME}.py"]
    data = tomllib.loads(toml_path.read_text())
    assert list(data["pins"]) == ["release"] and data["default_pins"] == "release"
    for side, version in (("base", "1.0"), ("head", "1.1")):
        wheel = wheel_index[version]
        assert data["pins"]["release"][side] == {
            "package": "minipkg",
            "version": version,
            "file": wheel.name,
            "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        }
    assert "tests" not in data["checks"] and data["fix"]["release"] == "1.1"
    exp = load_file(toml_path)
    assert list(exp.pin_sets) == ["release"] and exp.tests == ()
    assert exp.pin_sets["release"].python_path == (".",)  # the unpacked wheel's root
    assert leftovers(probes_dir) == []

    # 2. the template probe runs on both wheels at once; no expectations yet
    result = cli("run", WHEEL_ID, "--out", str(tmp_path / "w1"), "--json")
    summary = json.loads(result.stdout)
    assert result.exit_code == 1, summary["reasons"]
    assert summary["verdict"] == "no-expectations" and summary["tests"] == []
    receipt = json.loads((tmp_path / "w1" / "receipt.json").read_text())
    for side in ("base", "head"):
        case = receipt["comparison"]["cases"][side][f"{WHEEL_PROBE_NAME}/template.import"]
        assert case["observations"]["module_file"] == "minipkg/__init__.py"
        assert case["observations"]["from_pinned_tree"] is True

    # 3. a real probe observes the difference; recorded, then reproduced
    probe_path.write_text(WHEEL_PROBE)
    result = cli("run", WHEEL_ID, "--out", str(tmp_path / "w2"), "--record-expectations", "--yes")
    assert result.exit_code == 0, result.stderr
    expect = tomllib.loads(toml_path.read_text())["expect"]
    case = f"{WHEEL_PROBE_NAME}/clamp.above_upper"
    assert expect["base"][case] == {"value": 15, "within_bounds": False, "raised": False}
    assert expect["head"][case] == {"value": 10, "within_bounds": True, "raised": False}
    result = cli("run", WHEEL_ID, "--out", str(tmp_path / "w3"), "--json")
    summary = json.loads(result.stdout)
    assert result.exit_code == 0, summary["reasons"]
    assert summary["verdict"] == "reproduced"

    # no git at any step: new, run, record, run
    assert process_calls and no_git(process_calls), [c[:3] for c in process_calls]


def test_wheel_only_test_path_needs_git_pins(cli, probes_dir, process_calls):
    result = cli(*wheel_args("--test", "tests/test_minikv.py"))
    assert result.exit_code == 2, result.stderr
    assert "--test" in result.stderr and "git pins" in result.stderr and "wheels carry no tests" in result.stderr
    assert process_calls == [] and not (probes_dir / WHEEL_ID).exists()


@pytest.mark.parametrize("given", ["--base", "--head"])
def test_only_one_of_base_head_is_exit_2(world, cli, probes_dir, process_calls, given):
    sha = world["fake"].base_sha
    for args in (wheel_args(given, sha), ["new", EXP_ID, given, sha, "--profile", "pytest-minimal"]):
        result = cli(*args)
        assert result.exit_code == 2, result.stderr
        assert "--base and --head go together" in result.stderr and f"only {given}" in result.stderr
    assert process_calls == [] and not probes_dir.exists()


def test_neither_commits_nor_releases_is_exit_2(cli, probes_dir, process_calls):
    result = cli("new", EXP_ID, "--package", "minikv", "--profile", "pytest-minimal")
    assert result.exit_code == 2
    assert result.stderr.startswith("kvprobe: error:") and "--base and --head are required" in result.stderr
    assert "--release-base" in result.stderr
    assert process_calls == [] and not probes_dir.exists()


def test_new_keeps_looked_up_wheels_for_the_first_run(world, cli, probes_dir, tmp_path, wheel_index):
    """`new` hashes each release wheel: the file goes into the wheel cache `run` reads, so the
    first run downloads nothing (the index is emptied in between to prove it)."""
    result = cli(
        *wheel_args("--vulnerability-id", "KVPROBE-2026-0042", "--alias", "CVE-2026-0042", "--fix-kind", "security")
    )
    assert result.exit_code == 0, result.stderr
    data = tomllib.loads((probes_dir / WHEEL_ID / "experiment.toml").read_text())
    assert data["vulnerability"] == {"id": "KVPROBE-2026-0042", "aliases": ["CVE-2026-0042"], "fix_kind": "security"}
    for wheel in wheel_index.values():
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        cached = world["cache"] / "wheels" / digest / wheel.name
        assert cached.read_bytes() == wheel.read_bytes()
        wheel.unlink()
    result = cli("run", WHEEL_ID, "--out", str(tmp_path / "w1"), "--json")
    assert result.exit_code == 1, result.stderr  # no expectations yet; but it ran
    receipt = json.loads((tmp_path / "w1" / "receipt.json").read_text())
    assert [receipt["sides"][s]["source"]["fetched_via"] for s in ("base", "head")] == ["cache", "cache"]
    assert receipt["experiment"]["vulnerability"] == data["vulnerability"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--vulnerability-id", "SGLANG-PD-KV-1", "--fix-kind", "security"), "is not a vulnerability id"),
        (("--vulnerability-id", "CVE-2026-1234"), "needs --fix-kind"),
        (("--fix-kind", "security"), "go with --vulnerability-id"),
        (("--vulnerability-id", "CVE-2026-1234", "--alias", "GHSA-1", "--fix-kind", "security"), "--alias 'GHSA-1'"),
    ],
)
def test_bad_vulnerability_flags_are_exit_2_before_pip(cli, probes_dir, process_calls, extra, message):
    result = cli(*wheel_args(*extra))
    assert result.exit_code == 2 and message in result.stderr
    assert process_calls == [] and not probes_dir.exists()


def test_without_a_vulnerability_id_the_table_is_a_todo(world, cli, probes_dir):
    result = cli(*new_args(world["fake"]))
    assert result.exit_code == 0, result.stderr
    text = (probes_dir / EXP_ID / "experiment.toml").read_text()
    assert "# [vulnerability]" in text and "vulnerability" not in tomllib.loads(text)


# --- release wheels plus an upstream commit's test files (--tests-commit) -------------------


def test_tests_commit_scaffolds_a_release_tests_pin_set(world, cli, probes_dir, wheel_index):
    fake = world["fake"]
    args = wheel_args("--tests-commit", fake.head_sha, "--pr", str(fake.fix_pr), "--test", fake.test_path)
    result = cli(*args, "--upstream", fake.url, "--repo", fake.url)
    assert result.exit_code == 0, result.stderr
    toml_path = probes_dir / WHEEL_ID / "experiment.toml"
    data = tomllib.loads(toml_path.read_text())
    assert list(data["pins"]) == ["release", "release-tests"]
    tests_pins = data["pins"]["release-tests"]
    assert tests_pins["tests_commit"] == fake.head_sha and tests_pins["pr"] == fake.fix_pr
    assert tests_pins["base"] == data["pins"]["release"]["base"]  # the same wheels, checked once
    assert data["checks"]["tests"] == [{"path": fake.test_path, "pins": ["release-tests"]}]
    exp = load_file(toml_path)
    assert exp.pin_sets["release-tests"].tests_commit is not None
    assert exp.pin_sets["release-tests"].tests_commit.commit == fake.head_sha


def test_tests_commit_without_the_test_file_is_exit_2_and_writes_nothing(world, cli, probes_dir, wheel_index):
    fake = world["fake"]
    args = wheel_args("--tests-commit", fake.base_sha, "--test", "tests/test_absent.py")
    result = cli(*args, "--upstream", fake.url, "--repo", fake.url)
    assert result.exit_code == 2, result.stderr
    assert "does not exist at --tests-commit" in result.stderr
    assert not (probes_dir / WHEEL_ID).exists() and leftovers(probes_dir) == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--tests-commit", "main", "--test", "t.py"), "not a full"),
        (("--tests-commit", "0" * 40), "needs at least one --test"),
    ],
)
def test_bad_tests_commit_flags_are_exit_2_before_any_process(cli, probes_dir, process_calls, extra, message):
    result = cli(*wheel_args(*extra))
    assert result.exit_code == 2 and message in result.stderr, result.stderr
    assert process_calls == [] and not probes_dir.exists()


def test_tests_commit_needs_release_wheels(world, cli, probes_dir, process_calls):
    fake = world["fake"]
    result = cli(*new_args(fake, "--tests-commit", fake.head_sha, "--test", fake.test_path))
    assert result.exit_code == 2 and "--tests-commit goes with --release-base" in result.stderr
    assert process_calls == [] and not probes_dir.exists()


# --- base and head as history relates them; what the header claims ---------------------------


def test_a_swapped_base_and_head_is_exit_2_and_writes_nothing(world, cli, probes_dir):
    fake = world["fake"]
    base, head = fake.head_sha, fake.base_sha
    result = cli(*new_args(fake, **{"--base": base, "--head": head}))
    assert result.exit_code == 2, result.stderr
    error = result.stderr.split("kvprobe: error: ", 1)[1]
    said = f"--base {base} is not an ancestor of --head {head}: head is an ancestor of base (swapped?)"
    assert error.startswith(said)
    assert not (probes_dir / EXP_ID).exists() and leftovers(probes_dir) == []


def test_a_base_that_diverged_from_head_is_warned_about_and_said_in_the_header(world, cli, probes_dir):
    """GitHub records a PR's base as the target branch's tip, often not the PR's fork point:
    such a pair is scaffolded, with a warning naming the fork point, and the header says so."""
    fake = world["fake"]
    base, head = fake.nofix_sha, fake.head_sha
    result = cli(*new_args(fake, **{"--base": base, "--head": head}))
    assert result.exit_code == 0, result.stderr
    said = " ".join(result.stderr.split())
    assert f"warning: --base {base} is not an ancestor of --head {head}: they diverged at {fake.base_sha}" in said
    assert f"give --base {fake.base_sha}" in said
    assert f"base NOT an ancestor of head: they diverged at {fake.base_sha}" in header(
        probes_dir / EXP_ID / "experiment.toml"
    )


def header(path: Path) -> str:
    """The scaffold's opening comment, unwrapped."""
    lines = path.read_text().split("\nschema", 1)[0].splitlines()
    return " ".join(line.removeprefix("# ") for line in lines)


def test_an_older_ancestor_is_a_base_though_the_store_is_shallow(world, cli, probes_dir):
    """Base three commits before head: not its parent, so the shallow store is deepened to see it."""
    fake = world["fake"]
    result = cli(*new_args(fake, **{"--base": fake.early_shas[1]}))
    assert result.exit_code == 0, result.stderr
    assert "base an ancestor of head" in header(probes_dir / EXP_ID / "experiment.toml")


def test_an_ancestry_the_fetched_history_cannot_show_is_a_note_not_a_claim(
    world, cli, probes_dir, tmp_path, monkeypatch
):
    import kvprobe.sources.git as git

    monkeypatch.setenv("KVPROBE_CACHE_DIR", str(tmp_path / "own-cache"))  # a store not deepened before
    monkeypatch.setattr(git, "PR_DEEP_FETCH_DEPTH", 2)
    fake = world["fake"]
    result = cli(*new_args(fake, **{"--base": fake.early_shas[0]}))
    assert result.exit_code == 0, result.stderr
    assert "could not confirm that --base" in result.stderr and "2 commits before head" in result.stderr
    said = header(probes_dir / EXP_ID / "experiment.toml")
    assert "both commits fetched" in said and "ancestor" not in said


def test_the_header_claims_only_what_new_checked(world, cli, probes_dir):
    """No --test, no wheels: the header says neither was checked; a head fetched by SHA is not
    said to be reachable through the PR's ref (a squash commit on main is not)."""
    fake = world["fake"]
    result = cli(*new_args(fake))
    assert result.exit_code == 0, result.stderr
    text = (probes_dir / EXP_ID / "experiment.toml").read_text()
    said = header(probes_dir / EXP_ID / "experiment.toml")
    assert "both commits fetched, base an ancestor of head" in said
    assert "test" not in said and "wheel" not in said
    assert tomllib.loads(text)["pins"]["commits"]["description"] == "PR #1's base and head"
    assert "refs/pull" not in text


def test_a_test_file_the_pr_did_not_change_and_one_without_tests_are_named(world, cli, probes_dir):
    """minikv/__init__.py: the same at base and head, and no test in it (a researcher's slip)."""
    result = cli(*new_args(world["fake"], "--test", "minikv/__init__.py"))
    assert result.exit_code == 0, result.stderr
    assert "--test minikv/__init__.py is the same at base and head" in result.stderr
    assert "--test minikv/__init__.py defines no test function or Test class at head" in result.stderr


def test_a_head_that_reverts_is_named(tmp_path, cli, probes_dir):
    fake = build_fake_upstream(tmp_path / "reverting")
    tree = fake.git("rev-parse", f"{fake.base_sha}^{{tree}}")
    revert = fake.git("commit-tree", tree, "-p", fake.head_sha, "-m", 'Revert "minikv: scrub blocks on free (fix)"')
    fake.git("update-ref", "refs/pull/9/head", revert)
    result = cli(*new_args(fake, **{"--base": fake.head_sha, "--head": revert, "--pr": "9"}))
    assert result.exit_code == 0, result.stderr
    assert f'head {revert[:12]} is a revert (Revert "minikv: scrub blocks on free (fix)")' in result.stderr
    # the fix's own pair is no revert: nothing said
    assert "is a revert" not in cli(*new_args(fake, experiment_id="the-fix")).stderr


def test_a_package_not_found_at_head_is_named(world, cli, probes_dir):
    result = cli(*new_args(world["fake"], **{"--package": "sglang"}))
    assert result.exit_code == 0, result.stderr
    said = " ".join(result.stderr.split())
    assert "--package sglang: no sglang/__init__.py or sglang.py at head under python/, src/ or the root" in said
    assert "# TODO: sglang was not found at head" in (probes_dir / EXP_ID / "experiment.toml").read_text()

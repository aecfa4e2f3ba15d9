"""`kvprobe run` end to end on a real git upstream built by the test (real venv, real pytest)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import replace

import pytest
from click.testing import CliRunner

from kvprobe import schema
from kvprobe.cli import main
from kvprobe.files import json_bytes
from kvprobe.model.receipt import Receipt
from kvprobe.model.records import Verdict
from kvprobe.resources import builtin_probes_dir
from tests.fakeupstream import FakeUpstream, build_fake_upstream, git_pins

# Builds the pytest-minimal env from its hash-pinned lock: pip needs the package index.
pytestmark = pytest.mark.network

PROBE = '''"""Observes whether a freed block's data is visible to the next owner (fake upstream)."""
import kvprobe_probe as kp
from minikv import BlockPool


probe = kp.Probe("minikv_probe", mocks={"nothing": "minikv has no transport to mock"})


@probe.case("reuse.after_free")
def _(obs):
    pool = BlockPool(1)
    idx = pool.alloc("victim")
    pool.write(idx, "victim", [7, 7, 7, 7])
    pool.free(idx)
    again = pool.alloc("attacker")
    obs.record("same_block", again == idx)
    obs.record("previous_data_visible", pool.read(again, "attacker") != [0, 0, 0, 0])


@probe.case("scrub.exists")
def _(obs):
    obs.record("has_scrub", hasattr(BlockPool, "scrub"))
    BlockPool(1).scrub(0)


if __name__ == "__main__":
    probe.main()
'''


def experiment_toml(fake: FakeUpstream, extra_pins: str = "") -> str:
    return f'''
schema = "kvprobe.experiment/1"
id = "fake-fix"
title = "fake upstream: scrub freed blocks"
layer = "diff-probe"
upstream = "{fake.url}"
profile = "pytest-minimal"
default_pins = "commits"
[fix]
prs = [1]
summary = "scrub blocks on free"
{git_pins("commits", fake.base_sha, fake.head_sha, pr=1)}
{git_pins("nofix", fake.base_sha, fake.nofix_sha, pr=2)}
{extra_pins}
[checks]
tests = [{{ path = "{fake.test_path}" }}]
probes = [{{ path = "minikv_probe.py" }}]
[expect.base."minikv_probe/reuse.after_free"]
previous_data_visible = true
[expect.head."minikv_probe/reuse.after_free"]
previous_data_visible = false
[expect.base."minikv_probe/scrub.exists"]
raised = "AttributeError"
[expect.head."minikv_probe/scrub.exists"]
has_scrub = true
raised = false
[scope]
shows = "a freed block's data is visible to its next owner at base, not at head"
does_not_show = ["anything about a real inference engine"]
'''


DRIFT_PROBE = '''"""Scrubs a freed block; base has no scrub, so it cannot observe there."""
import kvprobe_probe as kp
from minikv import BlockPool

probe = kp.Probe("drift_probe", mocks={"nothing": "minikv has no transport to mock"})


@probe.case("scrub.clears", decision="BlockPool.scrub")
def _(obs):
    pool = BlockPool(1)
    scrub = kp.require(BlockPool, "scrub")
    with obs.decision():
        scrub(pool, 0)
    obs.record("scrubbed", True)


if __name__ == "__main__":
    probe.main()
'''


def drift_toml(fake: FakeUpstream) -> str:
    """fake-fix's pins with one probe whose decision point base lacks."""
    head, _, _ = experiment_toml(fake).partition("[checks]")
    return (
        head.replace('id = "fake-fix"', 'id = "fake-drift"')
        + '[checks]\nprobes = [{ path = "drift_probe.py" }]\n'
        + '[expect.base."drift_probe/scrub.clears"]\nscrubbed = true\n'
        + '[expect.head."drift_probe/scrub.clears"]\nscrubbed = true\n'
        + '[scope]\nshows = "nothing"\ndoes_not_show = ["anything"]\n'
    )


REPEAT_PROBE = '''"""One case records the same value every run, one a fresh random token (unstable)."""
import uuid

import kvprobe_probe as kp
from minikv import BlockPool

probe = kp.Probe("repeat_probe", mocks={"nothing": "minikv has no transport to mock"})


@probe.case("steady")
def _(obs):
    obs.record("blocks", len([BlockPool(2).alloc("a")]))


@probe.case("jitter")
def _(obs):
    obs.record("token", uuid.uuid4().hex)


if __name__ == "__main__":
    probe.main()
'''


def repeat_toml(fake: FakeUpstream) -> str:
    """fake-fix's pins with a probe whose ``jitter`` case differs on every run."""
    head, _, _ = experiment_toml(fake).partition("[checks]")
    return (
        head.replace('id = "fake-fix"', 'id = "fake-repeat"')
        + '[checks]\nprobes = [{ path = "repeat_probe.py" }]\n'
        + '[expect.base."repeat_probe/steady"]\nblocks = 1\n'
        + '[expect.head."repeat_probe/steady"]\nblocks = 1\n'
        + '[expect.head."repeat_probe/jitter"]\ntoken = "0"\n'
        + '[scope]\nshows = "nothing"\ndoes_not_show = ["anything"]\n'
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    fake = build_fake_upstream(root)
    missing = "0123456789abcdef0123456789abcdef01234567"
    extra = git_pins("missing", fake.base_sha, missing)
    folder = root / "probes" / "fake-fix"
    folder.mkdir(parents=True)
    (folder / "experiment.toml").write_text(experiment_toml(fake, extra))
    (folder / "minikv_probe.py").write_text(PROBE)
    drift = root / "probes" / "fake-drift"
    drift.mkdir()
    (drift / "experiment.toml").write_text(drift_toml(fake))
    (drift / "drift_probe.py").write_text(DRIFT_PROBE)
    again = root / "probes" / "fake-repeat"
    again.mkdir()
    (again / "experiment.toml").write_text(repeat_toml(fake))
    (again / "repeat_probe.py").write_text(REPEAT_PROBE)
    return {"root": root, "fake": fake, "probes": root / "probes", "cache": root / "cache"}


@pytest.fixture
def cli(world, monkeypatch):
    monkeypatch.setenv("KVPROBE_PROBES_PATH", str(world["probes"]))
    monkeypatch.setenv("KVPROBE_CACHE_DIR", str(world["cache"]))

    def invoke(*args: str):
        return CliRunner().invoke(main, list(args), catch_exceptions=False)

    return invoke


def test_run_reproduces_and_writes_a_checkable_bundle(world, cli, tmp_path):
    out = tmp_path / "bundle"
    result = cli("run", "fake-fix", "--out", str(out), "--json")
    summary = json.loads(result.stdout)
    assert result.exit_code == 0, summary["reasons"]
    assert summary["verdict"] == "reproduced"
    subprocess.run(["sha256sum", "-c", "--strict", "--quiet", "SHA256SUMS"], cwd=out, check=True)
    receipt = json.loads((out / "receipt.json").read_text())
    assert schema.errors(receipt, "kvprobe.receipt/1") == []
    assert json_bytes(Receipt.from_json(receipt).to_json()) == (out / "receipt.json").read_bytes()
    fake = world["fake"]
    assert receipt["sides"]["base"]["source"]["commit"] == fake.base_sha
    assert receipt["sides"]["head"]["source"]["commit"] == fake.head_sha
    assert receipt["sides"]["head"]["source"]["tree"]
    assert receipt["env"]["packages"]["pytest"] == "9.2.0"
    from kvprobe.env import installer

    uv = installer.find_uv()  # the env was built with uv when there is one: the receipt says which
    recorded = receipt["env"]["installer"]
    assert recorded["name"] == ("uv" if uv else "pip")
    if uv:
        assert installer.uv_version(uv).split()[1] == recorded["version"]
    assert receipt["evidence"]["mocks"] == {"minikv_probe": {"nothing": "minikv has no transport to mock"}}
    rows = {r["test"]: r for r in summary["tests"]}
    for nodeid, expected in fake.expected_tests.items():
        if "FreeClearsEverySlot" in nodeid:
            continue  # pytest 9 reports unittest subTest failures on the subtests, not the parent
        row = rows[nodeid]
        assert row["base"] == expected["base"] and row["head"] == expected["head"], nodeid
        if expected["base"] == "failed" and nodeid.endswith("test_scrub_clears_block"):
            assert (row["base_kind"], row["base_exc_type"]) == ("exception", "AttributeError")
        if nodeid.endswith("test_freed_block_is_zeroed_for_next_owner"):
            assert (row["base_kind"], row["base_exc_type"]) == ("assertion", "AssertionError")
    assert rows["tests/test_minikv.py::test_scrub_clears_block"]["transition"] == "FAIL_TO_PASS"
    assert rows["tests/test_minikv.py::test_alloc_write_read_roundtrip"]["transition"] == "PASS_TO_PASS"
    subtests = [r for r in summary["tests"] if "[" in r["test"]]
    assert len(subtests) == 4
    assert sorted(r["transition"] for r in subtests) == ["FAIL_TO_PASS", "FAIL_TO_PASS", "PASS_TO_PASS", "PASS_TO_PASS"]
    kinds = summary["test_summary"][fake.test_path]["base"]["failure_kinds"]
    assert kinds["AttributeError"] == 1 and kinds["assertion"] >= 1
    # the bundle carries the probe and the experiment byte for byte, and raw outputs per side
    assert (out / "probes" / "fake-fix" / "minikv_probe.py").read_text() == PROBE
    for side in ("base", "head"):
        assert (out / "raw" / side / "probes" / "minikv_probe.json").is_file()
        assert (out / "raw" / side / "tests" / "tests__test_minikv.py.json").is_file()
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_head_without_the_fix_is_not_reproduced(cli, tmp_path):
    result = cli("run", "fake-fix", "--pins", "nofix", "--out", str(tmp_path / "b"), "--json")
    assert result.exit_code == 1
    summary = json.loads(result.stdout)
    assert summary["verdict"] == "not-reproduced"
    assert any("previous_data_visible" in r for r in summary["reasons"])


def test_a_case_base_cannot_reach_is_could_not_observe_exit_3(cli, tmp_path):
    out = tmp_path / "drift"
    result = cli("run", "fake-drift", "--out", str(out), "--json")
    summary = json.loads(result.stdout)
    assert (result.exit_code, summary["verdict"]) == (3, "could-not-observe")
    assert summary["reasons"] == [
        "base: drift_probe/scrub.clears: not present in this release: minikv.pool.BlockPool.scrub"
    ]
    assert cli("verify", str(out)).exit_code == 0


def test_repeat_marks_the_case_that_differs_unstable_and_verify_recomputes_it(cli, tmp_path):
    """--repeat 3: the random case is unstable on both sides (its expectation is could-not-observe,
    not a mismatch), the steady one holds; the bundle cites every run and verifies; a receipt
    that claims the repeats agreed is refused."""
    out = tmp_path / "repeat"
    result = cli("run", "fake-repeat", "--repeat", "3", "--out", str(out), "--json")
    summary = json.loads(result.stdout)
    assert result.exit_code == 3, summary["reasons"]
    assert summary["verdict"] == "could-not-observe"
    assert len(summary["reasons"]) == 2  # the case has an expectation: each side that differed is named
    for side, reason in zip(("base", "head"), summary["reasons"], strict=True):
        assert re.fullmatch(
            rf"{side}: repeat_probe/jitter: unstable across repeats: observation 'token' was '[0-9a-f]{{32}}' "
            r"in run 1, '[0-9a-f]{32}' in run 2",
            reason,
        )
    receipt = json.loads((out / "receipt.json").read_text())
    assert receipt["repeats"] == 3
    assert {side: list(cases) for side, cases in receipt["comparison"]["unstable"].items()} == {
        "base": ["repeat_probe/jitter"],
        "head": ["repeat_probe/jitter"],
    }
    steady = [r for r in receipt["comparison"]["observations"] if r["case"] == "repeat_probe/steady"]
    assert steady and all(r["base_ok"] and r["head_ok"] and "unstable" not in r for r in steady)
    for side in ("base", "head"):
        cited = [r["raw"]["path"] for r in receipt["sides"][side]["probes"][0]["repeats"]]
        assert cited == [f"raw/{side}/probes/repeat_probe.repeat-{n}.json" for n in (2, 3)]
        assert all((out / rel).is_file() for rel in cited)
    assert cli("verify", str(out)).exit_code == 0
    # a rerun repeats as often as the published run did: unstable again, so the verdict agrees
    # (one run would read the random token as a mismatch: not-reproduced)
    rerun = json.loads(cli("verify", str(out), "--rerun", "--trust-bundle-code", "--json").stdout)
    step6 = next(s for s in rerun["steps"] if s["number"] == 6)
    assert step6["defects"] and not [d for d in step6["defects"] if "verdict" in d["detail"]], step6

    forged = tmp_path / "forged"
    shutil.copytree(out, forged)

    def claim_stable(doc):
        doc["sides"]["head"]["probes"][0]["repeats"] = doc["sides"]["head"]["probes"][0]["repeats"][:1]

    from tests import forge

    forge.edit_receipt(forged, claim_stable)
    refused = cli("verify", str(forged), "--json")
    assert refused.exit_code == 1
    assert "record-mismatch" in refused.stdout and "run(s)" in refused.stdout


def test_repeat_zero_is_bad_input(cli, tmp_path):
    result = cli("run", "fake-fix", "--repeat", "0", "--out", str(tmp_path / "none"))
    assert result.exit_code == 2 and "--repeat" in result.stderr
    assert not (tmp_path / "none").exists()


def test_missing_sha_is_exit_3_with_a_clear_message(cli, tmp_path):
    result = cli("run", "fake-fix", "--pins", "missing", "--out", str(tmp_path / "m"))
    assert result.exit_code == 3
    assert "0123456789abcdef0123456789abcdef01234567" in result.stderr
    assert not (tmp_path / "m").exists()


def _lines(stderr: str) -> list[str]:
    """Progress lines without their timings, and git's own words cut (they vary run to run);
    the preload's own progress lines (a run with a server has them) left out."""
    lines = (re.sub(r" \([0-9.]+s\)$", "", line).partition(": fatal:")[0] for line in stderr.splitlines())
    return sorted(line for line in lines if not line.startswith("· preload: "))


def test_a_fetch_failure_after_the_server_started_early_is_the_error_and_leaves_no_server(
    world, cli, tmp_path, monkeypatch
):
    import kvprobe.run.session as session_mod
    from kvprobe.checks.forkserver import ForkServer
    from kvprobe.env.venv import EnvManager, load_profile
    from tests.integration.test_forkserver import _groups_gone

    EnvManager(world["cache"]).ensure(load_profile("pytest-minimal"))  # warm: the server starts first
    started: list[ForkServer] = []

    class Recorded(ForkServer):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(session_mod, "ForkServer", Recorded)
    result = cli("run", "fake-fix", "--pins", "missing", "--out", str(tmp_path / "m"))
    assert result.exit_code == 3
    error = [line for line in result.stderr.splitlines() if line.startswith("kvprobe: error:")]
    assert len(error) == 1 and "0123456789abcdef0123456789abcdef01234567" in error[0], result.stderr
    assert len(started) == 1, "the fork server did not start before materializing"
    fresh = cli("run", "fake-fix", "--pins", "missing", "--out", str(tmp_path / "m"), "--no-preload")
    # what a run without a server says (sides in parallel: their lines in any order, timed)
    assert fresh.exit_code == 3 and _lines(fresh.stderr) == _lines(result.stderr)
    assert result.stderr.splitlines()[-1] == error[0]
    assert len(started) == 1
    assert _groups_gone([started[0].service.pid]), "the fork server outlived the failed run"


@pytest.mark.parametrize(
    "url",
    ["ext::sh -c touch% /tmp/kvprobe-pwned", "-uhttps://x", "http://example.org/x", "https://example.org/x\nmore"],
)
def test_bad_repo_url_is_exit_2_and_runs_no_git(cli, tmp_path, url, monkeypatch):
    import kvprobe.proc as proc

    calls = []
    real_run = proc.run
    monkeypatch.setattr(proc, "run", lambda argv, **kw: (calls.append(argv), real_run(argv, **kw))[1])
    result = cli("run", "fake-fix", "--repo", url, "--out", str(tmp_path / "u"))
    assert result.exit_code == 2
    assert not [argv for argv in calls if "git" in str(argv[0])]
    assert result.stderr.startswith("kvprobe: error:")


def test_out_dir_that_is_not_empty_is_refused(cli, tmp_path):
    out = tmp_path / "full"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    result = cli("run", "fake-fix", "--out", str(out))
    assert result.exit_code == 2 and "refusing to overwrite" in result.stderr
    assert (out / "keep.txt").read_text() == "user data"


def test_unknown_pin_set_and_experiment(cli):
    assert cli("run", "fake-fix", "--pins", "nope").exit_code == 2
    assert cli("run", "no-such-experiment").exit_code == 2
    assert cli("show", "fake-fix").exit_code == 0


def test_bad_sha_in_the_experiment_is_exit_2(world, cli, tmp_path, monkeypatch):
    folder = tmp_path / "probes" / "bad-sha"
    folder.mkdir(parents=True)
    text = experiment_toml(world["fake"]).replace('id = "fake-fix"', 'id = "bad-sha"')
    text = text.replace(world["fake"].head_sha, "main")
    (folder / "experiment.toml").write_text(text)
    (folder / "minikv_probe.py").write_text(PROBE)
    monkeypatch.setenv("KVPROBE_PROBES_PATH", str(tmp_path / "probes"))
    result = cli("run", "bad-sha")
    assert result.exit_code == 2 and "pins.commits.head.commit" in result.stderr


def test_repo_with_a_non_git_pin_set_is_refused(cli, tmp_path, monkeypatch):
    folder = tmp_path / "probes" / "synthetic-only"
    folder.mkdir(parents=True)
    (folder / "minikv_probe.py").write_text(PROBE)
    (folder / "experiment.toml").write_text("""
schema = "kvprobe.experiment/1"
id = "synthetic-only"
title = "t"
layer = "synthetic-model"
profile = "none"
[fix]
summary = "s"
[pins.model]
kind = "synthetic"
[pins.model.base]
switches = {}
[pins.model.head]
switches = {}
[checks]
probes = [{ path = "minikv_probe.py" }]
[scope]
shows = "s"
does_not_show = ["x"]
""")
    monkeypatch.setenv("KVPROBE_PROBES_PATH", str(tmp_path / "probes"))
    result = cli("run", "synthetic-only", "--repo", str(tmp_path))
    assert result.exit_code == 2 and "--repo applies to git pin sets" in result.stderr
    assert cli("run", "synthetic-only", "--repo", "ext::sh -c id").exit_code == 2


def test_a_bundle_that_fails_its_own_verification_is_not_published(cli, tmp_path, monkeypatch):
    import kvprobe.run.runner as runner_mod

    real = runner_mod._receipt

    def lying_receipt(*args):  # a verdict the raw outputs do not support
        receipt = real(*args)
        lie = Verdict.NOT_REPRODUCED
        return replace(receipt, verdict=lie, comparison=replace(receipt.comparison, verdict=lie))

    monkeypatch.setattr(runner_mod, "_receipt", lying_receipt)
    out = tmp_path / "never"
    result = cli("run", "fake-fix", "--out", str(out))
    assert result.exit_code == 3
    assert "failed its own verification" in result.stderr
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_pytest_files_forked_from_the_server_give_the_results_fresh_ones_give(cli, tmp_path):
    runs = {}
    for flags in ((), ("--no-preload",)):
        out = tmp_path / ("fresh" if flags else "forked")
        result = cli("run", "fake-fix", "--out", str(out), "--json", *flags)
        assert result.exit_code == 0, result.output
        receipt = json.loads((out / "receipt.json").read_text())
        modes = {(c["check"], c["mode"]) for c in receipt["execution"]["checks"]}
        assert modes == (
            {("test", "fresh"), ("probe", "fresh")} if flags else {("test", "forked"), ("probe", "forked")}
        )
        runs[out.name] = (json.loads(result.stdout)["tests"], receipt["comparison"])
    assert runs["forked"] == runs["fresh"]
    assert runs["forked"][0]  # there were tests to compare


def test_a_kept_server_serves_the_next_run_with_the_results_fresh_interpreters_give(cli, tmp_path, monkeypatch):
    """--keep-server: the first run starts the server and leaves it up, the second forks from
    it (the receipt says so), and both observe what --no-preload observes."""
    from kvprobe.checks.keptserver import kept_servers, stop_kept_servers

    runtime = tempfile.mkdtemp(prefix="kvrt-")  # short: a socket path has 107 bytes
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
    try:
        runs = {}
        for name, flags in (
            ("first", ("--keep-server",)),
            ("second", ("--keep-server",)),
            ("fresh", ("--no-preload",)),
        ):
            out = tmp_path / name
            result = cli("run", "fake-fix", "--out", str(out), "--json", *flags)
            assert result.exit_code == 0, result.output
            runs[name] = (json.loads((out / "receipt.json").read_text()), json.loads(result.stdout)["tests"])
        (server,) = kept_servers()  # still up after both runs, one for both
        first, second = (runs[n][0]["execution"] for n in ("first", "second"))
        assert first["server"]["reused"] is False and second["server"]["reused"] is True
        assert first["server"]["started_utc"] == second["server"]["started_utc"] == server.started_utc
        assert {c["mode"] for c in first["checks"] + second["checks"]} == {"forked"}
        assert "server" not in runs["fresh"][0]["execution"]
        assert server.served == len(first["checks"]) + len(second["checks"]) and server.attached == 0
        for name in ("first", "second"):
            assert runs[name][1] == runs["fresh"][1] and runs[name][1]
            assert runs[name][0]["comparison"] == runs["fresh"][0]["comparison"]
        assert cli("run", "fake-fix", "--keep-server", "--no-preload").exit_code == 2
        assert cli("run", "fake-fix", "--server-idle", "60").exit_code == 2
    finally:
        stop_kept_servers()
        shutil.rmtree(runtime, ignore_errors=True)


def test_the_profile_names_what_the_fork_server_preloads(world, cli, tmp_path):
    """A profile's ``preload`` is what the server imports and the receipt records; the
    observations are those of fresh interpreters."""
    shipped = builtin_probes_dir() / "profiles"
    profiles = world["probes"] / "profiles"
    profiles.mkdir(exist_ok=True)
    (profiles / "pytest-minimal.txt").write_bytes((shipped / "pytest-minimal.txt").read_bytes())
    toml = (shipped / "pytest-minimal.toml").read_text().replace('name = "pytest-minimal"', 'name = "pytest-preload"')
    (profiles / "pytest-preload.toml").write_text(
        toml.replace("[env]", 'preload = ["pytest", "decimal", "absent_x"]\n[env]')
    )
    folder = world["probes"] / "fake-preload"
    folder.mkdir()
    source = world["probes"] / "fake-fix"
    (folder / "minikv_probe.py").write_bytes((source / "minikv_probe.py").read_bytes())
    (folder / "experiment.toml").write_text(
        (source / "experiment.toml")
        .read_text()
        .replace('id = "fake-fix"', 'id = "fake-preload"')
        .replace('profile = "pytest-minimal"', 'profile = "pytest-preload"')
    )
    runs = {}
    for flags in ((), ("--no-preload",)):
        out = tmp_path / ("fresh" if flags else "forked")
        result = cli("run", "fake-preload", "--out", str(out), *flags)
        assert result.exit_code == 0, result.output
        receipt = json.loads((out / "receipt.json").read_text())
        runs[out.name] = receipt
    preloaded = runs["forked"]["execution"]["preloaded"]
    assert set(preloaded) == {"pytest", "decimal"} and preloaded["pytest"] == "9.2.0"  # absent: skipped
    assert runs["fresh"]["execution"]["preloaded"] == {}
    assert runs["forked"]["comparison"] == runs["fresh"]["comparison"]

"""`kvprobe run A B`: several experiments in one invocation, one env and one fork server."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_run_fake_upstream import cli, world  # noqa: F401 (fixtures)

pytestmark = pytest.mark.network  # the pytest-minimal env is built from its hash-pinned lock


def test_two_experiments_share_one_fork_server_and_write_two_verifying_bundles(cli, tmp_path, monkeypatch):  # noqa: F811
    import kvprobe.run.session as session_mod
    from kvprobe.checks.forkserver import ForkServer

    started: list[ForkServer] = []

    class Recorded(ForkServer):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(session_mod, "ForkServer", Recorded)
    out = tmp_path / "several"
    result = cli("run", "fake-fix", "fake-drift", "--out", str(out), "--json")
    document = json.loads(result.stdout)
    # the worst of reproduced (0) and could-not-observe (3)
    assert (result.exit_code, document["exit"]) == (3, 3), result.stderr
    assert [(r["experiment"], r["verdict"], r["exit"]) for r in document["runs"]] == [
        ("fake-fix", "reproduced", 0),
        ("fake-drift", "could-not-observe", 3),
    ]
    assert len(started) == 1, "each experiment started its own fork server"
    shared = []
    for run, name in zip(document["runs"], ("fake-fix", "fake-drift"), strict=True):
        assert run["bundle"] == str((out / name).resolve())
        receipt = json.loads((out / name / "receipt.json").read_text())
        assert {c["mode"] for c in receipt["execution"]["checks"]} == {"forked"}
        shared.append(receipt["execution"]["shared"])
        verified = cli("verify", str(out / name), "--expect-manifest-sha256", run["manifest_sha256"])
        assert verified.exit_code == 0, verified.stdout
    assert shared[0] == shared[1]
    assert shared[0]["experiments"] == ["fake-fix", "fake-drift"]
    assert started[0].service.pid and not started[0].running(), "the shared server outlived the invocation"


def test_several_print_one_verdict_block_each_in_order(cli, tmp_path):  # noqa: F811
    out = tmp_path / "human"
    result = cli("run", "fake-drift", "fake-fix", "--out", str(out))
    assert result.exit_code == 3
    lines = result.stdout.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("experiment: ")]
    assert [lines[i] for i in heads] == ["experiment: fake-drift", "experiment: fake-fix"]
    digests = [line for line in lines if line.startswith("manifest sha256: ")]
    bundles = [line for line in lines if line.startswith("bundle: ")]
    assert len(digests) == 2 and bundles == [f"bundle: {(out / n).resolve()}" for n in ("fake-drift", "fake-fix")]
    assert heads[1] > lines.index(bundles[0])  # the first block is whole before the second starts
    progress = result.stderr
    assert progress.index("experiment fake-drift (1/2)") < progress.index("experiment fake-fix (2/2)")


def test_an_experiment_that_fails_is_its_error_and_the_next_still_runs(world, cli, tmp_path, monkeypatch):  # noqa: F811
    from tests.integration.test_run_fake_upstream import PROBE, experiment_toml

    folder = tmp_path / "probes" / "fake-missing"
    folder.mkdir(parents=True)
    text = experiment_toml(world["fake"]).replace('id = "fake-fix"', 'id = "fake-missing"')
    missing = "0123456789abcdef0123456789abcdef01234567"
    (folder / "experiment.toml").write_text(text.replace(world["fake"].head_sha, missing, 1))
    (folder / "minikv_probe.py").write_text(PROBE)
    monkeypatch.setenv("KVPROBE_PROBES_PATH", f"{tmp_path / 'probes'}:{world['probes']}")
    out = tmp_path / "partial"
    result = cli("run", "fake-missing", "fake-fix", "--out", str(out), "--json")
    runs = json.loads(result.stdout)["runs"]
    assert result.exit_code == 3  # could not observe (the fetch) over reproduced
    assert runs[0]["experiment"] == "fake-missing" and runs[0]["exit"] == 3 and missing in runs[0]["error"]
    assert (runs[1]["experiment"], runs[1]["verdict"]) == ("fake-fix", "reproduced")
    assert sorted(p.name for p in out.iterdir()) == ["fake-fix"]
    assert "kvprobe: error: fake-missing: " in result.stderr


def test_a_bundle_that_exists_refuses_the_whole_invocation_before_anything_runs(cli, tmp_path):  # noqa: F811
    out = tmp_path / "taken"
    (out / "fake-drift").mkdir(parents=True)
    (out / "fake-drift" / "keep.txt").write_text("user data")
    result = cli("run", "fake-fix", "fake-drift", "--out", str(out))
    assert result.exit_code == 2 and "refusing to overwrite" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["fake-drift"], "fake-fix ran before the refusal"


@pytest.mark.parametrize(
    "args, says",
    [
        (["fake-fix", "fake-drift", "--pins", "commits"], "--pins applies to one experiment"),
        (["fake-fix", "fake-drift", "--repo", "/tmp"], "--repo applies to one experiment"),
        (["fake-fix", "fake-drift", "--record-expectations"], "--record-expectations applies to one experiment"),
        (["--all", "--pins", "commits"], "--pins applies to one experiment"),
        (["fake-fix", "fake-fix"], "named twice"),
        (["--all", "fake-fix"], "not both"),
        ([], "give an experiment id"),
        (["fake-fix", "no-such-experiment"], "no-such-experiment"),
    ],
)
def test_usage_errors_with_several_are_exit_2_and_run_nothing(cli, tmp_path, args, says):  # noqa: F811
    out = tmp_path / "none"
    result = cli("run", *args, "--out", str(out))
    assert result.exit_code == 2, result.stderr
    assert says in result.stderr
    assert not out.exists()


def test_the_env_stays_leased_between_experiments_while_the_shared_server_lives(world, cli, tmp_path):  # noqa: F811
    """`cache prune --all` between two experiments must not take the env the server forks from."""
    from kvprobe.experiments import experiment
    from kvprobe.run.runner import RunOptions, run_experiments

    planned = [
        (experiment.load(name), RunOptions(out=tmp_path / name, cache_root=world["cache"]))
        for name in ("fake-fix", "fake-drift")
    ]
    ran = run_experiments(planned)
    try:
        exp, first = next(ran)
        assert exp.id == "fake-fix" and not isinstance(first, Exception)
        pruned = json.loads(cli("cache", "prune", "--all", "--dry-run", "--json").stdout)
        env = [o for o in pruned["outcomes"] if o["kind"] == "env" and first.receipt.env.key in o["key"]]
        assert env and env[0]["action"] == "skipped", env
    finally:
        ran.close()
    pruned = json.loads(cli("cache", "prune", "--all", "--dry-run", "--json").stdout)
    env = [o for o in pruned["outcomes"] if o["kind"] == "env" and first.receipt.env.key in o["key"]]
    assert env and env[0]["action"] != "skipped", "the invocation's lease outlived it"


def test_several_with_keep_server_attach_once_and_leave_the_server_up(cli, tmp_path, monkeypatch):  # noqa: F811
    """--keep-server: the invocation starts (or finds) one kept server, every experiment forks
    from it, and it stays up after the invocation as after a single run."""
    import shutil
    import tempfile

    from kvprobe.checks.keptserver import kept_servers, stop_kept_servers

    runtime = tempfile.mkdtemp(prefix="kvrt-")  # short: a socket path has 107 bytes
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
    try:
        out = tmp_path / "kept"
        result = cli("run", "fake-fix", "fake-drift", "--keep-server", "--out", str(out), "--json")
        assert result.exit_code == 3, result.stderr
        executions = [
            json.loads((out / n / "receipt.json").read_text())["execution"] for n in ("fake-fix", "fake-drift")
        ]
        (server,) = kept_servers()
        assert [e["server"]["started_utc"] for e in executions] == [server.started_utc] * 2
        assert executions[0]["shared"] == executions[1]["shared"]
        assert server.served == sum(len(e["checks"]) for e in executions) and server.attached == 0
    finally:
        stop_kept_servers()
        shutil.rmtree(runtime, ignore_errors=True)

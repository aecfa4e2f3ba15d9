"""Every failure has an honest exit code, and bad input runs nothing (issue #11).

Profiles are found on the experiment search path (KVPROBE_PROBES_PATH, then ./probes, then
the built-ins) as ``profiles/NAME.toml``. Each profile attack uses an experiment of its own
whose git pins point at a small local repository built here: bad input must be refused
(exit 2, one line) before anything runs, so the kvprobe cache must stay empty (no git
fetch), no env is built, no probe runs and no ./bundles/ appears.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.attacks.gatelogs import RAISED, startup_log
from tests.attacks.harness import assert_outcome, line_naming, payload

pytestmark = pytest.mark.attack

GOOD_LOCK = "pytest==9.2.0 \\\n    --hash=sha256:07acdcf88ec174f907dc01af70bf52d49b014bbab03faeeade31c96b18c2e588\n"


def _git(repo, *args: str) -> str:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(repo),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "up",
        "GIT_AUTHOR_EMAIL": "up@example.invalid",
        "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
        "GIT_COMMITTER_NAME": "up",
        "GIT_COMMITTER_EMAIL": "up@example.invalid",
        "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], env=env, check=True, capture_output=True, text=True, timeout=30
    ).stdout.strip()


@pytest.fixture
def profiled(sandbox):
    """An experiment `hostile-exp` on KVPROBE_PROBES_PATH (git pins on a local two-commit
    repository, an armed probe) using profile `hostile`; returns (profiles dir, env)."""
    repo = sandbox.inputs / "upstream"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    shas = []
    for value in ("1", "2"):
        (repo / "m.py").write_text(f"X = {value}\n")
        _git(repo, "add", "m.py")
        _git(repo, "commit", "-qm", f"commit {value}")
        shas.append(_git(repo, "rev-parse", "HEAD"))
    root = sandbox.inputs / "experiments"
    exp = root / "hostile-exp"
    exp.mkdir(parents=True)
    (exp / "experiment.toml").write_text(f'''schema = "kvprobe.experiment/1"
id = "hostile-exp"
title = "An experiment whose dependency profile is hostile"
layer = "diff-probe"
upstream = "{repo.as_uri()}"
profile = "hostile"
default_pins = "commits"

[fix]
prs = [1]
summary = "m.py changes X."

[pins.commits]
kind = "git"
[pins.commits.base]
commit = "{shas[0]}"
[pins.commits.head]
commit = "{shas[1]}"

[checks]
probes = [{{ path = "p.py" }}]

[scope]
shows = "nothing"
does_not_show = ["anything"]
''')
    (exp / "p.py").write_bytes(b"import sys\n" + payload(sandbox.marker))
    (root / "profiles").mkdir()
    return root / "profiles", {"KVPROBE_PROBES_PATH": str(root)}


def run_hostile(sandbox, env):
    return sandbox.run("run", "hostile-exp", env=env, timeout=60)


def test_profile_without_a_lock_key(sandbox, profiled):
    profiles, env = profiled
    (profiles / "hostile.toml").write_text('name = "hostile"\npython = "3"\n')
    assert_outcome(sandbox, run_hostile(sandbox, env), 2, "hostile.toml", "lock")


def test_profile_that_is_not_toml(sandbox, profiled):
    profiles, env = profiled
    (profiles / "hostile.toml").write_text('name = "hostile"\nlock = "hostile.txt\n')
    assert_outcome(sandbox, run_hostile(sandbox, env), 2, "hostile.toml", "toml")


def test_lock_outside_the_profile_folder(sandbox, profiled):
    """Attack: `lock = "../../secret.txt"`; today the file is read and pip echoes its first line."""
    profiles, env = profiled
    (sandbox.inputs / "secret.txt").write_text("root:x:0:0:SECRET-OUTSIDE-LINE:/root:/bin/sh\n")
    (profiles / "hostile.toml").write_text('name = "hostile"\npython = "3"\nlock = "../../secret.txt"\n')
    result = run_hostile(sandbox, env)
    assert_outcome(sandbox, result, 2, "hostile.toml", "lock")
    assert "SECRET-OUTSIDE-LINE" not in result.err + result.out


def test_lock_line_without_a_hash(sandbox, profiled):
    """Attack: a lock line with no --hash; today only pip catches it, after an env build (exit 3)."""
    profiles, env = profiled
    (profiles / "hostile.toml").write_text('name = "hostile"\npython = "3"\nlock = "hostile.txt"\n')
    (profiles / "hostile.txt").write_text(GOOD_LOCK + "iniconfig==2.3.1\n")
    assert_outcome(sandbox, run_hostile(sandbox, env), 2, "hostile.txt", ("hash", "iniconfig"))


def test_bad_input_leaves_no_bundles_directory(sandbox):
    """Attack (own): `run model --repo PATH` is bad input (exit 2) but leaves an empty ./bundles/."""
    result = sandbox.run("run", "model", "--repo", str(sandbox.inputs))
    assert_outcome(sandbox, result, 2, "--repo")


@pytest.mark.parametrize("command", ["run", "gates"])
def test_plain_http_torch_index_is_refused(sandbox, command):
    """Attack: `--torch-index http://...` (unpinned wheels over plain HTTP); today `run model`
    accepts it (and writes a bundle) and `gates` carries on."""
    index = "http://evil.example/simple"
    if command == "run":
        result = sandbox.run("run", "model", "--torch-index", index)
    else:
        log = sandbox.inputs / "prefill.log"
        log.write_text(startup_log("prefill", RAISED))
        result = sandbox.run("gates", "--log", f"prefill={log}", "--torch-index", index, "--out", sandbox.out)
    assert_outcome(sandbox, result, 2, ("torch-index", "torch_index"), "http")


def test_internal_errors_have_their_own_documented_exit_code(sandbox):
    """A crash must never exit 1 ("verdict does not hold"): --help documents its own code."""
    result = sandbox.run("--help")
    assert_outcome(sandbox, result, 0)
    assert line_naming(result.out, "internal"), result.out

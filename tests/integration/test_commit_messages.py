"""Commit subjects of 72 characters or fewer, the reasoning in the body after a blank line.

.githooks/commit-msg refuses such a message at commit time (README, "Run the tests": git config
core.hooksPath .githooks); this test holds every commit after BASE to the same rule, so a
clone without the hook is caught in CI. It reads the history with one ``git log`` (a test of
the repository, not of kvprobe: the unit tier's one process, with a timeout) and skips, saying
why, outside a git checkout, without git, or in a clone too shallow to hold BASE.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / ".githooks" / "commit-msg"
BASE = "81695ab"  # the last commit before the rule; older subjects are left as they are

_spec = importlib.util.spec_from_loader("commit_msg_hook", SourceFileLoader("commit_msg_hook", str(HOOK)))
assert _spec is not None and _spec.loader is not None
hook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hook)


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60)


def _messages_after_base() -> dict[str, str]:
    """{short sha: message} of every commit after BASE on HEAD, or a skip saying why there are none."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the history cannot be read")
    if _git("rev-parse", "--is-inside-work-tree").stdout.strip() != "true":
        pytest.skip(f"{ROOT} is not a git checkout (an unpacked sdist?): no history to check")
    if _git("cat-file", "-e", f"{BASE}^{{commit}}").returncode != 0:
        pytest.skip(f"commit {BASE} is not in this clone (shallow?): the commits after it are unknown")
    log = _git("log", "--format=%h%x00%B%x1e", f"{BASE}..HEAD")
    assert log.returncode == 0, log.stderr
    records = [r.strip("\n").split("\0", 1) for r in log.stdout.split("\x1e") if r.strip()]
    return {sha: message for sha, message in records}


def test_every_commit_after_the_base_has_a_short_subject_and_a_blank_line():
    found = {sha: hook.problems(message) for sha, message in _messages_after_base().items()}
    assert {sha: problems for sha, problems in found.items() if problems} == {}


@pytest.mark.parametrize(
    ("message", "problems"),
    [
        ("Short subject\n\nWhy, at length.\n", 0),
        ("x" * 72 + "\n", 0),
        ("# a comment git strips\n\nShort subject\n", 0),
        ("x" * 73 + "\n\nbody\n", 1),
        ("Short subject\nbody with no blank line\n", 1),
        ("y" * 140 + "\nand no blank line\n", 2),
    ],
)
def test_the_hook_counts_the_subject_and_wants_a_blank_line(message, problems):
    assert len(hook.problems(message)) == problems

"""A real git repository standing in for an upstream project with a security fix.

History (all commits with a fixed author, committer and date, so SHAs are the same on
every machine; git runs with no system/global config so user settings cannot leak in):

    early[0] -- early[1] -- early[2] -- base          <- refs/heads/main
                                          |\\
                                          | head      <- refs/pull/1/head only (the fix)
                                          \\
                                            nofix     <- refs/pull/2/head only (no fix)
                                          \\
                                            collect   <- refs/pull/3/head only (fix + a new
                                                         test module base cannot import)

``minikv/`` is a tiny KV block pool (import it with python path entry "."). At base, a
freed block keeps its data and a new owner can read it (the bug); head scrubs blocks on
free and adds ``BlockPool.scrub``. ``tests/test_minikv.py`` at head and at nofix is the
same file; at base it is an older version that passes on base. Per-test expectations for
head's test file are in :data:`EXPECTED_TESTS`. PR 3 adds ``minikv.pool.scrub_all`` and
``tests/test_scrub_all.py``, which imports it: at base that module cannot be collected
(``ImportError``), at PR 3's head its 3 tests (one with 3 subtests) pass.

The tree also carries an executable script and a symlink so exports are checked for
modes and links.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from kvprobe import proc

AUTHOR = ("Fake Upstream", "fake-upstream@example.invalid")
TEST_PATH = "tests/test_minikv.py"
FIX_PR = 1
NOFIX_PR = 2
COLLECT_PR = 3
COLLECT_TEST_PATH = "tests/test_scrub_all.py"

# Head's test file, per test: outcome on base and on head, and how base fails.
EXPECTED_TESTS: dict[str, dict[str, str | None]] = {
    "tests/test_minikv.py::test_scrub_clears_block": {
        "base": "failed",
        "head": "passed",
        "kind": "exception",
        "exc_type": "AttributeError",
    },
    "tests/test_minikv.py::test_freed_block_is_zeroed_for_next_owner": {
        "base": "failed",
        "head": "passed",
        "kind": "assertion",
        "exc_type": "AssertionError",
    },
    "tests/test_minikv.py::test_alloc_write_read_roundtrip": {
        "base": "passed",
        "head": "passed",
        "kind": None,
        "exc_type": None,
    },
    "tests/test_minikv.py::FreeClearsEverySlot::test_every_slot": {
        "base": "failed",
        "head": "passed",
        "kind": "assertion",
        "exc_type": "AssertionError",
    },
}
# Subtests of FreeClearsEverySlot.test_every_slot: slot -> fails on base?
EXPECTED_SUBTESTS_FAIL_ON_BASE = {0: True, 1: False, 2: True, 3: False}


@dataclass(frozen=True)
class FakeUpstream:
    """Where the fake upstream lives and the commits an experiment pins."""

    path: Path
    base_sha: str
    head_sha: str
    nofix_sha: str
    collect_sha: str
    early_shas: tuple[str, ...]
    test_path: str = TEST_PATH
    fix_pr: int = FIX_PR
    nofix_pr: int = NOFIX_PR
    package: str = "minikv"
    python_path: tuple[str, ...] = (".",)
    expected_tests: dict = field(default_factory=lambda: dict(EXPECTED_TESTS))

    @property
    def url(self) -> str:
        return self.path.as_uri()

    def git(self, *args: str) -> str:
        """Run git in the fake upstream (fixed identity and dates); return stdout."""
        return _git(self.path, *args)

    def move_pr_head(self, pr: int, message: str = "follow-up commit") -> str:
        """Add a commit on top of refs/pull/<pr>/head and move the ref (a PR that moved)."""
        ref = f"refs/pull/{pr}/head"
        old = self.git("rev-parse", ref)
        new = self.git("commit-tree", f"{old}^{{tree}}", "-p", old, "-m", message)
        self.git("update-ref", ref, new, old)
        return new


def build_fake_upstream(root: Path) -> FakeUpstream:
    """Create the fake upstream repository in ``root / "upstream"`` and describe it."""
    repo = Path(root) / "upstream"
    repo.mkdir(parents=True)
    _git(repo, "init", "--quiet", "--template=", "-b", "main", ".")
    early = []
    for files, message in _EARLY_COMMITS:
        early.append(_commit(repo, files, message))
    base = _commit(repo, _BASE_FILES, "minikv: reuse freed blocks")
    head = _pr_commit(repo, base, FIX_PR, _HEAD_FILES, "minikv: scrub blocks on free (fix)")
    nofix = _pr_commit(repo, base, NOFIX_PR, _NOFIX_FILES, "minikv: add scrub tests only")
    collect = _pr_commit(repo, base, COLLECT_PR, _COLLECT_FILES, "minikv: scrub_all, tested in a new module")
    return FakeUpstream(
        path=repo, base_sha=base, head_sha=head, nofix_sha=nofix, collect_sha=collect, early_shas=tuple(early)
    )


def package_files(side: str) -> dict[str, str]:
    """minikv's files at base or head: the code a release wheel of that side would carry."""
    return {"minikv/__init__.py": _INIT, "minikv/pool.py": _POOL_BASE if side == "base" else _POOL_HEAD}


# --------------------------------------------------------------------------- git plumbing


def _env() -> dict[str, str]:
    """Isolated git: no user/system config, fixed identity; dates set per commit."""
    return proc.clean_env(
        {
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_AUTHOR_NAME": AUTHOR[0],
            "GIT_AUTHOR_EMAIL": AUTHOR[1],
            "GIT_COMMITTER_NAME": AUTHOR[0],
            "GIT_COMMITTER_EMAIL": AUTHOR[1],
            "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+0000",
            "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+0000",
            "TZ": "UTC",
        }
    )


def _git(repo: Path, *args: str, date: str | None = None) -> str:
    env = _env()
    if date:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = date
    result = proc.capture(["git", "-c", "core.hooksPath=/dev/null", *args], timeout_s=60, env=env, cwd=repo)
    if not result.ok:
        raise RuntimeError(f"git {' '.join(args)} failed in {repo}: {result.stderr.strip()}")
    return result.stdout.strip()


def _write(repo: Path, files: dict[str, str | tuple[str, str] | None]) -> None:
    """Write files; a ("symlink", target) value makes a link, ("exec", text) mode 755."""
    for rel, spec in files.items():
        path = repo / rel
        if spec is None:
            path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink() or path.exists():
            path.unlink()
        if isinstance(spec, tuple) and spec[0] == "symlink":
            os.symlink(spec[1], path)
        elif isinstance(spec, tuple) and spec[0] == "exec":
            path.write_text(spec[1], encoding="utf-8")
            path.chmod(0o755)
        else:
            path.write_text(spec, encoding="utf-8")
            path.chmod(0o644)


def _commit(repo: Path, files: dict, message: str) -> str:
    """Commit ``files`` on the checked-out branch with the next fixed date."""
    _write(repo, files)
    date = _DATES[message]
    _git(repo, "add", "-A")
    _git(repo, "commit", "--quiet", "--no-verify", "-m", message, date=date)
    return _git(repo, "rev-parse", "HEAD")


def _pr_commit(repo: Path, base: str, pr: int, files: dict, message: str) -> str:
    """Commit on a throwaway branch, keep it only as refs/pull/<pr>/head."""
    branch = f"pr-{pr}"
    _git(repo, "checkout", "--quiet", "-b", branch, base)
    sha = _commit(repo, files, message)
    _git(repo, "update-ref", f"refs/pull/{pr}/head", sha)
    _git(repo, "checkout", "--quiet", "main")
    _git(repo, "branch", "--quiet", "-D", branch)
    return sha


# --------------------------------------------------------------------------- contents

_README = "# minikv\n\nA tiny KV block pool, the fake upstream of kvprobe's tests.\n"
_LICENSE = "Do what you like with this fake upstream.\n"
_CHECK_SH = "#!/bin/sh\nexec python -m pytest -q tests\n"

_POOL_V1 = '''"""A fixed pool of KV blocks handed out to owners."""


class BlockPool:
    def __init__(self, num_blocks, block_size=4):
        self.block_size = block_size
        self._data = [[0] * block_size for _ in range(num_blocks)]
        self._free = list(range(num_blocks))
        self._owner = {}

    def alloc(self, owner):
        idx = self._free.pop(0)
        self._owner[idx] = owner
        return idx

    def write(self, idx, owner, values):
        if self._owner.get(idx) != owner:
            raise PermissionError(f"block {idx} is not owned by {owner!r}")
        self._data[idx][: len(values)] = list(values)

    def read(self, idx, owner):
        if self._owner.get(idx) != owner:
            raise PermissionError(f"block {idx} is not owned by {owner!r}")
        return list(self._data[idx])

    def free(self, idx):
        del self._owner[idx]
        self._free.append(idx)
'''

# base: freed blocks are handed out first (LIFO) for cache locality, and keep their data.
_POOL_BASE = _POOL_V1.replace(
    "        idx = self._free.pop(0)\n",
    "        # most recently freed first: its lines are still warm\n        idx = self._free.pop()\n",
)

_POOL_HEAD = _POOL_BASE.replace(
    "    def free(self, idx):\n        del self._owner[idx]\n        self._free.append(idx)\n",
    "    def scrub(self, idx):\n"
    '        """Zero a block so the next owner cannot read the previous owner\'s data."""\n'
    "        self._data[idx] = [0] * self.block_size\n"
    "\n"
    "    def free(self, idx):\n"
    "        del self._owner[idx]\n"
    "        self.scrub(idx)\n"
    "        self._free.append(idx)\n",
)
assert _POOL_HEAD != _POOL_BASE

_POOL_NOFIX = _POOL_BASE.replace(
    "    def free(self, idx):\n",
    "    def free(self, idx):\n        # TODO: scrub the block (see the new tests)\n",
)

_INIT = '"""minikv: a tiny KV block pool."""\n\nfrom minikv.pool import BlockPool\n\n__all__ = ["BlockPool"]\n'

_TESTS_BASE = """from minikv import BlockPool


def test_alloc_write_read_roundtrip():
    pool = BlockPool(2)
    idx = pool.alloc("a")
    pool.write(idx, "a", [1, 2, 3, 4])
    assert pool.read(idx, "a") == [1, 2, 3, 4]
"""

_TESTS_HEAD = """import unittest

from minikv import BlockPool


def test_alloc_write_read_roundtrip():
    pool = BlockPool(2)
    idx = pool.alloc("a")
    pool.write(idx, "a", [1, 2, 3, 4])
    assert pool.read(idx, "a") == [1, 2, 3, 4]


def test_scrub_clears_block():
    pool = BlockPool(1)
    idx = pool.alloc("a")
    pool.write(idx, "a", [5, 6, 7, 8])
    pool.scrub(idx)
    assert pool.read(idx, "a") == [0, 0, 0, 0]


def test_freed_block_is_zeroed_for_next_owner():
    pool = BlockPool(2)
    idx = pool.alloc("victim")
    pool.write(idx, "victim", [11, 12, 13, 14])
    pool.free(idx)
    reused = pool.alloc("attacker")
    assert reused == idx
    assert pool.read(reused, "attacker") == [0, 0, 0, 0]


class FreeClearsEverySlot(unittest.TestCase):
    def test_every_slot(self):
        pool = BlockPool(1)
        idx = pool.alloc("victim")
        pool.write(idx, "victim", [7, 0, 9, 0])
        pool.free(idx)
        idx = pool.alloc("attacker")
        data = pool.read(idx, "attacker")
        for slot in range(pool.block_size):
            with self.subTest(slot=slot):
                self.assertEqual(data[slot], 0)
"""

_POOL_COLLECT = (
    _POOL_HEAD
    + '''

def scrub_all(pool):
    """Zero every block of ``pool``."""
    for idx in range(len(pool._data)):
        pool.scrub(idx)
'''
)

_TESTS_COLLECT = """import unittest

from minikv import BlockPool
from minikv.pool import scrub_all


def test_scrub_all_zeroes_written_blocks():
    pool = BlockPool(2)
    for owner in ("a", "b"):
        idx = pool.alloc(owner)
        pool.write(idx, owner, [1, 2, 3, 4])
    scrub_all(pool)
    assert pool.read(0, "b") == [0, 0, 0, 0] or pool.read(1, "b") == [0, 0, 0, 0]


def test_scrub_all_on_an_empty_pool():
    scrub_all(BlockPool(0))


class ScrubAllEveryBlock(unittest.TestCase):
    def test_every_block(self):
        pool = BlockPool(3)
        scrub_all(pool)
        for idx in range(3):
            with self.subTest(block=idx):
                self.assertEqual(pool._data[idx], [0, 0, 0, 0])
"""

_EARLY_COMMITS: list[tuple[dict, str]] = [
    ({"README.md": _README, "LICENSE": _LICENSE, "COPYING": ("symlink", "LICENSE")}, "initial commit"),
    ({"minikv/__init__.py": _INIT, "minikv/pool.py": _POOL_V1}, "minikv: block pool"),
    ({"tests/test_minikv.py": _TESTS_BASE, "scripts/check.sh": ("exec", _CHECK_SH)}, "tests: roundtrip"),
]
_BASE_FILES = {"minikv/pool.py": _POOL_BASE}
_HEAD_FILES = {"minikv/pool.py": _POOL_HEAD, "tests/test_minikv.py": _TESTS_HEAD}
_NOFIX_FILES = {"minikv/pool.py": _POOL_NOFIX, "tests/test_minikv.py": _TESTS_HEAD}
_COLLECT_FILES = {"minikv/pool.py": _POOL_COLLECT, COLLECT_TEST_PATH: _TESTS_COLLECT}

_COMMIT_ORDER = [m for _f, m in _EARLY_COMMITS] + [
    "minikv: reuse freed blocks",
    "minikv: scrub blocks on free (fix)",
    "minikv: add scrub tests only",
    "minikv: scrub_all, tested in a new module",
]
_DATES = {message: f"2024-01-{day:02d}T12:00:00+0000" for day, message in enumerate(_COMMIT_ORDER, start=1)}


def git_pins(name: str, base: str, head: str, pr: int | None = None) -> str:
    """An experiment.toml pin set of two commits (TOML text), as the tests' experiments declare them."""
    pr_line = "" if pr is None else f"pr = {pr}\n"
    sides = f'[pins.{name}.base]\ncommit = "{base}"\n[pins.{name}.head]\ncommit = "{head}"\n'
    return f'[pins.{name}]\nkind = "git"\n{pr_line}{sides}'

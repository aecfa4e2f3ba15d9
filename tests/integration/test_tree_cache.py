"""The verified tree cache: built once, frozen, re-checked, rebuilt when damaged.

Real processes for concurrency and kill -9, real compileall for bytecode.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from kvprobe.env import cache
from kvprobe.sources import treecache
from kvprobe.sources.treecache import MARKER, TreeCache
from tests.forge import tamper_file

REPO = Path(__file__).resolve().parents[2]


def fill(tree: Path) -> None:
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    (tree / "pkg" / "data.txt").write_text("data\n")


def test_built_once_frozen_listed_and_reused(tmp_path):
    trees = TreeCache(tmp_path)
    tree, how = trees.ensure("k", fill)
    again, how_again = trees.ensure("k", lambda t: pytest.fail("a complete entry must not be rebuilt"))
    assert (how, how_again) == ("built", "cache") and tree == again
    listing = json.loads((tree.parent / MARKER).read_text())["files"]
    assert set(listing) == {"pkg/__init__.py", "pkg/data.txt"} and len(listing["pkg/data.txt"]["sha256"]) == 64
    assert not os.stat(tree / "pkg" / "data.txt").st_mode & 0o222 and not os.stat(tree / "pkg").st_mode & 0o222
    assert treecache.verify(tree.parent) == []


def test_a_runs_copy_is_linked_and_what_the_run_adds_stays_out(tmp_path):
    tree, _ = TreeCache(tmp_path / "c").ensure("k", fill)
    copy = tmp_path / "copy"
    treecache.link_copy(tree, copy)
    (copy / "pkg" / "new_test.py").write_text("x = 1\n")
    assert os.stat(copy / "pkg" / "data.txt").st_ino == os.stat(tree / "pkg" / "data.txt").st_ino
    assert not (tree / "pkg" / "new_test.py").exists() and treecache.quick_problems(tree.parent) == []


def test_tampered_file_is_detected_and_the_entry_rebuilt(tmp_path):
    trees = TreeCache(tmp_path)
    tree, _ = trees.ensure("k", fill)
    tamper_file(tree / "pkg" / "__init__.py", b"VALUE = 666\n", keep_stat=False)
    assert treecache.quick_problems(tree.parent)
    tree, how = trees.ensure("k", fill)
    assert how == "built" and (tree / "pkg" / "__init__.py").read_text() == "VALUE = 1\n"


def test_tamper_that_keeps_size_and_mtime_is_found_by_cache_verify(tmp_path, monkeypatch):
    tree, _ = TreeCache(tmp_path).ensure("k", fill)
    tamper_file(tree / "pkg" / "data.txt", b"DATA\n", keep_stat=True)
    assert treecache.quick_problems(tree.parent) == []  # stat alone cannot see it ...
    assert [p.what for p in treecache.verify(tree.parent)] == ["sha256 differs from the listing"]  # ... hashing does
    monkeypatch.setenv("KVPROBE_CACHE_DIR", str(tmp_path))
    result = CliRunner().invoke(main, ["cache", "verify", "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout) == {
        "schema": "kvprobe.cli.cache-verify/1",
        "intact": False,
        "trees": {"k": ["pkg/data.txt: sha256 differs from the listing"]},
    }


def test_added_file_and_missing_marker_are_not_trusted(tmp_path):
    trees = TreeCache(tmp_path)
    tree, _ = trees.ensure("k", fill)
    os.chmod(tree / "pkg", 0o755)
    (tree / "pkg" / "evil.py").write_text("x = 1\n")
    assert [p.path for p in treecache.quick_problems(tree.parent)] == ["pkg/evil.py"]
    tree, how = trees.ensure("k", fill)
    assert how == "built" and not (tree / "pkg" / "evil.py").exists()
    (tree.parent / MARKER).unlink()  # a half-written entry: the tree without its listing
    assert trees.ensure("k", fill)[1] == "built"


_CHILD = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from kvprobe.sources.treecache import TreeCache

    root, log, mode = Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]

    def build(tree):
        with open(log, "a") as handle:
            handle.write(f"build {os.getpid()}\\n")
        (tree / "pkg").mkdir(parents=True)
        (tree / "pkg" / "a.py").write_text("A = 1\\n")
        if mode == "hang":
            (root / "started").write_text("1")
            time.sleep(60)
        time.sleep(0.5)
        (tree / "pkg" / "b.py").write_text("B = 2\\n")

    tree, how = TreeCache(root).ensure("k", build)
    print(how, tree)
    """
)


def _child(tmp_path: Path, mode: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(REPO), str(tmp_path / "cache"), str(tmp_path / "log"), mode],
        stdout=subprocess.PIPE,
        text=True,
    )


def test_concurrent_first_use_by_two_processes_builds_once(tmp_path):
    children = [_child(tmp_path, "normal") for _ in range(2)]
    outputs = sorted(c.communicate(timeout=120)[0].split()[0] for c in children)
    assert [c.returncode for c in children] == [0, 0]
    assert outputs == ["built", "cache"] and len((tmp_path / "log").read_text().splitlines()) == 1


def test_kill_9_mid_unpack_leaves_no_entry_taken_as_complete(tmp_path):
    child = _child(tmp_path, "hang")
    deadline = time.monotonic() + 60
    while not (tmp_path / "cache" / "started").exists():
        assert time.monotonic() < deadline and child.poll() is None
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    root = tmp_path / "cache"
    assert not (root / "trees" / "k").exists()
    leftovers = [e for e in cache.scan(root) if e.kind == "partial"]
    assert len(leftovers) == 1 and leftovers[0].key.startswith(".build-k-")
    tree, how = TreeCache(root).ensure("k", fill)  # the lock died with its holder
    assert how == "built" and treecache.verify(tree.parent) == []


def test_bytecode_is_compiled_once_with_checked_hashes(tmp_path):
    tree, _ = TreeCache(tmp_path).ensure("k", fill, python=sys.executable)
    pyc = tree / "pkg" / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc"
    flags = int.from_bytes(pyc.read_bytes()[4:8], "little")
    assert pyc.read_bytes()[:4] == importlib.util.MAGIC_NUMBER and flags == 0b11  # hash-based, checked
    assert "pkg/__pycache__/" + pyc.name in json.loads((tree.parent / MARKER).read_text())["files"]


def test_prune_removes_a_frozen_tree(tmp_path):
    TreeCache(tmp_path).ensure("k", fill)
    outcomes = cache.prune(tmp_path, everything=True)
    assert [(o.entry.kind, o.action) for o in outcomes] == [("tree", "deleted")]
    assert [p.name for p in (tmp_path / "trees").iterdir()] == ["k.lock"]  # no trash left behind


def test_a_tree_used_in_place_is_leased_until_the_run_ends(tmp_path):
    with contextlib.ExitStack() as held:
        tree, _ = TreeCache(tmp_path).ensure("k", fill, hold=held)
        treecache.place_shared(tree, tmp_path / "run" / "tree")
        assert (tmp_path / "run" / "tree" / "pkg" / "__init__.py").read_text() == "VALUE = 1\n"
        during = cache.prune(tmp_path, everything=True)
        assert [(o.entry.kind, o.action, o.reason) for o in during] == [
            ("tree", "skipped", "in use by a run in progress")
        ]
        assert [e.name for e in treecache.entries(tmp_path)] == ["k"]  # `cache verify` skips the lease folder
    assert [(o.entry.kind, o.action) for o in cache.prune(tmp_path, everything=True)] == [("tree", "deleted")]
    assert not (tmp_path / "trees" / "k.users").exists()

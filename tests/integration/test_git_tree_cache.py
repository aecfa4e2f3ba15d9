"""Git exports in the verified tree cache: keyed by tree id, reused, re-checked, rebuilt.

Real git repositories built here, real processes for concurrency and kill -9.
"""

from __future__ import annotations

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
from kvprobe.model.records import GitPin
from kvprobe.sources import treecache
from kvprobe.sources.git import GitSource
from tests.forge import tamper_file

REPO = Path(__file__).resolve().parents[2]
_GIT_ENV = {
    "PATH": os.environ["PATH"],
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+0000",
}


def git(repo: Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=repo, env=_GIT_ENV, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def make_repo(root: Path, modules: int = 3) -> tuple[Path, str]:
    """A repository with a package of ``modules`` modules, a data file and a symlink; its HEAD."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    pkg = root / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("VALUE = 1\n")
    for i in range(modules):
        (pkg / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n")
    (root / "README").write_text("readme\n")
    os.symlink("README", root / "COPYING")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "one")
    return root, git(root, "rev-parse", "HEAD")


def entry_of(cache_root: Path, identity: dict) -> Path:
    return cache_root / "trees" / f"git-{identity['tree']}-{identity['bytecode']}"


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    return make_repo(tmp_path / "upstream")


def test_an_export_is_built_once_per_tree_id_and_reused(repo, tmp_path: Path) -> None:
    path, sha = repo
    root = tmp_path / "cache"
    source = GitSource(str(path), root, timeout_s=60)
    first = source.materialize(GitPin(sha), tmp_path / "one")
    git(path, "commit", "-q", "--allow-empty", "-m", "same tree, another commit")
    other = git(path, "rev-parse", "HEAD")
    second = source.materialize(GitPin(other), tmp_path / "two")
    assert (first["tree_cache"], second["tree_cache"]) == ("built", "cache")
    assert first["tree"] == second["tree"] and (first["commit"], second["commit"]) == (sha, other)
    entry = entry_of(root, first)
    listing = json.loads((entry / treecache.MARKER).read_text())["files"]
    assert listing["COPYING"] == {"symlink": "README"} and len(listing["pkg/__init__.py"]["sha256"]) == 64
    assert not os.stat(entry / "tree" / "pkg" / "__init__.py").st_mode & 0o222
    # each run's copy: hard links to the frozen files, the symlink made anew, still the commit's tree
    for dest in (tmp_path / "one", tmp_path / "two"):
        assert os.stat(dest / "README").st_ino == os.stat(entry / "tree" / "README").st_ino
        assert os.readlink(dest / "COPYING") == "README"
    assert source.verify_export(other, tmp_path / "two") == first["tree"]
    assert treecache.verify(entry) == []


def test_bytecode_trees_are_kept_per_interpreter_tag(repo, tmp_path: Path) -> None:
    path, sha = repo
    source = GitSource(str(path), tmp_path / "cache", timeout_s=60)
    plain = source.materialize(GitPin(sha), tmp_path / "plain")
    compiled = source.materialize(GitPin(sha), tmp_path / "compiled", python=sys.executable)
    assert (plain["bytecode"], compiled["bytecode"]) == ("source", sys.implementation.cache_tag)
    assert compiled["tree_cache"] == "built" and compiled["tree"] == plain["tree"]
    assert (tmp_path / "compiled" / "pkg" / "__pycache__" / f"mod0.{sys.implementation.cache_tag}.pyc").is_file()
    assert not (tmp_path / "plain" / "pkg" / "__pycache__").exists()


def test_a_tampered_entry_is_detected_and_rebuilt(repo, tmp_path: Path) -> None:
    path, sha = repo
    root = tmp_path / "cache"
    source = GitSource(str(path), root, timeout_s=60)
    identity = source.materialize(GitPin(sha), tmp_path / "one")
    entry = entry_of(root, identity)
    tamper_file(entry / "tree" / "pkg" / "__init__.py", b"VALUE = 666\n", keep_stat=False)
    assert [p.path for p in treecache.quick_problems(entry)] == ["pkg/__init__.py"]
    again = source.materialize(GitPin(sha), tmp_path / "two")
    assert again["tree_cache"] == "built" and (tmp_path / "two" / "pkg" / "__init__.py").read_text() == "VALUE = 1\n"
    os.chmod(entry / "tree", 0o755)  # a symlink pointed elsewhere
    (entry / "tree" / "COPYING").unlink()
    os.symlink("/etc/passwd", entry / "tree" / "COPYING")
    assert [p.what for p in treecache.quick_problems(entry)] == ["symlink changed"]
    assert source.materialize(GitPin(sha), tmp_path / "three")["tree_cache"] == "built"
    assert os.readlink(tmp_path / "three" / "COPYING") == "README"


def test_a_tamper_keeping_size_and_mtime_is_found_by_cache_verify(repo, tmp_path: Path, monkeypatch) -> None:
    path, sha = repo
    root = tmp_path / "cache"
    identity = GitSource(str(path), root, timeout_s=60).materialize(GitPin(sha), tmp_path / "one")
    entry = entry_of(root, identity)
    tamper_file(entry / "tree" / "README", b"README\n", keep_stat=True)
    assert treecache.quick_problems(entry) == []
    monkeypatch.setenv("KVPROBE_CACHE_DIR", str(root))
    result = CliRunner().invoke(main, ["cache", "verify", "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["trees"] == {entry.name: ["README: sha256 differs from the listing"]}


_CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from kvprobe.model.records import GitPin
    from kvprobe.sources.git import GitSource

    url, root, sha, dest, compiled = sys.argv[2:7]
    source = GitSource(url, Path(root), timeout_s=120)
    identity = source.materialize(GitPin(sha), Path(dest), python=sys.executable if compiled == "1" else None)
    print(json.dumps(identity))
    """
)


def _child(path: Path, root: Path, sha: str, dest: Path, *, compiled: bool) -> subprocess.Popen:
    argv = [sys.executable, "-c", _CHILD, str(REPO), str(path), str(root), sha, str(dest), "1" if compiled else "0"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)


def test_concurrent_first_use_exports_once(repo, tmp_path: Path) -> None:
    path, sha = repo
    root = tmp_path / "cache"
    children = [_child(path, root, sha, tmp_path / f"dest{i}", compiled=True) for i in range(2)]
    identities = [json.loads(c.communicate(timeout=300)[0]) for c in children]
    assert [c.returncode for c in children] == [0, 0]
    assert sorted(i["tree_cache"] for i in identities) == ["built", "cache"]
    assert identities[0]["tree"] == identities[1]["tree"]
    assert [e.name for e in treecache.entries(root)] == [entry_of(root, identities[0]).name]
    assert treecache.verify(entry_of(root, identities[0])) == []


def test_kill_9_mid_export_leaves_nothing_taken_as_complete(tmp_path: Path) -> None:
    path, sha = make_repo(tmp_path / "big", modules=3000)  # export + compile take seconds
    root = tmp_path / "cache"
    child = _child(path, root, sha, tmp_path / "dest", compiled=True)
    deadline = time.monotonic() + 120
    while not any((root / "trees").glob(".build-git-*/tree/pkg")):
        assert time.monotonic() < deadline and child.poll() is None, "the export never started"
        time.sleep(0.01)
    os.killpg(child.pid, signal.SIGKILL)  # kvprobe and the git / compileall it runs
    child.wait(timeout=30)
    assert not [p for p in (root / "trees").glob("git-*") if p.is_dir()], "killed after the entry was complete"
    assert [e.kind for e in cache.scan(root) if e.path.parent.name == "trees"] == ["partial"]
    identity = GitSource(str(path), root, timeout_s=120).materialize(GitPin(sha), tmp_path / "again")
    assert identity["tree_cache"] == "built" and treecache.verify(entry_of(root, identity)) == []
    assert (tmp_path / "again" / "pkg" / "mod2999.py").is_file()

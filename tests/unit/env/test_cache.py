"""kvprobe.env.cache and `kvprobe cache`: fake cache trees, real file locks, no subprocesses."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from filelock import FileLock

from kvprobe.cli import main
from kvprobe.env import cache
from kvprobe.env.venv import uv_cache_lease
from kvprobe.errors import UsageError

NOW = time.time()
DAY = 86400.0
WHEEL_SHA = "ab" * 32


def _age(path: Path, days: float) -> None:
    stamp = NOW - days * DAY
    os.utime(path, (stamp, stamp))


def _git(root: Path, key: str = "a" * 24, days: float = 0) -> Path:
    store = root / "git" / key
    (store / "objects").mkdir(parents=True)
    (store / "objects" / "pack").write_bytes(b"x" * 1000)
    (store / "kvprobe-url").write_text("https://example.invalid/repo\n")
    for p in (store / "objects" / "pack", store / "objects", store / "kvprobe-url", store):
        _age(p, days)
    return store


def _wheel(root: Path, days: float = 0) -> Path:
    entry = root / "wheels" / WHEEL_SHA
    entry.mkdir(parents=True)
    (entry / "pkg-1.0-py3-none-any.whl").write_bytes(b"w" * 500)
    _age(entry / "pkg-1.0-py3-none-any.whl", days)
    _age(entry, days)
    return entry


def _env(root: Path, name: str = "prof-0123", days: float = 0, complete: bool = True) -> Path:
    env = root / "envs" / name
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_bytes(b"p" * 300)
    if complete:
        (env / cache.ENV_MARKER).write_text("{}")
        _age(env / cache.ENV_MARKER, days)
    _age(env, days)
    return env


def _uv(root: Path, days: float = 0) -> Path:
    """uv's cache as uv lays it out: buckets, an archive, a symlink from a wheel bucket into it."""
    uv = root / cache.UV_DIR
    (uv / "archive-v0" / "abc" / "pkg").mkdir(parents=True)
    (uv / "archive-v0" / "abc" / "pkg" / "__init__.py").write_bytes(b"u" * 700)
    (uv / "wheels-v5" / "pypi" / "pkg").mkdir(parents=True)
    (uv / "wheels-v5" / "pypi" / "pkg" / "pkg-1.0").symlink_to(uv / "archive-v0" / "abc")
    for path in (uv / "archive-v0", uv / "wheels-v5", uv):
        _age(path, days)
    return uv


def _partial(root: Path, name: str = ".build-prof-0123-xyz", hours: float = 0) -> Path:
    path = root / "envs" / name
    path.mkdir(parents=True)
    (path / "half").write_bytes(b"h" * 10)
    stamp = NOW - hours * 3600
    os.utime(path, (stamp, stamp))
    return path


def _outcomes(root: Path, **kwargs) -> dict[str, cache.Outcome]:
    return {o.entry.key: o for o in cache.prune(root, now=NOW, **kwargs)}


def test_scan_lists_kinds_sizes_and_labels(tmp_path):
    _git(tmp_path, days=3)
    _wheel(tmp_path, days=1)
    _env(tmp_path, days=2)
    (tmp_path / "envs" / "prof-0123.lock").touch()
    entries = {e.kind: e for e in cache.scan(tmp_path)}
    assert set(entries) == {"git", "wheel", "env"}  # lock files are not entries
    assert entries["git"].size == 1000 + len("https://example.invalid/repo\n")
    assert entries["git"].label == "https://example.invalid/repo"
    assert entries["wheel"].label == "pkg-1.0-py3-none-any.whl"
    assert entries["env"].size == 302
    assert entries["env"].last_used == pytest.approx(NOW - 2 * DAY, abs=1)
    assert entries["env"].lock == tmp_path / "envs" / "prof-0123.lock"


def test_absent_root_is_an_empty_cache(tmp_path):
    assert cache.scan(tmp_path / "nope") == []
    assert cache.prune(tmp_path / "nope", everything=True) == []


def test_older_than_removes_only_old_entries(tmp_path):
    old_env, new_env = _env(tmp_path, "old-1", days=40), _env(tmp_path, "new-1", days=1)
    old_git = _git(tmp_path, days=31)
    done = _outcomes(tmp_path, older_than_days=30)
    assert set(done) == {"old-1", old_git.name}
    assert {o.action for o in done.values()} == {"deleted"}
    assert not old_env.exists() and not old_git.exists() and new_env.exists()
    assert not [p for p in (tmp_path / "envs").iterdir() if p.name.startswith(".trash-")]


def test_all_removes_every_unused_entry(tmp_path):
    _git(tmp_path), _wheel(tmp_path), _env(tmp_path)
    done = _outcomes(tmp_path, everything=True)
    assert [o.action for o in done.values()] == ["deleted"] * 3
    assert cache.scan(tmp_path) == []


def test_without_options_only_leftovers_go(tmp_path):
    env = _env(tmp_path, days=400)
    broken = _env(tmp_path, "broken-1", complete=False)
    stale = _partial(tmp_path, hours=30)
    done = _outcomes(tmp_path)
    assert set(done) == {"broken-1", stale.name}
    assert env.exists() and not broken.exists() and not stale.exists()


def test_dry_run_deletes_nothing(tmp_path):
    paths = [_git(tmp_path, days=90), _wheel(tmp_path, days=90), _env(tmp_path, days=90), _partial(tmp_path, hours=48)]
    done = cache.prune(tmp_path, everything=True, dry_run=True, now=NOW)
    assert len(done) == 4 and {o.action for o in done} == {"would-delete"}
    assert all(p.exists() for p in paths)


@pytest.mark.parametrize("make", [_git, _wheel, _env, _uv])
def test_a_held_lock_is_respected(tmp_path, make):
    entry = make(tmp_path)
    held = FileLock(str(entry.parent / f"{entry.name}.lock"))
    with held:
        done = _outcomes(tmp_path, everything=True)
    assert done[entry.name].action == "skipped"
    assert "lock is held" in done[entry.name].reason
    assert entry.exists()
    assert _outcomes(tmp_path, everything=True)[entry.name].action == "deleted"  # released: goes


def test_an_env_leased_by_a_run_is_skipped_and_stale_leases_are_cleared(tmp_path):
    env = _env(tmp_path, days=90)
    users = env.parent / f"{env.name}.users"
    users.mkdir()
    (users / "999-stale.lock").touch()  # a crashed run: nobody holds it
    with FileLock(str(users / "123-live.lock")):
        done = _outcomes(tmp_path, everything=True)
        assert done[env.name].action == "skipped" and "run in progress" in done[env.name].reason
        assert env.exists() and not (users / "999-stale.lock").exists()
    (users / "123-live.lock").unlink()
    assert _outcomes(tmp_path, everything=True)[env.name].action == "deleted"
    assert not env.exists() and not users.exists()


def test_uv_cache_is_one_entry_listed_and_pruned_by_age(tmp_path):
    _uv(tmp_path, days=10)
    (entry,) = cache.scan(tmp_path)
    # the wheel bucket's link into the archive is not followed: its 700 bytes count once
    assert (entry.kind, entry.key, entry.size, entry.lock) == ("uv", "uv", 700, tmp_path / "uv.lock")
    assert "uv" not in _outcomes(tmp_path, older_than_days=30)
    assert _outcomes(tmp_path, older_than_days=7)["uv"].action == "deleted"
    assert [p.name for p in tmp_path.iterdir()] == ["uv.lock"]  # no trash left behind


def test_uv_cache_leased_by_an_env_build_is_skipped(tmp_path):
    uv = _uv(tmp_path, days=90)
    with uv_cache_lease(uv):  # what EnvManager holds while uv installs
        done = _outcomes(tmp_path, everything=True)
        assert done["uv"].action == "skipped" and "env build in progress" in done["uv"].reason
        assert (uv / "archive-v0" / "abc" / "pkg" / "__init__.py").is_file()
    assert _outcomes(tmp_path, everything=True)["uv"].action == "deleted"
    assert not uv.exists() and not (tmp_path / "uv.users").exists()


def test_uv_cache_that_is_a_symlink_is_not_ours(tmp_path):
    outside = _uv(tmp_path / "outside")
    root = tmp_path / "cache"
    root.mkdir()
    (root / "uv").symlink_to(outside)
    assert cache.scan(root) == [] and cache.prune(root, everything=True) == []
    assert (outside / "archive-v0" / "abc" / "pkg" / "__init__.py").is_file()


def test_young_builds_are_skipped_even_with_all(tmp_path):
    young = _partial(tmp_path, hours=1)
    old = _partial(tmp_path, ".build-prof-0123-old", hours=cache.PARTIAL_GRACE_S / 3600 + 1)
    git_tmp = tmp_path / "git" / f".{'a' * 24}.tmp-xyz"
    git_tmp.mkdir(parents=True)
    with FileLock(str(tmp_path / "envs" / "prof-0123.lock")):  # its builder is at work
        done = _outcomes(tmp_path, everything=True)
    assert done[young.name].action == "skipped" and "in progress" in done[young.name].reason
    assert done[git_tmp.name].action == "skipped"
    assert done[old.name].action == "deleted"
    assert young.exists() and git_tmp.exists() and not old.exists()


def test_a_young_build_whose_builder_is_gone_is_reclaimed(tmp_path):
    """A build killed outright (SIGKILL: no finally ran) left `.build-*` behind; its builder
    held the env's lock while it lived, so a free lock says it is gone (#28)."""
    stale = _partial(tmp_path, ".build-sglang-cpu-07f5609f-abc123_x", hours=0.1)
    assert cache.stale_builds(tmp_path) == [stale]
    busy = _partial(tmp_path, ".build-prof-0123-busy", hours=0.1)
    with FileLock(str(tmp_path / "envs" / "prof-0123.lock")):
        assert cache.stale_builds(tmp_path) == [stale]
        done = _outcomes(tmp_path)
    assert done[stale.name].action == "deleted" and not stale.exists()
    assert done[busy.name].action == "skipped" and busy.exists()


def test_interrupted_trash_is_finished(tmp_path):
    trash = tmp_path / "envs" / ".trash-prof-0123-deadbeef"
    (trash / "bin").mkdir(parents=True)
    done = _outcomes(tmp_path)
    assert done[trash.name].action == "deleted" and not trash.exists()


def test_nothing_outside_the_root_is_touched(tmp_path):
    outside = tmp_path / "outside"
    (outside / "envs" / "prof-9").mkdir(parents=True)
    (outside / "envs" / "prof-9" / "kvprobe-env.json").write_text("{}")
    (outside / "precious").mkdir()
    (outside / "precious" / "data").write_text("keep")
    root = tmp_path / "cache"
    env = _env(root, days=90)
    (env / "link").symlink_to(outside / "precious")  # inside an entry: removed as a link only
    (root / "wheels").mkdir()
    (root / "wheels" / ("cd" * 32)).symlink_to(outside / "precious")  # an entry that is a symlink
    os.symlink(outside / "envs", root / "git")  # a kind dir that is a symlink: skipped
    done = _outcomes(root, everything=True)
    assert done[env.name].action == "deleted"
    assert (outside / "precious" / "data").read_text() == "keep"
    assert (outside / "envs" / "prof-9" / "kvprobe-env.json").is_file()
    assert "prof-9" not in done


def test_negative_age_is_usage_error(tmp_path):
    with pytest.raises(UsageError):
        cache.prune(tmp_path, older_than_days=-1)


def test_human_size():
    assert cache.human_size(0) == "0 B"
    assert cache.human_size(1536) == "1.5 KiB"
    assert cache.human_size(6 * 1024**3) == "6.0 GiB"


# --- the CLI -----------------------------------------------------------------------------


def _cli(root: Path, *args: str):
    runner = CliRunner()
    return runner.invoke(main, list(args), env={"KVPROBE_CACHE_DIR": str(root)}, catch_exceptions=False)


def test_cli_ls_json(tmp_path):
    _git(tmp_path), _env(tmp_path, days=2)
    result = _cli(tmp_path, "cache", "ls", "--json")
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert doc["root"] == str(tmp_path)
    assert sorted(e["kind"] for e in doc["entries"]) == ["env", "git"]
    assert doc["total_size"] == sum(e["size"] for e in doc["entries"])


def test_cli_ls_human(tmp_path):
    _env(tmp_path, days=2)
    result = _cli(tmp_path, "cache", "ls")
    assert result.exit_code == 0
    assert "prof-0123" in result.output and "2 days ago" in result.output


def test_cli_prune_older_than_and_dry_run(tmp_path):
    old, new = _env(tmp_path, "old-1", days=10), _env(tmp_path, "new-1", days=1)
    dry = _cli(tmp_path, "cache", "prune", "--older-than", "5", "--dry-run", "--json")
    assert dry.exit_code == 0
    assert [o["action"] for o in json.loads(dry.stdout)["outcomes"]] == ["would-delete"]
    assert old.exists()
    real = _cli(tmp_path, "cache", "prune", "--older-than", "5")
    assert real.exit_code == 0 and "deleted env old-1" in real.output
    assert not old.exists() and new.exists()


def test_cli_prune_names_what_it_skipped(tmp_path):
    env = _env(tmp_path)
    with FileLock(str(env.parent / f"{env.name}.lock")):
        result = _cli(tmp_path, "cache", "prune", "--all")
    assert result.exit_code == 0
    assert "skipped env prof-0123" in result.output and "lock is held" in result.output
    assert env.exists()


def test_cli_prune_rejects_negative_days(tmp_path):
    assert _cli(tmp_path, "cache", "prune", "--older-than", "-2").exit_code == 2


def test_a_file_hard_linked_between_an_env_and_uv_is_counted_once(tmp_path):
    """uv links an env's files to its own cache: 6.9 GB on disk read 12.3 GiB (#25)."""
    env = _env(tmp_path)
    uv = _uv(tmp_path)
    (env / "lib").mkdir()
    (env / "lib" / "torch.so").write_bytes(b"t" * 5000)
    os.link(env / "lib" / "torch.so", uv / "archive-v0" / "abc" / "torch.so")
    os.link(env / "lib" / "torch.so", env / "lib" / "again.so")  # twice inside one entry too
    entries = {e.kind: e for e in cache.scan(tmp_path)}
    assert entries["env"].size == 302 + 5000 and entries["env"].linked == 5000
    assert entries["uv"].size == 700 and entries["uv"].linked == 5000
    assert cache.total_size(entries.values()) == 302 + 5000 + 700
    doc = json.loads(_cli(tmp_path, "cache", "ls", "--json").stdout)
    assert doc["total_size"] == 6002 and {e["kind"]: e["linked_size"] for e in doc["entries"]}["uv"] == 5000
    human = _cli(tmp_path, "cache", "ls")
    assert "each file is counted once" in human.stdout and "hard links" in human.stdout

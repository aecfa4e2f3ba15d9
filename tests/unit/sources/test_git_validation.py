"""URL, SHA and path checks that run before any git process; no subprocess here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from kvprobe import proc
from kvprobe.errors import CheckoutError, PinError, UsageError
from kvprobe.sources import git
from kvprobe.sources.git import (
    GitSource,
    compare_trees,
    store_key,
    validate_pr,
    validate_rel_path,
    validate_sha,
    validate_url,
)

SHA = "0123456789abcdef0123456789abcdef01234567"

REJECTED_URLS = [
    ("", "empty"),
    ("   ", "empty"),
    ("ext::sh -c touch% /tmp/kvprobe-pwned", "transport helper"),
    ("ext::sh", "transport helper"),
    ("fd::17", "transport helper"),
    ("foo::https://github.com/x/y", "transport helper"),
    ("-uhttps://x", "option"),
    ("--upload-pack=touch /tmp/x", "option"),
    ("https://x\n", "control"),
    ("https://github.com/a/b\x00", "control"),
    ("https://github.com/a\tb", "control"),
    (" https://github.com/a/b", "whitespace"),
    ("https://github.com/a b", "whitespace"),
    ("git://github.com/sgl-project/sglang", "scheme 'git'"),
    ("ssh://git@github.com/sgl-project/sglang", "scheme 'ssh'"),
    ("http://github.com/sgl-project/sglang", "scheme 'http'"),
    ("ftp://example.com/repo", "scheme 'ftp'"),
    ("HTTPS://github.com/x/y", "scheme 'HTTPS'"),
    ("https:///no-host", "no host"),
    ("https://user:token@github.com/x/y", "credentials"),
    ("file://remotehost/srv/repo", "absolute"),
    ("git@github.com:sgl-project/sglang.git", "not an existing local directory"),
    ("github.com:sgl-project/sglang", "not an existing local directory"),
    ("/definitely/not/a/dir/kvprobe", "not an existing local directory"),
]


@pytest.mark.parametrize(("url", "why"), REJECTED_URLS)
def test_validate_url_rejects(url: str, why: str) -> None:
    with pytest.raises(UsageError) as info:
        validate_url(url)
    message = str(info.value)
    assert why in message
    assert repr(url) in message
    assert "\n" not in message
    assert info.value.exit_code == 2


@pytest.mark.parametrize(
    "url",
    [
        "https://github.com/sgl-project/sglang",
        "https://github.com/sgl-project/sglang.git",
        "https://mirror.example.com:8443/git/sglang.git",
        "file:///srv/mirrors/sglang.git",
        "file://localhost/srv/mirrors/sglang.git",
    ],
)
def test_validate_url_accepts_allowed_schemes(url: str) -> None:
    assert validate_url(url) == url


def test_validate_url_local_paths_become_absolute(tmp_path: Path, monkeypatch) -> None:
    repo = tmp_path / "clone"
    repo.mkdir()
    assert validate_url(str(repo)) == str(repo.resolve())
    monkeypatch.chdir(tmp_path)
    assert validate_url("clone") == str(repo.resolve())
    assert validate_url("./clone") == str(repo.resolve())


def test_validate_url_local_path_that_looks_like_scp_is_made_unambiguous(tmp_path: Path, monkeypatch) -> None:
    # git would read "host:path" as ssh; an absolute path cannot be read that way.
    (tmp_path / "host:repo").mkdir()
    monkeypatch.chdir(tmp_path)
    assert validate_url("host:repo") == str((tmp_path / "host:repo").resolve())


def test_validate_url_rejects_a_file_that_is_not_a_directory(tmp_path: Path) -> None:
    target = tmp_path / "file.txt"
    target.write_text("x")
    with pytest.raises(UsageError, match="not an existing local directory"):
        validate_url(str(target))


@pytest.mark.parametrize(
    "text",
    [
        SHA.upper(),
        "0123456789ABCDEF0123456789abcdef01234567",
        SHA[:7],
        SHA[:39],
        SHA + "0",
        "main",
        "v0.5.21",
        "refs/pull/1/head",
        "HEAD",
        "",
        " " + SHA,
        SHA + "\n",
        "g" * 40,
        None,
        12345,
    ],
)
def test_validate_sha_rejects(text) -> None:
    with pytest.raises(PinError) as info:
        validate_sha(text)
    assert repr(text) in str(info.value)
    assert info.value.exit_code == 2


def test_validate_sha_hints_lowercase_for_uppercase() -> None:
    with pytest.raises(PinError) as info:
        validate_sha(SHA.upper())
    assert "lowercase" in " ".join(info.value.diagnostics()[1:])


def test_validate_sha_accepts_full_lowercase_sha() -> None:
    assert validate_sha(SHA) == SHA


@pytest.mark.parametrize("pr", [0, -1, True, "1", 1.0])
def test_validate_pr_rejects(pr) -> None:
    with pytest.raises(UsageError):
        validate_pr(pr)


def test_validate_pr_accepts() -> None:
    assert validate_pr(None) is None
    assert validate_pr(23085) == 23085


@pytest.mark.parametrize("path", ["", "/etc/passwd", "../x", "a/../../b", "a/./b", "a\\b", "a\nb"])
def test_validate_rel_path_rejects(path: str) -> None:
    with pytest.raises(UsageError):
        validate_rel_path(path)


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("./test/x.py", "has '.' parts: write it as 'test/x.py'"),
        ("/abs/x.py", "is absolute: give it relative to the repository root"),
        ("test/../../x.py", "has '..' parts"),
    ],
)
def test_validate_rel_path_says_what_is_wrong(path: str, says: str) -> None:
    """'./test/x.py' is relative and inside the tree: the error names the '.' and the fix."""
    with pytest.raises(UsageError, match=re.escape(f"path {path!r} {says}")):
        validate_rel_path(path)


def test_validate_rel_path_accepts() -> None:
    assert validate_rel_path("test/srt/test_x.py") == "test/srt/test_x.py"


def test_store_key_is_stable_and_per_url() -> None:
    assert store_key("https://github.com/a/b") == store_key("https://github.com/a/b")
    assert store_key("https://github.com/a/b") != store_key("https://github.com/a/b.git")
    assert len(store_key("x")) == 24


def test_compare_trees_returns_tree_when_equal(tmp_path: Path) -> None:
    assert compare_trees(SHA, "a" * 40, "a" * 40, tmp_path) == "a" * 40


def test_compare_trees_names_both_trees_on_mismatch(tmp_path: Path) -> None:
    with pytest.raises(CheckoutError) as info:
        compare_trees(SHA, "a" * 40, "b" * 40, tmp_path)
    message = str(info.value)
    assert SHA in message and "a" * 40 in message and "b" * 40 in message
    assert info.value.exit_code == 3


@pytest.fixture
def no_processes(monkeypatch):
    """Any attempt to start a process fails the test."""

    def forbidden(*args, **kwargs):
        raise AssertionError(f"a process was started: {args!r}")

    monkeypatch.setattr(proc, "run", forbidden)
    monkeypatch.setattr(proc, "capture", forbidden)
    monkeypatch.setattr(subprocess, "Popen", forbidden)


@pytest.mark.parametrize("url", [u for u, _ in REJECTED_URLS])
def test_rejected_url_starts_no_git(url: str, tmp_path: Path, no_processes) -> None:
    with pytest.raises(UsageError):
        GitSource(url, tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_ext_transport_never_runs(tmp_path: Path, no_processes) -> None:
    canary = tmp_path / "pwned"
    with pytest.raises(UsageError):
        GitSource(f"ext::sh -c touch% {canary}", tmp_path / "cache")
    assert not canary.exists()


def test_constructing_a_source_runs_no_git(tmp_path: Path, no_processes) -> None:
    source = GitSource("https://github.com/sgl-project/sglang", tmp_path / "cache")
    assert source.store == tmp_path / "cache" / "git" / store_key(source.url)
    assert not (tmp_path / "cache").exists()


def test_every_git_invocation_carries_the_safety_switches() -> None:
    assert set(git.GIT_CONFIG_ARGS[0::2]) == {"-c"}
    flags = set(git.GIT_CONFIG_ARGS[1::2])
    for setting in (
        "core.hooksPath=/dev/null",
        "protocol.allow=never",
        "protocol.https.allow=always",
        "protocol.file.allow=always",
        "submodule.recurse=false",
        "fetch.recurseSubmodules=false",
        "core.fsmonitor=false",
        "gc.auto=0",
    ):
        assert setting in flags
    assert git.GIT_ENV["GIT_TERMINAL_PROMPT"] == "0"
    assert git.GIT_ENV["GIT_CONFIG_NOSYSTEM"] == "1"
    assert git.GIT_ENV["GIT_CONFIG_GLOBAL"] == "/dev/null"

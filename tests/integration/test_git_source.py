"""GitSource against real git repositories built by tests/fakeupstream.py."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

from kvprobe.errors import CheckoutError, FetchError, UsageError
from kvprobe.model.records import GitPin
from kvprobe.sources.git import GitSource
from tests.fakeupstream import FakeUpstream, build_fake_upstream

# The fake upstream's SHAs must be the same on every machine (fixed author, dates,
# content, modes; no user git config). If you change fakeupstream.py, update these.
KNOWN_SHAS = {
    "base": "f82a7e817b78d69e22d0e396e66d1e3a3ea23fbb",
    "head": "f4d01a76fdf1792cffd312f32b4fd05a1cb449e2",
    "nofix": "bfc73d347e40f1c3df30ebb2c12789a761fa1d5e",
}
MISSING_SHA = "0" * 40


@pytest.fixture
def upstream(fake_upstream: FakeUpstream) -> FakeUpstream:
    return fake_upstream


@pytest.fixture
def source(upstream: FakeUpstream, tmp_path: Path) -> GitSource:
    return GitSource(upstream.url, tmp_path / "cache", timeout_s=60)


def git_out(*args: str | Path) -> str:
    env = {
        "PATH": os.environ["PATH"],
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "HOME": "/nonexistent",
    }
    return subprocess.run(["git", *map(str, args)], check=True, capture_output=True, text=True, env=env).stdout.strip()


def git_ok(*args: str | Path) -> bool:
    try:
        git_out(*args)
    except subprocess.CalledProcessError:
        return False
    return True


def all_paths(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


# --------------------------------------------------------------------------- fake upstream


def test_fake_upstream_shas_are_stable(upstream: FakeUpstream, tmp_path: Path) -> None:
    again = build_fake_upstream(tmp_path)
    assert (again.base_sha, again.head_sha, again.nofix_sha) == (
        upstream.base_sha,
        upstream.head_sha,
        upstream.nofix_sha,
    )
    assert again.early_shas == upstream.early_shas
    assert {"base": upstream.base_sha, "head": upstream.head_sha, "nofix": upstream.nofix_sha} == KNOWN_SHAS


def test_fake_upstream_head_is_reachable_only_through_pull_refs(upstream: FakeUpstream) -> None:
    branches = git_out("-C", upstream.path, "branch", "--contains", upstream.head_sha)
    assert branches == ""
    assert git_out("-C", upstream.path, "rev-parse", "refs/pull/1/head") == upstream.head_sha
    assert git_out("-C", upstream.path, "rev-parse", "refs/pull/2/head") == upstream.nofix_sha
    assert git_out("-C", upstream.path, "rev-parse", "main") == upstream.base_sha


# --------------------------------------------------------------------------- materialize


def test_materialize_base_and_head(upstream: FakeUpstream, source: GitSource, tmp_path: Path) -> None:
    base = source.materialize(GitPin(upstream.base_sha), tmp_path / "base")
    head = source.materialize(GitPin(upstream.head_sha), tmp_path / "head", pr=upstream.fix_pr)

    for identity, sha in ((base, upstream.base_sha), (head, upstream.head_sha)):
        assert identity["kind"] == "git"
        assert identity["url"] == upstream.url
        assert identity["commit"] == sha
        assert identity["tree"] == git_out("-C", upstream.path, "rev-parse", f"{sha}^{{tree}}")
        assert identity["fetch_bytes"] > 0
    assert base["fetched_via"] == "sha"
    # git's protocol v2 serves any object by SHA, so the PR ref is only the fallback.
    assert head["fetched_via"] in ("sha", "refs/pull/1/head")

    for side in ("base", "head"):
        root = tmp_path / side
        assert not any(".git" in Path(p).parts for p in all_paths(root))
        assert (root / "minikv" / "__init__.py").is_file()
    assert all_paths(tmp_path / "base") == all_paths(tmp_path / "head")
    assert "def scrub" not in (tmp_path / "base/minikv/pool.py").read_text()
    assert "def scrub" in (tmp_path / "head/minikv/pool.py").read_text()
    assert "test_scrub_clears_block" not in (tmp_path / "base/tests/test_minikv.py").read_text()
    assert "test_scrub_clears_block" in (tmp_path / "head/tests/test_minikv.py").read_text()
    assert (tmp_path / "base/README.md").read_bytes() == (tmp_path / "head/README.md").read_bytes()
    # no leftovers from the temp-dir-then-rename
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "cache", "head"]


def test_exported_files_are_the_blobs_with_modes_and_symlinks(
    upstream: FakeUpstream, source: GitSource, tmp_path: Path
) -> None:
    root = tmp_path / "head"
    source.materialize(GitPin(upstream.head_sha), root, pr=upstream.fix_pr)
    copying = root / "COPYING"
    assert copying.is_symlink() and os.readlink(copying) == "LICENSE"
    assert os.stat(root / "scripts/check.sh").st_mode & stat.S_IXUSR
    assert not os.stat(root / "README.md").st_mode & stat.S_IXUSR
    blob = git_out("-C", upstream.path, "show", f"{upstream.head_sha}:minikv/pool.py")
    assert (root / "minikv/pool.py").read_text().strip() == blob


def test_second_materialize_comes_from_the_cache_without_the_upstream(upstream: FakeUpstream, tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    shutil.copytree(upstream.path, mirror, symlinks=True)
    source = GitSource(mirror.as_uri(), tmp_path / "cache", timeout_s=60)
    first = source.materialize(GitPin(upstream.base_sha), tmp_path / "one")
    assert first["fetched_via"] == "sha"
    objects_before = all_paths(source.store / "objects")

    shutil.rmtree(mirror)  # any fetch would now fail
    second = GitSource(mirror.as_uri(), tmp_path / "cache", timeout_s=60)
    identity = second.materialize(GitPin(upstream.base_sha), tmp_path / "two")
    assert identity["fetched_via"] == "cache"
    assert identity["fetch_bytes"] == 0
    assert identity["tree"] == first["tree"]
    assert all_paths(source.store / "objects") == objects_before
    assert all_paths(tmp_path / "one") == all_paths(tmp_path / "two")


def test_store_layout_marker_and_lock(upstream: FakeUpstream, source: GitSource, tmp_path: Path) -> None:
    source.materialize(GitPin(upstream.base_sha), tmp_path / "base")
    git_root = tmp_path / "cache" / "git"
    assert (source.store / "kvprobe-url").read_text().strip() == upstream.url
    assert git_out("--git-dir", source.store, "rev-parse", "--is-bare-repository") == "true"
    assert (git_root / f"{source.key}.lock").exists()
    assert [p.name for p in git_root.iterdir() if p.name.startswith(".")] == []
    assert (
        git_out("--git-dir", source.store, "rev-parse", f"refs/kvprobe/commits/{upstream.base_sha}")
        == upstream.base_sha
    )


def test_fetch_is_shallow(upstream: FakeUpstream, source: GitSource, tmp_path: Path) -> None:
    source.materialize(GitPin(upstream.base_sha), tmp_path / "base")
    store = source.store
    assert (store / "shallow").read_text().split() == [upstream.base_sha]
    assert git_out("--git-dir", store, "rev-list", "--count", upstream.base_sha) == "1"
    for early in upstream.early_shas:
        assert upstream.base_sha != early
        assert not git_ok("--git-dir", store, "cat-file", "-e", early)
    # and the upstream really has them
    assert all(git_ok("-C", upstream.path, "cat-file", "-e", e) for e in upstream.early_shas)


def test_missing_sha_is_a_fetch_error_naming_sha_and_url(
    upstream: FakeUpstream, source: GitSource, tmp_path: Path
) -> None:
    with pytest.raises(FetchError) as info:
        source.materialize(GitPin(MISSING_SHA), tmp_path / "x")
    message = str(info.value)
    assert MISSING_SHA in message and upstream.url in message
    assert "\n" not in message
    assert info.value.exit_code == 3
    assert not (tmp_path / "x").exists()

    with pytest.raises(FetchError, match="refs/pull/1/head"):
        source.materialize(GitPin(MISSING_SHA), tmp_path / "x", pr=1)


def test_pr_head_that_moved_is_found_through_a_deeper_pull_ref_fetch(tmp_path: Path) -> None:
    upstream = build_fake_upstream(tmp_path / "moved")
    upstream.move_pr_head(upstream.fix_pr)  # the pinned head is no longer a ref tip
    source = GitSource(upstream.url, tmp_path / "cache", timeout_s=60)
    # A server that only serves advertised tips (protocol v0, like older or stricter
    # hosts): the pinned SHA cannot be asked for directly.
    git_out("--git-dir", source.ensure_store(), "config", "protocol.version", "0")
    pin = GitPin(upstream.head_sha)

    with pytest.raises(FetchError) as info:
        source.materialize(pin, tmp_path / "nopr")
    assert upstream.head_sha in str(info.value)

    identity = source.materialize(pin, tmp_path / "head", pr=upstream.fix_pr)
    assert identity["fetched_via"] == "refs/pull/1/head"
    assert identity["commit"] == upstream.head_sha
    assert "def scrub" in (tmp_path / "head/minikv/pool.py").read_text()


def test_pr_ref_at_the_pinned_sha_depth_one(tmp_path: Path) -> None:
    upstream = build_fake_upstream(tmp_path / "up")
    source = GitSource(upstream.url, tmp_path / "cache", timeout_s=60)
    git_out("--git-dir", source.ensure_store(), "config", "protocol.version", "0")
    # In v0 an advertised tip can be fetched by SHA: nofix is the tip of refs/pull/2/head.
    identity = source.materialize(GitPin(upstream.nofix_sha), tmp_path / "nofix", pr=2)
    assert identity["fetched_via"] == "sha"
    assert (source.store / "shallow").read_text().split() == [upstream.nofix_sha]


def test_local_path_url(upstream: FakeUpstream, tmp_path: Path) -> None:
    source = GitSource(str(upstream.path), tmp_path / "cache", timeout_s=60)
    identity = source.materialize(GitPin(upstream.head_sha), tmp_path / "head")
    assert identity["url"] == str(upstream.path.resolve())
    assert identity["commit"] == upstream.head_sha
    assert (tmp_path / "head/minikv/pool.py").is_file()


@pytest.mark.parametrize(
    "make_url",
    [
        lambda tmp: (tmp / "gone").as_uri(),
        lambda tmp: str(tmp),  # a directory that is not a git repository
        lambda tmp: "https://127.0.0.1:9/nothing-listens-here.git",  # https is allowed, fails
    ],
    ids=["missing-file-url", "not-a-repository", "refused-https"],
)
def test_unreachable_upstream_is_a_fetch_error(make_url, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    url = make_url(plain)
    source = GitSource(url, tmp_path / "cache", timeout_s=60)
    with pytest.raises(FetchError) as info:
        source.materialize(GitPin(KNOWN_SHAS["base"]), tmp_path / "out")
    assert source.url in str(info.value)
    assert not (tmp_path / "out").exists()


def test_fetch_timeout_is_a_fetch_error(tmp_path: Path) -> None:
    with socket.socket() as server:  # accepts connections, never answers the TLS hello
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        url = f"https://127.0.0.1:{server.getsockname()[1]}/slow.git"
        source = GitSource(url, tmp_path / "cache", timeout_s=2)
        started = time.monotonic()
        with pytest.raises(FetchError) as info:
            source.materialize(GitPin(KNOWN_SHAS["base"]), tmp_path / "out", pr=1)
    assert time.monotonic() - started < 30
    assert "timed out" in str(info.value) and url in str(info.value)


def test_destination_that_is_not_empty_is_refused(upstream: FakeUpstream, source: GitSource, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    with pytest.raises(CheckoutError, match="not empty"):
        source.materialize(GitPin(upstream.base_sha), dest)
    assert all_paths(dest) == {"keep.txt"}
    # an empty existing directory is fine
    empty = tmp_path / "empty"
    empty.mkdir()
    source.materialize(GitPin(upstream.base_sha), empty)
    assert (empty / "minikv/pool.py").is_file()


def test_concurrent_materialize_shares_one_store(upstream: FakeUpstream, tmp_path: Path) -> None:
    results: dict[int, dict] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            src = GitSource(upstream.url, tmp_path / "cache", timeout_s=60)
            results[i] = src.materialize(GitPin(upstream.head_sha), tmp_path / f"out{i}", pr=1)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    vias = sorted(r["fetched_via"] for r in results.values())
    assert vias.count("cache") == 2
    assert len({r["tree"] for r in results.values()}) == 1


# --------------------------------------------------------------------------- verification


def _edit(root: Path) -> None:
    (root / "minikv/pool.py").write_text("# tampered\n")


def _add(root: Path) -> None:
    (root / "minikv/extra.py").write_text("x = 1\n")


def _remove(root: Path) -> None:
    (root / "README.md").unlink()


def _chmod(root: Path) -> None:
    (root / "README.md").chmod(0o755)


def _relink(root: Path) -> None:
    (root / "COPYING").unlink()
    (root / "COPYING").symlink_to("README.md")


def _unlink_to_file(root: Path) -> None:
    (root / "COPYING").unlink()
    (root / "COPYING").write_text("LICENSE")


def _add_hidden(root: Path) -> None:
    (root / "tests" / ".hidden").write_text("dotfiles count too\n")


@pytest.mark.parametrize(
    "tamper", [_edit, _add, _remove, _chmod, _relink, _unlink_to_file, _add_hidden], ids=lambda f: f.__name__.strip("_")
)
def test_verify_export_detects_tampering(tamper, upstream: FakeUpstream, source: GitSource, tmp_path: Path) -> None:
    root = tmp_path / "head"
    identity = source.materialize(GitPin(upstream.head_sha), root, pr=1)
    assert source.verify_export(upstream.head_sha, root) == identity["tree"]
    tamper(root)
    with pytest.raises(CheckoutError) as info:
        source.verify_export(upstream.head_sha, root)
    assert upstream.head_sha in str(info.value)


def test_verify_export_against_the_other_side_fails(upstream: FakeUpstream, source: GitSource, tmp_path: Path) -> None:
    source.materialize(GitPin(upstream.base_sha), tmp_path / "base")
    source.materialize(GitPin(upstream.head_sha), tmp_path / "head", pr=1)
    with pytest.raises(CheckoutError):
        source.verify_export(upstream.head_sha, tmp_path / "base")


def _repo(tmp_path: Path, name: str) -> Path:
    repo = tmp_path / name
    git_out("init", "-q", "-b", "main", repo)
    return repo


def _commit_all(repo: Path) -> str:
    env_args = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    git_out("-C", repo, "add", "-A")
    git_out("-C", repo, *env_args, "commit", "-q", "-m", "c")
    return git_out("-C", repo, "rev-parse", "HEAD")


def test_gitattributes_do_not_change_exported_bytes(tmp_path: Path) -> None:
    repo = _repo(tmp_path, "attrs")
    (repo / ".gitattributes").write_text("*.txt text eol=crlf\n*.id ident\n")
    (repo / "a.txt").write_bytes(b"one\ntwo\n")
    (repo / "b.id").write_bytes(b"$Id$\n")
    sha = _commit_all(repo)
    source = GitSource(repo.as_uri(), tmp_path / "cache", timeout_s=60)
    source.materialize(GitPin(sha), tmp_path / "out")
    assert (tmp_path / "out/a.txt").read_bytes() == b"one\ntwo\n"
    assert (tmp_path / "out/b.id").read_bytes() == b"$Id$\n"


def test_submodules_are_not_fetched_but_verify(tmp_path: Path) -> None:
    repo = _repo(tmp_path, "withsub")
    (repo / "main.py").write_text("print('hi')\n")
    (repo / ".gitmodules").write_text(
        '[submodule "vendor"]\n\tpath = vendor\n\turl = ext::sh -c touch% /tmp/kvprobe-sub\n'
    )
    git_out("-C", repo, "add", "-A")
    git_out("-C", repo, "update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},vendor")
    git_out(
        "-C", repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "with a submodule"
    )
    sha = git_out("-C", repo, "rev-parse", "HEAD")
    assert git_out("-C", repo, "ls-tree", sha, "vendor").startswith("160000 commit")
    source = GitSource(repo.as_uri(), tmp_path / "cache", timeout_s=60)
    identity = source.materialize(GitPin(sha), tmp_path / "out")
    assert identity["commit"] == sha
    vendor = tmp_path / "out/vendor"
    assert not vendor.exists() or list(vendor.iterdir()) == []
    assert not Path("/tmp/kvprobe-sub").exists()


# --------------------------------------------------------------------------- read_file


def test_read_file_at_head_and_missing_paths(upstream: FakeUpstream, source: GitSource) -> None:
    head = GitPin(upstream.head_sha)
    base = GitPin(upstream.base_sha)
    head_test = source.read_file(head, upstream.test_path, pr=upstream.fix_pr)
    assert isinstance(head_test, bytes) and b"def test_scrub_clears_block" in head_test
    base_test = source.read_file(base, upstream.test_path)
    assert base_test is not None and b"test_scrub_clears_block" not in base_test
    assert (
        head_test == git_out("-C", upstream.path, "show", f"{upstream.head_sha}:{upstream.test_path}").encode() + b"\n"
    )
    assert source.read_file(head, "tests/test_nope.py") is None
    assert source.read_file(head, "minikv") is None  # a directory is not a file
    with pytest.raises(UsageError):
        source.read_file(head, "../outside.py")


def test_read_file_of_a_missing_commit_is_a_fetch_error(source: GitSource) -> None:
    with pytest.raises(FetchError, match=MISSING_SHA):
        source.read_file(GitPin(MISSING_SHA), "README.md")

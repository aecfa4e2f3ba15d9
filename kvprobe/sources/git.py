"""Git sources: a cached object store per upstream URL, fetch by full SHA, export one tree
(once per tree id, into the verified tree cache: kvprobe.sources.treecache).

Every git process goes through :mod:`kvprobe.proc` (timeout, process-group kill, clean
environment). Git runs with no system or global config, no hooks, no submodules and only
the https and file transports, so neither the user's config nor the remote can make it run
anything. URLs and SHAs are checked here, before any git process starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlsplit

import filelock

from kvprobe import proc
from kvprobe.env.cache import tree_size
from kvprobe.errors import CheckoutError, FetchError, PinError, UsageError
from kvprobe.model.records import GitPin
from kvprobe.sources.treecache import TreeCache, cache_tag, place_copy

# Safety switches on every git invocation. The store's own config can add to these but
# cannot turn them off, because -c wins over repository config.
GIT_CONFIG_ARGS: tuple[str, ...] = (
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "protocol.allow=never",
    "-c",
    "protocol.https.allow=always",
    "-c",
    "protocol.file.allow=always",
    "-c",
    "submodule.recurse=false",
    "-c",
    "fetch.recurseSubmodules=false",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "gc.auto=0",
    "-c",
    "maintenance.auto=false",
    "-c",
    "core.autocrlf=false",
    "-c",
    "init.defaultBranch=main",
)
GIT_ENV: Mapping[str, str] = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    # Older spelling of the protocol allow-list; honoured by every git since 2.12.
    "GIT_ALLOW_PROTOCOL": "https:file",
}
# Highest-precedence attributes: export blob bytes as stored, whatever the upstream's
# .gitattributes asks (eol conversion, ident, filters would make bytes differ from blobs).
_NEUTRAL_ATTRIBUTES = "* -text -eol -crlf -ident -filter -working-tree-encoding\n"
URL_MARKER = "kvprobe-url"
PR_DEEP_FETCH_DEPTH = 200
_PLUMBING_TIMEOUT_S = 60.0
_TRANSPORT_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*::")
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_ALLOWED_SCHEMES = ("https", "file")
# fullmatch, not models.SHA1_RE.match: "$" would let a trailing newline through.
_FULL_SHA_RE = re.compile(r"[0-9a-f]{40}")


# How a base commit stands to a head commit (GitSource.ancestry).
ANCESTOR, REVERSED, DIVERGED, UNKNOWN = "ancestor", "reversed", "diverged", "unknown"


@dataclass(frozen=True)
class Ancestry:
    """``relation``: base is one of head's ancestors (ANCESTOR), head is one of base's
    (REVERSED), neither (DIVERGED, at ``fork_point``, their merge base), or UNKNOWN: no
    common commit in the PR_DEEP_FETCH_DEPTH commits fetched before each (the store is
    shallow: base may still be an older ancestor)."""

    relation: str
    fork_point: str | None = None


# --------------------------------------------------------------------------- validation


def validate_url(url: str) -> str:
    """Return ``url`` if git may fetch from it, with local paths made absolute.

    Allowed: ``https://host/...``, ``file:///abs/path`` and existing local directories.
    Raises UsageError for anything else (``ext::``, ssh, git, http, options, control
    characters) so that no git process ever sees it.
    """
    if not isinstance(url, str) or not url.strip():
        raise UsageError(f"repository URL {url!r} is empty")
    if any(unicodedata.category(ch) == "Cc" for ch in url):
        raise UsageError(f"repository URL {url!r} contains control characters")
    if url != url.strip():
        raise UsageError(f"repository URL {url!r} has leading or trailing whitespace")
    if url.startswith("-"):
        raise UsageError(f"repository URL {url!r} looks like an option")
    if _TRANSPORT_RE.match(url):
        raise UsageError(
            f"repository URL {url!r} uses a '::' transport helper; only https://, file:// and local paths are allowed"
        )
    scheme = _SCHEME_RE.match(url)
    if scheme:
        return _validate_scheme_url(url, scheme.group(1))
    return _validate_local_path(url)


def _validate_scheme_url(url: str, scheme: str) -> str:
    """https needs a host and no credentials; file needs an absolute path and no host."""
    if scheme not in _ALLOWED_SCHEMES:
        raise UsageError(
            f"repository URL {url!r} uses scheme {scheme!r}; only https://, file:// and local paths are allowed"
        )
    if any(ch.isspace() for ch in url):
        raise UsageError(f"repository URL {url!r} contains whitespace")
    parts = urlsplit(url)
    if scheme == "https":
        if not parts.hostname:
            raise UsageError(f"repository URL {url!r} has no host")
        if "@" in parts.netloc:
            raise UsageError(f"repository URL {url!r} carries credentials; credentials are never put in URLs")
        return url
    if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
        raise UsageError(f"repository URL {url!r}: a file:// URL needs an absolute local path (file:///path/to/repo)")
    return url


def check_local_repository(url: str) -> None:
    """For a checked ``url`` (:func:`validate_url`) that is local (file:// or a path): raises
    UsageError unless it is a git repository (a work tree's ``.git``, or a bare repository's
    HEAD and objects/), before a store is made in the cache for it. https is left to git."""
    if url.startswith("https://"):
        return
    path = Path(unquote(urlsplit(url).path)) if url.startswith("file:") else Path(url)
    try:
        if not path.is_dir():
            raise UsageError(f"repository {url!r}: {path} is not a directory (no such file or directory)")
        bare = (path / "HEAD").is_file() and (path / "objects").is_dir()
        if not (path / ".git").exists() and not bare:
            raise UsageError(f"repository {url!r}: {path} is not a git repository (no .git, not a bare repository)")
    except OSError as exc:
        raise UsageError(f"repository {url!r}: cannot read {path}: {exc.strerror or exc}") from exc


def _validate_local_path(url: str) -> str:
    """A path without a scheme must be an existing directory; returned absolute."""
    path = Path(url)
    if not path.is_dir():
        raise UsageError(
            f"repository {url!r} is not an allowed URL (https://, file://) and not an existing local directory"
        )
    # Absolute paths start with "/", so git can never read "host:path" (ssh) into them.
    return str(path.resolve())


def validate_sha(text: Any) -> str:
    """Return ``text`` if it is a full lowercase 40-hex commit SHA; raise PinError."""
    if isinstance(text, str) and _FULL_SHA_RE.fullmatch(text):
        return text
    hints = []
    if isinstance(text, str) and _FULL_SHA_RE.fullmatch(text.lower()):
        hints.append("write the SHA in lowercase")
    raise PinError(
        f"pin {text!r} is not a full 40-hex lowercase commit SHA (branch names, tags and short SHAs are not pins)",
        hints=hints,
    )


def validate_pr(pr: Any) -> int | None:
    """A PR number is a positive int (it becomes part of a refspec)."""
    if pr is None:
        return None
    if isinstance(pr, bool) or not isinstance(pr, int) or pr <= 0:
        raise UsageError(f"pull request number {pr!r} is not a positive integer")
    return pr


def validate_rel_path(rel_path: str) -> str:
    """A POSIX path inside the tree: relative, no '..', no empty or '.' parts."""
    if not isinstance(rel_path, str) or not rel_path or "\\" in rel_path:
        raise UsageError(f"path {rel_path!r} is not a relative POSIX path")
    if any(unicodedata.category(ch) == "Cc" for ch in rel_path):
        raise UsageError(f"path {rel_path!r} contains control characters")
    pure = PurePosixPath(rel_path)
    parts = rel_path.split("/")
    if pure.is_absolute():
        raise UsageError(f"path {rel_path!r} is absolute: give it relative to the repository root")
    if ".." in parts:
        raise UsageError(f"path {rel_path!r} has '..' parts: give it inside the tree, from the repository root")
    if "." in parts:
        raise UsageError(f"path {rel_path!r} has '.' parts: write it as {str(pure)!r}")
    return str(pure)


def store_key(url: str) -> str:
    """The cache directory name for a (validated) URL."""
    return hashlib.sha256(url.encode("utf-8")).hexdigest()[:24]


def compare_trees(sha: str, expected_tree: str, exported_tree: str, where: Path) -> str:
    """Return the tree SHA if the exported files hash to the commit's tree.

    Raises CheckoutError otherwise: the directory is not exactly the pinned commit.
    """
    if expected_tree != exported_tree:
        raise CheckoutError(
            f"exported tree at {where} hashes to {exported_tree}, but commit {sha} "
            f"has tree {expected_tree}; the export is not the pinned commit"
        )
    return expected_tree


# --------------------------------------------------------------------------- the source


class GitSource:
    """One upstream URL backed by a cached, shallow, bare object store.

    Construction validates the URL and runs no git. The store lives at
    ``cache_root/git/<sha256(url)[:24]>`` and is shared between runs and processes
    (guarded by a file lock next to it).
    """

    def __init__(self, url: str, cache_root: Path, *, timeout_s: float = 600.0) -> None:
        self.url = validate_url(url)
        self.key = store_key(self.url)
        self.git_root = Path(cache_root) / "git"
        self.store = self.git_root / self.key
        self.lock_path = self.git_root / f"{self.key}.lock"
        self.timeout_s = float(timeout_s)

    def __repr__(self) -> str:
        return f"GitSource({self.url!r}, store={str(self.store)!r})"

    # ---- public API

    def materialize(self, pin: GitPin, dest: Path, *, pr: int | None = None, python: str | None = None) -> dict:
        """Export the pinned commit's tree into ``dest`` (no .git) and return its identity.

        The tree comes from the tree cache, keyed by the commit's tree id (and, with
        ``python``, that interpreter's bytecode tag): exported, hashed against the tree id,
        byte-compiled and frozen once; ``dest`` gets a private copy made of hard links.
        ``dest`` must not exist or be empty. Raises FetchError when the commit cannot be
        fetched, CheckoutError when the export does not hash to the commit's tree.
        """
        sha = validate_sha(pin.commit)
        pr = validate_pr(pr)
        dest = Path(dest)
        _check_dest(dest)
        with self._locked():
            via, fetch_bytes = self._ensure_commit(sha, pr)
            tree = self._tree_id(sha)
        tag = cache_tag(python) if python else "source"

        def build(target: Path) -> None:
            with self._locked():
                self._export(sha, target)

        cached, how = TreeCache(self.git_root.parent).ensure(f"git-{tree}-{tag}", build, python=python)
        try:
            place_copy(cached, dest)
        except OSError as exc:
            raise CheckoutError(f"could not place the exported tree at {dest}: {exc}") from exc
        return {
            "kind": "git",
            "url": self.url,
            "commit": sha,
            "tree": tree,
            "fetched_via": via,
            "fetch_bytes": fetch_bytes,
            "tree_cache": how,
            "bytecode": tag,
        }

    def read_file(self, pin: GitPin, rel_path: str, *, pr: int | None = None) -> bytes | None:
        """The bytes of ``rel_path`` at the pinned commit, or None if it is not a file there.

        Used to read the head's version of a test file without exporting the tree.
        """
        sha = validate_sha(pin.commit)
        rel = validate_rel_path(rel_path)
        pr = validate_pr(pr)
        with self._locked():
            self._ensure_commit(sha, pr)
            kind = self._git_capture(["cat-file", "-t", f"{sha}:{rel}"])
            if not kind.ok or kind.stdout.strip() != "blob":
                return None
            return self._git_bytes(["cat-file", "blob", f"{sha}:{rel}"])

    def fetch_commit(self, pin: GitPin, *, pr: int | None = None) -> str:
        """Make the pinned commit present in the store; return how it came.

        ("cache", "sha" or the pull ref it came through.) Raises FetchError when it
        cannot be fetched; :meth:`remote_answers` tells an absent commit from a dead remote.
        """
        sha = validate_sha(pin.commit)
        pr = validate_pr(pr)
        with self._locked():
            via, _bytes = self._ensure_commit(sha, pr)
        return via

    def ancestry(self, base: GitPin, head: GitPin, *, pr: int | None = None) -> Ancestry:
        """How ``base`` stands to ``head`` in history (both must be fetchable).

        A direct parent is read from the commit object; otherwise both histories are
        deepened to PR_DEEP_FETCH_DEPTH commits (the store is shallow) and git decides.
        Raises FetchError when a commit or its history cannot be fetched.
        """
        base_sha, head_sha = validate_sha(base.commit), validate_sha(head.commit)
        pr = validate_pr(pr)
        with self._locked():
            for sha in (base_sha, head_sha):
                self._ensure_commit(sha, pr)
            if base_sha in self._parents(head_sha):
                return Ancestry(ANCESTOR)
            if head_sha in self._parents(base_sha):
                return Ancestry(REVERSED)
            for sha in (head_sha, base_sha):
                self._deepen(sha, pr)
            if self._is_ancestor(base_sha, head_sha):
                return Ancestry(ANCESTOR)
            if self._is_ancestor(head_sha, base_sha):
                return Ancestry(REVERSED)
            fork = self._git_capture(["merge-base", base_sha, head_sha])
            fork_point = fork.stdout.strip() if fork.ok else ""
            if _FULL_SHA_RE.fullmatch(fork_point):
                return Ancestry(DIVERGED, fork_point)
            return Ancestry(UNKNOWN)

    def subject(self, pin: GitPin, *, pr: int | None = None) -> str:
        """The first line of the pinned commit's message."""
        sha = validate_sha(pin.commit)
        with self._locked():
            self._ensure_commit(sha, validate_pr(pr))
            text = self._git_checked(["cat-file", "commit", sha], what=f"read commit {sha}")
        message = text.split("\n\n", 1)[1] if "\n\n" in text else ""
        return message.strip().split("\n", 1)[0]

    def remote_answers(self) -> str | None:
        """None if the repository answers ``git ls-remote``, else git's last stderr line."""
        result = self._git_capture(["ls-remote", self.url, "HEAD"], use_store=False, timeout_s=self.timeout_s)
        return None if result.ok else result.summary(200)

    def has_commit(self, sha: str) -> bool:
        """True if the store already holds ``sha`` as a commit (no network)."""
        sha = validate_sha(sha)
        if not self.store.is_dir():
            return False
        result = self._git_capture(["cat-file", "-t", sha])
        return result.ok and result.stdout.strip() == "commit"

    def ensure_store(self) -> Path:
        """Create the bare store if missing (temp dir, then rename); return its path."""
        with self._locked():
            self._init_store()
        return self.store

    # ---- store

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the store's file lock; a lock that never frees is a FetchError."""
        self.git_root.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(str(self.lock_path), timeout=self.timeout_s)
        try:
            lock.acquire()
        except filelock.Timeout as exc:
            raise FetchError(f"git cache for {self.url} is locked by another process ({self.lock_path})") from exc
        try:
            yield
        finally:
            lock.release()

    def _init_store(self) -> None:
        """A complete store is one whose directory exists: it appears by rename only."""
        if self.store.is_dir():
            self._check_marker()
            _write_attributes(self.store)
            return
        tmp = Path(tempfile.mkdtemp(prefix=f".{self.key}.tmp-", dir=self.git_root))
        try:
            self._git_checked(
                ["init", "--bare", "--quiet", "--template=", str(tmp)],
                use_store=False,
                what=f"create a git store in {tmp}",
            )
            (tmp / URL_MARKER).write_text(self.url + "\n", encoding="utf-8")
            _write_attributes(tmp)
            os.replace(tmp, self.store)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _check_marker(self) -> None:
        """Guard against a key collision or a store written for another URL."""
        marker = self.store / URL_MARKER
        named = marker.read_text(encoding="utf-8").strip() if marker.is_file() else None
        if named != self.url:
            raise FetchError(f"git cache {self.store} belongs to {named!r}, not {self.url}; remove it and run again")

    # ---- fetch

    def _ensure_commit(self, sha: str, pr: int | None) -> tuple[str, int]:
        """Make ``sha`` present in the store; return (how it came, bytes fetched)."""
        self._init_store()
        os.utime(self.store)  # last used, for `kvprobe cache ls` / `prune`
        if self.has_commit(sha):
            return "cache", 0
        before = tree_size(self.store / "objects")
        via = self._fetch(sha, pr)
        self._git_checked(["update-ref", _pin_ref(sha), sha], what=f"pin {sha} in the cache")
        return via, max(0, tree_size(self.store / "objects") - before)

    def _fetch(self, sha: str, pr: int | None) -> str:
        """Fetch by SHA, then via refs/pull/<pr>/head (shallow, then deeper if it moved)."""
        tried, reasons = ["by SHA"], [self._fetch_refspec(f"{sha}:{_pin_ref(sha)}", depth=1)]
        if self.has_commit(sha):
            return "sha"
        if pr is not None:
            pull = f"refs/pull/{pr}/head"
            for depth in (1, PR_DEEP_FETCH_DEPTH):
                result = self._fetch_refspec(f"+{pull}:refs/kvprobe/{pull}", depth=depth)
                if self.has_commit(sha):
                    return pull
                tried.append(f"{pull} depth {depth}")
                reasons.append(result)
        why = "; ".join(dict.fromkeys(r for r in reasons if r != "ok")) or "no such commit"
        raise FetchError(f"commit {sha} could not be fetched from {self.url} (tried {', '.join(tried)}): {why}")

    def _parents(self, sha: str) -> list[str]:
        """The parents named in the commit object (present even where the store is shallow)."""
        text = self._git_checked(["cat-file", "commit", sha], what=f"read commit {sha}")
        header = text.split("\n\n", 1)[0]
        return [line.split(" ", 1)[1] for line in header.splitlines() if line.startswith("parent ")]

    def _deepen(self, sha: str, pr: int | None) -> None:
        """Fetch PR_DEEP_FETCH_DEPTH commits of ``sha``'s history (by SHA, else via the PR ref)."""
        why = self._fetch_refspec(f"{sha}:{_pin_ref(sha)}", depth=PR_DEEP_FETCH_DEPTH)
        if why != "ok" and pr is not None:
            pull = f"refs/pull/{pr}/head"
            why = self._fetch_refspec(f"+{pull}:refs/kvprobe/{pull}", depth=PR_DEEP_FETCH_DEPTH)
        if why != "ok":
            raise FetchError(f"could not fetch the history of {sha} from {self.url}: {why}")

    def _is_ancestor(self, ancestor: str, descendant: str) -> bool:
        result = self._git_capture(["merge-base", "--is-ancestor", ancestor, descendant])
        if result.returncode not in (0, 1):
            raise FetchError(f"could not compare {ancestor} and {descendant}: {result.summary(200)}")
        return result.returncode == 0

    def _fetch_refspec(self, refspec: str, *, depth: int) -> str:
        """One shallow fetch; returns git's last stderr line ('ok' on success)."""
        argv = [
            "fetch",
            f"--depth={depth}",
            "--no-tags",
            "--no-recurse-submodules",
            "--no-write-fetch-head",
            "--quiet",
            "--",
            self.url,
            refspec,
        ]
        with tempfile.TemporaryDirectory(prefix="kvprobe-git-") as scratch:
            result = proc.run(
                self._argv(argv),
                timeout_s=self.timeout_s,
                env=self._env(),
                stdout_path=Path(scratch, "stdout"),
                stderr_path=Path(scratch, "stderr"),
                cwd=self.store,
            )
            if result.timed_out:
                raise FetchError(
                    f"fetching {refspec.split(':')[0].lstrip('+')} from "
                    f"{self.url} timed out after {self.timeout_s:.0f}s"
                )
            return "ok" if result.ok else result.summary(200)

    # ---- export and verification

    def _export(self, sha: str, target: Path) -> str:
        """Write the commit's tree to ``target`` (new) and check it hashes to the commit's tree."""
        kind = self._git_capture(["cat-file", "-t", sha])
        if kind.stdout.strip() != "commit":
            raise CheckoutError(f"{sha} in {self.url} is a {kind.stdout.strip() or 'missing'} object, not a commit")
        target.mkdir(parents=True)
        self._checkout_tree(sha, target)
        return self.verify_export(sha, target)

    def _checkout_tree(self, sha: str, target: Path) -> None:
        """read-tree into a throwaway index, then checkout-index: files only, no .git."""
        with tempfile.TemporaryDirectory(prefix="kvprobe-index-") as scratch:
            env = {"GIT_INDEX_FILE": str(Path(scratch, "index"))}
            what = f"export {sha} from {self.url}"
            self._git_checked(["read-tree", sha], env=env, what=what, error=CheckoutError)
            self._git_checked(
                ["--work-tree", str(target), "checkout-index", "-a", "-f", f"--prefix={target}/"],
                env=env,
                what=what,
                error=CheckoutError,
                cwd=target,
                timeout_s=self.timeout_s,
            )

    def verify_export(self, sha: str, root: Path) -> str:
        """Hash the files under ``root`` as a git tree and compare with ``sha``'s tree.

        Returns the tree SHA; raises CheckoutError on any difference (content, mode,
        symlink, extra or missing file).
        """
        sha = validate_sha(sha)
        expected = self._tree_id(sha)
        with tempfile.TemporaryDirectory(prefix="kvprobe-index-") as scratch:
            env = {"GIT_INDEX_FILE": str(Path(scratch, "index"))}
            what = f"hash the exported tree at {root}"
            self._git_checked(
                ["--work-tree", str(root), "add", "-A", "-f", "--", "."],
                env=env,
                what=what,
                error=CheckoutError,
                cwd=root,
                timeout_s=self.timeout_s,
            )
            self._add_gitlinks(sha, env)
            exported = self._git_checked(["write-tree"], env=env, what=what, error=CheckoutError)
        return compare_trees(sha, expected, exported, root)

    def _tree_id(self, sha: str) -> str:
        """The commit's tree id: what an export must hash to, and its tree cache key."""
        return self._git_checked(
            ["rev-parse", "--verify", f"{sha}^{{tree}}"], what=f"read the tree of {sha}", error=CheckoutError
        )

    def _add_gitlinks(self, sha: str, env: Mapping[str, str]) -> None:
        """Put the commit's submodule entries into the hashing index.

        Submodules are never fetched, so their directories are exported empty and
        ``add`` cannot see them; the pinned gitlink SHAs are taken from the commit.
        """
        # Read in full: a large tree's listing exceeds capture()'s output limit.
        listing = self._git_bytes(["ls-tree", "-r", "-z", sha], error=CheckoutError)
        for entry in filter(None, listing.split(b"\0")):
            meta, _, raw_path = entry.partition(b"\t")
            mode, _kind, oid = meta.decode("ascii").split(" ")
            path = raw_path.decode("utf-8", errors="surrogateescape")
            if mode == "160000":
                self._git_checked(
                    ["update-index", "--add", "--cacheinfo", f"{mode},{oid},{path}"],
                    env=env,
                    error=CheckoutError,
                    what=f"record submodule {path!r} of {sha}",
                )

    # ---- running git

    def _argv(self, args: list[str], use_store: bool = True) -> list[str]:
        prefix = ["git", *GIT_CONFIG_ARGS]
        if use_store:
            prefix += ["--git-dir", str(self.store)]
        return prefix + args

    def _env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return proc.clean_env({**GIT_ENV, **(extra or {})}, network=True)

    def _git_capture(
        self,
        args: list[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        timeout_s: float | None = None,
        use_store: bool = True,
    ) -> proc.Captured:
        return proc.capture(
            self._argv(args, use_store),
            env=self._env(env),
            timeout_s=timeout_s or _PLUMBING_TIMEOUT_S,
            cwd=cwd or self.git_root,
        )

    def _git_checked(
        self,
        args: list[str],
        *,
        what: str,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        timeout_s: float | None = None,
        use_store: bool = True,
        error: type[Exception] = FetchError,
    ) -> str:
        """Run git and return stripped stdout; raise ``error`` with git's last line."""
        result = self._git_capture(args, env=env, cwd=cwd, timeout_s=timeout_s, use_store=use_store)
        if not result.ok:
            raise error(f"could not {what}: {result.summary(200)}")
        return result.stdout.strip()

    def _git_bytes(self, args: list[str], *, error: type[Exception] = FetchError) -> bytes:
        """Run git and return raw stdout bytes (capture() decodes text; blobs are bytes)."""
        with tempfile.TemporaryDirectory(prefix="kvprobe-git-") as scratch:
            out = Path(scratch, "stdout")
            result = proc.run(
                self._argv(args),
                timeout_s=_PLUMBING_TIMEOUT_S,
                env=self._env(),
                stdout_path=out,
                stderr_path=Path(scratch, "stderr"),
                cwd=self.git_root,
            )
            if not result.ok:
                raise error(f"could not read {args[-1]} from {self.url}: {result.summary(200)}")
            return out.read_bytes()


# --------------------------------------------------------------------------- helpers


def _pin_ref(sha: str) -> str:
    """A ref per fetched pin keeps its objects safe from any pruning."""
    return f"refs/kvprobe/commits/{sha}"


def _write_attributes(git_dir: Path) -> None:
    info = git_dir / "info"
    info.mkdir(exist_ok=True)
    target = info / "attributes"
    if not target.is_file() or target.read_text(encoding="utf-8") != _NEUTRAL_ATTRIBUTES:
        target.write_text(_NEUTRAL_ATTRIBUTES, encoding="utf-8")


def _check_dest(dest: Path) -> None:
    """Never overwrite: dest must be absent or an empty directory."""
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise CheckoutError(f"destination {dest} exists and is not a directory")
    if dest.is_dir() and any(dest.iterdir()):
        raise CheckoutError(f"destination {dest} exists and is not empty")

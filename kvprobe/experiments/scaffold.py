"""``kvprobe new``: scaffold ``probes/<id>/`` for a PR pair, with pins checked before writing.

The pair is git commits (``--base/--head``), release wheels (``--release-base/--release-head``),
or both. Wheel-only (no commits) is for hosts that reach PyPI but not the git upstream: then
there is only the ``release`` pin set, no upstream tests (wheels carry none) and no git at all.
``--tests-only`` scaffolds a pair whose evidence is the upstream tests alone: no probe file.

``--upstream`` is the canonical repository URL written into ``upstream``; ``--repo`` is only
where the commits are fetched from (a mirror, a local clone) and is never written.

Order of checks (cheap and local first, so bad input never starts git or pip):

1. the id (``models.ID_RE``) and that no folder of that name exists anywhere on the
   experiment search path or in the target directory (never overwrite);
2. SHAs, PR number, repository URL, test paths, release versions and profile, locally;
3. git (only with ``--base/--head`` or ``--tests-commit``): the commits fetched into the cache
   by SHA (or via ``refs/pull/N/head``), base checked to be an ancestor of head (swapped:
   PinError; diverged: a warning, and the header says so; further back than the history
   fetched: a note, and no claim), every
   ``--test`` path read at head and at the tests commit (``--tests-commit`` with release
   wheels writes a ``release-tests`` pin set: the wheels' code, that commit's test files);
   notes for a test the PR did not change or that defines no test, a reverting head, and a
   package not found at head;
4. pip: for ``--release-base/--release-head``, the wheel is downloaded once to read its
   exact file name and sha256, and kept in the wheel cache for the first run;
5. the files are written into a temp folder, loaded back with
   :func:`kvprobe.experiments.experiment.load_file`, then renamed into place; the header
   comment of experiment.toml lists what was checked, and nothing else.

Errors: an unknown commit in a repository that answers is bad input (PinError, exit 2);
a repository that cannot be reached is FetchError (exit 3, could not observe).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvprobe.errors import FetchError, PinError, UsageError
from kvprobe.experiments import tomltext
from kvprobe.experiments.experiment import FILENAME, load_file
from kvprobe.model.records import ID_RE, VULN_ID_RE, Experiment, FixKind, GitPin, WheelPin
from kvprobe.names import EXPERIMENT_SCHEMA, SIDES
from kvprobe.progress import Reporter
from kvprobe.resources import experiment_dirs
from kvprobe.text import for_shell

if TYPE_CHECKING:
    from kvprobe.sources.git import GitSource

DEFAULT_UPSTREAM = "https://github.com/sgl-project/sglang"
GIT_PINS, RELEASE_PINS, RELEASE_TESTS_PINS = "commits", "release", "release-tests"
TEMPLATE_MOCKS = {"none yet": "template: declare what this probe mocks"}
# The template's placeholder case: it observes where the package came from, not the fix.
TEMPLATE_CASE = "template.import"
# Folder names on the search path that are not experiments (dependency profiles live there).
_RESERVED_IDS = ("profiles",)
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")
_PACKAGE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.!+-]*")
_PYTHON_XY_RE = re.compile(r"3\.\d+")
# pytest's default test names (python_functions = "test", python_classes = "Test").
_TEST_DEF_RE = re.compile(rb"^[ \t]*(?:async[ \t]+)?def[ \t]+test|^[ \t]*class[ \t]+Test", re.MULTILINE)
_PIP_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class NewSpec:
    """What ``kvprobe new`` was asked for (unchecked user input)."""

    experiment_id: str
    base: str | None = None  # None (with head) only when release wheels are the pins
    head: str | None = None
    pr: int | None = None
    repo: str | None = None  # where to fetch from (a mirror); None: the upstream itself
    tests: tuple[str, ...] = ()
    release_base: str | None = None
    release_head: str | None = None
    package: str = "sglang"
    profile: str = "sglang-cpu"
    probes_dir: Path = Path("probes")
    title: str | None = None
    vulnerability_id: str | None = None  # None: a TODO comment in place of [vulnerability]
    aliases: tuple[str, ...] = ()
    fix_kind: str | None = None
    upstream: str = DEFAULT_UPSTREAM  # the canonical URL, written into the experiment
    tests_only: bool = False  # the upstream tests are the evidence: no probe
    tests_commit: str | None = None  # with release wheels: the upstream commit to take test files from


@dataclass(frozen=True)
class Created:
    """What was written, and whether ``kvprobe run ID`` will find it without more setup."""

    directory: Path
    experiment_file: Path
    probe_file: Path | None  # None for --tests-only
    on_search_path: bool


@dataclass(frozen=True)
class _CommitFacts:
    """What fetching --base/--head showed."""

    python_path: str | None  # where the package lives at head; None: not found
    head_via: str  # how head came: "cache", "sha" or the pull ref (fetch_pin)
    ancestry: str | None  # how base stands to head, as the header says it (None: history too shallow)


@dataclass(frozen=True)
class _Checked:
    """The spec after every check: normalized URL, pins, python path, wheel pins."""

    spec: NewSpec
    url: str  # the canonical upstream, written
    tests: tuple[str, ...]
    commits: _CommitFacts | None  # None: no --base/--head
    wheels: tuple[WheelPin, WheelPin] | None

    @property
    def python_path(self) -> str | None:
        return self.commits.python_path if self.commits else None


def create(spec: NewSpec, *, cache_root: Path, reporter: Reporter | None = None) -> Created:
    """Check everything, then write ``probes_dir/<id>/``; raises UsageError/PinError (bad
    input, exit 2) or FetchError (git/pip could not be reached, exit 3). Writes nothing on error."""
    reporter = reporter or Reporter()
    upstream, fetch_url, tests = check_local(spec)
    commits = _check_commits(spec, fetch_url, tests, cache_root, reporter) if has_commits(spec) else None
    if spec.tests_commit is not None:
        _check_tests_commit(spec, fetch_url, tests, cache_root, reporter)
    wheels = _lookup_releases(spec, cache_root, reporter)
    checked = _Checked(spec, upstream, tests, commits, wheels)
    directory = _write(checked)
    probes_dir = spec.probes_dir.resolve()
    probe = None if spec.tests_only else directory / probe_filename(spec.experiment_id)
    return Created(directory, directory / FILENAME, probe, probes_dir in experiment_dirs())


def unfinished(exp: Experiment) -> list[str]:
    """The experiment's fields that still hold a scaffold TODO (title, fix.summary, scope):
    a bundle quotes them as they are, next to its verdict."""
    fields = [("title", exp.title), ("fix.summary", exp.fix.summary), ("scope.shows", exp.scope.shows)]
    fields += [("scope.does_not_show", text) for text in exp.scope.does_not_show]
    return list(dict.fromkeys(name for name, text in fields if "TODO" in text))


# --- local checks (no git, no pip) -------------------------------------------------------


def check_local(spec: NewSpec) -> tuple[str, str, tuple[str, ...]]:
    """Everything checkable without a process; returns (upstream URL, URL to fetch from, test paths)."""
    from kvprobe.sources.git import (
        check_local_repository,
        validate_pr,
        validate_rel_path,
        validate_url,
    )

    check_id(spec.experiment_id)
    _check_dir(spec.probes_dir)
    check_free(spec.experiment_id, spec.probes_dir)
    _check_release_args(spec)
    if has_commits(spec):
        _check_sha("--base", spec.base)
        _check_sha("--head", spec.head)
        if spec.base == spec.head:
            raise PinError(f"--base and --head are the same commit {spec.base}: nothing to compare")
    elif spec.base is not None or spec.head is not None:
        raise UsageError(
            "--base and --head go together (the commits before and after the fix); "
            f"only {'--base' if spec.base is not None else '--head'} was given"
        )
    elif spec.release_base is None:
        raise UsageError(
            "--base and --head are required (the commits before and after the fix), "
            "unless --release-base and --release-head name release wheels"
        )
    elif spec.tests and spec.tests_commit is None:
        raise UsageError(
            "--test needs git pins (--base and --head), or --tests-commit with release wheels: "
            "release wheels carry no tests"
        )
    _check_tests_commit_args(spec)
    validate_pr(spec.pr)
    tests = tuple(dict.fromkeys(validate_rel_path(t) for t in spec.tests))
    for test in tests:
        if not test.endswith(".py"):
            raise UsageError(f"--test {test}: an upstream test is a .py file")
    if spec.tests_only and not ((has_commits(spec) or spec.tests_commit) and tests):
        raise UsageError(
            "--tests-only needs --base/--head (or --tests-commit) and at least one --test: "
            "the upstream tests are the evidence"
        )
    _check_profile(spec.profile)
    _check_vulnerability(spec)
    upstream = validate_url(spec.upstream)
    fetch_url = validate_url(spec.repo) if spec.repo is not None else upstream
    if has_commits(spec):
        check_local_repository(fetch_url)  # before a git store is made in the cache for it
    return upstream, fetch_url, tests


def _check_sha(flag: str, value: str | None) -> None:
    """A full SHA, with the flag named: a researcher pasting from `git log --oneline` or a
    branch name learns which argument to fix and how."""
    from kvprobe.sources.git import validate_sha

    try:
        validate_sha(value)
    except PinError as exc:
        raise PinError(
            f"{flag} {value!r} is not a full 40-hex lowercase commit SHA (branch names, tags and short SHAs "
            "are not pins)",
            hints=[*exc.hints, f"resolve it in a clone: git rev-parse {for_shell(f'{value}^{{commit}}')}"],
        ) from exc


def check_id(experiment_id: str) -> str:
    """The id names a folder and a probe module: lowercase letters, digits, '-'."""
    if not ID_RE.fullmatch(experiment_id or ""):
        bad = sorted({ch for ch in experiment_id or "" if ch not in _ID_CHARS})
        detail = f"characters not allowed: {' '.join(repr(c) for c in bad)}; " if bad else ""
        raise UsageError(
            f"bad experiment id {experiment_id!r}: {detail}use 2-63 characters, lowercase "
            "letters, digits and '-', starting with a letter (e.g. pr-38935-admission)"
        )
    if experiment_id in _RESERVED_IDS:
        raise UsageError(f"experiment id {experiment_id!r} is reserved (probes/{experiment_id}/ is not an experiment)")
    return experiment_id


def _check_dir(probes_dir: Path) -> None:
    """--dir is a folder, or can be made in the nearest folder above it that exists and this
    user may write (checked before any fetch; the write itself says why it failed)."""
    path = Path(probes_dir).absolute()
    above = path
    try:
        while not os.path.lexists(above) and above != above.parent:
            above = above.parent
        if not above.is_dir():
            raise UsageError(f"--dir {probes_dir}: {above} is not a directory")
    except OSError as exc:
        raise UsageError(f"--dir {probes_dir}: {exc.strerror or exc}") from exc
    if not os.access(above, os.W_OK | os.X_OK):
        raise UsageError(f"--dir {probes_dir}: cannot create a folder in {above} (not writable)")


def check_free(experiment_id: str, probes_dir: Path) -> None:
    """No folder named ``experiment_id`` anywhere an experiment could be found; never overwrite."""
    for directory in [Path(probes_dir).resolve(), *experiment_dirs()]:
        taken = directory / experiment_id
        if taken.exists() or taken.is_symlink():
            raise UsageError(
                f"experiment id {experiment_id!r} is already taken: {taken} exists; nothing was written",
                hints=["choose another id, or remove that folder yourself"],
            )


def has_commits(spec: NewSpec) -> bool:
    """Whether git pins were asked for (both --base and --head); else only release wheels."""
    return spec.base is not None and spec.head is not None


def _check_release_args(spec: NewSpec) -> None:
    if (spec.release_base is None) != (spec.release_head is None):
        raise UsageError("--release-base and --release-head go together (a pair of released versions)")
    if spec.release_base is None:
        return
    if not _PACKAGE_RE.fullmatch(spec.package):
        raise UsageError(f"--package {spec.package!r} is not a package name")
    for flag, version in (("--release-base", spec.release_base), ("--release-head", spec.release_head)):
        if not _VERSION_RE.fullmatch(version or ""):
            raise UsageError(f"{flag} {version!r} is not an exact version (e.g. 0.5.21)")
    if spec.release_base == spec.release_head:
        raise UsageError(f"--release-base and --release-head are the same version {spec.release_base}")


def _check_tests_commit_args(spec: NewSpec) -> None:
    """--tests-commit: a full SHA, with release wheels to run the tests against and a --test."""
    if spec.tests_commit is None:
        return
    _check_sha("--tests-commit", spec.tests_commit)
    if spec.release_base is None:
        raise UsageError(
            "--tests-commit goes with --release-base/--release-head: it runs an upstream commit's "
            "test files against release wheels"
        )
    if not spec.tests:
        raise UsageError("--tests-commit needs at least one --test: the test files to take from that commit")


def _check_vulnerability(spec: NewSpec) -> None:
    kinds = ", ".join(k.value for k in FixKind)
    if spec.vulnerability_id is None:
        if spec.aliases or spec.fix_kind:
            raise UsageError("--alias and --fix-kind go with --vulnerability-id")
        return
    for flag, vid in (("--vulnerability-id", spec.vulnerability_id), *(("--alias", a) for a in spec.aliases)):
        if not VULN_ID_RE.fullmatch(vid):
            raise UsageError(
                f"{flag} {vid!r} is not a vulnerability id: use CVE-YYYY-N..., GHSA-xxxx-xxxx-xxxx, "
                "PYSEC-YYYY-N or, where none exists, KVPROBE-YYYY-NNNN (docs/vulnerability-ids.md)"
            )
    if spec.vulnerability_id in spec.aliases:
        raise UsageError(f"--alias {spec.vulnerability_id} is the --vulnerability-id itself")
    if spec.fix_kind not in {k.value for k in FixKind}:
        raise UsageError(f"--vulnerability-id needs --fix-kind, one of {kinds}: only a security fix is exported as VEX")


def _check_profile(name: str) -> None:
    from kvprobe.env.venv import load_profile

    load_profile(name)


# --- git ---------------------------------------------------------------------------------


def _check_commits(
    spec: NewSpec, url: str, tests: tuple[str, ...], cache_root: Path, reporter: Reporter
) -> _CommitFacts:
    """Fetch both commits, check base is an ancestor of head, read each test at head."""
    from kvprobe.sources.git import GitSource

    assert spec.base is not None and spec.head is not None, "called only when has_commits(spec)"
    source = GitSource(url, cache_root)
    via = {}
    for side, sha in (("base", spec.base), ("head", spec.head)):
        with reporter.step(f"{side}: fetching {sha[:12]} from {url}"):
            via[side] = fetch_pin(source, GitPin(sha), spec.pr, side)
    with reporter.step(f"base: checking that {spec.base[:12]} is an ancestor of head {spec.head[:12]}"):
        ancestry = check_ancestry(source, spec, reporter)
    head = GitPin(spec.head)
    for test in tests:
        text = source.read_file(head, test, pr=spec.pr)
        if text is None:
            raise UsageError(
                f"--test {test} does not exist at head {spec.head} in {url}",
                hints=["paths are relative to the repository root, as at the head commit"],
            )
        _note_test_file(test, text, source.read_file(GitPin(spec.base), test, pr=spec.pr), reporter)
    _note_revert(source.subject(head, pr=spec.pr), head, reporter)
    python_path = _python_path(source, head, spec)
    if python_path is None:
        module = import_name(spec.package)
        reporter.note(
            f"--package {spec.package}: no {module}/__init__.py or {module}.py at head under python/, src/ "
            "or the root; python_path is left a TODO (is --package the upstream's import package?)"
        )
    return _CommitFacts(python_path, via["head"], ancestry)


def _note_test_file(test: str, at_head: bytes, at_base: bytes | None, reporter: Reporter) -> None:
    """What a researcher should know about a --test before running it (notes, not errors:
    an unchanged test may still reach the fixed code; a project may name its tests otherwise)."""
    if at_head == at_base:
        reporter.note(
            f"--test {test} is the same at base and head: the PR did not change it, so it shows "
            "the fix only if its tests reach the changed code"
        )
    if not _TEST_DEF_RE.search(at_head):
        reporter.note(
            f"--test {test} defines no test function or Test class at head: pytest may collect "
            "nothing from it, and a run that collects nothing ends in error"
        )


def _note_revert(subject: str, head: GitPin, reporter: Reporter) -> None:
    """A revert as head takes a change out: if that change is the fix, head is the unfixed side."""
    if subject.startswith(("Revert ", 'Revert"')):
        reporter.note(
            f"head {head.commit[:12]} is a revert ({subject}): base has the reverted change and head "
            "does not; if that change is the fix, pin the reverted commit and its parent instead"
        )


def _check_tests_commit(spec: NewSpec, url: str, tests: tuple[str, ...], cache_root: Path, reporter: Reporter) -> None:
    """Fetch --tests-commit and read every --test there: the release-tests pin set's files."""
    from kvprobe.sources.git import GitSource

    assert spec.tests_commit is not None, "called only with --tests-commit"
    source = GitSource(url, cache_root)
    pin = GitPin(spec.tests_commit)
    with reporter.step(f"tests: fetching {spec.tests_commit[:12]} from {url}"):
        fetch_pin(source, pin, spec.pr, "tests-commit")
    for test in tests:
        if source.read_file(pin, test, pr=spec.pr) is None:
            raise UsageError(
                f"--test {test} does not exist at --tests-commit {spec.tests_commit} in {url}",
                hints=["paths are relative to the repository root, as at that commit"],
            )


def check_ancestry(source: GitSource, spec: NewSpec, reporter: Reporter) -> str | None:
    """How --base stands to --head, as the header says it. Swapped (head an ancestor of base)
    is PinError (exit 2). Diverged is a warning, not an error: GitHub's recorded base of a PR
    is often the target branch's tip, not the PR's fork point, and published pairs use it;
    base -> head then also undoes what base has beyond the fork point, and the scaffold says
    so. None (with a note) when the shallow history fetched cannot tell."""
    from kvprobe.sources.git import ANCESTOR, PR_DEEP_FETCH_DEPTH, REVERSED, UNKNOWN

    assert spec.base is not None and spec.head is not None, "called only when has_commits(spec)"
    found = source.ancestry(GitPin(spec.base), GitPin(spec.head), pr=spec.pr)
    if found.relation == ANCESTOR:
        return "base an ancestor of head"
    if found.relation == UNKNOWN:
        reporter.note(
            f"could not confirm that --base {spec.base} is an ancestor of --head {spec.head}: it is not "
            f"among the {PR_DEEP_FETCH_DEPTH} commits before head and they share none of the "
            f"{PR_DEEP_FETCH_DEPTH} before each; a PR pair's base is usually the fix's parent"
        )
        return None
    if found.relation == REVERSED:
        raise PinError(
            f"--base {spec.base} is not an ancestor of --head {spec.head}: head is an ancestor of base (swapped?)",
            hints=["--base is the commit before the fix, --head the commit with it"],
        )
    reporter.note(
        f"warning: --base {spec.base} is not an ancestor of --head {spec.head}: they diverged at "
        f"{found.fork_point}, so base -> head also undoes what base has beyond it; for the PR's own "
        f"changes alone, give --base {found.fork_point}"
    )
    return f"base NOT an ancestor of head: they diverged at {found.fork_point}"


def fetch_pin(source: GitSource, pin: GitPin, pr: int | None, side: str) -> str:
    """Fetch one pin and return how it came ("cache", "sha" or a pull ref); an answering
    repository without the commit is bad input (exit 2)."""
    try:
        return source.fetch_commit(pin, pr=pr)
    except FetchError as exc:
        unreachable = source.remote_answers()
        if unreachable is not None:
            raise FetchError(
                f"could not check --{side} {pin.commit}: {source.url} did not answer ({unreachable})"
            ) from exc
        via = "by SHA" + (f" and via refs/pull/{pr}/head" if pr else "")
        hints = [] if pr else ["a commit reachable only from a pull request needs --pr N"]
        raise PinError(f"--{side} {pin.commit} is not a commit in {source.url} (fetched {via})", hints=hints) from exc


def _python_path(source: GitSource, head: GitPin, spec: NewSpec) -> str | None:
    """Where the package lives at head: 'python' (SGLang), 'src' or '.'; None if not found."""
    module = import_name(spec.package)
    for entry in ("python", "src", "."):
        prefix = "" if entry == "." else f"{entry}/"
        for rel in (f"{prefix}{module}/__init__.py", f"{prefix}{module}.py"):
            if source.read_file(head, rel, pr=spec.pr) is not None:
                return entry
    return None


def import_name(package: str) -> str:
    return package.replace("-", "_").replace(".", "_").lower()


# --- releases ----------------------------------------------------------------------------


def _lookup_releases(spec: NewSpec, cache_root: Path, reporter: Reporter) -> tuple[WheelPin, WheelPin] | None:
    if spec.release_base is None:
        return None
    assert spec.release_head is not None, "_check_release_args: both or neither"
    python = _profile_python(spec.profile)
    pins = []
    for version in (spec.release_base, spec.release_head):
        with reporter.step(f"looking up the {spec.package} {version} wheel"):
            pins.append(lookup_wheel(spec.package, version, python, cache_root=cache_root))
    return pins[0], pins[1]


def _profile_python(profile: str) -> str | None:
    from kvprobe.env.venv import load_profile

    python = load_profile(profile).python
    return python if _PYTHON_XY_RE.fullmatch(python) else None


def lookup_wheel(package: str, version: str, python: str | None = None, *, cache_root: Path) -> WheelPin:
    """Download ``package==version``'s wheel for this platform (and ``python``) with pip into a
    temp dir; return its exact file name and sha256, and keep the file in the wheel cache
    (the entry `kvprobe run` reads), so the first run does not download it again.
    FetchError if pip cannot get one wheel."""
    from kvprobe.files import sha256_file
    from kvprobe.sources.wheel import WheelSource, pip_download

    with tempfile.TemporaryDirectory(prefix="kvprobe-new-wheel-") as scratch:
        flags = ["--only-binary=:all:", *(["--python-version", python] if python else [])]
        got = pip_download(
            f"{package}=={version}",
            Path(scratch),
            flags,
            timeout_s=_PIP_TIMEOUT_S,
            failure=f"could not look up the {package} {version} wheel",
        )
        wheels = [p for p in got if p.name.endswith(".whl")]
        if len(wheels) != 1:
            raise FetchError(
                f"pip download of {package}=={version} gave "
                f"{', '.join(p.name for p in got) or 'nothing'}, not one wheel"
            )
        pin = WheelPin(package, version, wheels[0].name, sha256_file(wheels[0]))
        WheelSource(cache_root).keep(pin, wheels[0])
        return pin


# --- writing -----------------------------------------------------------------------------


def probe_filename(experiment_id: str) -> str:
    return f"probe_{experiment_id.replace('-', '_')}.py"


def _write(checked: _Checked) -> Path:
    """Write into a temp folder beside the target, load it back, then rename it into place."""
    spec = checked.spec
    probes_dir = Path(spec.probes_dir)
    final = probes_dir / spec.experiment_id
    try:
        probes_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{spec.experiment_id}.new-", dir=probes_dir))
    except OSError as exc:
        raise UsageError(f"--dir {probes_dir}: cannot create a folder there: {exc.strerror or exc}") from exc
    try:
        staged = tmp / spec.experiment_id
        staged.mkdir()
        if not spec.tests_only:
            (staged / probe_filename(spec.experiment_id)).write_text(render_probe(checked), encoding="utf-8")
        (staged / FILENAME).write_text(render_experiment(checked), encoding="utf-8")
        load_file(staged / FILENAME)
        check_free(spec.experiment_id, probes_dir)  # again: someone may have been quicker
        try:
            os.rename(staged, final)
        except OSError as exc:
            raise UsageError(f"could not create {final}: {exc}; nothing was written") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final.resolve()


def render_experiment(checked: _Checked) -> str:
    """experiment.toml: pins filled in, TODOs where only a human can write the text."""
    spec, s = checked.spec, tomltext.string
    title = spec.title or (
        f"PR #{spec.pr}: TODO one line on what the fix changes" if spec.pr else "TODO: one line on what the fix changes"
    )
    lines = [
        *_header_lines(checked),
        f'schema = "{EXPERIMENT_SCHEMA}"',
        f"id = {s(spec.experiment_id)}",
        f"title = {s(title)}",
        f'layer = "{"upstream-tests" if spec.tests_only else "diff-probe"}"',
        f"upstream = {s(checked.url)}",
        f"profile = {s(spec.profile)}",
        f'default_pins = "{GIT_PINS if has_commits(spec) else RELEASE_PINS}"',
        "",
        "[fix]",
        *([f"prs = [{spec.pr}]"] if spec.pr else []),
        *([f"release = {s(spec.release_head)}"] if spec.release_head else []),
        'summary = "TODO: what the fix changes, where (file, function), and what upstream calls it"',
        "",
        *_vulnerability_lines(spec),
        *_git_pin_lines(checked),
        *_wheel_pin_lines(checked),
        "[checks]",
        *_test_lines(checked),
        *([] if spec.tests_only else [f'probes = [{{ path = "{probe_filename(spec.experiment_id)}" }}]']),
        "",
        "[scope]",
        'shows = "TODO: what the evidence shows, in one paragraph, with what is mocked"',
        "does_not_show = [",
        '  "TODO: what the evidence does not show (GPU, transport, a running server, ...)",',
        "]",
        "",
        *_expect_note(spec),
    ]
    return "\n".join(lines) + "\n"


def _header_lines(checked: _Checked) -> list[str]:
    """What `new` checked, and only that: a claim the scaffold cannot back is not written."""
    spec = checked.spec
    done = []
    if checked.commits is not None:
        ancestry = checked.commits.ancestry
        done.append("both commits fetched" + (f", {ancestry}" if ancestry else ""))
        if checked.tests:
            done.append("each test file read at head")
    if spec.tests_commit is not None:
        done.append("the tests commit fetched and each test file read there")
    if checked.wheels is not None:
        done.append("each wheel's file name and sha256 computed")
    text = (
        f"Scaffolded by `kvprobe new`. The pins below were checked ({'; '.join(done)}); "
        "replace every TODO before committing."
    )
    return ["# " + line for line in textwrap.wrap(text, width=90)]


def _vulnerability_lines(spec: NewSpec) -> list[str]:
    if spec.vulnerability_id is None:
        return [
            "# TODO: name what the evidence is about, for VEX/OSV (docs/vulnerability-ids.md);",
            "# `kvprobe report --format openvex` refuses an experiment without it:",
            "# [vulnerability]",
            '# id = "CVE-YYYY-NNNNN"  # or GHSA-..., or KVPROBE-YYYY-NNNN where none exists',
            '# aliases = ["GHSA-xxxx-xxxx-xxxx"]',
            '# fix_kind = "security"  # or hardening, performance, correctness: not exported as VEX',
            "",
        ]
    aliases = ", ".join(tomltext.string(a) for a in spec.aliases)
    return [
        "[vulnerability]",
        f"id = {tomltext.string(spec.vulnerability_id)}",
        f"aliases = [{aliases}]",
        f"fix_kind = {tomltext.string(spec.fix_kind or '')}",
        "",
    ]


def _expect_note(spec: NewSpec) -> list[str]:
    """Where the expectations come from: a reviewed run, recorded below this line."""
    first = "Run, review the upstream tests' transitions" if spec.tests_only else "Write the probe, run, review"
    return [
        "# Expectations: `kvprobe run` reports no-expectations (exit 1) until they are recorded.",
        f"# {first}, then: kvprobe run {spec.experiment_id} --record-expectations",
    ]


def _git_pin_lines(checked: _Checked) -> list[str]:
    spec = checked.spec
    if not has_commits(spec):
        return []
    pr_text = f"PR #{spec.pr}'s base and head" if spec.pr else "the commits before and after the fix"
    # Only what this fetch showed: a head that came by SHA may be on a branch (a squash commit).
    pull = f"refs/pull/{spec.pr}/head"
    via = checked.commits.head_via if checked.commits else None
    reach = f" (head fetched via {pull})" if spec.pr and via == pull else ""
    lines = [f"[pins.{GIT_PINS}]", 'kind = "git"', f"description = {tomltext.string(pr_text + reach)}"]
    if spec.pr:
        lines.append(f"pr = {spec.pr}")
    if checked.python_path is None:
        lines.append(f"# TODO: {spec.package} was not found at head under python/, src/ or the root;")
        lines.append("# set python_path to the folder(s) its import package lives in.")
    lines += [
        f"python_path = [{tomltext.string(checked.python_path or '.')}]",
        f"[pins.{GIT_PINS}.base]",
        f'commit = "{spec.base}"',
        f"[pins.{GIT_PINS}.head]",
        f'commit = "{spec.head}"',
        "",
    ]
    return lines


def _wheel_pin_lines(checked: _Checked) -> list[str]:
    if checked.wheels is None:
        return []
    spec, s = checked.spec, tomltext.string
    lines = [
        f"[pins.{RELEASE_PINS}]",
        'kind = "wheel"',
        f"description = {s(f'{spec.package} release wheels: {spec.release_base} -> {spec.release_head}')}",
    ]
    lines += _wheel_sides(RELEASE_PINS, checked.wheels)
    if spec.tests_commit is not None:
        lines += [
            "",
            f"[pins.{RELEASE_TESTS_PINS}]",
            'kind = "wheel"',
            "description = "
            + s(
                f"{spec.package} release wheels {spec.release_base} -> {spec.release_head}, test files "
                f"from upstream commit {spec.tests_commit}"
            ),
            *([f"pr = {spec.pr}"] if spec.pr else []),
            f'tests_commit = "{spec.tests_commit}"',
            *_wheel_sides(RELEASE_TESTS_PINS, checked.wheels),
        ]
    return [*lines, ""]


def _wheel_sides(name: str, wheels: tuple[WheelPin, WheelPin]) -> list[str]:
    lines: list[str] = []
    for side, pin in zip(SIDES, wheels, strict=True):
        lines += [
            f"[pins.{name}.{side}]",
            f"package = {tomltext.string(pin.package)}",
            f"version = {tomltext.string(pin.version)}",
            f"file = {tomltext.string(pin.filename)}",
            f'sha256 = "{pin.sha256}"',
        ]
    return lines


def _test_lines(checked: _Checked) -> list[str]:
    spec = checked.spec
    if not has_commits(spec) and spec.tests_commit is None:
        return [
            "# No upstream tests: release wheels carry none (they need git: kvprobe new --base/--head,",
            "# or --tests-commit SHA to run a commit's test files against the wheels).",
        ]
    if not checked.tests:
        return [
            "# TODO: upstream test files the fix added or changed, run at head's version on both sides:",
            '# tests = [{ path = "test/..." }]',
        ]
    names = [GIT_PINS] if has_commits(spec) else []
    names += [RELEASE_TESTS_PINS] if spec.tests_commit is not None else []
    only = f", pins = [{', '.join(tomltext.string(n) for n in names)}]" if checked.wheels else ""
    return ["tests = [", *(f"  {{ path = {tomltext.string(t)}{only} }}," for t in checked.tests), "]"]


def render_probe(checked: _Checked) -> str:
    spec = checked.spec
    name = probe_filename(spec.experiment_id)[:-3]
    return _PROBE_TEMPLATE.format(
        name=name,
        package=import_name(spec.package),
        exp_id=spec.experiment_id,
        mocks=repr(TEMPLATE_MOCKS),
        template_case=TEMPLATE_CASE,
    )


_PROBE_TEMPLATE = '''"""TODO: one line on what this probe observes about the fix, base vs head.

Scaffolded by `kvprobe new {exp_id}`. It runs as is: each side's pinned tree comes first on
sys.path, so `import {package}` imports that side's code. Replace the template case with
cases that drive the code the fix changed and record what a reviewer needs to see differ
(values, calls made, objects created), e.g. obs.record("enqueued", req in queue).
An exception in a case is recorded as data (the reserved observation "raised").
"""

import importlib
import os

import kvprobe_probe as kp

PACKAGE = "{package}"

probe = kp.Probe(
    "{name}",
    # TODO: name every collaborator this probe replaces (mock, stub, fake) and why; the
    # receipt quotes this. `kvprobe run --record-expectations` refuses the template's value.
    mocks={mocks},
    description="TODO: what this probe observes",
)


@probe.case("{template_case}")
def _(obs):
    """Placeholder: where the package under test was imported from (the same on both sides).
    Delete it once real cases exist: --record-expectations refuses to record it."""
    module = importlib.import_module(PACKAGE)
    where = os.path.realpath(module.__file__)
    roots = [os.path.realpath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    root = next((r for r in roots if where.startswith(r + os.sep)), None)
    # relative to the sys.path entry it came from, so it is stable across runs and sides
    obs.record("module_file", os.path.relpath(where, root) if root else os.path.basename(where))
    obs.record("from_pinned_tree", root is not None)


# TODO: add cases like this one (names: lowercase letters, digits, '_' and '.'):
# @probe.case("door.rejected_request", "a rejected request at the admission door")
# def _(obs):
#     ...build the objects the fixed function uses, mocking only what has to be mocked...
#     obs.record("enqueued", ...)


if __name__ == "__main__":
    probe.main()
'''

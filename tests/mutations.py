"""Mutation testing of an experiment's probes: does the verdict follow the fix's lines?

A probe that says "fixed" whatever the code is a defect. This harness takes the two release
trees an experiment's wheel pin set names (the pinned wheels, sha256-checked and unpacked
through kvprobe's own wheel source), and builds a local git repository of four commits with
a fixed author and date (stable SHAs):

    base ----------- base-backported    base plus the fix's lines, moved over from head
      \\
       head -------- head-reverted      head with the fix's lines put back as base had them

Which lines are "the fix's" is a :class:`MutationSpec`: data (file + qualified name) kept
beside the test. Its changes, each applied in both directions unless it says otherwise:

- :class:`Define`: a whole definition (function, method, class, or a module/class level
  assignment such as an env default) swapped for the other release's text; a definition one
  side lacks is inserted or removed. ``revert=False`` marks scaffolding the fix added (a
  helper, a flag) that head keeps when its call sites are reverted.
- :class:`Hunks`: only the lines of one definition's base -> head diff that mention a
  pattern (a pure insertion or deletion is split into its statements first), so a release's
  unrelated edits to the same function stay where they are.
- :class:`Edit`: a hand-written edit of one definition on one side, for a fix whose lines
  cannot be lifted from the other release as they are (its neighbours moved).
- :class:`ImportName`: ``from MODULE import NAME`` added to the base (a moved call needs it).

Every change must change something (a spec that no longer matches the wheels fails loudly)
and every mutated file must still parse. :func:`experiment_copy` writes the experiment's
probe files byte for byte plus an experiment.toml with one more pin set, ``mutants``
(``kind = "git"``, base = head-reverted, head = base-backported), and the real ``kvprobe run
ID --pins mutants --repo REPO`` runs it. With the experiment's own expectations, that run
reproduces only if the reverted head reads "not fixed" exactly as base does and the
backported base reads "fixed" exactly as head does; :func:`judge` says which side failed
and how. A one-way spec (a fix the base cannot take by hand) runs its mutant beside the
other release instead, and the verdict must then be "not reproduced" on its side alone.

No SGLang source is committed anywhere: trees are built at test time from the wheels. The
repository lives under the system temp folder, keyed by a digest of the spec, the wheels and
this file, so the git store and tree cache entries kvprobe makes from it are reused by the
next session instead of piling up in the user's cache.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
import os
import re
import shutil
import tempfile
import textwrap
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import filelock

from kvprobe import proc
from kvprobe.model.records import WheelPin

Target = Literal["head", "base"]  # head: revert the fix there; base: backport it there
PIN_SET = "mutants"
# compare/5's reserved expectation that a case's code is absent on a side: presence is not
# behaviour a mutant should copy (a reverted feature keeps its code, minus its effect).
NOT_PRESENT = "not_present"
AUTHOR = ("kvprobe mutation harness", "mutations@example.invalid")
DATE = "2024-01-01T00:00:00+0000"
# How a release tree becomes a commit (author, date, messages, what is added); bump it when
# that changes, so a repository built the old way is not reused (see build_repo).
LAYOUT = 1


class SpecError(Exception):
    """A mutation spec does not apply to the trees it names (stale or wrong)."""


# --------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class Define:
    """A whole definition, by qualified name (``Class.method``, ``function``, ``Class.ATTR``)."""

    file: str
    qualname: str
    revert: bool = True  # False: scaffolding the fix added; head keeps it when reverted

    def describe(self) -> str:
        return f"{self.file}: {self.qualname} (whole definition{'' if self.revert else ', backport only'})"


@dataclass(frozen=True)
class Hunks:
    """The hunks of one definition's base -> head diff mentioning any ``select`` pattern
    (and none of ``exclude``): regular expressions searched in the hunk's lines, both sides."""

    file: str
    qualname: str
    select: tuple[str, ...]
    exclude: tuple[str, ...] = ()
    revert: bool = True

    def describe(self) -> str:
        return f"{self.file}: {self.qualname} (hunks matching {'|'.join(self.select)})"


@dataclass(frozen=True)
class Edit:
    """A hand-written edit of one definition, on one side only: the lines of ``find``
    (compared stripped, so write it dedented) replaced by ``replace``, re-indented."""

    file: str
    qualname: str
    on: Target
    find: str
    replace: str

    def describe(self) -> str:
        return f"{self.file}: {self.qualname} (hand edit on {self.on})"


@dataclass(frozen=True)
class ImportName:
    """``from module import name`` in the base (nothing to undo in head: unused there)."""

    file: str
    module: str
    name: str

    def describe(self) -> str:
        return f"{self.file}: from {self.module} import {self.name} (backport only)"


Change = Define | Hunks | Edit | ImportName


@dataclass(frozen=True)
class MutationSpec:
    """Where an experiment's fix lives in the release trees, and which ways to move it."""

    experiment: str
    prs: tuple[int, ...]
    changes: tuple[Change, ...]
    releases: tuple[str, str]  # (base, head) versions: the experiment's pin set must name them
    pins: str = "release"  # the experiment's wheel pin set whose trees are mutated
    # "revert" (head minus the fix) and/or "backport" (base plus the fix); a one-way spec
    # says why in ``note`` (e.g. the fix is a new module the base cannot take by hand)
    directions: tuple[str, ...] = ("revert", "backport")
    note: str = ""

    def files(self) -> list[str]:
        return sorted({c.file for c in self.changes})

    def digest(self) -> str:
        return hashlib.sha256(repr(self).encode()).hexdigest()


# --------------------------------------------------------------------------- locating code


@dataclass(frozen=True)
class Span:
    """Lines ``start``..``end`` (0-based, end exclusive) of a definition, and its parent's body."""

    start: int
    end: int
    indent: str
    siblings: tuple[tuple[str, int, int], ...]  # (name, start, end) of named statements beside it
    parent_end: int  # where the parent's body ends (insertion point of last resort)


def _name_of(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    return None


def _first_line(node: ast.stmt, lines: list[str]) -> int:
    """0-based first line of ``node``: decorators and the comment lines right above it."""
    start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno]) - 1
    indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
    while start > 0 and lines[start - 1].startswith(indent + "#"):
        start -= 1
    return start


def _body_of(source: str, parent: str) -> tuple[list[ast.stmt], int]:
    """The statements of ``parent`` ("" = the module) and the line its body ends on."""
    tree = ast.parse(source)
    body: list[ast.stmt] = tree.body
    end = len(source.splitlines())
    for part in filter(None, parent.split(".")):
        found = [n for n in body if _name_of(n) == part and isinstance(n, (ast.ClassDef, ast.FunctionDef))]
        if len(found) != 1:
            raise SpecError(f"{parent}: {part!r} is defined {len(found)} times where one is expected")
        body, end = found[0].body, found[0].end_lineno or end
    return body, end


def locate(source: str, qualname: str) -> Span | None:
    """Where ``qualname`` is defined in ``source``, or None. SpecError if the parent is
    missing or the name is defined more than once there."""
    parent, _, name = qualname.rpartition(".")
    lines = source.splitlines(keepends=True)
    body, parent_end = _body_of(source, parent)
    siblings = tuple(
        (n, _first_line(node, lines), node.end_lineno or node.lineno)
        for node in body
        if (n := _name_of(node)) is not None
    )
    found = [node for node in body if _name_of(node) == name]
    if not found:
        return Span(-1, -1, "", siblings, parent_end)
    if len(found) > 1:
        raise SpecError(f"{qualname} is defined {len(found)} times")
    node = found[0]
    start = _first_line(node, lines)
    line = lines[node.lineno - 1]
    return Span(start, node.end_lineno or node.lineno, line[: len(line) - len(line.lstrip())], siblings, parent_end)


def _exists(span: Span | None) -> bool:
    return span is not None and span.start >= 0


# --------------------------------------------------------------------------- applying changes


def _define(target: str, donor: str, change: Define) -> str:
    tspan, dspan = locate(target, change.qualname), locate(donor, change.qualname)
    tlines, dlines = target.splitlines(keepends=True), donor.splitlines(keepends=True)
    if _exists(tspan) and _exists(dspan):
        assert tspan and dspan
        new = tlines[: tspan.start] + dlines[dspan.start : dspan.end] + tlines[tspan.end :]
    elif _exists(tspan):  # the donor lacks it: remove it, with the blank lines after it
        assert tspan
        end = tspan.end
        while end < len(tlines) and not tlines[end].strip() and end - tspan.end < 2:
            end += 1
        new = tlines[: tspan.start] + tlines[end:]
    elif _exists(dspan):  # the target lacks it: insert after the sibling that precedes it in the donor
        assert tspan and dspan
        at = _insertion_point(tspan, dspan)
        block = dlines[dspan.start : dspan.end]
        new = tlines[:at] + ["\n"] + block + (["\n"] if at < len(tlines) and tlines[at].strip() else []) + tlines[at:]
    else:
        raise SpecError(f"{change.describe()}: defined in neither tree")
    return "".join(new)


def _insertion_point(tspan: Span, dspan: Span) -> int:
    """After the last donor sibling before the definition that the target also has; else
    at the end of the target's parent body."""
    target_ends = {name: end for name, _start, end in tspan.siblings}
    before = [name for name, start, _end in dspan.siblings if start < dspan.start]
    for name in reversed(before):
        if name in target_ends:
            return target_ends[name]
    return tspan.parent_end


@dataclass(frozen=True)
class _Segment:
    base: list[str]
    head: list[str]
    differs: bool


_CONTINUES = re.compile(r"[)\]}]|(else|elif|except|finally)\b")


def statements(lines: list[str]) -> list[list[str]]:
    """Split a run of whole lines into its outermost statements: each with the comment
    lines right above it, blank lines kept with the statement before them. A run that is
    not a sequence of whole statements comes back as one piece."""
    indents = [len(line) - len(line.lstrip()) for line in lines if line.strip()]
    if not indents:
        return [lines]
    outer = min(indents)
    out: list[list[str]] = [[]]
    started = False  # the current piece has a statement (not only comments or blanks)
    for line in lines:
        text = line.strip()
        at_outer = bool(text) and len(line) - len(line.lstrip()) == outer
        opens = at_outer and not _CONTINUES.match(text)
        if opens and started and (not text.startswith("#") or not _last_is_comment(out[-1])):
            out.append([])
            started = False
        out[-1].append(line)
        if at_outer and not text.startswith("#"):
            started = True
    pieces = [p for p in out if p]
    return pieces if all(_parses(p) for p in pieces) else [lines]


def _last_is_comment(piece: list[str]) -> bool:
    filled = [line for line in piece if line.strip()]
    return bool(filled) and filled[-1].strip().startswith("#")


def _parses(piece: list[str]) -> bool:
    try:
        ast.parse(textwrap.dedent("".join(piece)))
    except SyntaxError:
        return False
    return True


def segments(base: list[str], head: list[str]) -> list[_Segment]:
    """base -> head as equal and differing segments; a pure insertion or deletion is split
    into its statements, so one of several added blocks can be moved alone."""
    out: list[_Segment] = []
    matcher = difflib.SequenceMatcher(None, base, head, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            out.append(_Segment(base[i1:i2], head[j1:j2], False))
        elif op == "insert":
            out += [_Segment([], p, True) for p in statements(head[j1:j2])]
        elif op == "delete":
            out += [_Segment(p, [], True) for p in statements(base[i1:i2])]
        else:
            out.append(_Segment(base[i1:i2], head[j1:j2], True))
    return out


def _hunks(target: str, donor: str, change: Hunks, to: Target) -> str:
    tspan, dspan = locate(target, change.qualname), locate(donor, change.qualname)
    if not (_exists(tspan) and _exists(dspan)):
        raise SpecError(f"{change.describe()}: not defined in both trees")
    assert tspan and dspan
    tlines, dlines = target.splitlines(keepends=True), donor.splitlines(keepends=True)
    mine, theirs = tlines[tspan.start : tspan.end], dlines[dspan.start : dspan.end]
    base, head = (theirs, mine) if to == "head" else (mine, theirs)
    selected = 0
    body: list[str] = []
    for seg in segments(base, head):
        text = "".join(seg.base + seg.head)
        take = (
            seg.differs
            and any(re.search(p, text) for p in change.select)
            and not any(re.search(p, text) for p in change.exclude)
        )
        selected += take
        keep, other = (seg.head, seg.base) if to == "head" else (seg.base, seg.head)
        body += other if take else keep
    if not selected:
        raise SpecError(f"{change.describe()}: no hunk of the base -> head diff matches")
    return "".join(tlines[: tspan.start] + body + tlines[tspan.end :])


def _edit(target: str, change: Edit) -> str:
    span = locate(target, change.qualname)
    if not _exists(span):
        raise SpecError(f"{change.describe()}: not defined in the {change.on} tree")
    assert span
    lines = target.splitlines(keepends=True)
    block = lines[span.start : span.end]
    find = [line.strip() for line in textwrap.dedent(change.find).strip("\n").splitlines()]
    stripped = [line.strip() for line in block]
    hits = [i for i in range(len(block) - len(find) + 1) if stripped[i : i + len(find)] == find]
    if len(hits) != 1:
        raise SpecError(f"{change.describe()}: the text to replace is found {len(hits)} times, not once")
    at = hits[0]
    first = block[at]
    indent = first[: len(first) - len(first.lstrip())]
    replace = textwrap.dedent(change.replace).strip("\n")
    new = [(indent + line if line.strip() else "") + "\n" for line in replace.splitlines()] if replace else []
    block = block[:at] + new + block[at + len(find) :]
    return "".join(lines[: span.start] + block + lines[span.end :])


def _import(target: str, change: ImportName) -> str:
    tree = ast.parse(target)
    lines = target.splitlines(keepends=True)
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    for node in imports:
        if isinstance(node, ast.ImportFrom) and node.module == change.module and change.name in _names(node):
            raise SpecError(f"{change.describe()}: already imported there")
    same = [n for n in imports if isinstance(n, ast.ImportFrom) and n.module == change.module]
    anchor = (same or imports)[-1] if (same or imports) else None
    at = anchor.end_lineno or 0 if anchor else 0
    return "".join([*lines[:at], f"from {change.module} import {change.name}\n", *lines[at:]])


def _names(node: ast.ImportFrom) -> set[str]:
    return {alias.asname or alias.name for alias in node.names}


def apply(changes: Iterable[Change], to: Target, base: Mapping[str, str], head: Mapping[str, str]) -> dict[str, str]:
    """The files ``changes`` rewrite on side ``to`` ("head": revert the fix; "base":
    backport it), by path. SpecError when a change matches nothing or a file stops parsing."""
    mine, theirs = (head, base) if to == "head" else (base, head)
    out: dict[str, str] = {}
    for change in changes:
        if isinstance(change, (Define, Hunks)) and to == "head" and not change.revert:
            continue
        if isinstance(change, ImportName) and to == "head":
            continue
        if isinstance(change, Edit) and change.on != to:
            continue
        if change.file not in mine or change.file not in theirs:
            raise SpecError(f"{change.describe()}: no such file in both trees")
        before = out.get(change.file, mine[change.file])
        if isinstance(change, Define):
            after = _define(before, theirs[change.file], change)
        elif isinstance(change, Hunks):
            after = _hunks(before, theirs[change.file], change, to)
        elif isinstance(change, Edit):
            after = _edit(before, change)
        else:
            after = _import(before, change)
        if after == before:
            raise SpecError(f"{change.describe()}: changes nothing on {to}")
        try:
            compile(after, change.file, "exec", dont_inherit=True)
        except SyntaxError as exc:
            raise SpecError(f"{change.describe()}: {change.file} no longer parses on {to}: {exc}") from exc
        out[change.file] = after
    return out


# --------------------------------------------------------------------------- the repository


@dataclass(frozen=True)
class MutantRepo:
    """The built repository and its four commits."""

    path: Path
    base: str
    head: str
    reverted: str  # head minus the fix
    backported: str  # base plus the fix
    changed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # "reverted"/"backported" -> files

    def pair(self, spec: MutationSpec) -> tuple[str, str]:
        """The pin set's (base, head). Both ways: (head reverted, base backported), each
        mutant in the slot of the release it should now behave like, so the experiment's
        own verdict must be "reproduced". One way: the mutant in its own release's slot
        beside the other release, (base, head reverted) or (base backported, head), so the
        verdict must be "not reproduced" on the mutant's side only."""
        if set(spec.directions) == {"revert", "backport"}:
            return self.reverted, self.backported
        if spec.directions == ("revert",):
            return self.base, self.reverted
        return self.backported, self.head

    @staticmethod
    def slots(spec: MutationSpec) -> dict[str, tuple[str, str]]:
        """direction -> (the pin-set slot its mutant runs in, whose expectations it should meet)."""
        both = set(spec.directions) == {"revert", "backport"}
        table = {"revert": ("base" if both else "head", "base"), "backport": ("head" if both else "base", "head")}
        return {d: table[d] for d in spec.directions}


def _git_env() -> dict[str, str]:
    return proc.clean_env(
        {
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_AUTHOR_NAME": AUTHOR[0],
            "GIT_AUTHOR_EMAIL": AUTHOR[1],
            "GIT_COMMITTER_NAME": AUTHOR[0],
            "GIT_COMMITTER_EMAIL": AUTHOR[1],
            "GIT_AUTHOR_DATE": DATE,
            "GIT_COMMITTER_DATE": DATE,
        }
    )


def _git(repo: Path, *args: str, env: Mapping[str, str] | None = None) -> str:
    argv = ["git", "-c", "core.hooksPath=/dev/null", "-c", "core.autocrlf=false", *args]
    result = proc.capture(argv, timeout_s=600, env={**_git_env(), **(env or {})}, cwd=repo)
    if not result.ok:
        raise RuntimeError(f"git {' '.join(args[:3])} failed in {repo}: {result.summary(300)}")
    return result.stdout.strip()


def _commit_tree(repo: Path, tree_dir: Path, parents: list[str], message: str) -> str:
    index = repo / ".git" / "mutations-index"
    index.unlink(missing_ok=True)
    env = {"GIT_INDEX_FILE": str(index)}
    _git(repo, "--work-tree", str(tree_dir), "add", "-A", "-f", "--", ".", env=env)
    tree = _git(repo, "write-tree", env=env)
    index.unlink()
    return _git(repo, "commit-tree", tree, *[a for p in parents for a in ("-p", p)], "-m", message)


def _commit_files(repo: Path, parent: str, files: Mapping[str, str], message: str) -> str:
    """``parent``'s tree with ``files`` replaced (same paths, regular files)."""
    index = repo / ".git" / "mutations-index"
    index.unlink(missing_ok=True)
    env = {"GIT_INDEX_FILE": str(index)}
    _git(repo, "read-tree", parent, env=env)
    with tempfile.TemporaryDirectory(prefix="mutant-") as scratch:
        for rel, text in sorted(files.items()):
            staged = Path(scratch) / "blob"
            staged.write_text(text, encoding="utf-8")
            blob = _git(repo, "hash-object", "-w", "--", str(staged))
            _git(repo, "update-index", "--cacheinfo", f"100644,{blob},{rel}", env=env)
    tree = _git(repo, "write-tree", env=env)
    index.unlink()
    return _git(repo, "commit-tree", tree, "-p", parent, "-m", message)


def release_pins(experiment: str, pins: str) -> tuple[WheelPin, WheelPin]:
    """The (base, head) wheels of ``experiment``'s pin set ``pins``; SpecError if not wheels."""
    from kvprobe.experiments import experiment as experiments

    pin_set = experiments.load(experiment).pin_sets[pins]
    if not (isinstance(pin_set.base, WheelPin) and isinstance(pin_set.head, WheelPin)):
        raise SpecError(f"{experiment}: pin set {pins!r} is not a wheel pin set")
    return pin_set.base, pin_set.head


def read_wheel_files(pin: WheelPin, files: Iterable[str], cache_root: Path) -> dict[str, str]:
    """``files`` of the pinned wheel (fetched through kvprobe's wheel source: sha256 checked,
    cached), read from the archive; a file the wheel lacks is left out."""
    from kvprobe.sources.wheel import WheelSource

    wheel, _how = WheelSource(cache_root).fetch(pin)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        return {rel: archive.read(rel).decode("utf-8") for rel in files if rel in names}


def wheel_trees(pins: tuple[WheelPin, WheelPin], cache_root: Path, dest: Path) -> dict[str, Path]:
    """``{"base": tree, "head": tree}``: the pinned wheels, fetched through kvprobe's wheel
    source (sha256 checked, cached) and unpacked into ``dest`` (RECORD checked)."""
    from kvprobe.sources.wheel import WheelSource, safe_unzip

    source = WheelSource(cache_root)
    trees = {}
    for side, pin in zip(("base", "head"), pins, strict=True):
        wheel, _how = source.fetch(pin)
        trees[side] = dest / side
        safe_unzip(wheel, trees[side])
    return trees


def _read(tree: Path, files: Iterable[str]) -> dict[str, str]:
    out = {}
    for rel in files:
        path = tree / rel
        if path.is_file():
            out[rel] = path.read_text(encoding="utf-8")
    return out


def build_repo(
    spec: MutationSpec, pins: tuple[WheelPin, WheelPin], cache_root: Path, root: Path | None = None
) -> MutantRepo:
    """The spec's repository over the (base, head) wheels ``pins``, built once and reused.

    Its folder (under ``root``, default ``$TMPDIR/kvprobe-mutations``) is named by what
    decides its commits: the wheels, the mutated files' bytes, :data:`LAYOUT`. So an edit of
    the spec or of this harness that changes no mutant reuses the repository (and the git
    store and tree cache entries kvprobe made from it), and any that does gets a new one.
    SpecError when a change does not apply to the wheels' trees.
    """
    cache_root = Path(cache_root)
    base = read_wheel_files(pins[0], spec.files(), cache_root)
    head = read_wheel_files(pins[1], spec.files(), cache_root)
    mutants = {
        "reverted": apply(spec.changes, "head", base, head) if "revert" in spec.directions else {},
        "backported": apply(spec.changes, "base", base, head) if "backport" in spec.directions else {},
    }
    identity = json.dumps(
        {"layout": LAYOUT, "pins": [repr(p) for p in pins], "prs": spec.prs, "mutants": mutants}, sort_keys=True
    )
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    root = Path(root or Path(tempfile.gettempdir()) / "kvprobe-mutations")
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{spec.experiment}-{key}"
    with filelock.FileLock(str(root / f"{final.name}.lock")):
        marker = final / "mutants.json"
        if marker.is_file():
            return _loaded(final, json.loads(marker.read_text(encoding="utf-8")))
        work = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
        try:
            made = _build(spec, pins, mutants, cache_root, work)
            shutil.rmtree(work / "trees")
            (work / "mutants.json").write_text(json.dumps(made, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            os.replace(work, final)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        return _loaded(final, made)


def _loaded(final: Path, made: Mapping[str, Any]) -> MutantRepo:
    changed = {k: tuple(v) for k, v in made["changed"].items()}
    return MutantRepo(final / "repo", made["base"], made["head"], made["reverted"], made["backported"], changed)


def _build(
    spec: MutationSpec,
    pins: tuple[WheelPin, WheelPin],
    mutants: Mapping[str, Mapping[str, str]],
    cache_root: Path,
    work: Path,
) -> dict[str, Any]:
    trees = wheel_trees(pins, cache_root, work / "trees")
    reverted, backported = mutants["reverted"], mutants["backported"]
    repo = work / "repo"
    repo.mkdir()
    _git(repo, "init", "--quiet", "--template=", "-b", "base", ".")
    base = _commit_tree(repo, trees["base"], [], f"{spec.experiment}: base release tree")
    head = _commit_tree(repo, trees["head"], [base], f"{spec.experiment}: head release tree")
    made: dict[str, Any] = {"base": base, "head": head, "reverted": head, "backported": base, "changed": {}}
    prs = ", ".join(f"#{n}" for n in spec.prs)
    if reverted:
        made["reverted"] = _commit_files(repo, head, reverted, f"head with {prs} reverted")
        made["changed"]["reverted"] = sorted(reverted)
    if backported:
        made["backported"] = _commit_files(repo, base, backported, f"base with {prs} backported")
        made["changed"]["backported"] = sorted(backported)
    for ref in ("base", "head", "reverted", "backported"):
        _git(repo, "update-ref", f"refs/heads/{ref}", made[ref])
    return made


# --------------------------------------------------------------------------- the experiment copy


def experiment_copy(spec: MutationSpec, repo: MutantRepo, dest: Path) -> str:
    """Write ``dest/<id>-mutants/``: the experiment's files byte for byte, its
    experiment.toml with the new id and the ``mutants`` git pin set added; returns the id."""
    from kvprobe.experiments import experiment as experiments

    exp = experiments.load(spec.experiment)
    new_id = f"{exp.id}-mutants"
    folder = dest / new_id
    folder.mkdir(parents=True)
    for path in experiments.bundled_files(exp.directory)[1:]:
        shutil.copyfile(path, folder / path.name)
    text = (exp.directory / experiments.FILENAME).read_text(encoding="utf-8")
    text, count = re.subn(r'(?m)^id = "[^"]*"$', f'id = "{new_id}"', text, count=1)
    if count != 1:
        raise SpecError(f"{exp.id}: experiment.toml has no top-level id line")
    base, head = repo.pair(spec)
    prs = ", ".join(f"#{n}" for n in spec.prs)
    description = (
        f"Mutants of {exp.id}'s release trees (tests/mutations.py): base = head with {prs} reverted, "
        f"head = base with {prs} backported"
    )
    text += textwrap.dedent(
        f"""
        [pins.{PIN_SET}]
        kind = "git"
        description = "{description}"
        python_path = ["."]
        [pins.{PIN_SET}.base]
        commit = "{base}"
        [pins.{PIN_SET}.head]
        commit = "{head}"
        """
    )
    (folder / experiments.FILENAME).write_text(text, encoding="utf-8")
    return new_id


# --------------------------------------------------------------------------- the judgement


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


@dataclass(frozen=True)
class SideJudgement:
    """What one mutant read, against the release it should now behave like."""

    unobserved: tuple[str, ...]  # cases that did not reach their decision point
    flipped: tuple[str, ...]  # discriminating observations now as the release it stands for
    not_flipped: tuple[str, ...]  # discriminating observations that did not move there
    controls_broken: tuple[str, ...]  # observations both releases agree on, now different

    @property
    def ok(self) -> bool:
        return bool(self.flipped) and not (self.unobserved or self.not_flipped or self.controls_broken)


def judge(receipt: Mapping[str, Any], *, slot: str, wants: str) -> SideJudgement:
    """Did the mutant that ran in the pin set's ``slot`` ("base"/"head") behave like the
    release whose expectations are ``wants``? Read from the receipt's comparison.

    Every case of the slot observed. An observation both releases declare and differ on (a
    discriminating one) must equal ``wants``'s value; one they agree on must hold (a
    control). One only the other release declares (a feature that side alone has) counts as
    flipped when the mutant's value differs from it, and is left alone when equal (it may be
    a control); one only ``wants`` declares must hold."""
    comparison = receipt["comparison"]
    table = comparison["cases"][slot]
    unobserved = tuple(sorted(k for k, case in table.items() if case.get("observation", "observed") != "observed"))
    flipped, not_flipped, controls = [], [], []
    other = "head" if wants == "base" else "base"
    for row in comparison["observations"]:
        declared = row[f"expected_{wants}_declared"], row[f"expected_{other}_declared"]
        if not any(declared) or row["observation"] == NOT_PRESENT:
            continue
        name = f"{row['case']}: {row['observation']}"
        got = row[slot] if row[f"{slot}_recorded"] else "<not recorded>"
        wanted, original = row[f"expected_{wants}"], row[f"expected_{other}"]
        line = f"{name} = {got!r} (want {wanted!r}, {other} has {original!r})"
        if all(declared) and not _same(wanted, original):
            (flipped if _same(got, wanted) else not_flipped).append(line)
        elif all(declared) and not _same(got, wanted):
            controls.append(line)
        elif declared == (False, True) and not _same(got, original):
            flipped.append(line)
        elif declared == (True, False) and not _same(got, wanted):
            not_flipped.append(line)
    return SideJudgement(unobserved, tuple(flipped), tuple(not_flipped), tuple(controls))

"""Load and validate ``probes/<id>/experiment.toml`` into an :class:`Experiment`."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import shutil
import tomllib
from pathlib import Path
from typing import Any

from kvprobe import schema
from kvprobe.errors import ExperimentError, SchemaError
from kvprobe.model.records import (
    ID_RE,
    Experiment,
    Fix,
    FixKind,
    GitPin,
    Layer,
    ModelPin,
    Pin,
    PinSet,
    ProbeCheck,
    Scope,
    SourceKind,
    TestCheck,
    Vulnerability,
    WheelPin,
)
from kvprobe.names import EXPERIMENT_SCHEMA, PROBES_DIR, SIDES
from kvprobe.resources import SOURCE_BUILTIN, builtin_probes_dir, experiment_dirs, experiment_search_path

FILENAME = "experiment.toml"


def find(experiment_id: str) -> Path:
    """The experiment.toml for ``experiment_id``; ExperimentError lists what exists."""
    if not ID_RE.match(experiment_id):
        raise ExperimentError(f"bad experiment id {experiment_id!r}: use lowercase letters, digits and '-'")
    for directory in experiment_dirs():
        candidate = directory / experiment_id / FILENAME
        if candidate.is_file():
            return candidate
    ids = list_ids()
    known = ", ".join(ids) or "none"
    close = difflib.get_close_matches(experiment_id, ids, n=1, cutoff=0.6)
    guess = f"; did you mean {close[0]}?" if close else ""
    raise ExperimentError(f"unknown experiment {experiment_id!r}{guess} (known: {known})")


def sources(experiment_id: str) -> list[tuple[Path, str]]:
    """Every folder on the search path holding ``experiment_id``, first (the one used) first,
    each with its source (built-in, ./probes, KVPROBE_PROBES_PATH): more than one means the
    first shadows the others."""
    found = []
    for directory, source in experiment_search_path():
        candidate = directory / experiment_id / FILENAME
        if candidate.is_file():
            found.append((candidate.parent, source))
    return found


def differing_files(one: Path, other: Path) -> list[str]:
    """The names among :func:`bundled_files` of two experiment folders whose bytes differ, or
    that only one of them has: empty when they hold the same experiment."""
    ours = {p.name: p for p in bundled_files(one)}
    theirs = {p.name: p for p in bundled_files(other)}
    return sorted(
        name
        for name in set(ours) | set(theirs)
        if name not in ours or name not in theirs or ours[name].read_bytes() != theirs[name].read_bytes()
    )


def bundled_files(directory: Path) -> list[Path]:
    """What a bundle carries of the experiment in ``directory``: its experiment.toml and every
    .py beside it (the probes and the helpers they import: all of it ran)."""
    helpers = sorted(p for p in directory.glob("*.py") if p.is_file() and not p.is_symlink())
    return [directory / FILENAME, *helpers]


def copy_into_bundle(exp: Experiment, staging: Path) -> Path:
    """Copy :func:`bundled_files` to ``probes/<id>/`` of the bundle being staged; return it.

    Run, sweep and gate 2 all copy through here, so verify step 5 (which compares the same
    set with the installed copy) sees the same files whoever wrote the bundle.
    """
    probe_dir = staging / PROBES_DIR / exp.id
    probe_dir.mkdir(parents=True, exist_ok=True)
    for source in bundled_files(exp.directory):
        shutil.copy2(source, probe_dir / source.name)
    return probe_dir


def list_ids() -> list[str]:
    """Every experiment id found on the search path, first occurrence wins."""
    seen: list[str] = []
    for directory in experiment_dirs():
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob(f"*/{FILENAME}")):
            if path.parent.name not in seen:
                seen.append(path.parent.name)
    return sorted(seen)


def shipped_ids() -> list[str]:
    """The experiments kvprobe ships that run in an env (`run --all`, `sweep --all`): every
    built-in one with a pin set that is not synthetic (so not `model`, kvprobe's own model)."""
    found = []
    for path in sorted(builtin_probes_dir().glob(f"*/{FILENAME}")):
        exp = load_file(path, validate=False)
        if any(p.kind is not SourceKind.SYNTHETIC for p in exp.pin_sets.values()):
            found.append(exp.id)
    return found


def load(experiment_id: str, *, validate: bool = True) -> Experiment:
    """The experiment kvprobe would run for ``experiment_id``, with where it came from."""
    path = find(experiment_id)
    source = next(src for folder, src in sources(experiment_id) if folder == path.parent)
    exp = dataclasses.replace(load_file(path, validate=validate), source=source)
    if validate and source != SOURCE_BUILTIN:
        check_profile(exp)
    return exp


def check_profile(exp: Experiment) -> None:
    """An experiment kvprobe does not ship is checked whole when loaded: its dependency
    profile found and its lock hash-pinned (ExperimentError), as `new` checks a new one, not
    first when a run is about to build an env. Synthetic pin sets use kvprobe's interpreter."""
    if all(p.kind is SourceKind.SYNTHETIC for p in exp.pin_sets.values()):
        return
    from kvprobe.env.venv import load_profile

    load_profile(exp.profile)


def load_file(path: Path, *, validate: bool = True) -> Experiment:
    """Parse, schema-validate and build; every error names the file and the field.

    ``validate=False`` (for `kvprobe list`, which must start fast) skips the schema unless
    building fails, then validates to name the offending field: importing jsonschema alone
    costs more than the whole listing.
    """
    raw = path.read_bytes()
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ExperimentError(f"{path}: not valid TOML: {exc}") from exc
    if not validate:
        try:
            if data.get("id") == path.parent.name:
                return _build(data, path, hashlib.sha256(raw).hexdigest())
        except (KeyError, TypeError, ValueError, AttributeError):
            pass  # malformed: the schema below says where
    _validate(data, path)
    if data["id"] != path.parent.name:
        raise ExperimentError(f"{path}: id: {data['id']!r} must equal its folder name {path.parent.name!r}")
    return _build(data, path, hashlib.sha256(raw).hexdigest())


def _validate(data: dict[str, Any], path: Path) -> None:
    try:
        schema.validate(data, EXPERIMENT_SCHEMA, source=str(path))
    except SchemaError as exc:
        raise ExperimentError(exc.message, hints=exc.hints) from exc


def _build(data: dict[str, Any], path: Path, digest: str) -> Experiment:
    pin_sets = {name: _pin_set(name, spec, path) for name, spec in data["pins"].items()}
    default = data.get("default_pins", next(iter(pin_sets)))
    if default not in pin_sets:
        raise ExperimentError(f"{path}: default_pins: {default!r} is not a pin set")
    probes = tuple(ProbeCheck(p["path"]) for p in data["checks"].get("probes", []))
    for probe in probes:
        if not (path.parent / probe.path).is_file():
            raise ExperimentError(f"{path}: checks.probes: {probe.path} does not exist in {path.parent}")
    tests = tuple(
        TestCheck(t["path"], tuple(t["pins"]) if "pins" in t else None) for t in data["checks"].get("tests", [])
    )
    for test in tests:
        for name in test.pin_sets or ():
            if name not in pin_sets:
                raise ExperimentError(f"{path}: checks.tests: {test.path} names unknown pin set {name!r}")
            if not pin_sets[name].runs_tests:
                raise ExperimentError(
                    f"{path}: checks.tests: {test.path} names pin set {name!r}, whose release wheels carry "
                    f"no tests: give pins.{name}.tests_commit (the upstream commit to take the test files from)"
                )
    if not probes and not tests:
        raise ExperimentError(f"{path}: checks: declare at least one probe or upstream test")
    _check_expectation_keys(data.get("expect", {}), probes, path)
    _check_test_expectations(data.get("expect", {}).get("tests", {}), tests, path)
    return Experiment(
        id=data["id"],
        title=data["title"],
        layer=Layer(data["layer"]),
        upstream=data.get("upstream"),
        fix=Fix(tuple(data["fix"].get("prs", [])), data["fix"].get("release"), data["fix"]["summary"]),
        pin_sets=pin_sets,
        default_pin_set=default,
        tests=tests,
        probes=probes,
        profile=data["profile"],
        expectations={side: dict(cases) for side, cases in data.get("expect", {}).items()},
        scope=Scope(data["scope"]["shows"], tuple(data["scope"]["does_not_show"])),
        directory=path.parent,
        file_sha256=digest,
        vulnerability=_vulnerability(data.get("vulnerability"), path),
    )


def _vulnerability(table: dict[str, Any] | None, path: Path) -> Vulnerability | None:
    if table is None:
        return None
    aliases = tuple(table.get("aliases", []))
    if table["id"] in aliases:
        raise ExperimentError(f"{path}: vulnerability.aliases: {table['id']!r} is the id itself, not an alias")
    return Vulnerability(table["id"], aliases, FixKind(table["fix_kind"]))


def _pin_set(name: str, spec: dict[str, Any], path: Path) -> PinSet:
    kind = SourceKind(spec["kind"])
    if "tests_commit" in spec and kind is not SourceKind.WHEEL:
        raise ExperimentError(f"{path}: pins.{name}.tests_commit: only a wheel pin set takes its tests from git")
    sides: dict[str, Pin] = {}
    for side in SIDES:
        pin = spec[side]
        try:
            if kind is SourceKind.GIT:
                sides[side] = GitPin(pin["commit"])
            elif kind is SourceKind.WHEEL:
                sides[side] = WheelPin(pin["package"], pin["version"], pin["file"], pin["sha256"])
            else:
                sides[side] = ModelPin(pin["switches"])
        except ValueError as exc:
            raise ExperimentError(f"{path}: pins.{name}.{side}: {exc}") from exc
    try:
        tests_commit = GitPin(spec["tests_commit"]) if "tests_commit" in spec else None
    except ValueError as exc:
        raise ExperimentError(f"{path}: pins.{name}.tests_commit: {exc}") from exc
    return PinSet(
        name=name,
        kind=kind,
        base=sides["base"],
        head=sides["head"],
        pr=spec.get("pr"),
        python_path=tuple(spec.get("python_path", ["."])),
        description=spec.get("description", ""),
        tests_commit=tests_commit,
    )


def _check_expectation_keys(expect: dict[str, Any], probes: tuple[ProbeCheck, ...], path: Path) -> None:
    names = {p.name for p in probes}
    for side, cases in expect.items():
        if side == "tests":
            continue
        for key in cases:
            if key.split("/", 1)[0] not in names:
                raise ExperimentError(f"{path}: expect.{side}.{key!r}: no probe named {key.split('/', 1)[0]!r}")


def _check_test_expectations(expect: dict[str, Any], tests: tuple[TestCheck, ...], path: Path) -> None:
    """Sets per listed test file, disjoint; a base failure kind only for a FAIL_TO_PASS test."""
    listed = {t.path for t in tests}
    for file, sets in expect.items():
        where = f"{path}: expect.tests.{file!r}"
        if file not in listed:
            raise ExperimentError(f"{where}: not a test file of checks.tests")
        both = set(sets["FAIL_TO_PASS"]) & set(sets["PASS_TO_PASS"])
        if both:
            raise ExperimentError(f"{where}: in both FAIL_TO_PASS and PASS_TO_PASS: {', '.join(sorted(both))}")
        stray = set(sets.get("base_failure_kind", {})) - set(sets["FAIL_TO_PASS"])
        if stray:
            names = ", ".join(sorted(stray))
            raise ExperimentError(f"{where}: base_failure_kind for tests not in FAIL_TO_PASS: {names}")

"""Frozen dataclasses and str Enums shared by the core. Invariants live in __post_init__."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

SHA1_RE = re.compile(r"^[0-9a-f]{40}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
ID_RE = re.compile(r"^[a-z][a-z0-9-]{1,62}$")
# Vulnerability ids kvprobe names (the schemas' vuln_id): CVE, GHSA, PYSEC, or its own
# KVPROBE-YYYY-NNNN where no public id exists (docs/vulnerability-ids.md).
VULN_ID_RE = re.compile(
    r"^(CVE-[0-9]{4}-[0-9]{4,}|GHSA(-[23456789cfghjmpqrvwx]{4}){3}|PYSEC-[0-9]{4}-[0-9]+|KVPROBE-[0-9]{4}-[0-9]{4,})$"
)


class Side(StrEnum):
    BASE = "base"
    HEAD = "head"


class SourceKind(StrEnum):
    GIT = "git"
    WHEEL = "wheel"
    SYNTHETIC = "synthetic"


class Layer(StrEnum):
    """Which evidence layer a receipt belongs to (the README's "What the evidence shows": three layers)."""

    SYNTHETIC = "synthetic-model"
    UPSTREAM_TESTS = "upstream-tests"
    DIFF_PROBE = "diff-probe"


class Outcome(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"
    XFAILED = "xfailed"
    XPASSED = "xpassed"


class FailureKind(StrEnum):
    """Why a test did not pass: an assertion is not the same as a stub fall-through."""

    ASSERTION = "assertion"
    EXCEPTION = "exception"
    COLLECTION = "collection"
    TIMEOUT = "timeout"
    INFRASTRUCTURE = "infrastructure"


class Transition(StrEnum):
    FAIL_TO_PASS = "FAIL_TO_PASS"
    # base could not even collect the test (e.g. ImportError of the fixed module), head
    # passes it: a fail-to-pass by exception, never an assertion
    ERROR_TO_PASS = "ERROR_TO_PASS"
    PASS_TO_PASS = "PASS_TO_PASS"
    PASS_TO_FAIL = "PASS_TO_FAIL"
    FAIL_TO_FAIL = "FAIL_TO_FAIL"
    NOT_RUN = "NOT_RUN"
    ERROR = "ERROR"


class Verdict(StrEnum):
    REPRODUCED = "reproduced"
    NOT_REPRODUCED = "not-reproduced"
    NO_EXPECTATIONS = "no-expectations"
    COULD_NOT_OBSERVE = "could-not-observe"  # a case with expectations never reached its decision point
    ERROR = "error"


class GateStatus(StrEnum):
    """A gate's or a gate check's status (how they combine: ``rules.gate_status``)."""

    PASS = "pass"
    FAIL = "fail"
    UNKNOWN = "unknown"
    INFO = "info"  # reported, does not decide the gate


class SweepClass(StrEnum):
    """A swept release's class, or one of its cases' (how: ``rules.sweep_classification``)."""

    AFFECTED = "affected"
    FIXED = "fixed"
    MIXED = "mixed"
    UNOBSERVED = "could-not-observe"
    NOT_PRESENT = "not-present"
    CONTROL = "control"  # a case only: behaves as both sides expect
    NEITHER = "neither"  # a case only: behaves as no side expects
    NOT_SERVED = "not-served"  # a release no profile of the experiment can import: nothing ran


@dataclass(frozen=True)
class GitPin:
    commit: str

    def __post_init__(self) -> None:
        if not SHA1_RE.fullmatch(self.commit):
            raise ValueError(f"commit pin {self.commit!r} is not a full lowercase 40-hex SHA")

    def identity(self) -> dict[str, str]:
        return {"kind": "git", "commit": self.commit}


@dataclass(frozen=True)
class WheelPin:
    package: str
    version: str
    filename: str
    sha256: str

    def __post_init__(self) -> None:
        if not SHA256_RE.fullmatch(self.sha256):
            raise ValueError(f"wheel pin {self.filename!r}: sha256 must be 64 lowercase hex")
        if not self.filename.endswith(".whl") or "/" in self.filename:
            raise ValueError(f"wheel pin {self.filename!r}: not a wheel file name")

    def identity(self) -> dict[str, str]:
        return {
            "kind": "wheel",
            "package": self.package,
            "version": self.version,
            "filename": self.filename,
            "sha256": self.sha256,
        }


@dataclass(frozen=True)
class ModelPin:
    """A synthetic side: the model's switches stand in for a commit."""

    switches: Mapping[str, Any]

    def identity(self) -> dict[str, Any]:
        return {"kind": "synthetic", "switches": dict(self.switches)}


Pin = GitPin | WheelPin | ModelPin


@dataclass(frozen=True)
class PinSet:
    name: str
    kind: SourceKind
    base: Pin
    head: Pin
    pr: int | None = None
    python_path: tuple[str, ...] = (".",)
    description: str = ""
    # wheel pin sets only: the upstream commit whose test files run against both wheels
    tests_commit: GitPin | None = None

    def pin(self, side: Side) -> Pin:
        return self.base if side is Side.BASE else self.head

    @property
    def runs_tests(self) -> bool:
        """Git trees carry their tests; release wheels only with a tests commit beside them."""
        return self.kind is SourceKind.GIT or self.tests_commit is not None


@dataclass(frozen=True)
class TestCheck:
    """An upstream test file, by path in the upstream tree; head's version runs on both sides."""

    __test__ = False  # not a pytest test class

    path: str
    pin_sets: tuple[str, ...] | None = None

    def applies_to(self, pin_set: str) -> bool:
        return self.pin_sets is None or pin_set in self.pin_sets


@dataclass(frozen=True)
class ProbeCheck:
    path: str

    @property
    def name(self) -> str:
        return Path(self.path).stem


@dataclass(frozen=True)
class Scope:
    shows: str
    does_not_show: tuple[str, ...]


@dataclass(frozen=True)
class Fix:
    prs: tuple[int, ...]
    release: str | None
    summary: str


class FixKind(StrEnum):
    """What the fix is with respect to the vulnerability the experiment names. Only a
    ``security`` fix is exported as OpenVEX affected/fixed (docs/vulnerability-ids.md)."""

    SECURITY = "security"  # the fix closes the vulnerability
    HARDENING = "hardening"  # defence in depth on the vulnerability's path; not its fix
    PERFORMANCE = "performance"  # upstream calls it a waste/latency fix
    CORRECTNESS = "correctness"  # a functional bug, not a security one


@dataclass(frozen=True)
class Vulnerability:
    """The vulnerability an experiment's evidence is about: ``id`` (CVE, GHSA, PYSEC or a
    kvprobe id ``KVPROBE-YYYY-NNNN``), its ``aliases``, and what kind of fix was tested."""

    id: str
    aliases: tuple[str, ...]
    fix_kind: FixKind

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "aliases": list(self.aliases), "fix_kind": self.fix_kind.value}


@dataclass(frozen=True)
class Experiment:
    id: str
    title: str
    layer: Layer
    upstream: str | None
    fix: Fix
    pin_sets: Mapping[str, PinSet]
    default_pin_set: str
    tests: tuple[TestCheck, ...]
    probes: tuple[ProbeCheck, ...]
    profile: str
    expectations: Mapping[str, Mapping[str, Mapping[str, Any]]]
    scope: Scope
    directory: Path
    file_sha256: str
    vulnerability: Vulnerability | None = None  # None: declared by no [vulnerability] table
    source: str | None = None  # built-in, ./probes or KVPROBE_PROBES_PATH; None: read from a file (a bundle)

    def __post_init__(self) -> None:
        if self.default_pin_set not in self.pin_sets:
            raise ValueError(f"default pin set {self.default_pin_set!r} is not defined")

    def tests_for(self, pin_set: str) -> tuple[TestCheck, ...]:
        return tuple(t for t in self.tests if t.applies_to(pin_set))


@dataclass(frozen=True)
class TestResult:
    __test__ = False  # not a pytest test class

    nodeid: str
    outcome: Outcome
    kind: FailureKind | None = None
    exc_type: str | None = None
    message: str = ""
    subtest: str | None = None

    @property
    def key(self) -> str:
        return f"{self.nodeid} [{self.subtest}]" if self.subtest else self.nodeid


@dataclass(frozen=True)
class EnvInfo:
    key: str
    path: Path
    python: str
    lock_name: str
    lock_sha256: str
    packages: Mapping[str, str]
    build: Mapping[str, Any] = field(default_factory=dict)

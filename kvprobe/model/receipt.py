"""The run receipt (schemas/receipt.schema.json) as frozen dataclasses.

Frozen dataclasses, not pydantic: the on-disk contract is the JSON Schema, which
``kvprobe.schema`` checks on every write and every verification; a second validating
model would be a second contract to keep in step. These classes only give the receipt's
parts names and types. ``Receipt.to_json()`` is the one place a receipt becomes a dict,
and ``Receipt.from_json(doc).to_json() == doc`` for every receipt kvprobe has written
(keys the schema leaves optional are written only when the record has them).

Free-form parts the schema leaves open (pin and source identities, host facts, the
comparison's tables) stay mappings, copied as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvprobe.model.records import Fix, FixKind, Layer, SourceKind, Verdict, Vulnerability
from kvprobe.names import SIDES

Json = dict[str, Any]


def _some(**fields: Any) -> Json:
    """The optional keys that have a value: absent, not null, when a record has none."""
    return {k: v for k, v in fields.items() if v is not None}


@dataclass(frozen=True)
class FileRef:
    """A file in the bundle, as a receipt cites it."""

    path: str
    sha256: str

    def to_json(self) -> Json:
        return {"path": self.path, "sha256": self.sha256}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> FileRef:
        return cls(doc["path"], doc["sha256"])

    @classmethod
    def maybe(cls, doc: Mapping[str, Any] | None) -> FileRef | None:
        return None if doc is None else cls.from_json(doc)


def _ref_json(ref: FileRef | None) -> Json | None:
    return None if ref is None else ref.to_json()


@dataclass(frozen=True)
class Tool:
    version: str
    name: str = "kvprobe"

    def to_json(self) -> Json:
        return {"name": self.name, "version": self.version}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Tool:
        return cls(doc["version"], doc["name"])


@dataclass(frozen=True)
class ExperimentRef:
    """The experiment a receipt ran: its file in the bundle and the facts readers quote."""

    id: str
    title: str
    layer: Layer
    file: str
    sha256: str
    upstream: str | None
    profile: str
    fix: Fix
    vulnerability: Vulnerability | None = None
    source: str | None = None  # absent in receipts written before it was recorded

    def to_json(self) -> Json:
        fix = {"prs": list(self.fix.prs), "release": self.fix.release, "summary": self.fix.summary}
        vuln = self.vulnerability.to_json() if self.vulnerability else None
        return {
            "id": self.id,
            "title": self.title,
            "layer": self.layer.value,
            "file": self.file,
            "sha256": self.sha256,
            "upstream": self.upstream,
            "profile": self.profile,
            "fix": fix,
            **_some(vulnerability=vuln, source=self.source),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ExperimentRef:
        fix, vuln = doc["fix"], doc.get("vulnerability")
        return cls(
            id=doc["id"],
            title=doc["title"],
            layer=Layer(doc["layer"]),
            file=doc["file"],
            sha256=doc["sha256"],
            upstream=doc["upstream"],
            profile=doc["profile"],
            fix=Fix(tuple(fix["prs"]), fix["release"], fix["summary"]),
            vulnerability=None
            if vuln is None
            else Vulnerability(vuln["id"], tuple(vuln["aliases"]), FixKind(vuln["fix_kind"])),
            source=doc.get("source"),
        )


@dataclass(frozen=True)
class PinSetRef:
    name: str
    kind: SourceKind
    pr: int | None
    python_path: tuple[str, ...]
    tests_from: Mapping[str, Any] | None = None  # wheel pin sets with a tests commit

    def to_json(self) -> Json:
        return {
            "name": self.name,
            "kind": self.kind.value,
            "pr": self.pr,
            "python_path": list(self.python_path),
            **_some(tests_from=self.tests_from),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PinSetRef:
        return cls(doc["name"], SourceKind(doc["kind"]), doc["pr"], tuple(doc["python_path"]), doc.get("tests_from"))


@dataclass(frozen=True)
class TestRecord:
    """One upstream test file on one side: its raw document, junit XML, and how pytest ended."""

    __test__ = False  # not a pytest test class

    path: str
    raw: FileRef
    junit: FileRef | None
    exit_code: int | None
    overlay: str
    problem: str | None

    def to_json(self) -> Json:
        return {
            "path": self.path,
            "raw": self.raw.to_json(),
            "junit": _ref_json(self.junit),
            "exit_code": self.exit_code,
            "overlay": self.overlay,
            "problem": self.problem,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TestRecord:
        return cls(
            doc["path"],
            FileRef.from_json(doc["raw"]),
            FileRef.maybe(doc["junit"]),
            doc["exit_code"],
            doc["overlay"],
            doc["problem"],
        )


@dataclass(frozen=True)
class ProbeRecord:
    """One probe on one side: its source in the bundle, its raw output (None: it had none)."""

    name: str
    source: FileRef
    raw: FileRef | None
    exit_code: int | None
    problem: str | None

    def to_json(self) -> Json:
        return {
            "name": self.name,
            "source": self.source.to_json(),
            "raw": _ref_json(self.raw),
            "exit_code": self.exit_code,
            "problem": self.problem,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ProbeRecord:
        return cls(
            doc["name"], FileRef.from_json(doc["source"]), FileRef.maybe(doc["raw"]), doc["exit_code"], doc["problem"]
        )


@dataclass(frozen=True)
class SideRecord:
    """One side: the pin, the tree it resolved to, and the checks that ran on it."""

    pin: Mapping[str, Any]
    source: Mapping[str, Any]
    tests: tuple[TestRecord, ...]
    probes: tuple[ProbeRecord, ...]

    def to_json(self) -> Json:
        return {
            "pin": dict(self.pin),
            "source": dict(self.source),
            "tests": [t.to_json() for t in self.tests],
            "probes": [p.to_json() for p in self.probes],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> SideRecord:
        return cls(
            doc["pin"],
            doc["source"],
            tuple(TestRecord.from_json(t) for t in doc["tests"]),
            tuple(ProbeRecord.from_json(p) for p in doc["probes"]),
        )

    def cited(self) -> list[tuple[str, FileRef]]:
        """("test" | "probe", raw file) for every raw document this side cites."""
        return [("test", t.raw) for t in self.tests] + [("probe", p.raw) for p in self.probes if p.raw is not None]


@dataclass(frozen=True)
class EnvRecord:
    """The env both sides ran in (one lock)."""

    key: str
    python: str
    profile: str
    lock_name: str | None
    lock_sha256: str | None
    packages: Mapping[str, str]
    torch: Mapping[str, Any] | None
    torch_index: str | None
    shared_by_sides: bool = True

    def to_json(self) -> Json:
        return {
            "key": self.key,
            "python": self.python,
            "profile": self.profile,
            "lock_name": self.lock_name,
            "lock_sha256": self.lock_sha256,
            "packages": dict(self.packages),
            "torch": None if self.torch is None else dict(self.torch),
            "torch_index": self.torch_index,
            "shared_by_sides": self.shared_by_sides,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> EnvRecord:
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__})


_COMPARISON_KEYS = ("algorithm", "verdict", "reasons", "cases", "observations", "tests", "test_summary", "counts")


@dataclass(frozen=True)
class Comparison:
    """evidence/compare's output: the verdict, its reasons, and the tables it was read from.

    The tables stay as compare wrote them (verify recomputes and compares them whole);
    ``other`` holds keys a comparison algorithm added that this model does not name.
    """

    algorithm: str
    verdict: Verdict
    reasons: tuple[str, ...]
    cases: Mapping[str, Any]
    observations: list[Any]
    tests: list[Any]
    test_summary: Mapping[str, Any]
    counts: Mapping[str, Any]
    other: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> Json:
        return {
            **self.other,
            "algorithm": self.algorithm,
            "verdict": self.verdict.value,
            "reasons": list(self.reasons),
            "cases": self.cases,
            "observations": self.observations,
            "tests": self.tests,
            "test_summary": self.test_summary,
            "counts": self.counts,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Comparison:
        return cls(
            algorithm=doc["algorithm"],
            verdict=Verdict(doc["verdict"]),
            reasons=tuple(doc["reasons"]),
            cases=doc["cases"],
            observations=doc["observations"],
            tests=doc["tests"],
            test_summary=doc["test_summary"],
            counts=doc["counts"],
            other={k: v for k, v in doc.items() if k not in _COMPARISON_KEYS},
        )


@dataclass(frozen=True)
class EvidenceScope:
    """What the receipt's evidence shows and does not, and what stood in for the real thing."""

    layer: Layer
    shows: str
    does_not_show: tuple[str, ...]
    mocks: Mapping[str, Mapping[str, str]]
    limits: tuple[str, ...]
    # per side and probe (compare/4 on); absent in receipts written before probes recorded them
    configuration: Mapping[str, Any] | None = None
    absorbed: Mapping[str, Any] | None = None

    def to_json(self) -> Json:
        return {
            "layer": self.layer.value,
            "shows": self.shows,
            "does_not_show": list(self.does_not_show),
            "mocks": dict(self.mocks),
            **_some(configuration=self.configuration, absorbed=self.absorbed),
            "limits": list(self.limits),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> EvidenceScope:
        return cls(
            Layer(doc["layer"]),
            doc["shows"],
            tuple(doc["does_not_show"]),
            doc["mocks"],
            tuple(doc["limits"]),
            doc.get("configuration"),
            doc.get("absorbed"),
        )


@dataclass(frozen=True)
class Receipt:
    """A run receipt: what ran on which pins, in which env, what was observed, the verdict."""

    schema: str
    tool: Tool
    run_id: str
    created_utc: str
    experiment: ExperimentRef
    pin_set: PinSetRef
    sides: Mapping[str, SideRecord]  # "base", "head"
    env: EnvRecord
    host: Mapping[str, Any]
    settings: Mapping[str, Any]
    expectations: Mapping[str, Any]
    comparison: Comparison
    verdict: Verdict
    evidence: EvidenceScope
    timings: Mapping[str, float]

    def to_json(self) -> Json:
        return {
            "schema": self.schema,
            "tool": self.tool.to_json(),
            "run_id": self.run_id,
            "created_utc": self.created_utc,
            "experiment": self.experiment.to_json(),
            "pin_set": self.pin_set.to_json(),
            "sides": {side: self.sides[side].to_json() for side in SIDES},
            "env": self.env.to_json(),
            "host": dict(self.host),
            "settings": dict(self.settings),
            "expectations": dict(self.expectations),
            "comparison": self.comparison.to_json(),
            "verdict": self.verdict.value,
            "evidence": self.evidence.to_json(),
            "timings": dict(self.timings),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Receipt:
        """A receipt document step 2 accepted (schema-valid): this reads, it does not check."""
        return cls(
            schema=doc["schema"],
            tool=Tool.from_json(doc["tool"]),
            run_id=doc["run_id"],
            created_utc=doc["created_utc"],
            experiment=ExperimentRef.from_json(doc["experiment"]),
            pin_set=PinSetRef.from_json(doc["pin_set"]),
            sides={side: SideRecord.from_json(doc["sides"][side]) for side in SIDES},
            env=EnvRecord.from_json(doc["env"]),
            host=doc["host"],
            settings=doc["settings"],
            expectations=doc["expectations"],
            comparison=Comparison.from_json(doc["comparison"]),
            verdict=Verdict(doc["verdict"]),
            evidence=EvidenceScope.from_json(doc["evidence"]),
            timings=doc["timings"],
        )

"""The run receipt (schemas/receipt.schema.json) as frozen dataclasses.

Frozen dataclasses, not pydantic: the on-disk contract is the JSON Schema, which
``kvprobe.schema`` checks on every write and every verification; a second validating
model would be a second contract to keep in step. These classes only give the receipt's
parts names and types. ``Receipt.to_json()`` is the one place a receipt becomes a dict,
and ``Receipt.from_json(doc).to_json() == doc`` for every receipt kvprobe has written.

Every part is a :class:`Part`: its JSON keys are its field names, written and read by one
walk over the fields' types. A field declared with ``metadata=OPTIONAL`` is a key the schema
lets receipts leave out (older receipts, or a part of the run that did not happen): None
means absent, not null. Free-form parts the schema leaves open (pin and source
identities, host facts, the comparison's tables) stay mappings, copied as they are.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, TypeVar

from kvprobe.model.records import Fix, Layer, SourceKind, Verdict, Vulnerability
from kvprobe.names import SIDES

Json = dict[str, Any]
_P = TypeVar("_P", bound="Part")


# A field's metadata for a key written only when it has a value (the schema does not require it).
OPTIONAL = types.MappingProxyType({"optional": True})


def _write(value: Any) -> Any:
    if isinstance(value, Part | Vulnerability):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _write(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple):
        return [_write(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _write(v) for k, v in value.items()}
    return value


def _read(kind: Any, value: Any) -> Any:
    """``value`` (from JSON) as the type a field declares: parts, enums, tuples, mappings of parts."""
    if value is None:
        return None
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return _read(next(a for a in args if a is not type(None)), value)
    if origin is tuple:
        return tuple(_read(args[0], v) for v in value)
    if origin is Mapping and dataclasses.is_dataclass(args[1]):
        return {k: _read(args[1], v) for k, v in value.items()}
    if isinstance(kind, type) and issubclass(kind, Enum):
        return kind(value)
    if isinstance(kind, type) and issubclass(kind, Part):
        return kind.from_json(value)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return kind(**{f.name: _read(t, value[f.name]) for f, t in _field_types(kind)})
    return value


_FIELD_TYPES: dict[type, tuple[tuple[dataclasses.Field[Any], Any], ...]] = {}


def _field_types(cls: type) -> tuple[tuple[dataclasses.Field[Any], Any], ...]:
    """Each field and its declared type, resolved once per class: get_type_hints evaluates
    every string annotation again on each call, and a receipt is read part by part."""
    found = _FIELD_TYPES.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls)
        found = _FIELD_TYPES[cls] = tuple((f, hints[f.name]) for f in dataclasses.fields(cls))
    return found


class Part:
    """A receipt part: a frozen dataclass whose field names are its JSON keys."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def to_json(self) -> Json:
        doc = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not (value is None and f.metadata.get("optional")):
                doc[f.name] = _write(value)
        return doc

    @classmethod
    def from_json(cls: type[_P], doc: Mapping[str, Any]) -> _P:
        """A part of a receipt step 2 accepted (schema-valid): this reads, it does not check."""
        return cls(
            **{
                f.name: _read(t, doc.get(f.name) if f.metadata.get("optional") else doc[f.name])
                for f, t in _field_types(cls)
            }
        )


@dataclass(frozen=True)
class FileRef(Part):
    """A file in the bundle, as a receipt cites it."""

    path: str
    sha256: str


@dataclass(frozen=True)
class Tool(Part):
    version: str
    name: str = "kvprobe"


@dataclass(frozen=True)
class ReceiptHead(Part):
    """What every receipt opens with (run, gates, sweep): its schema id, the kvprobe that
    wrote it, its run id and when it started."""

    schema: str
    tool: Tool
    run_id: str
    created_utc: str


@dataclass(frozen=True)
class ExperimentRef(Part):
    """The experiment a receipt ran: its file in the bundle and the facts readers quote."""

    id: str
    title: str
    layer: Layer
    file: str
    sha256: str
    upstream: str | None
    profile: str
    fix: Fix
    vulnerability: Vulnerability | None = field(default=None, metadata=OPTIONAL)
    source: str | None = field(default=None, metadata=OPTIONAL)  # absent in receipts written before it was recorded


@dataclass(frozen=True)
class PinSetRef(Part):
    name: str
    kind: SourceKind
    pr: int | None
    python_path: tuple[str, ...]
    tests_from: Mapping[str, Any] | None = field(default=None, metadata=OPTIONAL)  # wheel pin sets with a tests commit


@dataclass(frozen=True)
class TestRecord(Part):
    """One upstream test file on one side: its raw document, junit XML, and how pytest ended."""

    __test__ = False  # not a pytest test class

    path: str
    raw: FileRef
    junit: FileRef | None
    exit_code: int | None
    overlay: str
    problem: str | None


@dataclass(frozen=True)
class ProbeRecord(Part):
    """One probe on one side: its source in the bundle, its raw output (None: it had none)."""

    name: str
    source: FileRef
    raw: FileRef | None
    exit_code: int | None
    problem: str | None


@dataclass(frozen=True)
class RunProbeRecord(ProbeRecord):
    """A probe record of a run receipt or a sweep release, with runs 2..N when it repeated
    (``run --repeat N``, ``sweep --repeat N``)."""

    repeats: tuple[ProbeRepeat, ...] | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class ProbeRepeat(Part):
    """A further run of one probe on one side (``run --repeat``): its raw output, or its problem."""

    raw: FileRef | None
    exit_code: int | None
    problem: str | None


@dataclass(frozen=True)
class SideRecord(Part):
    """One side: the pin, the tree it resolved to, and the checks that ran on it."""

    pin: Mapping[str, Any]
    source: Mapping[str, Any]
    tests: tuple[TestRecord, ...]
    probes: tuple[RunProbeRecord, ...]


@dataclass(frozen=True)
class InstallerRecord(Part):
    """What filled the env from its lock: uv (kvprobe's default) or pip (without uv, or when
    uv failed), and its version (None when it could not be read)."""

    name: str  # uv | pip
    version: str | None


@dataclass(frozen=True)
class EnvRecord(Part):
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
    # absent: kvprobe's own interpreter, an env whose build did not record it, or a receipt
    # written before it was recorded
    installer: InstallerRecord | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class Comparison(Part):
    """rules/compare's output: the verdict, its reasons, and the tables it was read from.

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
        doc = super().to_json()
        return {**doc.pop("other"), **doc}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Comparison:
        named = set(cls.__dataclass_fields__)
        return super().from_json({**doc, "other": {k: v for k, v in doc.items() if k not in named}})


@dataclass(frozen=True)
class ScopeRecord(Part):
    """What a receipt's evidence shows, what it does not, and the limits it was made within."""

    shows: str
    does_not_show: tuple[str, ...]
    limits: tuple[str, ...]


@dataclass(frozen=True)
class EvidenceScope(ScopeRecord):
    """A run's scope: its layer, and what stood in for the real thing."""

    layer: Layer
    mocks: Mapping[str, Mapping[str, str]]
    # per side and probe (compare/4 on); absent in receipts written before probes recorded them
    configuration: Mapping[str, Any] | None = field(default=None, metadata=OPTIONAL)
    absorbed: Mapping[str, Any] | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class CheckMode(Part):
    """How one check ran: a ``fresh`` interpreter or ``forked`` from the preloaded one, and why
    it ran fresh (``--no-preload``, a fork server that did not start)."""

    name: str
    mode: str  # "fresh" | "forked"
    reason: str | None


@dataclass(frozen=True)
class CheckExecution(CheckMode):
    """A run's check: which side, a test file or a probe."""

    side: str
    check: str  # "test" | "probe"


@dataclass(frozen=True)
class Preloaded(Part):
    """What the fork server preloaded (module -> version; empty: checks ran fresh)."""

    preloaded: Mapping[str, str | None]


@dataclass(frozen=True)
class KeptServerRecord(Part):
    """The fork server kept between runs that the checks forked from (``--keep-server``):
    when it started, whether this run found it running, how long it stays up unused."""

    started_utc: str
    reused: bool
    idle_s: float


@dataclass(frozen=True)
class SharedServerRecord(Part):
    """The fork server one invocation of several experiments (`kvprobe run A B`) shared: when
    it started, and the experiments of the invocation planned to fork from it."""

    started_utc: str
    experiments: tuple[str, ...]


@dataclass(frozen=True)
class ExecutionRecord(Preloaded):
    """How each of a run's checks ran."""

    checks: tuple[CheckExecution, ...]
    server: KeptServerRecord | None = field(default=None, metadata=OPTIONAL)  # absent: the run's own server
    shared: SharedServerRecord | None = field(default=None, metadata=OPTIONAL)  # absent: not shared


@dataclass(frozen=True)
class Receipt(ReceiptHead):
    """A run receipt: what ran on which pins, in which env, what was observed, the verdict."""

    experiment: ExperimentRef
    pin_set: PinSetRef
    sides: Mapping[str, SideRecord]  # one per name in SIDES
    env: EnvRecord
    host: Mapping[str, Any]
    settings: Mapping[str, Any]
    expectations: Mapping[str, Any]
    comparison: Comparison
    verdict: Verdict
    evidence: EvidenceScope
    timings: Mapping[str, float]
    execution: ExecutionRecord | None = field(default=None, metadata=OPTIONAL)  # absent before the fork server
    repeats: int | None = field(default=None, metadata=OPTIONAL)  # run --repeat N, N > 1; absent: one run

    def cited(self) -> list[tuple[str, str, FileRef]]:
        """(side, "test" | "probe", raw file) for every raw document the receipt cites."""
        found: list[tuple[str, str, FileRef]] = []
        for side in SIDES:
            record = self.sides[side]
            found += [(side, "probe", p.raw) for p in record.probes if p.raw is not None]
            found += [(side, "test", t.raw) for t in record.tests]
        return found

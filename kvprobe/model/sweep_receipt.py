"""The sweep receipt (schemas/sweep-receipt.schema.json, kvprobe.sweep-receipt/2) as frozen
dataclasses: the same :class:`~kvprobe.model.receipt.Part` writer and reader as the run
receipt, and its parts where a sweep records the same thing (the tool, cited files, a probe's
record, the env), so ``SweepReceipt.from_json(doc).to_json() == doc``.

A release's class is a :class:`~kvprobe.model.records.SweepClass`; how a release is classified
lives in ``rules.sweep_classification``, above this layer. A case's classification stays the mapping
``rules.sweep_classification`` wrote (its key ``class`` is no field name), as do host and settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvprobe.model.receipt import (
    OPTIONAL,
    CheckMode,
    EnvRecord,
    Json,
    Part,
    Preloaded,
    ReceiptHead,
    RunProbeRecord,
    ScopeRecord,
)
from kvprobe.model.records import Fix, SweepClass, Vulnerability


@dataclass(frozen=True)
class SweepExperimentRef(Part):
    """The experiment swept: its file in the bundle and the facts readers quote."""

    id: str
    title: str
    file: str
    sha256: str
    upstream: str | None
    fix: Fix
    vulnerability: Vulnerability | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class ProfileRef(Part):
    """The dependency profile the probes ran in, the releases it serves (None: every one), and
    why it does not serve the others (``serves_why``; absent in receipts from before it)."""

    name: str
    serves: str | None
    serves_why: str | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class WheelRecord(Part):
    """A release's wheel as the index named it, and whether it came from the cache or a download."""

    package: str
    version: str
    file: str
    sha256: str
    fetched_via: str


@dataclass(frozen=True)
class ListedRelease(Part):
    """A version the index listed within the sweep's range: the wheel it served for it (None,
    ``problem`` says why: the index named none), and why the sweep did not run it (None: a
    release entry holds it)."""

    version: str
    file: str | None
    sha256: str | None
    problem: str | None
    not_run: str | None


@dataclass(frozen=True)
class Listing(Part):
    """The release listing the sweep worked from: the package on which index, when it was read,
    every version the index listed (for the wheel tags swept), and those the range selected."""

    package: str
    index: str
    read_utc: str
    versions: tuple[str, ...]
    selected: tuple[ListedRelease, ...]


@dataclass(frozen=True)
class ObservedRange(Part):
    """What the sweep observed of the range (rules.sweep_listing.observed_range): the oldest
    release observed, an observed ``introduced`` (the oldest affected release with a
    not-present one before it; None: not observed), the first fixed release, and the listed
    versions older than anything observed, with why the newest of them was not."""

    algorithm: str
    oldest: str | None
    introduced: str | None
    first_fixed: str | None
    not_observed: tuple[str, ...]
    not_observed_reason: str | None


@dataclass(frozen=True)
class Classification(Part):
    """rules/sweep_classification's classification of one release, as it wrote it."""

    algorithm: str
    overall: SweepClass
    reasons: tuple[str, ...]
    cases: Mapping[str, Mapping[str, Any]]
    # sweep --repeat N: each case that differed between the release's runs, with how (empty:
    # every case agreed); absent when the probes ran once
    unstable: Mapping[str, str] | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class ReleaseExecution(Preloaded):
    """How each of a release's probes ran."""

    probes: tuple[CheckMode, ...]


@dataclass(frozen=True)
class ReusedUnit(Part):
    """A release whose unit the sweep took from the kvprobe cache rather than observing it
    again (run/unit_cache): when that unit observed it, and the digest of its manifest."""

    observed_utc: str
    unit_manifest_sha256: str


@dataclass(frozen=True)
class ReleaseRecord(Part):
    """One release: its wheel (None: not had, ``problem`` says why), its probes, its class."""

    version: str
    wheel: WheelRecord | None
    problem: str | None
    probes: tuple[RunProbeRecord, ...]  # with runs 2..N of sweep --repeat N
    classification: Classification
    duration_s: float
    execution: ReleaseExecution | None = field(default=None, metadata=OPTIONAL)  # absent before the fork server
    reused: ReusedUnit | None = field(default=None, metadata=OPTIONAL)  # absent: observed by this sweep


@dataclass(frozen=True)
class SweepReceipt(ReceiptHead):
    """One experiment's probes on each release of a range, each release classified."""

    experiment: SweepExperimentRef
    profile: ProfileRef
    spec: str | None
    listing: Listing
    algorithm: str
    env: EnvRecord | None  # None (written {}): no unit came back to say which env it ran in
    host: Mapping[str, Any]
    settings: Mapping[str, str]
    expectations: Mapping[str, Any]
    releases: tuple[ReleaseRecord, ...]
    unserved: tuple[str, ...]
    summary: Mapping[str, list[str]]
    observed: ObservedRange
    evidence: ScopeRecord
    timings: Mapping[str, float]
    repeats: int | None = field(default=None, metadata=OPTIONAL)  # sweep --repeat N, N > 1; absent: one run

    def to_json(self) -> Json:
        doc = super().to_json()
        return {**doc, "env": doc["env"] or {}}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> SweepReceipt:
        return super().from_json({**doc, "env": doc["env"] or None})

"""The gates receipt (schemas/gates-receipt.schema.json, kvprobe.gates-receipt/4) as frozen
dataclasses: the same :class:`~kvprobe.model.receipt.Part` writer and reader as the run
receipt, so ``GatesReceipt.from_json(doc).to_json() == doc``.

Statuses are :class:`~kvprobe.model.records.GateStatus`; how they combine lives in
``rules.gate_status``, above this layer. The model reads the receipts of every version verify
accepts, each part as written (an OPTIONAL field's None: absent, so the round trip holds): /1
(inputs first by absolute path, no ``gate2`` basis), /2 (no ``--env`` inputs, no ``gate4``
basis) and /3 (gate 2 the only behavioural gate, its basis ``gate2``, probes without
``gate``); /4 receipts have ``behaviour`` and ``gate4`` and no ``gate2``. Which keys a version
must have is its schema's rule (verify's step 2), not the model's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvprobe.model.receipt import OPTIONAL, EnvRecord, ExecutionRecord, FileRef, Part, ReceiptHead, ScopeRecord
from kvprobe.model.records import GateStatus


@dataclass(frozen=True)
class CheckRecord(Part):
    """One check of a gate; only checks that ``decides`` count towards the gate's status."""

    name: str
    status: GateStatus
    detail: str
    evidence: str
    decides: bool


@dataclass(frozen=True)
class GateRecord(Part):
    number: int
    title: str
    status: GateStatus
    checks: tuple[CheckRecord, ...]


@dataclass(frozen=True)
class InputRecord(Part):
    """An operator's file by name and digest (never its path or its bytes), and the secret
    keys whose values were masked before anything was stored."""

    role_flag: str | None
    role: str | None
    sha256: str
    size: int
    # absent in the first kvprobe.gates-receipt/1 shape, which named the file by its path
    name: str | None = field(default=None, metadata=OPTIONAL)
    redacted_keys: tuple[str, ...] | None = field(default=None, metadata=OPTIONAL)
    path: str | None = field(default=None, metadata=OPTIONAL)  # that first /1 shape only


@dataclass(frozen=True)
class Inputs(Part):
    logs: tuple[InputRecord, ...]
    server_args: tuple[InputRecord, ...]
    # the workers' environments (--env): what no log shows; absent before /3
    env: tuple[InputRecord, ...] | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class MarkerRecord(Part):
    """A fix marker looked for in the target's code, and whether it is there."""

    pr: int
    gate: int
    title: str
    presence: str
    evidence: str
    first_release: str
    basis: str


@dataclass(frozen=True)
class TargetRecord(Part):
    """The SGLang the deployment runs: how it was given, what it is, what its code shows."""

    spec: str
    kind: str
    identity: Mapping[str, Any]
    markers: tuple[MarkerRecord, ...]
    settings: Mapping[str, Any] | None


@dataclass(frozen=True)
class GateProbeRecord(Part):
    """One probe of a behavioural gate (2, 3 or 4) run against the target's code."""

    experiment: str
    name: str
    source: FileRef
    raw: FileRef | None
    exit_code: int | None
    problem: str | None
    duration_s: float
    gate: int | None = field(default=None, metadata=OPTIONAL)  # absent before /4: gate 2's
    # the probe output's own lists; absent in receipts written before probes recorded them
    configuration: list[Any] | None = field(default=None, metadata=OPTIONAL)
    absorbed: list[Any] | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class GateExperimentRecord(Part):
    """A behavioural gate's experiment and its bundled experiment.toml, whose head expectations
    the probe outputs were held to: verify recomputes the gate's probe checks from that file and
    the raw outputs."""

    id: str
    file: FileRef


@dataclass(frozen=True)
class Gate2Basis(Part):
    """Gate 2's basis as /2 and /3 receipts recorded it (``gate2``): its rule and experiments."""

    algorithm: str
    experiments: tuple[GateExperimentRecord, ...]


@dataclass(frozen=True)
class BehaviourBasis(Gate2Basis):
    """What a behavioural gate's probe checks were decided from, besides the probe outputs: the
    rule (``rules.gate_probes``) and the experiments."""

    gate: int


@dataclass(frozen=True)
class ReleaseFacts(Part):
    """What the running code says about deferred release (from its environ.py and conn.py)."""

    declared: bool | None  # environ.py declares the variable; None: no environ.py to read
    default: bool | None
    evidence: str
    capability_flag: bool  # the release declares per-backend support at all
    backends: tuple[str, ...]


@dataclass(frozen=True)
class WorkerFacts(Part):
    """One worker's deferred-release setting and backend, and where each was read."""

    env_value: str | None  # None: not given
    env_source: str | None
    backend: str | None  # None: not known (no server arguments say it)
    evidence: str  # what the check cites: the worker's arguments or the env input
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeferredWorkers(Part):
    """Each role's workers as gate 4 read them (none: no input names that role)."""

    prefill: tuple[WorkerFacts, ...]
    decode: tuple[WorkerFacts, ...]

    def by_role(self) -> dict[str, tuple[WorkerFacts, ...]]:
        """Prefill's workers, then decode's: the order the checks and the JSON keys have."""
        return {"prefill": self.prefill, "decode": self.decode}


@dataclass(frozen=True)
class Gate4Basis(Part):
    """What gate 4's deferred-release checks were decided from (``gate4``): the rule
    (``rules.gate4``), the release's facts (None without target code) and each worker's."""

    algorithm: str
    release: ReleaseFacts | None
    workers: DeferredWorkers


@dataclass(frozen=True)
class DeploymentScope(ScopeRecord):
    layer: str


@dataclass(frozen=True)
class GatesReceipt(ReceiptHead):
    """One deployment against the four acceptance gates."""

    layer: str
    overall: GateStatus
    exit_code: int
    gates: tuple[GateRecord, ...]
    inputs: Inputs
    workers: tuple[Mapping[str, Any], ...]  # what each worker's startup log showed, as parsed
    target: TargetRecord | None
    probes: tuple[GateProbeRecord, ...]  # every behavioural gate's, each naming its gate
    env: EnvRecord | None
    host: Mapping[str, Any]
    evidence: DeploymentScope
    timings: Mapping[str, float]
    # one per behavioural gate (2, 3, 4); absent before /4
    behaviour: tuple[BehaviourBasis, ...] | None = field(default=None, metadata=OPTIONAL)
    # what gate 4's deferred-release checks were decided from (rules/gate4 recomputes them);
    # absent before /3
    gate4: Gate4Basis | None = field(default=None, metadata=OPTIONAL)
    gate2: Gate2Basis | None = field(default=None, metadata=OPTIONAL)  # /2 and /3 only
    # how the behavioural gates' probes ran (the run receipt's part; names are "<experiment>/<probe>"):
    # absent when no probe ran, and in receipts written before gate 2 forked its probes
    execution: ExecutionRecord | None = field(default=None, metadata=OPTIONAL)

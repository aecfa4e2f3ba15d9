"""Step 4 of a gates receipt (layer deployment): cited files are the manifest's; each behavioural
gate's probe checks are recomputed from the raw outputs and the bundled experiments' expectations,
gate 4's deferred-release checks from their recorded basis; each gate and the overall result
follow from the checks.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from kvprobe.defects import (
    BundleDefect,
    CitationMisplaced,
    CitationNotInManifest,
    ComparisonAlgorithmUnknown,
    ComparisonMismatch,
    ExperimentMismatch,
    ForgedVerdict,
    ReadmeMismatch,
    RecomputeFailed,
    RecordMismatch,
)
from kvprobe.evidence.gates_readme import render_readme
from kvprobe.evidence.reader import Bundle, read_bytes
from kvprobe.model.gates_receipt import (
    CheckRecord,
    Gate4Basis,
    GateProbeRecord,
    GateRecord,
    GatesReceipt,
    TargetRecord,
)
from kvprobe.names import PROBES_DIR, README, RECEIPT
from kvprobe.rules import gate2, gate4, gate_probes, gate_scope, markers
from kvprobe.rules.gate_status import RECORDED_EXIT_CODE, Check, Status, combine
from kvprobe.verify.consistency import citation_defects, cited_files, json_diff, probe_record, summary
from kvprobe.verify.result import StepResult, step_result


def step_gates_consistency(bundle: Bundle, receipt: GatesReceipt) -> StepResult:
    """Cited files are the manifest's; each behavioural gate's probe checks (gate 2; gates 3 and 4
    from /4) are recomputed from the raw outputs and the bundled experiments' expectations; each
    gate and the overall result follow from the checks."""
    defects = citation_defects(cited_files(receipt.to_json()), bundle.listed())
    defects += gates_probe_defects(bundle, receipt) + behaviour_basis_defects(bundle, receipt)
    probe_checks: dict[int, list[Check]] = {}
    for stated in behaviour_bases(receipt):
        recomputed, found = recompute_probe_gate(bundle, receipt, stated)
        defects += found
        if recomputed is not None:
            probe_checks[stated.gate] = recomputed
    gate4_checks, found = recompute_gate4(receipt)
    defects += found + marker_check_defects(receipt.target, receipt.gates) + deciding_defects(receipt)
    gates = []
    for gate in receipt.gates:
        number = gate.number
        checks = [(Status(c.status), c.decides) for c in gate.checks]
        if number == 4 and gate4_checks is not None:
            found, checks = gate4_check_defects(gate.checks, gate4_checks)  # one per stated check
            defects += found
        if number in probe_checks:
            found, checks = probe_check_defects(number, gate.checks, checks, probe_checks[number])
            defects += found
        status = combine(s for s, decides in checks if decides)
        if status.value != gate.status:
            basis = "its deciding checks give"
            if number in probe_checks:
                basis = "its checks, the probe checks recomputed from the raw outputs, give"
                if number == 2:
                    basis = "the raw outputs give"
            if number == 4 and gate4_checks is not None:
                basis = "its checks, the probes and deferred release recomputed, give"
            why = f"gate {number} states {gate.status.value!r}; {basis} {status.value!r}"
            defects.append(ForgedVerdict(RECEIPT, why))
        gates.append(status)
    overall = combine(gates)
    if overall.value != receipt.overall or RECORDED_EXIT_CODE[overall] != receipt.exit_code:
        defects.append(
            ForgedVerdict(
                RECEIPT,
                f"overall states {receipt.overall.value!r} (exit {receipt.exit_code}); "
                f"the gates give {overall.value!r}",
            )
        )
    defects += scope_defects(receipt) + readme_defects(bundle, receipt)
    notes = []
    if receipt.behaviour is None:
        notes.append(
            f"a {receipt.schema} receipt: gates 3 and 4 were decided by code markers and settings, not by "
            "probes (only gate 2 is behavioural before kvprobe.gates-receipt/4)"
        )
    return step_result(
        4, defects, f"gates receipt {receipt.overall.value!r} recomputed from its checks and raw outputs", notes
    )


# --- what the exports and README.md quote ------------------------------------------------

_MAX_README_BYTES = 1 << 20


def scope_defects(receipt: GatesReceipt) -> list[BundleDefect]:
    """The evidence block is kvprobe's own statement for the receipt's version
    (rules/gate_scope), its host line the receipt's host: what the Markdown export and README.md
    say the evidence shows, does not show, and its limits."""
    stated = receipt.evidence.to_json()
    diffs = json_diff(stated, gate_scope.scope(receipt.schema, receipt.host), "evidence")
    if not diffs:
        return []
    return [RecordMismatch(RECEIPT, f"not what kvprobe states for a {receipt.schema} receipt: {summary(diffs)}")]


def readme_defects(bundle: Bundle, receipt: GatesReceipt) -> list[BundleDefect]:
    """README.md, when present, is byte for byte what kvprobe renders from the receipt: an
    operator attaches it to a change ticket, and nothing else ties its words to the gates."""
    if README not in bundle.listed():
        return []
    found: list[BundleDefect] = []
    data = read_bytes(bundle, README, _MAX_README_BYTES, found)
    if data is None:
        return [ReadmeMismatch(README, d.detail) for d in found]
    if data != render_readme(receipt).encode("utf-8"):
        return [ReadmeMismatch(README, "not the summary kvprobe renders from receipt.json (edited after the run)")]
    return []


# --- gate 4's deferred-release checks and the fix markers ---------------------------------


def recompute_gate4(receipt: GatesReceipt) -> tuple[list[Check] | None, list[BundleDefect]]:
    """Gate 4's deferred-release checks from the receipt's ``gate4`` record (each worker's
    setting and backend, the release's facts), by :mod:`kvprobe.rules.gate4`; None for
    receipts before /3, which record no such basis."""
    basis = receipt.gate4
    if basis is None:
        return None, []
    if basis.algorithm != gate4.ALGORITHM:
        why = f"gate 4 was decided by {basis.algorithm!r}; this kvprobe computes {gate4.ALGORITHM!r}"
        return None, [ComparisonAlgorithmUnknown(RECEIPT, why)]
    return gate4.checks_from_basis(basis), gate4_basis_defects(receipt, basis)


def marker_check_defects(target: TargetRecord | None, gates: Sequence[GateRecord]) -> list[BundleDefect]:
    """Each fix-marker check of gates 3 and 4 ("#PR in code") has the status its marker record
    gives (unknown without one), and a fix called absent because the release predates it is so
    by the target's version."""
    records = {} if target is None else {(m.gate, m.pr): m for m in target.markers}
    version = None if target is None else target.identity.get("version")
    found: list[BundleDefect] = []
    for gate in gates:
        for check in gate.checks:
            pr = re.fullmatch(r"#(\d+) in code", check.name)
            if gate.number not in (3, 4) or pr is None:
                continue
            name, record = check.name, records.get((gate.number, int(pr[1])))
            # no record (no target code, or none for this PR): nothing was found, so unknown
            want = markers.STATUS[record.presence] if record else Status.UNKNOWN
            if check.status != want.value:
                found.append(
                    ForgedVerdict(
                        RECEIPT,
                        f"gate {gate.number} check {name!r} states {check.status.value!r}; "
                        f"its marker record gives {want.value!r}",
                    )
                )
    for record in records.values():
        if markers.NOT_IN_RELEASE in record.evidence and not markers.older_than(version, record.first_release):
            found.append(
                RecordMismatch(
                    RECEIPT,
                    f"marker #{record.pr} is absent as 'not in this release', but the target's version "
                    f"{version!r} is not before {record.first_release}",
                )
            )
    return found


def gate4_basis_defects(receipt: GatesReceipt, basis: Gate4Basis) -> list[BundleDefect]:
    """The basis agrees with the rest of the receipt: release facts only with a target, and the
    same as the target's settings; every environment source is an input the receipt lists."""
    release, target = basis.release, receipt.target
    found: list[BundleDefect] = []
    if (release is None) != (target is None or target.settings is None):
        found.append(RecordMismatch(RECEIPT, "gate 4's basis states release facts, but the receipt has no target code"))
    elif release is not None and target is not None and target.settings is not None:
        settings = target.settings
        stated = (release.default, list(release.backends) if release.capability_flag else None)
        recorded = (settings.get("deferred_default"), settings.get("deferred_backends"))
        if stated != recorded or release.declared != settings.get("deferred_declared", release.declared):
            found.append(
                RecordMismatch(RECEIPT, f"gate 4's release facts {stated} are not the target's settings {recorded}")
            )
    inputs = receipt.inputs
    names = {i.name for i in (*inputs.logs, *inputs.server_args, *(inputs.env or ())) if i.name is not None}
    for role, workers in basis.workers.by_role().items():
        for worker in workers:
            source = worker.env_source
            if source is not None and not any(source.startswith((f"{n}:", f"{n} ")) for n in names):
                found.append(RecordMismatch(RECEIPT, f"gate 4's {role} setting cites {source!r}, not an input"))
    return found


def gate4_check_defects(
    stated: Sequence[CheckRecord], recomputed: list[Check]
) -> tuple[list[BundleDefect], list[tuple[Status, bool]]]:
    """The receipt's deferred-release checks are exactly the recomputed ones (one per role);
    returns the defects and the gate's checks with the recomputed ones in their place."""
    want = {c.name: c for c in recomputed}
    defects: list[BundleDefect] = []
    names = [c.name for c in stated if c.name in want]
    if sorted(names) != sorted(want):
        defects.append(
            ForgedVerdict(
                RECEIPT, f"gate 4 states deferred-release checks {sorted(names)}; its basis gives {sorted(want)}"
            )
        )
    checks = []
    for c in stated:
        if c.name not in want:
            checks.append((Status(c.status), c.decides))
            continue
        check = want[c.name]
        checks.append((check.status, check.decides))
        if c.status != check.status.value:
            defects.append(
                ForgedVerdict(
                    RECEIPT,
                    f"gate 4 check {c.name!r} states {c.status.value!r}; "
                    f"its recorded basis gives {check.status.value!r}",
                )
            )
        elif diffs := json_diff(c.to_json(), check.record().to_json(), f"gates[4].checks[{c.name}]"):
            defects.append(
                ComparisonMismatch(RECEIPT, f"gate 4's checks differ from those recomputed: {summary(diffs)}")
            )
    return defects, checks


# --- the behavioural gates' probes ----------------------------------------------------------


@dataclass(frozen=True)
class StatedBasis:
    """One behavioural gate's basis as a receipt records it: the rule and the experiments' files."""

    gate: int
    algorithm: str
    experiments: list[tuple[str, str]]  # (experiment id, bundled experiment.toml)


def behaviour_bases(receipt: GatesReceipt) -> list[StatedBasis]:
    """Each behavioural gate's basis. /4 receipts record one per gate (``behaviour``); /2 and /3
    record gate 2's alone (``gate2``); a /1 receipt cites none: kvprobe wrote gate 2's to
    probes/<id>/experiment.toml of every gate-2 experiment whenever an SGLang was given, so a /1
    receipt is held to those files."""
    if receipt.behaviour is not None:
        return [
            StatedBasis(b.gate, b.algorithm, [(e.id, e.file.path) for e in b.experiments]) for b in receipt.behaviour
        ]
    if receipt.gate2 is not None:
        pairs = [(e.id, e.file.path) for e in receipt.gate2.experiments]
        return [StatedBasis(2, receipt.gate2.algorithm, pairs)]
    ids = gate2.EXPERIMENTS if receipt.target is not None else ()
    return [StatedBasis(2, gate2.ALGORITHM, [(exp_id, f"{PROBES_DIR}/{exp_id}/experiment.toml") for exp_id in ids])]


def behaviour_experiments(receipt: GatesReceipt) -> list[tuple[str, str]]:
    """(experiment id, bundled experiment.toml) of every behavioural gate's experiments."""
    return [pair for basis in behaviour_bases(receipt) for pair in basis.experiments]


def _probe_gate(probe: GateProbeRecord) -> int:
    """The gate a probe ran for: before /4 only gate 2 ran probes."""
    return 2 if probe.gate is None else probe.gate


def behaviour_basis_defects(bundle: Bundle, receipt: GatesReceipt) -> list[BundleDefect]:
    """A /4 receipt records gates 2, 3 and 4's bases, each by its gate's rule; each gate ran all its
    experiments when an SGLang was given (none without one), each from its bundled experiment file,
    with the probes that file declares and no others."""
    bases = behaviour_bases(receipt)
    found: list[BundleDefect] = []
    gates = [b.gate for b in bases]
    want_gates = list(gate_probes.BEHAVIOURAL) if receipt.behaviour is not None else [2]
    if gates != want_gates:
        found.append(
            RecordMismatch(RECEIPT, f"the receipt records probe bases for gates {gates}; it must for {want_gates}")
        )
    listed = bundle.listed()
    ran: dict[int, set[str]] = {}
    for basis in bases:
        rule = gate_probes.RULES.get(basis.gate)
        if rule is None:
            continue
        want = list(rule.experiments) if receipt.target is not None else []
        if [exp_id for exp_id, _rel in basis.experiments] != want:
            found.append(
                RecordMismatch(
                    RECEIPT,
                    f"gate {basis.gate} cites experiments {[e for e, _r in basis.experiments]}; with this target "
                    f"it runs {want}",
                )
            )
        for exp_id, rel in basis.experiments:
            if rel != f"{PROBES_DIR}/{exp_id}/experiment.toml":
                found.append(
                    CitationMisplaced(
                        rel, f"gate {basis.gate} experiment {exp_id!r}: expected probes/{exp_id}/experiment.toml"
                    )
                )
            elif receipt.gate2 is None and receipt.behaviour is None and rel not in listed:
                found.append(CitationNotInManifest(rel, f"gate 2 ran {exp_id!r}; manifest.json does not list its file"))
        ran[basis.gate] = {exp_id for exp_id, _rel in basis.experiments}
        for exp_id, rel in basis.experiments:
            data = bundle.experiment_docs.get(rel)
            if data is not None:
                found += _probe_set(basis.gate, exp_id, rel, data, receipt.probes)
    for i, probe in enumerate(receipt.probes):
        gate = _probe_gate(probe)
        if probe.experiment not in ran.get(gate, set()):
            found.append(
                RecordMismatch(RECEIPT, f"probes[{i}]: experiment {probe.experiment!r} is not one gate {gate} ran")
            )
    return found


def _probe_set(
    gate: int, exp_id: str, rel: str, data: dict[str, Any], probes: Sequence[GateProbeRecord]
) -> list[BundleDefect]:
    found: list[BundleDefect] = []
    if data["id"] != exp_id:
        found.append(ExperimentMismatch(rel, f"the file is experiment {data['id']!r}, cited as {exp_id!r}"))
    declared = [
        (PurePosixPath(p["path"]).stem, f"{PROBES_DIR}/{exp_id}/{p['path']}") for p in data["checks"].get("probes", [])
    ]
    recorded = [(p.name, p.source.path) for p in probes if p.experiment == exp_id and _probe_gate(p) == gate]
    if recorded != declared:
        found.append(
            RecordMismatch(
                RECEIPT, f"gate {gate} probes of {exp_id!r} are {recorded}; its experiment declares {declared}"
            )
        )
    return found


def recompute_probe_gate(
    bundle: Bundle, receipt: GatesReceipt, basis: StatedBasis
) -> tuple[list[Check] | None, list[BundleDefect]]:
    """A behavioural gate's probe checks from the raw outputs and each bundled experiment's head
    expectations, by the rule the basis names (:mod:`kvprobe.rules.gate_probes`); None (with
    why) when they cannot be recomputed."""
    rule = gate_probes.rule_for(basis.algorithm)
    if rule is None or rule.gate != basis.gate:
        current = gate_probes.RULES[basis.gate].algorithm if basis.gate in gate_probes.RULES else None
        why = f"gate {basis.gate} was decided by {basis.algorithm!r}; this kvprobe computes {current!r}"
        return None, [ComparisonAlgorithmUnknown(RECEIPT, why)]
    if receipt.target is None:
        return [gate_probes.NO_TARGET], []
    checks: list[Check] = []
    for exp_id, rel in basis.experiments:
        data = bundle.experiment_docs.get(rel)
        if data is None:
            return None, [RecomputeFailed(rel, f"unusable or missing (step 2): gate {basis.gate} not recomputed")]
        docs: dict[str, Any] = {}
        problems: list[str] = []
        for probe in (p for p in receipt.probes if p.experiment == exp_id and _probe_gate(p) == basis.gate):
            if probe.raw is None:
                problems.append(str(probe.problem))
            elif probe.raw.path in bundle.raw_docs:
                docs[probe.name] = bundle.raw_docs[probe.raw.path]
            else:
                why = f"unusable (step 2): gate {basis.gate} not recomputed"
                return None, [RecomputeFailed(probe.raw.path, why)]
        try:
            head = data.get("expect", {}).get("head", {})
            checks += gate_probes.experiment_checks(rule, exp_id, data["fix"]["prs"], head, docs, problems)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            why = f"gate {basis.gate}'s raw outputs cannot be read: {type(exc).__name__}: {exc}"
            return None, [RecomputeFailed(RECEIPT, why)]
    return checks, []


def probe_check_defects(
    number: int, stated: Sequence[CheckRecord], checks: list[tuple[Status, bool]], recomputed: list[Check]
) -> tuple[list[BundleDefect], list[tuple[Status, bool]]]:
    """The receipt's probe checks of gate ``number`` are exactly the recomputed ones: a status that
    differs is a forged verdict; any other difference (a check's name, detail, count or whether
    it decides) a mismatch. Gate 2's checks are all probe checks; gates 3 and 4's are those the
    rule owns (named after its experiments). Returns the defects and the gate's checks (``checks``,
    one per stated check) with the recomputed probe checks in place of the stated ones."""
    rule = gate_probes.RULES[number]
    own = [c for c in stated if number == 2 or rule.owns(c.name)]
    rest = [checks[i] for i, c in enumerate(stated) if not (number == 2 or rule.owns(c.name))]
    merged = [(c.status, c.decides) for c in recomputed] + rest
    want = [c.record() for c in recomputed]
    stated_status = [(c.name, c.status) for c in own]
    want_status = [(c.name, c.status) for c in want]
    if stated_status != want_status:
        wrong = [f"{n!r} states {s.value!r}" for n, s in stated_status if (n, s) not in want_status]
        missing = [f"{n!r} {s}" for n, s in want_status if (n, s) not in stated_status]
        return [
            ForgedVerdict(
                RECEIPT,
                f"gate {number}'s probe checks are not those its raw outputs and expectations give "
                f"({summary(wrong)}); recomputed: {summary(missing)}",
            )
        ], merged
    diffs = json_diff([c.to_json() for c in own], [c.to_json() for c in want], f"gates[{number}].checks")
    found: list[BundleDefect] = []
    if diffs:
        found.append(
            ComparisonMismatch(RECEIPT, f"gate {number}'s probe checks differ from those recomputed: {summary(diffs)}")
        )
    return found, merged


def deciding_defects(receipt: GatesReceipt) -> list[BundleDefect]:
    """From /4 on, a fix marker ("#PR in code") never decides gates 3 and 4 (the probes do), and
    gate 3's read-integrity defence always does: a receipt that moves either is refused."""
    if receipt.behaviour is None:
        return []
    found: list[BundleDefect] = []
    for gate in receipt.gates:
        if gate.number not in (3, 4):
            continue
        for check in gate.checks:
            marker = re.fullmatch(r"#\d+ in code", check.name) is not None
            if marker and check.decides:
                found.append(
                    RecordMismatch(RECEIPT, f"gate {gate.number} check {check.name!r} decides; markers do not")
                )
            if gate.number == 3 and check.name == "read-integrity defence" and not check.decides:
                found.append(RecordMismatch(RECEIPT, "gate 3's read-integrity defence is stated as not deciding"))
    return found


def gates_probe_defects(bundle: Bundle, receipt: GatesReceipt) -> list[BundleDefect]:
    """The behavioural gates' probe records agree with the raw outputs they cite: where each sits
    (raw/gate<N>/<experiment>/<probe>.json), a problem only without an output, and the
    configuration the probe set and the calls its mocks absorbed exactly the output's (absent
    only where the output records none: receipts written before probes recorded them)."""
    found: list[BundleDefect] = []
    for i, probe in enumerate(receipt.probes):
        where = f"probes[{i}] {probe.experiment}/{probe.name}"
        want = f"raw/gate{_probe_gate(probe)}/{probe.experiment}/{probe.name}.json"
        if probe.raw is None:
            if not (isinstance(probe.problem, str) and probe.problem):
                found.append(RecordMismatch(RECEIPT, f"{where}: no output and no problem recorded"))
            doc: dict[str, Any] = {}
        elif probe.raw.path != want:
            found.append(CitationMisplaced(probe.raw.path, f"{where}: expected {want}"))
            continue
        elif probe.raw.path not in bundle.raw_docs:
            continue  # unusable, reported by step 2
        else:
            doc = bundle.raw_docs[probe.raw.path]
            found += probe_record(probe.raw.path, doc, probe.name, probe.problem)
        for key, stated in (("configuration", probe.configuration), ("absorbed", probe.absorbed)):
            derived = list(doc.get(key) or [])
            if stated is None and not derived:
                continue
            if stated is None:
                found.append(
                    RecordMismatch(RECEIPT, f"{where}: {key} is missing; its raw output records {len(derived)}")
                )
                continue
            diffs = json_diff(stated, derived, f"probes[{i}].{key}")
            if diffs:
                found.append(RecordMismatch(RECEIPT, f"{where}: {key} differs from the raw output: {summary(diffs)}"))
    return found

"""Verify a bundle as untrusted input, as numbered steps that each report every defect.

1 layout  2 documents (strict JSON/TOML, kvprobe's own schemas)  3 integrity  4 consistency
5 authenticity (matches a digest published elsewhere, or only self-consistent; for an experiment
kvprobe ships, the bundled experiment file and probes equal the installed copy)  6 rerun (opt-in).

A failed verification is an outcome (a :class:`Report`), not an exception; only a path that
is not a bundle at all raises (:class:`~kvprobe.defects.NotABundle`, exit 2).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvprobe import schema
from kvprobe.defects import (
    BundleDefect,
    ManifestDigestMismatch,
    MissingRequired,
    NotABundle,
    OversizedClaim,
    RawInvalid,
    SchemaViolation,
    UnknownSchemaVersion,
)
from kvprobe.errors import SchemaError, UsageError, VerificationFailed
from kvprobe.evidence.archive import extracted
from kvprobe.evidence.reader import Bundle, parse_json, read_bytes, read_json, read_toml
from kvprobe.evidence.safetree import Limits, Tree
from kvprobe.model.gates_receipt import GateProbeRecord, GatesReceipt
from kvprobe.model.load import AnyReceipt, load
from kvprobe.model.receipt import ProbeRecord, ProbeRepeat, Receipt
from kvprobe.model.sweep_receipt import SweepReceipt
from kvprobe.names import MANIFEST, PROBES_DIR, PYTEST_REPORT_SCHEMA, RECEIPT, SUMS, TEST_RUN_SCHEMA
from kvprobe.verify.anchor import Anchor, compare_experiment, compare_installed
from kvprobe.verify.gates_consistency import behaviour_experiments, step_gates_consistency
from kvprobe.verify.integrity import integrity_defects, reread_defects
from kvprobe.verify.result import STEP_NAMES, StepResult, VerifyOutcome, step_result
from kvprobe.verify.run_consistency import cited_outputs, step_consistency
from kvprobe.verify.sweep_consistency import step_sweep_consistency

REQUIRED = (RECEIPT, MANIFEST, SUMS)
# The receipt step 2 accepted, in its typed form (model.load's): what steps 4 and 5 read.
Accepted = AnyReceipt
_MAX_SCHEMA_ERRORS = 20


# Step 6, handed in by the caller (kvprobe.run.rerun builds it): re-running needs the
# pipeline, which itself verifies what it writes, so verify does not import it.
RerunStep = Callable[[Bundle], StepResult]


@dataclass(frozen=True)
class Anchoring:
    """One thing outside the bundle that a verified outcome rests on."""

    kind: str  # expect-manifest-sha256 | attestation | rerun
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "detail": self.detail}


@dataclass(frozen=True)
class VerifyOptions:
    limits: Limits = Limits()
    expect_manifest_sha256: str | None = None
    rerun: RerunStep | None = None
    check_installed: bool = True  # step 5 compares a known experiment with kvprobe's own copy
    # what supplied expect_manifest_sha256 (its anchor's name in the Report): the user's
    # --expect-manifest-sha256, a checked --attestation (with its key id), or both
    digest_from: tuple[Anchoring, ...] = ()


@dataclass
class Report:
    bundle: str
    steps: list[StepResult]
    archive: str | None = None
    manifest_sha256: str | None = None
    expected_manifest_sha256: str | None = None
    run_id: str | None = None
    digest_from: tuple[Anchoring, ...] = ()
    # the documents steps 2-4 checked, for readers that go on to use them (report, pack)
    receipt: dict[str, Any] | None = field(default=None, repr=False)
    manifest: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def defects(self) -> list[BundleDefect]:
        return [d for s in self.steps for d in s.defects]

    @property
    def outcome(self) -> VerifyOutcome:
        """verified (sound, and anchored outside the bundle) | self-consistent (sound, but
        nothing outside the bundle vouches for it) | failed | could-not-rerun (the rerun
        could not observe; never a pass)."""
        if not self._sound():
            return VerifyOutcome.FAILED
        if any(s.status == "could-not-run" for s in self.steps):
            return VerifyOutcome.COULD_NOT_RERUN
        return VerifyOutcome.VERIFIED if self._anchors() else VerifyOutcome.SELF_CONSISTENT

    @property
    def ok(self) -> bool:
        """No defect and nothing left unobserved: verified or self-consistent. What a writer
        (verify-on-write) or a reader that only needs a sound bundle (pack, report) asks."""
        return self.outcome in (VerifyOutcome.VERIFIED, VerifyOutcome.SELF_CONSISTENT)

    @property
    def anchored_by(self) -> list[Anchoring]:
        """What outside the bundle a ``verified`` outcome rests on; empty for every other outcome."""
        return self._anchors() if self.outcome is VerifyOutcome.VERIFIED else []

    def _sound(self) -> bool:
        if any(s.status == "fail" for s in self.steps) or self.defects:
            return False
        return not any(s.status == "skipped" and s.number <= 4 for s in self.steps)

    def _anchors(self) -> list[Anchoring]:
        found: list[Anchoring] = []
        for step in self.steps:
            if step.number == 5 and step.status == "pass":
                found += self.digest_from
            elif step.number == 6 and step.status == "pass":
                found.append(Anchoring("rerun", f"re-ran and reproduced: {step.summary}"))
        return found

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "anchored_by": [a.to_json() for a in self.anchored_by],
            "bundle": self.bundle,
            "archive": self.archive,
            "run_id": self.run_id,
            "manifest_sha256": self.manifest_sha256,
            "expected_manifest_sha256": self.expected_manifest_sha256,
            "steps": [s.to_json() for s in self.steps],
            "defect_count": len(self.defects),
        }


# --- entry points ------------------------------------------------------------------------


def parse_digest(text: str | None) -> str | None:
    """A user-given manifest digest (64 hex, optional 'sha256:'); raises UsageError."""
    if text is None:
        return None
    value = text.strip().lower().removeprefix("sha256:")
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise UsageError(f"--expect-manifest-sha256 {text!r} is not a 64-hex sha256 digest")
    return value


def verify(path: Path, opts: VerifyOptions = VerifyOptions()) -> Report:
    """Verify a bundle directory or a .tar.gz made by ``kvprobe bundle pack``.

    Raises NotABundle (exit 2) when ``path`` is neither; every other problem is a defect
    in the returned Report.
    """
    path = Path(path)
    if path.is_dir():
        return verify_dir(path, opts)
    if path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
        with extracted(path, opts.limits) as (root, defects):
            if root is None:
                report = Report(
                    str(path),
                    [
                        StepResult(1, "fail", "archive members rejected; nothing extracted", defects),
                        *_skipped(range(2, 7), 1, opts),
                    ],
                )
            else:
                report = verify_dir(root, opts)
            report.archive, report.bundle = str(path), str(path)
            return report
    if not os.path.lexists(path):
        raise NotABundle(f"{path}: no such file or directory, so not a bundle (give a bundle directory or a .tar.gz)")
    raise NotABundle(f"{path}: not a bundle (expected a directory or a .tar.gz from `kvprobe bundle pack`)")


def verified(path: Path, opts: VerifyOptions = VerifyOptions()) -> Report:
    """``verify(path, opts)`` for readers that must say nothing verify would not (report, pack):
    the Report of a bundle that verifies; VerificationFailed naming its first defect (exit 1)
    otherwise, NotABundle (exit 2) when ``path`` is not a bundle."""
    report = verify(path, opts)
    if report.ok:
        return report
    defects = report.defects
    first = defects[0].message if defects else next(s.summary for s in report.steps if s.status != "pass")
    raise VerificationFailed(
        f"{path} does not verify: {first}",
        hints=[d.message for d in defects[1:10]] + [f"`kvprobe verify {path}` lists every defect"],
    )


def verify_dir(root: Path, opts: VerifyOptions) -> Report:
    with Tree(root) as tree:
        bundle = Bundle(tree, opts.limits)
        steps = [step_layout(bundle)]
        documents, receipt = step_documents(bundle) if _usable(steps[0]) else (_skip(2, 1), None)
        steps.append(documents)
        steps.append(
            step_integrity(bundle)
            if bundle.manifest is not None and bundle.scanned.complete
            else _skip(3, 2 if bundle.scanned.complete else 1)
        )
        steps.append(
            step_consistency_of(bundle, receipt) if receipt is not None and bundle.manifest is not None else _skip(4, 2)
        )
        _reread_check(steps[2], bundle)
        steps.append(step_authenticity(bundle, receipt, opts.expect_manifest_sha256, opts.check_installed))
        if opts.rerun is not None:
            steps.append(_rerun_step(bundle, steps, opts.rerun))
        return Report(
            str(root),
            steps,
            manifest_sha256=_digest(bundle.manifest_bytes),
            expected_manifest_sha256=opts.expect_manifest_sha256,
            digest_from=_digest_sources(opts),
            run_id=None if receipt is None else receipt.run_id,
            receipt=bundle.receipt,
            manifest=bundle.manifest,
        )


def _digest_sources(opts: VerifyOptions) -> tuple[Anchoring, ...]:
    """What step 5's digest match stands for: the caller's sources, else the user's flag."""
    if opts.expect_manifest_sha256 is None:
        return ()
    return opts.digest_from or (
        Anchoring("expect-manifest-sha256", "manifest sha256 matches --expect-manifest-sha256"),
    )


def _usable(layout: StepResult) -> bool:
    return not any(isinstance(d, MissingRequired) for d in layout.defects)


def _skip(number: int, needs: int) -> StepResult:
    return StepResult(number, "skipped", f"needs step {needs} ({STEP_NAMES[needs]})")


def _skipped(numbers: Iterable[int], needs: int, opts: VerifyOptions) -> list[StepResult]:
    return [_skip(n, needs) for n in numbers if n != 6 or opts.rerun is not None]


def _digest(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


# --- step 1: layout ----------------------------------------------------------------------


def step_layout(bundle: Bundle) -> StepResult:
    scan = bundle.tree.scan(bundle.limits)
    bundle.scan = scan
    files = scan.files()
    if not any(name in scan.entries for name in REQUIRED):
        raise NotABundle(f"{bundle.tree.root}: not a bundle (no {', '.join(REQUIRED)})")
    defects = list(scan.defects)
    for name in REQUIRED:
        if name not in files:
            what = "missing" if name not in scan.entries else f"a {scan.entries[name].kind}, not a regular file"
            defects.append(MissingRequired(name, f"required file is {what}"))
    size = sum(e.size for e in files.values())
    return step_result(1, defects, f"{len(files)} files, {size} bytes")


# --- step 2: documents -------------------------------------------------------------------


def schema_defects(doc: Any, rel: str, family: str) -> list[BundleDefect]:
    """The document names a version of ``family`` kvprobe knows, and passes that schema."""
    version = doc.get("schema") if isinstance(doc, dict) else None
    if not isinstance(version, str) or not version.startswith(f"{family}/"):
        return [SchemaViolation(rel, f"schema: expected a {family}/N document, found {version!r}")]
    try:
        problems = schema.errors(doc, version)
    except SchemaError as exc:
        return [UnknownSchemaVersion(rel, exc.message)]
    return [SchemaViolation(rel, p) for p in problems[:_MAX_SCHEMA_ERRORS]]


def step_documents(bundle: Bundle) -> tuple[StepResult, Accepted | None]:
    """Step 2, and the receipt it accepted in its typed form (None: it accepted none)."""
    defects: list[BundleDefect] = []
    doc = read_json(bundle, RECEIPT, defects)
    bundle.manifest_bytes = read_bytes(bundle, MANIFEST, bundle.limits.max_json_bytes, defects)
    manifest = parse_json(bundle, MANIFEST, bundle.manifest_bytes, defects)
    bundle.receipt_family = _receipt_family(doc)
    receipt_ok = doc is not None and _append(defects, schema_defects(doc, RECEIPT, bundle.receipt_family))
    receipt = _typed(doc, bundle.receipt_family, defects) if receipt_ok else None
    manifest_ok = manifest is not None and _append(defects, manifest_defects(manifest, bundle.limits))
    bundle.receipt = doc if receipt is not None else None
    bundle.manifest = manifest if manifest_ok else None
    count = 2
    if isinstance(receipt, Receipt):
        count += _read_cited(bundle, receipt, defects)
        _read_experiment(bundle, receipt.experiment.file, defects)
    elif isinstance(receipt, SweepReceipt):
        probes = [p for r in receipt.releases for p in r.probes]
        again = [r for p in probes for r in getattr(p, "repeats", None) or ()]  # sweep --repeat N
        count += _read_probe_outputs(bundle, [*probes, *again], defects)
        _read_experiment(bundle, receipt.experiment.file, defects)
    elif isinstance(receipt, GatesReceipt):
        count += _read_probe_outputs(bundle, receipt.probes, defects)
        for _exp_id, rel in behaviour_experiments(receipt):
            _read_experiment_file(bundle, rel, defects)
    return step_result(2, defects, f"{count} JSON documents, strict; schemas: kvprobe's own"), receipt


def _typed(doc: Any, family: str, defects: list[BundleDefect]) -> Accepted | None:
    """The schema-valid receipt ``doc`` in its typed form (:func:`kvprobe.model.load.load`, the
    one entry); None, with a defect, where a part the schema leaves open is not what the model
    reads (a gates receipt's ``env`` that is no env record)."""
    try:
        return load(doc)
    except (KeyError, TypeError, ValueError, AttributeError, SchemaError) as exc:
        defects.append(SchemaViolation(RECEIPT, f"does not read as a {family} document: {type(exc).__name__}: {exc}"))
        return None


def step_consistency_of(bundle: Bundle, receipt: Accepted) -> StepResult:
    """Step 4, by the kind of receipt step 2 accepted."""
    if isinstance(receipt, GatesReceipt):
        return step_gates_consistency(bundle, receipt)
    if isinstance(receipt, SweepReceipt):
        return step_sweep_consistency(bundle, receipt)
    return step_consistency(bundle, receipt)


def manifest_defects(manifest: Any, limits: Limits) -> list[BundleDefect]:
    """More entries than a bundle may hold is refused before the (slow) schema check."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if isinstance(files, list) and len(files) > limits.max_files:
        return [OversizedClaim(MANIFEST, f"lists {len(files)} files > cap {limits.max_files} (raise with --max-files)")]
    return schema_defects(manifest, MANIFEST, "kvprobe.manifest")


def _receipt_family(receipt: Any) -> str:
    """Run receipts and `kvprobe gates` receipts (layer deployment) share the bundle format."""
    version = receipt.get("schema") if isinstance(receipt, dict) else None
    for family in ("kvprobe.gates-receipt", "kvprobe.sweep-receipt"):
        if isinstance(version, str) and version.startswith(f"{family}/"):
            return family
    return "kvprobe.receipt"


def _append(defects: list[BundleDefect], found: list[BundleDefect]) -> bool:
    defects.extend(found)
    return not found


def _read_cited(bundle: Bundle, receipt: Receipt, defects: list[BundleDefect]) -> int:
    count = 0
    for _side, kind, rel, _name, _record in cited_outputs(receipt):
        doc = read_json(bundle, rel, defects)
        if doc is None:
            continue
        count += 1
        found = probe_output_defects(doc, rel) if kind == "probe" else test_run_defects(doc, rel)
        if _append(defects, found):
            bundle.raw_docs[rel] = doc
    return count


def _read_probe_outputs(
    bundle: Bundle, probes: Sequence[ProbeRecord | ProbeRepeat | GateProbeRecord], defects: list[BundleDefect]
) -> int:
    """The probe outputs a sweep or gates receipt cites (``probes[].raw``), schema-checked."""
    count = 0
    for probe in probes:
        if probe.raw is None:
            continue
        rel = probe.raw.path
        doc = read_json(bundle, rel, defects)
        if doc is not None:
            count += 1
            if _append(defects, probe_output_defects(doc, rel)):
                bundle.raw_docs[rel] = doc
    return count


NOT_PRESENT_ERROR = "kvprobe_probe.NotPresent"  # probe_api: the only error a not-present case records


def probe_output_defects(doc: Any, rel: str) -> list[BundleDefect]:
    """The probe output passes its schema, and each not-present case is what the probe API
    writes of one: raised NotPresent (never CannotObserve, the probe API's "this env cannot
    import the release", nor any set-up error), its reason naming exactly its ``missing``. A
    case whose own error record says otherwise is no evidence of absence."""
    found = schema_defects(doc, rel, "kvprobe.probe-output")
    if found:
        return found
    for i, case in enumerate(doc["cases"]):
        if case.get("observation") != "not-present":
            continue
        said = "not present in this release: " + ", ".join(case["missing"])
        error = case["error"]
        if error["type"] != NOT_PRESENT_ERROR or case["reason"] != said:
            found.append(
                RawInvalid(
                    rel,
                    f"cases[{i}] ({case['name']}) is not-present, but its error is {error['type'][:100]!r} "
                    f"({error['message'][:200]!r}), not {NOT_PRESENT_ERROR} with a reason naming what it lacks",
                )
            )
    return found


_TEST_RUN_KEYS = {"schema", "path", "side", "exit_code", "timed_out", "overlay", "problem", "report"}


def test_run_defects(doc: Any, rel: str) -> list[BundleDefect]:
    """The runner's test-run record (no JSON Schema file yet): shape and version checked here."""
    version = doc.get("schema") if isinstance(doc, dict) else None
    if not isinstance(version, str) or not version.startswith("kvprobe.test-run/"):
        return [SchemaViolation(rel, f"schema: expected a kvprobe.test-run/N document, found {version!r}")]
    if version != TEST_RUN_SCHEMA:
        return [
            UnknownSchemaVersion(
                rel, f"unknown schema version {version!r}: this kvprobe knows {TEST_RUN_SCHEMA}; upgrade kvprobe"
            )
        ]
    if set(doc) != _TEST_RUN_KEYS:
        return [SchemaViolation(rel, f"keys {sorted(doc)} != {sorted(_TEST_RUN_KEYS)}")]
    report = doc["report"]
    if report is not None and (not isinstance(report, dict) or report.get("schema") != PYTEST_REPORT_SCHEMA):
        return [SchemaViolation(rel, "report: not a kvprobe.pytest-report/1 document")]
    return []


def _read_experiment(bundle: Bundle, rel: str, defects: list[BundleDefect]) -> None:
    """The receipt's own experiment file (``rel``), kept when it is a valid experiment."""
    bundle.experiment_bytes, doc = read_toml(bundle, rel, defects)
    if doc is not None and _append(defects, schema_defects(doc, rel, "kvprobe.experiment")):
        bundle.experiment = doc


def _read_experiment_file(bundle: Bundle, rel: str, defects: list[BundleDefect]) -> None:
    """One behavioural gate's experiment file, kept by path when it is a valid experiment."""
    _data, doc = read_toml(bundle, rel, defects)
    if doc is not None and _append(defects, schema_defects(doc, rel, "kvprobe.experiment")):
        bundle.experiment_docs[rel] = doc


# --- step 3: integrity -------------------------------------------------------------------


def step_integrity(bundle: Bundle) -> StepResult:
    defects = integrity_defects(bundle)
    listed = bundle.listed()
    return step_result(3, defects, f"{len(listed)} listed files: size, sha256; SHA256SUMS == manifest.json")


def _reread_check(integrity: StepResult, bundle: Bundle) -> None:
    """After steps 2-4 read what they parse: step 3 fails where those bytes are not the ones
    the manifest lists (it hashed a second read)."""
    if integrity.status == "skipped":
        return
    found = reread_defects(bundle)
    if found:
        integrity.defects += found
        integrity.status = "fail"


# --- step 5: authenticity ----------------------------------------------------------------

SELF_CONSISTENT_NOTE = (
    "a bundle that agrees with itself proves that it agrees with itself, nothing more: its raw "
    "outputs could have been written by hand. Pass --expect-manifest-sha256 with a digest published "
    "elsewhere, or --attestation with the publisher's key, to tie it to its publisher (or --rerun)"
)


def step_authenticity(
    bundle: Bundle, receipt: Accepted | None, expected: str | None, check_installed: bool = True
) -> StepResult:
    """The published digest (when given) and, for each experiment kvprobe ships, the installed copy."""
    result = _digest_check(bundle, expected)
    anchors = _anchors(bundle, receipt) if check_installed else []
    if not anchors and isinstance(receipt, Receipt):
        result.notes.append(
            f"{receipt.experiment.id} is not an experiment this kvprobe ships: "
            "its probe code is only as trustworthy as the bundle"
        )
    same = []
    for anchor in anchors:
        prefix = f"{PROBES_DIR}/{anchor.experiment}/"
        if anchor.defects:
            result.status = "fail"
            result.defects += anchor.defects
            result.summary += f"; {prefix} differs from {anchor.label}"
        else:
            same.append(f"{prefix}: same as {anchor.label} (experiment file and probes, sha256 by sha256)")
    result.notes[:0] = same
    return result


def _anchors(bundle: Bundle, receipt: Accepted | None) -> list[Anchor]:
    """The installed experiments to hold the bundle to: its own, or each experiment of a gates
    receipt's behavioural gates."""
    if receipt is None:
        return []
    if not isinstance(receipt, GatesReceipt):
        found = [compare_installed(bundle, receipt)]
    else:
        made_by = receipt.tool.version
        found = [compare_experiment(bundle, exp_id, made_by) for exp_id, _rel in behaviour_experiments(receipt)]
    return [a for a in found if a is not None]


def _digest_check(bundle: Bundle, expected: str | None) -> StepResult:
    digest = _digest(bundle.manifest_bytes)
    if expected is None:
        if digest is None:
            return StepResult(5, "skipped", "manifest.json unreadable")
        return StepResult(5, "self-consistent", f"manifest sha256 {digest}", notes=[SELF_CONSISTENT_NOTE])
    if digest == expected:
        return StepResult(5, "pass", f"manifest sha256 {digest} matches --expect-manifest-sha256")
    found = digest or "unreadable"
    return StepResult(
        5,
        "fail",
        "manifest digest does not match",
        [ManifestDigestMismatch(MANIFEST, f"sha256 {found} != expected {expected}")],
    )


# --- step 6: rerun -----------------------------------------------------------------------


def _rerun_step(bundle: Bundle, steps: list[StepResult], rerun: RerunStep) -> StepResult:
    if any(s.status != "pass" for s in steps[:4]) or steps[4].status == "fail":
        return StepResult(6, "skipped", "an earlier step failed; nothing was re-run")
    if bundle.receipt_family not in ("kvprobe.receipt", "kvprobe.sweep-receipt"):
        return StepResult(
            6,
            "could-not-run",
            "a gates bundle holds digests of the operator's logs, not "
            "the logs: run `kvprobe gates` again with the same inputs",
        )
    return rerun(bundle)

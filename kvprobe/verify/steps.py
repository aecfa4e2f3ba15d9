"""Verify a bundle as untrusted input, as numbered steps that each report every defect.

1 layout  2 documents (strict JSON/TOML, kvprobe's own schemas)  3 integrity  4 consistency
5 authenticity (self-consistent, or matches a digest published elsewhere)  6 rerun (opt-in).

A failed verification is an outcome (a :class:`Report`), not an exception; only a path that
is not a bundle at all raises (:class:`~kvprobe.defects.NotABundle`, exit 2).
"""

from __future__ import annotations

import hashlib
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvprobe import schema
from kvprobe.defects import (
    BundleDefect,
    ManifestDigestMismatch,
    MissingRequired,
    NotABundle,
    SchemaViolation,
    TomlMalformed,
    UnknownSchemaVersion,
)
from kvprobe.errors import SchemaError, UsageError
from kvprobe.evidence.archive import extracted
from kvprobe.evidence.reader import Bundle, cited_raw, parse_json, read_bytes, read_json
from kvprobe.evidence.safetree import Limits, Tree
from kvprobe.names import MANIFEST, PYTEST_REPORT_SCHEMA, RECEIPT, SUMS, TEST_RUN_SCHEMA
from kvprobe.verify.consistency import step_consistency, step_gates_consistency
from kvprobe.verify.integrity import integrity_defects
from kvprobe.verify.result import STEP_NAMES, StepResult, step_result

REQUIRED = (RECEIPT, MANIFEST, SUMS)
_MAX_SCHEMA_ERRORS = 20


# Step 6, handed in by the caller (kvprobe.run.rerun builds it): re-running needs the
# pipeline, which itself verifies what it writes, so verify does not import it.
RerunStep = Callable[[Bundle], StepResult]


@dataclass(frozen=True)
class VerifyOptions:
    limits: Limits = Limits()
    expect_manifest_sha256: str | None = None
    rerun: RerunStep | None = None


@dataclass
class Report:
    bundle: str
    steps: list[StepResult]
    archive: str | None = None
    manifest_sha256: str | None = None
    expected_manifest_sha256: str | None = None
    run_id: str | None = None

    @property
    def defects(self) -> list[BundleDefect]:
        return [d for s in self.steps for d in s.defects]

    @property
    def outcome(self) -> str:
        """verified | failed | could-not-rerun (the rerun could not observe; never a pass)."""
        if any(s.status == "fail" for s in self.steps) or self.defects:
            return "failed"
        if any(s.status == "could-not-run" for s in self.steps):
            return "could-not-rerun"
        if any(s.status == "skipped" and s.number <= 4 for s in self.steps):
            return "failed"
        return "verified"

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
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
    raise NotABundle(f"{path}: not a bundle (expected a directory or a .tar.gz from `kvprobe bundle pack`)")


def verify_dir(root: Path, opts: VerifyOptions) -> Report:
    with Tree(root) as tree:
        bundle = Bundle(tree, opts.limits)
        steps = [step_layout(bundle)]
        steps.append(step_documents(bundle) if _usable(steps[0]) else _skip(2, 1))
        steps.append(
            step_integrity(bundle)
            if bundle.manifest is not None and bundle.scanned.complete
            else _skip(3, 2 if bundle.scanned.complete else 1)
        )
        consistency = step_gates_consistency if bundle.receipt_family != "kvprobe.receipt" else step_consistency
        steps.append(consistency(bundle) if bundle.receipt is not None and bundle.manifest is not None else _skip(4, 2))
        steps.append(step_authenticity(bundle, opts.expect_manifest_sha256))
        if opts.rerun is not None:
            steps.append(_rerun_step(bundle, steps, opts.rerun))
        return Report(
            str(root),
            steps,
            manifest_sha256=_digest(bundle.manifest_bytes),
            expected_manifest_sha256=opts.expect_manifest_sha256,
            run_id=(bundle.receipt or {}).get("run_id") if isinstance(bundle.receipt, dict) else None,
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


def step_documents(bundle: Bundle) -> StepResult:
    defects: list[BundleDefect] = []
    receipt = read_json(bundle, RECEIPT, defects)
    bundle.manifest_bytes = read_bytes(bundle, MANIFEST, bundle.limits.max_json_bytes, defects)
    manifest = parse_json(bundle, MANIFEST, bundle.manifest_bytes, defects)
    bundle.receipt_family = _receipt_family(receipt)
    receipt_ok = receipt is not None and _append(defects, schema_defects(receipt, RECEIPT, bundle.receipt_family))
    manifest_ok = manifest is not None and _append(defects, schema_defects(manifest, MANIFEST, "kvprobe.manifest"))
    bundle.receipt = receipt if receipt_ok else None
    bundle.manifest = manifest if manifest_ok else None
    count = 2
    if bundle.receipt is not None and bundle.receipt_family == "kvprobe.receipt":
        count += _read_cited(bundle, defects)
        _read_experiment(bundle, defects)
    return step_result(2, defects, f"{count} JSON documents, strict; schemas: kvprobe's own")


def _receipt_family(receipt: Any) -> str:
    """Run receipts and `kvprobe gates` receipts (layer deployment) share the bundle format."""
    version = receipt.get("schema") if isinstance(receipt, dict) else None
    gates = isinstance(version, str) and version.startswith("kvprobe.gates-receipt/")
    return "kvprobe.gates-receipt" if gates else "kvprobe.receipt"


def _append(defects: list[BundleDefect], found: list[BundleDefect]) -> bool:
    defects.extend(found)
    return not found


def _read_cited(bundle: Bundle, defects: list[BundleDefect]) -> int:
    count = 0
    for _side, kind, rel, _record in cited_raw(bundle.accepted_receipt):
        doc = read_json(bundle, rel, defects)
        if doc is None:
            continue
        count += 1
        found = schema_defects(doc, rel, "kvprobe.probe-output") if kind == "probe" else test_run_defects(doc, rel)
        if _append(defects, found):
            bundle.raw_docs[rel] = doc
    return count


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


def _read_experiment(bundle: Bundle, defects: list[BundleDefect]) -> None:
    rel = bundle.accepted_receipt["experiment"]["file"]
    data = read_bytes(bundle, rel, bundle.limits.max_json_bytes, defects)
    if data is None:
        return
    bundle.experiment_bytes = data
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        defects.append(TomlMalformed(rel, f"not valid TOML: {exc}"))
        return
    if _append(defects, schema_defects(doc, rel, "kvprobe.experiment")):
        bundle.experiment = doc


# --- step 3: integrity -------------------------------------------------------------------


def step_integrity(bundle: Bundle) -> StepResult:
    defects = integrity_defects(bundle)
    listed = bundle.listed()
    return step_result(3, defects, f"{len(listed)} listed files: size, sha256; SHA256SUMS == manifest.json")


# --- step 5: authenticity ----------------------------------------------------------------


def step_authenticity(bundle: Bundle, expected: str | None) -> StepResult:
    digest = _digest(bundle.manifest_bytes)
    if expected is None:
        if digest is None:
            return StepResult(5, "skipped", "manifest.json unreadable")
        return StepResult(
            5,
            "self-consistent",
            f"manifest sha256 {digest}",
            notes=[
                "a bundle that agrees with itself is not thereby authentic: pass "
                "--expect-manifest-sha256 with a digest published elsewhere"
            ],
        )
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
    if any(s.status != "pass" for s in steps[:4]):
        return StepResult(6, "skipped", "the bundle did not verify (steps 1-4); nothing to re-run")
    if bundle.receipt_family != "kvprobe.receipt":
        return StepResult(
            6,
            "could-not-run",
            "a gates bundle holds digests of the operator's logs, not "
            "the logs: run `kvprobe gates` again with the same inputs",
        )
    return rerun(bundle)

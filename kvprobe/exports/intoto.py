"""An in-toto Statement v1 from a bundle of any kind (run, sweep, gates): its files, its
packed .tar.gz (when given) and the artifacts it tested as subjects, the receipt as predicate.
A Statement carries no time: the run's time is the receipt's ``created_utc``; when it was
signed is the signature's business (cosign, DSSE)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvprobe import files
from kvprobe.defects import NotABundle
from kvprobe.errors import UsageError
from kvprobe.exports.bundle_view import BundleView, project, purl, wheel_purl
from kvprobe.model.receipt import Receipt
from kvprobe.model.sweep_receipt import SweepReceipt
from kvprobe.names import INTOTO_PREDICATE_TYPE, MANIFEST, SIDES
from kvprobe.verify.steps import VerifyOptions, verify

INTOTO_SCHEMA = "in-toto/statement-v1"  # a key of kvprobe.schema.KNOWN
INTOTO_STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = INTOTO_PREDICATE_TYPE


def archive_subject(view: BundleView, archive: Path) -> dict[str, Any]:
    """``archive`` as a subject (file name, sha256), once it is known to be this bundle packed:
    it verifies as `kvprobe verify` reads an archive (every member its manifest lists, by
    sha256), its manifest.json is byte for byte the bundle's, and its bytes did not change
    while they were read. UsageError otherwise: a matching manifest.json alone says nothing
    of the archive's other members, and the statement vouches for the archive's digest."""
    if not archive.is_file():
        raise UsageError(f"--subject-archive {archive}: no such file")
    digest = files.sha256_file(archive)
    try:
        report = verify(archive, VerifyOptions())
    except NotABundle as exc:
        raise UsageError(f"--subject-archive {archive}: not a bundle archive ({exc.message})") from None
    if not report.ok:
        found = report.defects
        why = found[0].message if found else report.outcome
        raise UsageError(f"--subject-archive {archive}: does not verify, so it is not this bundle packed ({why})")
    if report.manifest_sha256 != view.manifest_sha256:
        raise UsageError(
            f"--subject-archive {archive}: its manifest.json sha256 is {report.manifest_sha256}, not this bundle's "
            f"{view.manifest_sha256}: it is another bundle"
        )
    if files.sha256_file(archive) != digest:
        raise UsageError(f"--subject-archive {archive}: it changed while it was read")
    return {"name": archive.name, "digest": {"sha256": digest}}


def intoto(view: BundleView, *, archive: Path | None = None) -> dict[str, Any]:
    """An in-toto Statement v1: every bundle file (and manifest.json itself) by sha256, the
    packed ``archive`` (see :func:`archive_subject`), the artifacts the receipt tested (a run's
    pinned commits by gitCommit or wheels by sha256, a sweep's release wheels by sha256; a
    gates bundle names only its files), the receipt as predicate."""
    r = view.receipt
    subjects = [{"name": f["path"], "digest": {"sha256": f["sha256"]}} for f in view.manifest["files"]]
    subjects.append({"name": MANIFEST, "digest": {"sha256": view.manifest_sha256}})
    if archive is not None:
        subjects.append(archive_subject(view, archive))
    if isinstance(r, Receipt):
        subjects += _pin_subjects(r)
    elif isinstance(r, SweepReceipt):
        subjects += _release_subjects(r)
    return {
        "_type": INTOTO_STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": r.to_json(),  # the verified receipt.json's document (the model writes it back whole)
    }


def _pin_subjects(r: Receipt) -> list[dict[str, Any]]:
    found = []
    upstream = (r.experiment.upstream or "").rstrip("/")
    for side in SIDES:
        pin = r.sides[side].pin
        if pin["kind"] == "git":
            subject = {"name": f"{project(r) or 'upstream'}@{pin['commit']}", "digest": {"gitCommit": pin["commit"]}}
            if upstream:
                subject["uri"] = f"git+{upstream}@{pin['commit']}"
        elif pin["kind"] == "wheel":
            subject = {"name": pin["filename"], "uri": purl(r, side), "digest": {"sha256": pin["sha256"]}}
        else:
            continue  # a synthetic side has no artifact to name
        subject["annotations"] = {"kvprobeSide": side}
        found.append(subject)
    return found


def _release_subjects(r: SweepReceipt) -> list[dict[str, Any]]:
    """Each release wheel the sweep ran, with the class it was given (unresolved ones have none)."""
    found = []
    for release in r.releases:
        wheel = release.wheel
        if not wheel:
            continue
        found.append(
            {
                "name": wheel.file,
                "uri": wheel_purl(wheel.package, wheel.version),
                "digest": {"sha256": wheel.sha256},
                "annotations": {
                    "kvprobeRelease": release.version,
                    "kvprobeClass": release.classification.overall.value,
                },
            }
        )
    return found

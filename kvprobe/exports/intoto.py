"""An in-toto Statement v1 from a bundle: its files and pins as subjects, the receipt as predicate."""

from __future__ import annotations

import json
from typing import Any

from kvprobe.exports.bundle_view import BundleView, project, purl
from kvprobe.names import MANIFEST, SIDES

INTOTO_SCHEMA = "in-toto/statement-v1"  # a key of kvprobe.schema.KNOWN
INTOTO_STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://kvprobe.dev/attestation/receipt/v1"


def intoto(view: BundleView) -> dict[str, Any]:
    """An in-toto Statement v1: every bundle file (and manifest.json itself) by sha256, the
    pinned commits by gitCommit or wheels by sha256, the receipt as predicate."""
    r = view.receipt
    subjects = [{"name": f["path"], "digest": {"sha256": f["sha256"]}} for f in view.manifest["files"]]
    subjects.append({"name": MANIFEST, "digest": {"sha256": view.manifest_sha256}})
    upstream = (r["experiment"].get("upstream") or "").rstrip("/")
    for side in SIDES:
        pin = r["sides"][side]["pin"]
        if pin["kind"] == "git":
            subject = {"name": f"{project(r) or 'upstream'}@{pin['commit']}", "digest": {"gitCommit": pin["commit"]}}
            if upstream:
                subject["uri"] = f"git+{upstream}@{pin['commit']}"
        elif pin["kind"] == "wheel":
            subject = {"name": pin["filename"], "uri": purl(r, side), "digest": {"sha256": pin["sha256"]}}
        else:
            continue  # a synthetic side has no artifact to name
        subject["annotations"] = {"kvprobeSide": side}
        subjects.append(subject)
    return {
        "_type": INTOTO_STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": json.loads(json.dumps(r)),
    }

"""Step 4, what every receipt kind shares: the receipt agrees with the manifest and the bundled
experiment.

Differences are named as 'path: receipt X, recomputed Y' (:func:`json_diff`); every file a receipt
cites is the manifest's, with the digest it records; a probe record agrees with its raw output;
the bundled experiment.toml has the digest the receipt states. Each receipt kind's own checks
are in :mod:`~kvprobe.verify.run_consistency`, :mod:`~kvprobe.verify.sweep_consistency` and
:mod:`~kvprobe.verify.gates_consistency`.
"""

from __future__ import annotations

import hashlib
from pathlib import PurePosixPath
from typing import Any

from kvprobe.defects import (
    BundleDefect,
    CitationDigestMismatch,
    CitationNotInManifest,
    ExperimentDigestMismatch,
    RawInvalid,
    RecordMismatch,
)
from kvprobe.evidence.reader import Bundle
from kvprobe.model.receipt import FileRef
from kvprobe.names import PROBES_DIR, RECEIPT, SIDES

_MAX_DIFFS = 8


def json_diff(a: Any, b: Any, where: str = "", out: list[str] | None = None) -> list[str]:
    """Differences as 'path: receipt X, recomputed Y' (True and 1 are different)."""
    out = [] if out is None else out
    if len(out) >= 100:
        return out
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            sub = f"{where}.{key}" if where else str(key)
            if key not in b:
                out.append(f"{sub}: only in the receipt")
            elif key not in a:
                out.append(f"{sub}: missing from the receipt")
            else:
                json_diff(a[key], b[key], sub, out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{where}: {len(a)} items in the receipt, {len(b)} recomputed")
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            json_diff(x, y, f"{where}[{_label(i, x)}]", out)
    elif type(a) is not type(b) or a != b:
        out.append(f"{where}: receipt {short(a)}, recomputed {short(b)}")
    return out


def _label(index: int, item: Any) -> str:
    """A comparison row's identity beside its index, so a diff names the case it is about."""
    if isinstance(item, dict):
        name = [str(item[k]) for k in ("case", "observation", "file", "test") if isinstance(item.get(k), str)]
        if name:
            return f"{index} {' '.join(name)}"
    return str(index)


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def summary(diffs: list[str]) -> str:
    more = f" (+{len(diffs) - _MAX_DIFFS} more)" if len(diffs) > _MAX_DIFFS else ""
    return "; ".join(diffs[:_MAX_DIFFS]) + more


Cited = list[tuple[str, FileRef]]  # (where in the receipt, the file it cites)


def citation_defects(cited: Cited, listed: dict[str, dict[str, Any]]) -> list[BundleDefect]:
    """Each cited file is in the manifest with the digest the receipt records."""
    found: list[BundleDefect] = []
    for where, ref in cited:
        entry = listed.get(ref.path)
        if entry is None:
            found.append(CitationNotInManifest(ref.path, f"receipt {where} cites it; manifest.json does not list it"))
        elif entry["sha256"] != ref.sha256:
            found.append(
                CitationDigestMismatch(
                    ref.path, f"receipt {where} records sha256 {ref.sha256}, manifest.json lists {entry['sha256']}"
                )
            )
    return found


def cited_files(node: Any, where: str = "") -> Cited:
    """Every ``{"path", "sha256"}`` object anywhere in a receipt part's JSON (``Part.to_json()``):
    the files it cites, wherever the schema lets a part or a free-form mapping hold one. Keys are
    walked in sorted order, the order kvprobe writes them in."""
    found: Cited = []
    if isinstance(node, dict):
        if (
            set(node) >= {"path", "sha256"}
            and isinstance(node.get("path"), str)
            and isinstance(node.get("sha256"), str)
            and not node["path"].startswith("/")
        ):
            found.append((where or "(top)", FileRef(node["path"], node["sha256"])))
        for key, value in sorted(node.items()):
            found += cited_files(value, f"{where}.{key}" if where else key)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += cited_files(value, f"{where}[{i}]")
    return found


def duplicates(names: list[str], where: str) -> list[BundleDefect]:
    return [
        RecordMismatch(RECEIPT, f"{where}: {name!r} recorded twice")
        for name in sorted(set(names))
        if names.count(name) > 1
    ]


def probe_record(rel: str, doc: dict[str, Any], name: str, problem: str | None) -> list[BundleDefect]:
    """A probe's record (its ``name``, the ``problem`` it states) agrees with the output at ``rel``."""
    from kvprobe.checks.probes import check_output
    from kvprobe.errors import SchemaError

    found: list[BundleDefect] = []
    if problem is not None:
        found.append(RecordMismatch(rel, f"receipt records problem {problem!r} for a probe whose output it cites"))
    try:
        check_output(doc, name)
    except SchemaError as exc:
        found.append(RawInvalid(rel, exc.message))
    return found


def experiment_digest_defects(bundle: Bundle, stated: FileRef) -> list[BundleDefect]:
    """The bundled experiment.toml has the sha256 the receipt states (``stated``: its
    experiment's file and sha256)."""
    data_bytes = bundle.experiment_bytes
    assert data_bytes is not None, "called only when step 2 read the experiment"
    digest = hashlib.sha256(data_bytes).hexdigest()
    if digest == stated.sha256:
        return []
    detail = f"sha256 {digest}, receipt.experiment.sha256 {stated.sha256}"
    return [ExperimentDigestMismatch(stated.path, detail)]


def _vulnerability_view(table: Any) -> dict[str, Any]:
    """The receipt's ``vulnerability`` as the bundled [vulnerability] table implies it (none
    without one: bundles from before kvprobe recorded it)."""
    if not isinstance(table, dict):
        return {}
    return {
        "vulnerability": {
            "id": table.get("id"),
            "aliases": list(table.get("aliases", [])),
            "fix_kind": table.get("fix_kind"),
        }
    }


def experiment_view(data: dict[str, Any], pin_set: str) -> dict[str, Any]:
    """What a receipt states of the bundled experiment ``data`` (its facts, scope and checks),
    as that file declares it, for the pin set named ``pin_set``."""
    exp_id = data["id"]
    fix = data["fix"]
    probes = [
        [PurePosixPath(p["path"]).stem, f"{PROBES_DIR}/{exp_id}/{p['path']}"] for p in data["checks"].get("probes", [])
    ]
    spec = data["pins"].get(pin_set, {})
    tests = [
        t["path"]
        for t in data["checks"].get("tests", [])
        if (spec.get("kind") == "git" or "tests_commit" in spec) and ("pins" not in t or pin_set in t["pins"])
    ]
    return {
        "experiment": {
            "id": exp_id,
            "title": data["title"],
            "layer": data["layer"],
            "file": f"{PROBES_DIR}/{exp_id}/experiment.toml",
            "upstream": data.get("upstream"),
            "profile": data["profile"],
            "fix": {"prs": list(fix.get("prs", [])), "release": fix.get("release"), "summary": fix["summary"]},
            **_vulnerability_view(data.get("vulnerability")),
        },
        "evidence": {
            "layer": data["layer"],
            "shows": data["scope"]["shows"],
            "does_not_show": list(data["scope"]["does_not_show"]),
        },
        "sides": {side: {"probes": probes, "tests": tests} for side in SIDES},
    }

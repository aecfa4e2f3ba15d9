"""Exports of a sweep bundle: an OSV record, OpenVEX (one statement per observed release) and
Markdown (the release table and the timeline picture).

Only observed releases (classified affected or fixed) make OSV range events and versions;
every other release is listed under ``database_specific``, never folded into a range.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kvprobe import __version__
from kvprobe.errors import UsageError
from kvprobe.evidence.sweep import AFFECTED, FIXED, MIXED
from kvprobe.evidence.sweep_view import release_table, timeline_svg, unserved_line
from kvprobe.exports.bundle_view import BundleView, oneline, prs_text, verify_command
from kvprobe.exports.markdown import cell
from kvprobe.exports.openvex import document, vulnerability

OSV_SCHEMA = "osv"  # a key of kvprobe.schema.KNOWN
OSV_SCHEMA_VERSION = "1.6.0"
_RANGE = re.compile(r"^\s*[^,<>=!~]+\.\.[^,<>=!~]+\s*$")


def _package(r: Mapping[str, Any]) -> str:
    releases = [x for x in r["releases"] if x["wheel"]]
    if not releases:
        raise UsageError("the sweep resolved no release wheel: there is no package to name")
    return releases[0]["wheel"]["package"]


def _purl(package: str, version: str | None = None) -> str:
    name = re.sub(r"[-_.]+", "-", package).lower()
    return f"pkg:pypi/{name}" + (f"@{version}" if version else "")


def contiguous(r: Mapping[str, Any]) -> bool:
    """Consecutive releases in the receipt are consecutive on the index: the sweep ran every
    served release (no SPEC) or one ``A..B`` range. Only then may a first fixed release
    follow a last affected one as a ``fixed`` event."""
    return r["spec"] is None or bool(_RANGE.match(r["spec"]))


def osv_ranges(r: Mapping[str, Any]) -> list[dict[str, Any]]:
    """ECOSYSTEM ranges from the observed releases alone, oldest first.

    A run of affected releases opens with ``introduced`` (its first observed release: older
    ones were not observed). It closes with ``fixed`` where the next release on the index was
    observed fixed, with ``last_affected`` where the next one was not observed (or the sweep is
    not contiguous), and stays open where no later release was observed at all."""
    ranges: list[dict[str, Any]] = []
    runs: list[list[int]] = []
    classes = [x["classification"]["overall"] for x in r["releases"]]
    for i, cls in enumerate(classes):
        if cls == AFFECTED:
            if runs and runs[-1][-1] == i - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
    for run in runs:
        first, last = r["releases"][run[0]]["version"], r["releases"][run[-1]]["version"]
        after = run[-1] + 1
        events: list[dict[str, str]] = [{"introduced": first}]
        if after < len(classes) and classes[after] == FIXED and contiguous(r):
            events.append({"fixed": r["releases"][after]["version"]})
        elif after < len(classes):
            events.append({"last_affected": last})
        ranges.append({"type": "ECOSYSTEM", "events": events})
    return ranges


def _unobserved(r: Mapping[str, Any]) -> dict[str, str]:
    found = {}
    for release in r["releases"]:
        cls = release["classification"]
        if cls["overall"] not in (AFFECTED, FIXED):
            found[release["version"]] = f"{cls['overall']}: " + "; ".join(oneline(x) for x in cls["reasons"][:3])
    return found


def osv(view: BundleView, *, modified: str) -> dict[str, Any]:
    """An OSV record of the experiment's vulnerability (refused, as for OpenVEX, unless the
    tested fix is its security fix), ``modified`` at the export time."""
    r = view.receipt
    vuln = vulnerability(r)
    package = _package(r)
    observed = {x["version"]: x["classification"]["overall"] for x in r["releases"]}
    affected_versions = [v for v, cls in observed.items() if cls == AFFECTED]
    exp = r["experiment"]
    details = (
        f"{oneline(exp['title'])}. Fixed upstream by {prs_text(r, links=False)}. {oneline(exp['fix']['summary'])} "
        f"Ranges and versions come only from releases kvprobe observed (sweep run {r['run_id']}); "
        f"check the evidence with `{verify_command(view)}`."
    )
    record: dict[str, Any] = {
        "schema_version": OSV_SCHEMA_VERSION,
        "id": vuln["name"],
        "modified": modified,
        "summary": oneline(exp["title"]),
        "details": details,
        "affected": [
            {
                "package": {"ecosystem": "PyPI", "name": package, "purl": _purl(package)},
                "ranges": osv_ranges(r),
                "versions": affected_versions,
                "database_specific": {
                    "kvprobe_releases_swept": r["spec"] or "every release on the index the profile serves",
                    "kvprobe_observed": {v: c for v, c in observed.items() if c in (AFFECTED, FIXED)},
                    "kvprobe_not_observed": _unobserved(r),
                    "kvprobe_not_served": list(r["unserved"]),
                },
            }
        ],
        "database_specific": {
            "kvprobe": {
                "tool": f"kvprobe {__version__}",
                "run_id": r["run_id"],
                "manifest_sha256": view.manifest_sha256,
                "receipt_sha256": view.receipt_sha256,
                "classification": r["algorithm"],
            }
        },
    }
    if vuln.get("aliases"):
        record["aliases"] = list(vuln["aliases"])
    return record


def openvex(view: BundleView, *, author: str, issued: str, role: str | None = None) -> dict[str, Any]:
    """One statement per observed release: affected, fixed, or (mixed) under_investigation."""
    r = view.receipt
    vuln = vulnerability(r)
    statements = []
    for release in r["releases"]:
        cls = release["classification"]
        if cls["overall"] not in (AFFECTED, FIXED, MIXED) or release["wheel"] is None:
            continue
        wheel = release["wheel"]
        ident = _purl(wheel["package"], wheel["version"])
        status = {AFFECTED: "affected", FIXED: "fixed", MIXED: "under_investigation"}[cls["overall"]]
        statement: dict[str, Any] = {
            "vulnerability": vuln,
            "products": [{"@id": ident, "identifiers": {"purl": ident}, "hashes": {"sha-256": wheel["sha256"]}}],
            "status": status,
            "timestamp": r["created_utc"],
            "status_notes": (
                f"kvprobe sweep {r['run_id']} classified {wheel['file']} (sha256 {wheel['sha256']}) "
                f"{cls['overall']} from its raw probe outputs; check with `{verify_command(view)}`."
                + (" " + "; ".join(oneline(x) for x in cls["reasons"][:3]) if cls["reasons"] else "")
            ),
        }
        if status == "affected":
            fixed = [x["version"] for x in r["releases"] if x["classification"]["overall"] == FIXED]
            statement["action_statement"] = (
                f"Upgrade {wheel['package']} to a release kvprobe observed fixed ({', '.join(fixed)})"
                if fixed
                else f"No release kvprobe observed is fixed; backport {prs_text(r, links=False)}"
            )
        statements.append(statement)
    if not statements:
        raise UsageError("the sweep observed no release: there is nothing to state in OpenVEX")
    name = f"{r['experiment']['id']}:sweep:{view.manifest_sha256}"
    return document(name, f"a kvprobe {r['tool']['version']} sweep", statements, author, issued, role)


def markdown(view: BundleView) -> str:
    """The release table and the timeline (inline SVG), for a security review."""
    r = view.receipt
    exp = r["experiment"]
    out = [
        f"## kvprobe sweep: {cell(exp['id'])}: {cell(oneline(exp['title']))}",
        "",
        f"- **Releases:** {cell(r['spec'] or 'every release on the index the profile serves')}; profile "
        f"`{r['profile']['name']}` serves `{r['profile']['serves']}`",
        f"- **Fix:** {prs_text(r, links=True)}",
        f"- **Run:** `{r['run_id']}` at {r['created_utc']} by kvprobe {r['tool']['version']}",
        f"- **Check it:** `{verify_command(view)}`",
        "",
        timeline_svg(r).strip(),
        "",
        *release_table(r),
        "",
    ]
    line = unserved_line(r)
    if line:
        out += [line, ""]
    return "\n".join(out)

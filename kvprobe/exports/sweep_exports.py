"""Exports of a sweep bundle: an OSV record, OpenVEX (one statement per observed release) and
Markdown (the release table and the timeline picture).

Only observed releases (classified affected or fixed) make OSV range events and versions;
every other release is listed under ``database_specific``, never folded into a range.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from packaging.version import InvalidVersion, Version

from kvprobe import __version__, schema
from kvprobe.errors import UsageError
from kvprobe.evidence.sweep_view import TIMELINE
from kvprobe.exports.bundle_view import BundleView, oneline, pr_url, prs_text, verify_command, wheel_purl
from kvprobe.exports.markdown import cell, code_cell, code_span, provenance_lines
from kvprobe.exports.openvex import document, vulnerability
from kvprobe.model.sweep_receipt import SweepReceipt
from kvprobe.rules.sweep_classification import AFFECTED, FIXED, MIXED, NOT_PRESENT
from kvprobe.text import for_markdown

OSV_SCHEMA = "osv"  # a key of kvprobe.schema.KNOWN
OSV_SCHEMA_VERSION = "1.7.5"  # schemas/vendor/README.md: the revision vendored
# A release observed unaffected right before a run of affected ones is an observed boundary.
_UNAFFECTED = (NOT_PRESENT, FIXED)


def _package(r: SweepReceipt) -> str:
    wheels = [x.wheel for x in r.releases if x.wheel]
    if not wheels:
        raise UsageError("the sweep resolved no release wheel: there is no package to name")
    return wheels[0].package


def _key(version: str) -> tuple[int, Any]:
    try:
        return (0, Version(version))
    except InvalidVersion:  # the receipt schema admits any string; order such a one last, stably
        return (1, version)


@dataclass(frozen=True)
class Observations:
    """What a sweep observed, the one input OSV's ranges are drawn from.

    ``classes``: (version, class) of every release entry, oldest first by PEP 440 order
    (whatever the receipt's order). ``listing``: every version the index listed (the
    receipt's ``listing.versions``, which verify's step 4 holds the release set to), oldest
    first: two releases are neighbours only there, never by the --releases text.
    ``unserved``: versions in the range the profile does not serve (nothing ran on them).
    ``not_observed_reason``: why the listed versions older than the oldest observed release
    were not observed (the receipt's ``observed``, which verify recomputes; None: none are).
    """

    classes: tuple[tuple[str, str], ...]
    listing: tuple[str, ...]
    unserved: tuple[str, ...]
    swept: str
    not_observed_reason: str | None = None

    def older_not_observed(self) -> str:
        """Why the releases older than the oldest one swept say nothing: never "not swept"
        where the range selected them and the profile could not run them."""
        return f"not observed ({self.not_observed_reason})" if self.not_observed_reason else "not observed"

    def neighbours(self, older: str, newer: str) -> bool:
        """``newer`` comes right after ``older`` on the index."""
        if older not in self.listing or newer not in self.listing:
            return False
        return self.listing.index(newer) == self.listing.index(older) + 1

    def not_observed_before(self, version: str) -> list[str]:
        """Versions of the listing older than ``version`` that were not classified affected,
        fixed or not-present (unserved, could not observe, mixed)."""
        seen = {v for v, c in self.classes if c in (AFFECTED, FIXED, NOT_PRESENT)}
        older = [v for v in self.listing if _key(v) < _key(version)]
        return [v for v in older if v not in seen]


def observations(r: SweepReceipt, *, publisher_why: bool = False) -> Observations:
    """The sweep receipt's observations. Reads ``releases[].version``,
    ``releases[].classification.overall``, ``unserved``, ``spec`` (as text to show, never
    parsed) and the index ``listing.versions``, nothing else. ``publisher_why``: the profile's
    ``serves_why`` is the publisher's (kvprobe does not ship the profile, so verify held it to
    nothing): the not-observed reason then leaves it out, never stating it as kvprobe's."""
    reason = r.observed.not_observed_reason
    why = r.profile.serves_why
    if publisher_why and why and reason and reason.endswith(f": {why}"):
        reason = reason[: -len(why) - 2]  # rules.sweep_listing.unserved_reason appended it
    classes = tuple(sorted(((x.version, str(x.classification.overall)) for x in r.releases), key=lambda t: _key(t[0])))
    unserved = tuple(sorted(r.unserved, key=_key))
    listing = tuple(sorted(r.listing.versions, key=_key))
    swept = r.spec or "every release on the index the profile serves"
    return Observations(classes, listing, unserved, swept, reason)


def osv_ranges(r: SweepReceipt) -> list[dict[str, Any]]:
    """ECOSYSTEM ranges of the receipt's observations (:func:`ranges_of`)."""
    return ranges_of(observations(r))


def ranges_of(obs: Observations) -> list[dict[str, Any]]:
    """ECOSYSTEM ranges from the observed releases alone, oldest first.

    A run is affected releases that are neighbours on the index. It opens with ``introduced``
    at its first release only where the release right before it on the index was observed
    not affected (``not-present``: the code path does not exist yet; or ``fixed``): that is an
    observed boundary. Otherwise the start is unknown, and the range takes in the releases
    nothing observed: it starts at the release the index lists right after the last release
    observed unaffected, the first run's as every other's, so no release observed unaffected
    falls inside a range and none the sweep skipped falls outside one; ``"0"`` (OSV's "every
    earlier version") only where no earlier release was observed unaffected. Never the
    profile's floor: a release the profile cannot import is unobserved, not unaffected. A run
    closes with ``fixed`` where the next release on the index was observed fixed, with
    ``last_affected`` where a later release exists but the next was not observed fixed, and
    stays open where nothing later was swept."""
    classes = list(obs.classes)
    runs: list[list[int]] = []
    for i, (version, cls) in enumerate(classes):
        if cls != AFFECTED:
            continue
        if runs and runs[-1][-1] == i - 1 and obs.neighbours(classes[i - 1][0], version):
            runs[-1].append(i)
        else:
            runs.append([i])
    ranges: list[dict[str, Any]] = []
    for run in runs:
        last = classes[run[-1]][0]
        events: list[dict[str, str]] = [{"introduced": _introduced(obs, run[0])}]
        after = run[-1] + 1
        if after < len(classes) and classes[after][1] == FIXED and obs.neighbours(last, classes[after][0]):
            events.append({"fixed": classes[after][0]})
        elif after < len(classes) or (obs.listing and obs.listing[-1] != last):
            events.append({"last_affected": last})
        ranges.append({"type": "ECOSYSTEM", "events": events})
    return ranges


def _introduced(obs: Observations, i: int) -> str:
    classes = obs.classes
    version = classes[i][0]
    if i > 0 and classes[i - 1][1] in _UNAFFECTED and obs.neighbours(classes[i - 1][0], version):
        return version
    unaffected = [j for j in range(i) if classes[j][1] in _UNAFFECTED]
    if not unaffected:
        return "0"
    # the start is unknown, but no earlier than the release after one observed unaffected
    return _after(obs, classes[unaffected[-1]][0]) or classes[unaffected[-1] + 1][0]


def _after(obs: Observations, version: str) -> str | None:
    """The release right after ``version`` on the index (None: it is not listed, or last)."""
    if version not in obs.listing or obs.listing.index(version) + 1 >= len(obs.listing):
        return None
    return obs.listing[obs.listing.index(version) + 1]


def introduced_text(obs: Observations, ranges: Sequence[Mapping[str, Any]]) -> str:
    """Why the first range starts where it does, in one sentence."""
    if not ranges:
        return "no release was observed affected"
    start = ranges[0]["events"][0]["introduced"]
    oldest = next(v for v, c in obs.classes if c == AFFECTED)
    if start != "0":
        before = [v for v, c in obs.classes if _key(v) < _key(start) and c in _UNAFFECTED][-1]
        cls = dict(obs.classes)[before]
        if start == oldest:
            return f"observed: {before} was observed {cls} and {start}, the next release on the index, affected"
        return (
            f"unknown, from {start}: {before} was observed {cls}, {oldest} is the oldest release observed "
            "affected, and the releases between them were not observed (a later start cannot be ruled out)"
        )
    return (
        f'unknown ("0"): {oldest} is the oldest release observed affected and no older release was '
        f"observed unaffected; releases older than {obs.classes[0][0]} were {obs.older_not_observed()}"
    )


def _unobserved(r: SweepReceipt) -> dict[str, str]:
    found = {}
    for release in r.releases:
        cls = release.classification
        if cls.overall not in (AFFECTED, FIXED):
            found[release.version] = f"{cls.overall}: " + "; ".join(oneline(x) for x in cls.reasons[:3])
    return found


def valid_osv_id(text: str) -> bool:
    """``text`` is an id the vendored OSV schema accepts (a home database's prefix)."""
    return not schema.errors({"id": text, "modified": "2000-01-01T00:00:00Z"}, OSV_SCHEMA)


def osv_id(vuln: Mapping[str, Any], given: str | None = None) -> tuple[str, list[str]]:
    """The record's ``id`` and ``aliases``: ``given`` (--osv-id), else the first declared id
    (id, then aliases) with a prefix the OSV schema lists; every other declared id is an
    alias. UsageError when there is none: kvprobe's own ``KVPROBE-`` ids name no OSV database."""
    declared = [vuln["name"], *vuln.get("aliases", [])]
    if given is not None:
        if not valid_osv_id(given):
            raise UsageError(
                f"--osv-id {given!r} does not start with a database prefix the OSV schema "
                f"{OSV_SCHEMA_VERSION} lists (CVE-, GHSA-, PYSEC-, ...)"
            )
        chosen = given
    else:
        found = [x for x in declared if valid_osv_id(x)]
        if not found:
            raise UsageError(
                f"no OSV id for {', '.join(declared)}: OSV {OSV_SCHEMA_VERSION} ids start with a home "
                "database's prefix (CVE-, GHSA-, PYSEC-, ...) and kvprobe's KVPROBE- ids name none; add the "
                "assigned CVE or GHSA to the experiment's [vulnerability] aliases, or give the id the record "
                "is published under with --osv-id",
            )
        chosen = found[0]
    return chosen, [x for x in declared if x != chosen]


def references(r: SweepReceipt, package: str) -> list[dict[str, str]]:
    """The fix PRs (FIX) and the package's index page (PACKAGE)."""
    found = [{"type": "FIX", "url": url} for n in r.experiment.fix.prs if (url := pr_url(r, n))]
    name = re.sub(r"[-_.]+", "-", package).lower()
    found.append({"type": "PACKAGE", "url": f"https://pypi.org/project/{quote(name)}/"})
    return found


def osv(view: BundleView, *, modified: str, osv_id_given: str | None = None) -> dict[str, Any]:
    """An OSV record of the experiment's vulnerability (refused, as for OpenVEX, unless the
    tested fix is its security fix), ``modified`` at the export time. Its text passes the
    Markdown neutraliser (OSV viewers render ``details`` as Markdown); where the bundle is not
    anchored, the record says so in ``details`` and ``database_specific``."""
    r = view.sweep
    vuln = vulnerability(r, fmt="OSV")
    record_id, aliases = osv_id(vuln, osv_id_given)
    package = _package(r)
    obs = observations(r, publisher_why=view.provenance.unshipped_profile is not None)
    ranges = ranges_of(obs)
    observed = dict(obs.classes)
    affected_versions = [v for v, cls in obs.classes if cls == AFFECTED]
    if not affected_versions:
        # an affected entry without ranges or versions is read as every version affected (or none)
        raise UsageError(
            "the sweep observed no release affected: an OSV record would name the package affected with no "
            "range kvprobe observed (--format openvex or markdown state each release's class)"
        )
    exp = r.experiment
    caveats = view.provenance.caveats()
    details = " ".join(
        [
            *(for_markdown(x) for x in caveats),
            f"{for_markdown(oneline(exp.title))}. Fixed upstream by {prs_text(r, links=True)}.",
            for_markdown(oneline(exp.fix.summary)),
            f"Ranges and versions come only from releases kvprobe observed (sweep run {code_span(r.run_id)});",
            f"introduced: {for_markdown(introduced_text(obs, ranges))}.",
            f"Check the evidence with {code_span(verify_command(view))}.",
        ]
    )
    oldest = obs.classes[0][0] if obs.classes else None
    record: dict[str, Any] = {
        "schema_version": OSV_SCHEMA_VERSION,
        "id": record_id,
        "modified": modified,
        "summary": for_markdown(oneline(exp.title)),
        "details": details,
        "references": references(r, package),
        "affected": [
            {
                "package": {"ecosystem": "PyPI", "name": package, "purl": wheel_purl(package)},
                "ranges": ranges,
                "versions": affected_versions,
                "database_specific": {
                    "kvprobe_releases_swept": obs.swept,
                    "kvprobe_observed": {v: c for v, c in observed.items() if c in (AFFECTED, FIXED)},
                    "kvprobe_not_observed": _unobserved(r),
                    "kvprobe_not_served": list(obs.unserved),
                    "kvprobe_introduced": introduced_text(obs, ranges),
                    "kvprobe_not_observed_before": (
                        {
                            "oldest_swept": oldest,
                            "listed_not_observed": obs.not_observed_before(affected_versions[0])
                            if affected_versions
                            else [],
                            "older": f"every release older than {oldest}: {obs.older_not_observed()}",
                        }
                        if oldest
                        else {}
                    ),
                },
            }
        ],
        "database_specific": {
            "kvprobe": {
                "tool": f"kvprobe {__version__}",
                "run_id": r.run_id,
                "manifest_sha256": view.manifest_sha256,
                "receipt_sha256": view.receipt_sha256,
                "classification": r.algorithm,
                "provenance": view.provenance.to_json(),
            }
        },
    }
    if aliases:
        record["aliases"] = aliases
    return record


def openvex(view: BundleView, *, author: str, issued: str, role: str | None = None) -> dict[str, Any]:
    """One statement per observed release: affected, fixed, or (mixed) under_investigation;
    each one's notes carry the bundle's caveats (see :class:`~kvprobe.exports.bundle_view.Provenance`)."""
    r = view.sweep
    vuln = vulnerability(r)
    caveats = " ".join(view.provenance.caveats())
    statements = []
    for release in sorted(r.releases, key=lambda x: _key(x.version)):
        cls = release.classification
        if cls.overall not in (AFFECTED, FIXED, MIXED) or release.wheel is None:
            continue
        wheel = release.wheel
        ident = wheel_purl(wheel.package, wheel.version)
        status = {AFFECTED: "affected", FIXED: "fixed", MIXED: "under_investigation"}[cls.overall]
        statement: dict[str, Any] = {
            "vulnerability": vuln,
            "products": [{"@id": ident, "identifiers": {"purl": ident}, "hashes": {"sha-256": wheel.sha256}}],
            "status": status,
            "timestamp": r.created_utc,
            "status_notes": (
                (caveats + " " if caveats else "")
                + f"kvprobe sweep {r.run_id} classified {wheel.file} (sha256 {wheel.sha256}) "
                f"{cls.overall} from its raw probe outputs; check with `{verify_command(view)}`."
                + (" " + "; ".join(oneline(x) for x in cls.reasons[:3]) if cls.reasons else "")
            ),
        }
        if status == "affected":
            # only releases after this one: a release observed fixed before it is a downgrade
            fixed = [
                x.version
                for x in sorted(r.releases, key=lambda x: _key(x.version))
                if x.classification.overall is FIXED and _key(x.version) > _key(release.version)
            ]
            statement["action_statement"] = (
                f"Upgrade {wheel.package} to a later release kvprobe observed fixed ({', '.join(fixed)})"
                if fixed
                else f"No later release kvprobe observed is fixed; backport {prs_text(r, links=False)}"
            )
        statements.append(statement)
    if not statements:
        raise UsageError("the sweep observed no release: there is nothing to state in OpenVEX")
    name = f"{r.experiment.id}:sweep:{view.manifest_sha256}"
    return document(name, f"a kvprobe {r.tool.version} sweep", statements, author, issued, role)


def _timeline_digest(view: BundleView) -> str | None:
    for entry in view.manifest.get("files", []):
        if entry.get("path") == TIMELINE:
            return entry["sha256"]
    return None


def markdown(view: BundleView, author: str | None = None) -> str:
    """The release table and the timeline, for a security review. The timeline is an image
    link to the bundle's timeline.svg (GitHub strips inline ``<svg>``), relative to where the
    bundle sits, as the verify command names it."""
    r = view.sweep
    exp = r.experiment
    profile = r.profile
    out = [
        f"## kvprobe sweep: {cell(exp.id)}: {cell(oneline(exp.title))}",
        "",
        *provenance_lines(view, author),
        f"- **Releases:** {cell(r.spec or 'every release on the index the profile serves')}; profile "
        f"{code_span(profile.name)} serves {code_span(profile.serves or 'every release')}",
        f"- **Fix:** {prs_text(r, links=True)}",
        f"- **Run:** {code_span(r.run_id)} at {cell(r.created_utc)} by kvprobe {cell(r.tool.version)}",
        f"- **Check it:** {code_span(verify_command(view))}",
        "",
    ]
    digest = _timeline_digest(view)
    if digest:
        link = quote(f"{view.name}/{TIMELINE}", safe="/._-~")
        out += [
            f"![releases of {cell(exp.id)} by classification, oldest left]({link})",
            "",
            f"The timeline is {code_span(TIMELINE)} in the bundle (sha256 {code_span(digest)}).",
            "",
        ]
    out += [*_release_table(r), ""]
    if r.unserved:
        shown = ", ".join(sorted(r.unserved, key=_key))
        why = f" Why: {cell(profile.serves_why)}." if profile.serves_why else ""
        if profile.serves_why and view.provenance.unshipped_profile is not None:
            why = f" Why, in the words of the bundle's publisher (not kvprobe's): {cell(profile.serves_why)}."
        out += [
            f"Not run: {len(r.unserved)} selected releases that profile {code_span(profile.name)} does not "
            f"serve: {cell(shown)}.{why}",
            "",
        ]
    obs = observations(r, publisher_why=view.provenance.unshipped_profile is not None)
    if obs.classes:
        floor = f"; profile {code_span(profile.name)} serves {code_span(profile.serves)}" if profile.serves else ""
        out += [
            f"Oldest release observed: {cell(obs.classes[0][0])}. Releases older than it were not observed: "
            f"the sweep selected {cell(obs.swept)}{floor}. An OSV record's `introduced` is therefore an "
            "observed boundary, the first release after the last one observed unaffected, or "
            '`"0"` (unknown), never the profile\'s floor.',
            "",
        ]
    return "\n".join(out)


def _release_table(r: SweepReceipt) -> list[str]:
    """One row per release, oldest first: class, case counts, the wheel's sha256, and why;
    every value escaped (reasons quote probe outputs)."""
    lines = ["| release | classification | cases | wheel sha256 | why |", "| --- | --- | --- | --- | --- |"]
    for release in sorted(r.releases, key=lambda x: _key(x.version)):
        cls = release.classification
        counts: dict[str, int] = {}
        for case in cls.cases.values():
            counts[case["class"]] = counts.get(case["class"], 0) + 1
        wheel = release.wheel
        digest = code_cell(wheel.sha256[:16] + "…") if wheel else "none"
        reasons = cls.reasons
        why = "; ".join(reasons[:3]) + (f" (+{len(reasons) - 3} more)" if len(reasons) > 3 else "")
        shown = ", ".join(f"{n} {c}" for c, n in sorted(counts.items()))
        lines.append(f"| {cell(release.version)} | {cell(cls.overall)} | {cell(shown)} | {digest} | {cell(why)} |")
    return lines

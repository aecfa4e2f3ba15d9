"""What a sweep receipt looks like to a reader: the release table, the SVG timeline of
releases coloured by classification, and the bundle's README (which embeds both).

Hand-written SVG text (no plotting library): one box per release, oldest left whatever
order the receipt stores them in, the first fixed release marked. `verify` renders both
files again from the receipt and compares them byte for byte, so nothing but what this
module writes (no script, no foreign element) survives in a bundle that verifies.
"""

from __future__ import annotations

from typing import Any
from xml.sax.saxutils import escape

from kvprobe.model.sweep_receipt import Classification, ObservedRange, SweepReceipt
from kvprobe.rules.sweep_classification import NOT_SERVED
from kvprobe.rules.sweep_listing import ascending, observed_range
from kvprobe.text import for_markdown, for_terminal

TIMELINE = "timeline.svg"

# Class -> (fill colour, legend text). Colour-blind-safe pairs for affected/fixed.
COLOURS = {
    "affected": ("#d55e00", "affected (behaves as base)"),
    "fixed": ("#009e73", "fixed (behaves as head)"),
    "mixed": ("#e69f00", "mixed"),
    "could-not-observe": ("#999999", "could not observe"),
    "not-present": ("#56b4e9", "not present"),
    NOT_SERVED: ("#eeeeee", "not served by the profile"),
}
_BOX, _GAP, _LEFT, _TOP = 56, 6, 16, 100


def recomputed_range(receipt: SweepReceipt) -> ObservedRange:
    """The observed range recomputed from the releases, the listing and the profile (never the
    receipt's own ``observed``: what is drawn is what verify recomputes)."""
    return observed_range(receipt.releases, receipt.listing, receipt.profile, receipt.spec)


def timeline_rows(receipt: SweepReceipt) -> list[tuple[str, str]]:
    """(version, class) in version order: the releases that ran, and (when a SPEC chose
    them) the selected releases no profile serves."""
    rows: list[tuple[str, str]] = [(r.version, r.classification.overall) for r in receipt.releases]
    if receipt.spec is not None:
        rows += [(v, NOT_SERVED) for v in receipt.unserved]
    order = {v: i for i, v in enumerate(ascending([v for v, _ in rows]))}
    return sorted(rows, key=lambda row: order[row[0]])


def timeline_svg(receipt: SweepReceipt) -> str:
    """The releases as coloured boxes left to right, labelled, with a legend."""
    rows = timeline_rows(receipt)
    observed = recomputed_range(receipt)
    width = max(_LEFT * 2 + len(rows) * (_BOX + _GAP), 720)
    used = [c for c in COLOURS if c in {cls for _, cls in rows}]
    height = _TOP + _BOX + 40 + 20 * len(used) + 20
    title = f"{receipt.experiment.id}: releases by classification"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f"<title>{escape(title)}</title>",
        '<rect width="100%" height="100%" fill="#ffffff"/>',
        f'<text x="{_LEFT}" y="22" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    for k, line in enumerate(oldest_lines(observed)):
        parts.append(f'<text x="{_LEFT}" y="{40 + 15 * k}" font-size="11">{escape(line)}</text>')
    for i, (version, cls) in enumerate(rows):
        x = _LEFT + i * (_BOX + _GAP)
        fill = COLOURS[cls][0]
        first_fixed = version == observed.first_fixed
        stroke = ' stroke="#000000" stroke-width="3"' if first_fixed else ' stroke="#333333"'
        parts.append(
            f'<rect x="{x}" y="{_TOP}" width="{_BOX}" height="{_BOX}" rx="4" fill="{fill}"{stroke}>'
            f"<title>{escape(version)}: {escape(cls)}{' (first fixed release)' if first_fixed else ''}</title></rect>"
        )
        if first_fixed:
            parts.append(
                f'<text x="{x + _BOX / 2}" y="{_TOP - 6}" text-anchor="middle" font-size="10" '
                f'font-weight="bold">first fixed</text>'
            )
        parts.append(
            f'<text x="{x + _BOX / 2}" y="{_TOP + _BOX + 16}" text-anchor="middle" font-size="10">'
            f"{escape(version)}</text>"
        )
    for j, cls in enumerate(used):
        y = _TOP + _BOX + 34 + 20 * j
        parts.append(f'<rect x="{_LEFT}" y="{y}" width="14" height="14" fill="{COLOURS[cls][0]}" stroke="#333333"/>')
        parts.append(f'<text x="{_LEFT + 20}" y="{y + 11}">{escape(COLOURS[cls][1])}</text>')
    if observed.first_fixed is not None:
        y = _TOP + _BOX + 34 + 20 * len(used)
        parts.append(
            f'<rect x="{_LEFT}" y="{y}" width="14" height="14" fill="#ffffff" stroke="#000000" stroke-width="3"/>'
        )
        first = escape(observed.first_fixed)
        parts.append(f'<text x="{_LEFT + 20}" y="{y + 11}">first fixed release: {first}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def oldest_lines(observed: ObservedRange) -> list[str]:
    """The oldest release observed, the older ones on the index that were not, and why (the
    timeline's three lines)."""
    oldest = observed.oldest
    head = f"oldest release observed: {oldest}" if oldest else "no release was observed"
    older = observed.not_observed
    if not older:
        return [head, "the index lists no older release"]
    shown = ", ".join(older[-3:]) + (f" and {len(older) - 3} older" if len(older) > 3 else "")
    return [head, f"not observed: {shown}", f"why: {observed.not_observed_reason}"]


def oldest_line(observed: ObservedRange) -> str:
    """The oldest release observed, and why older ones on the index were not (one line)."""
    head, *rest = oldest_lines(observed)
    if len(rest) == 1:
        return f"{head}; {rest[0]}"
    return f"{head}; {rest[0]} ({rest[1].removeprefix('why: ')})"


def range_lines(observed: ObservedRange) -> list[str]:
    """README lines: the oldest release observed and why older ones were not, the observed
    introduced boundary (or that none was observed), the first fixed release."""
    lines = [f"- {_cell(oldest_line(observed))}."]
    if observed.introduced is not None:
        lines.append(
            f"- Introduced (observed): {observed.introduced}, the oldest affected release; the release "
            "before it is not-present."
        )
    else:
        lines.append(
            "- Introduced: not observed (no not-present release before the oldest affected one): "
            "the affected range's start is unknown."
        )
    first = observed.first_fixed
    lines.append(f"- First fixed release: {first}." if first else "- No fixed release newer than every affected one.")
    return lines


def _code(text: Any) -> str:
    """A code span that ``text`` cannot leave (no backtick, one line, controls escaped)."""
    return "`" + for_terminal(str(text)).replace("`", "'") + "`"


def _cell(text: str) -> str:
    """Receipt text as inert Markdown (kvprobe.text's one neutraliser): no HTML, link or cell break."""
    return for_markdown(text)


def release_table(receipt: SweepReceipt) -> list[str]:
    """One markdown row per release that ran: class, the wheel's sha256, and why."""
    lines = ["| release | classification | cases | wheel sha256 | why |", "| --- | --- | --- | --- | --- |"]
    order = {v: i for i, v in enumerate(ascending([r.version for r in receipt.releases]))}
    for release in sorted(receipt.releases, key=lambda r: order[r.version]):
        cls = release.classification
        wheel = release.wheel
        digest = f"`{wheel.sha256[:16]}…`" if wheel else "none"
        why = "; ".join(cls.reasons[:3]) + (f" (+{len(cls.reasons) - 3} more)" if len(cls.reasons) > 3 else "")
        lines.append(f"| {_cell(release.version)} | {cls.overall} | {_case_counts(cls)} | {digest} | {_cell(why)} |")
    return lines


def _case_counts(classification: Classification) -> str:
    """How many cases fell in each class, e.g. '2 affected, 9 control, 1 not-present'."""
    counts: dict[str, int] = {}
    for case in classification.cases.values():
        counts[case["class"]] = counts.get(case["class"], 0) + 1
    return ", ".join(f"{n} {cls}" for cls, n in sorted(counts.items()))


def reused_lines(receipt: SweepReceipt) -> list[str]:
    """README lines naming each release whose unit came from the kvprobe cache (none: no line)."""
    reused = {r.version: r.reused for r in receipt.releases if r.reused is not None}
    if not reused:
        return []
    lines = [
        f"Reused: {len(reused)} of {len(receipt.releases)} releases were not observed again. Each one's unit "
        "came from the kvprobe cache and was checked as a fresh unit is before it was merged "
        "(`kvprobe sweep --no-reuse` observes every release):",
    ]
    for version in ascending(list(reused)):
        unit = reused[version]
        lines.append(
            f"- {_cell(version)}: reused from {_cell(unit.observed_utc)} "
            f"(unit manifest sha256 `{_cell(unit.unit_manifest_sha256)}`)"
        )
    return [*lines, ""]


def unserved_line(receipt: SweepReceipt) -> str | None:
    unserved = receipt.unserved
    if not unserved:
        return None
    profile = receipt.profile
    shown = ", ".join(unserved[-8:]) + (f" and {len(unserved) - 8} older" if len(unserved) > 8 else "")
    return (
        f"Not run: {len(unserved)} selected releases that profile {_code(profile.name)} does not serve "
        f"({_code(profile.serves)}): {_cell(shown)}."
    )


def render_readme(receipt: SweepReceipt) -> str:
    """README.md of a sweep bundle: what was swept, the picture, the table, how to check it."""
    exp = receipt.experiment
    summary = receipt.summary
    listing = receipt.listing
    lines = [
        f"# kvprobe sweep: {exp.id}",
        "",
        _cell(exp.title),
        "",
        f"Releases: {_code(receipt.spec or 'every release on the index the profile serves')}; "
        f"profile {_code(receipt.profile.name)} (serves {_code(receipt.profile.serves)}); "
        f"run `{receipt.run_id}` at {receipt.created_utc}.",
        "",
        f"![releases by classification]({TIMELINE})",
        "",
        *range_lines(recomputed_range(receipt)),
        "",
        *(f"- {cls}: {_cell(', '.join(ascending(versions)))}" for cls, versions in sorted(summary.items())),
        "",
        *release_table(receipt),
        "",
    ]
    lines += reused_lines(receipt)
    line = unserved_line(receipt)
    if line:
        lines += [line, ""]
    lines += [
        f"Release listing: {_code(listing.package)} on {_cell(listing.index)}, "
        f"read {listing.read_utc}: {len(listing.versions)} versions, {len(listing.selected)} in the range.",
        "",
        "Each release's raw probe outputs are under `raw/<version>/probes/`; the classification",
        f"(`{receipt.algorithm}`), the range and this file are recomputed by `kvprobe verify <this directory>`.",
        "",
    ]
    if receipt.repeats:  # sweep --repeat N
        lines += [
            f"Each release's probes ran {receipt.repeats} times (runs 2..N: `<probe>.repeat-<run>.json`); a "
            "release with an expected case that differed between runs is could-not-observe (unstable).",
            "",
        ]
    lines += [
        "What this shows: " + _cell(receipt.evidence.shows),
        "",
        "What it does not show:",
        *(f"- {_cell(item)}" for item in receipt.evidence.does_not_show),
        *(f"- {_cell(item)}" for item in receipt.evidence.limits),
        "",
    ]
    return "\n".join(lines)

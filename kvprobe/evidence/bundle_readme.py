"""The short human summary written as README.md inside every bundle."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from kvprobe.model.receipt import Comparison, Receipt
from kvprobe.names import NOT_PRESENT, SIDES
from kvprobe.text import for_markdown


def _pins(receipt: Receipt) -> list[str]:
    lines = []
    for side in SIDES:
        pin = receipt.sides[side].pin
        if pin["kind"] == "git":
            lines.append(f"- {side}: commit `{pin['commit']}`")
        elif pin["kind"] == "wheel":
            lines.append(f"- {side}: `{pin['filename']}` sha256 `{pin['sha256']}`")
        else:
            lines.append(f"- {side}: model switches `{json.dumps(pin['switches'], sort_keys=True)}`")
    return lines


def case_state(
    case: Mapping[str, Any] | None,
    name: Callable[[str], str],
    text: Callable[[str], str],
    raised: Callable[[Mapping[str, Any]], str],
) -> str:
    """How far a probe case got on one side, for a Markdown table: ``name`` renders a missing
    symbol, ``text`` a reason, ``raised`` a case that raised (each destination its own way)."""
    if case is None:
        return "not run"
    seen = case.get("observation", "observed")  # receipts before compare/4: every case observed
    if seen == "not-present":
        return "not present (" + ", ".join(name(m) for m in case["missing"]) + ")"
    if seen != "observed":
        return f"unobserved ({text(case['reason'])})"
    return raised(case) if case["status"] == "raised" else "behaviour"


def _case_state(case: Mapping[str, Any] | None) -> str:
    return case_state(case, for_markdown, for_markdown, lambda c: f"raised {c['error_type']}")


def _cases(receipt: Receipt) -> list[str]:
    """One row per case: what each side did, and how many expected observations held."""
    comp = receipt.comparison
    keys = sorted(set(comp.cases["base"]) | set(comp.cases["head"]))
    if not keys:
        return []
    lines = ["| case | base | head | expected observations held |", "| --- | --- | --- | --- |"]
    for key in keys:
        rows = [
            r
            for r in comp.observations
            if r["case"] == key and (r["expected_base_declared"] or r["expected_head_declared"])
        ]
        held = sum(1 for r in rows if r["base_ok"] and r["head_ok"])
        lines.append(
            f"| `{key}` | {_case_state(comp.cases['base'].get(key))} | "
            f"{_case_state(comp.cases['head'].get(key))} | {held}/{len(rows)} |"
        )
    return [*lines, ""]


def render_readme(receipt: Receipt) -> str:
    exp = receipt.experiment
    comp = receipt.comparison
    counts = comp.counts
    lines = [
        f"# {exp.id}: {exp.title}",
        "",
        f"Verdict: **{receipt.verdict}** ({counts['observations_matched']}/"
        f"{counts['observations_expected']} expected observations matched, "
        f"{counts['tests']} upstream test results, {counts['fail_to_pass']} fail-to-pass"
        + (f", {counts['error_to_pass']} error-to-pass" if counts.get("error_to_pass") else "")
        + ").",
        f"Evidence layer: {receipt.evidence.layer}. Pin set: {receipt.pin_set.name}.",
        "",
        "Pins:",
        *_pins(receipt),
        "",
        *_collection_errors(comp),
        *_absent_sides(receipt),
        f"What this shows: {receipt.evidence.shows}",
        "",
        "What this does not show:",
        *[f"- {item}" for item in receipt.evidence.does_not_show],
        "",
    ]
    lines += _cases(receipt)
    if comp.reasons:
        lines += ["Reasons:", *[f"- {r}" for r in comp.reasons], ""]
    lines += [
        "Check it: `kvprobe verify <this directory>` (offline), "
        "`kvprobe verify --rerun <this directory>` (runs it again), "
        "or `sha256sum -c --strict SHA256SUMS`.",
        "",
    ]
    return "\n".join(lines)


def _absent_sides(receipt: Receipt) -> list[str]:
    """A side whose cases are expected not-present: what a reproduced verdict then means."""
    lines = []
    for side in SIDES:
        absent = sorted(k for k, v in receipt.expectations.get(side, {}).items() if NOT_PRESENT in v)
        if absent:
            other = "head" if side == "base" else "base"
            lines.append(
                f"The {side} is expected to lack the code of {len(absent)} case(s) (not present there, by the "
                f"symbols the probe names): what the {other} shows for them is a feature it adds, not a changed "
                "behaviour of code both sides share."
            )
    return [*lines, ""] if lines else []


def _collection_errors(comp: Comparison) -> list[str]:
    """A side that could not collect a test module, said first and plainly, root cause included."""
    lines = [
        f"The {side} could not collect `{e['nodeid']}`: {e['exc_type'] or 'error'}: {e['message']}"
        for summary in comp.test_summary.values()
        for side in ("base", "head")
        for e in summary[side].get("collection_errors", [])
    ]
    return [*lines, ""] if lines else []

"""The Markdown rendering of a bundle for a security review: verdict, pins, cases, tests, limits.

Every value from the receipt is untrusted text: prose passes :func:`kvprobe.text.for_markdown`
(no HTML, links, images or emphasis), code spans show control characters as escapes, and
table cells escape every value (:func:`cell`), so nothing a receipt holds can add, drop or
split a cell.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from kvprobe.evidence.bundle_readme import case_state
from kvprobe.exports.bundle_view import (
    BundleView,
    counts_text,
    failure_kinds_text,
    prs_text,
    verify_command,
)
from kvprobe.model.receipt import Comparison, EvidenceScope, Receipt, ScopeRecord
from kvprobe.names import SIDES
from kvprobe.text import for_markdown, for_terminal

_MAX_VALUE = 160  # characters of one observed value shown in a Markdown cell


def code_span(text: Any) -> str:
    """An inline code span that survives backticks in ``text``; controls shown as escapes."""
    text = for_terminal(" ".join(str(text).split()))
    fence = "`"
    while fence in text:
        fence += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def scope_lines(ev: ScopeRecord) -> list[str]:
    """The Scope section every bundle kind's Markdown states: what the evidence shows and does not."""
    return [
        "### Scope",
        "",
        f"**What this shows:** {for_markdown(ev.shows)}",
        "",
        "**What this does not show:**",
        "",
        *(f"- {for_markdown(item)}" for item in ev.does_not_show),
        "",
    ]


def provenance_lines(view: BundleView, author: str | None = None) -> list[str]:
    """What anchored the bundle (or that nothing did), and who exported it: bullet lines."""
    prov = view.provenance
    lines = []
    if author:
        lines.append(f"- **Reported by:** {for_markdown(author)}")
    if prov.anchor:
        lines.append(f"- **Anchored:** {for_markdown(prov.anchor)}")
    lines += [f"- **Caveat:** {for_markdown(text)}" for text in prov.caveats()]
    return lines


def cell(text: Any) -> str:
    """Prose in a table cell: each line through for_markdown (pipes, HTML and link syntax as
    entities) and line breaks as <br>, so no value can add, drop or split a cell."""
    return "<br>".join(for_markdown(line) for line in re.split(r"\r\n|\r|\n", str(text)))


def code_cell(text: str) -> str:
    """A code span in a table cell when that is safe (no backslash, backtick, control or
    format character); otherwise the same text as escaped prose."""
    if re.search(r"[\\`]", text) or for_terminal(text) != text or not text.strip():
        return cell(text)
    return "`" + text.replace("|", "\\|") + "`"


def _value(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)
    if len(text) > _MAX_VALUE:
        text = text[: _MAX_VALUE - 1] + "…"
    return code_cell(text)


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


def _case_outcome(case: Mapping[str, Any] | None) -> str:
    return case_state(case, code_cell, cell, _raised)


def _raised(case: Mapping[str, Any]) -> str:
    root = case.get("root_type")
    extra = f" (root {code_cell(root)})" if root and root != case.get("error_type") else ""
    return f"raised {code_cell(case.get('error_type') or 'an exception')}{extra}"


def _check(row: Mapping[str, Any]) -> str:
    declared = row["expected_base_declared"] or row["expected_head_declared"]
    if not declared:
        return "changed (no expectation)"
    unknown = [s for s in SIDES if row[f"{s}_ok"] is None]
    if unknown:
        return f"unknown (could not observe): {', '.join(unknown)}"
    bad = [s for s in SIDES if not row[f"{s}_ok"]]
    return f"**mismatch**: {', '.join(bad)}" if bad else "ok"


def _observed(row: Mapping[str, Any], side: str, case: Mapping[str, Any] | None) -> str:
    if row[f"{side}_recorded"]:
        return _value(row[side])
    if case is None:
        return "(case not run)"
    if case.get("observation", "observed") != "observed":
        return "(not recorded: case did not observe)"
    return "(not recorded: case raised)" if case["status"] == "raised" else "(not recorded)"


def _expected(row: Mapping[str, Any], side: str) -> str:
    return _value(row[f"expected_{side}"]) if row[f"expected_{side}_declared"] else "—"


def _side_tests(summary: Mapping[str, Any]) -> str:
    tests = summary.get("tests") or {}
    total = sum(tests.values())
    text = f"{tests.get('passed', 0)}/{total} passed"
    subtests = summary.get("subtests") or {}
    if subtests:
        text += f" (+{sum(subtests.values())} subtests, {subtests.get('passed', 0)} passed)"
    text += "; " + failure_kinds_text(summary.get("failure_kinds") or {})
    if summary.get("problem"):
        text += f"; problem: {summary['problem']}"
    return text


def _test_outcome(row: Mapping[str, Any], side: str) -> str:
    outcome = row.get(side)
    if outcome is None:
        return "not run"
    detail = row.get(f"{side}_exc_type") or row.get(f"{side}_kind")
    return f"{outcome} ({detail})" if outcome in ("failed", "error") and detail else outcome


def markdown(view: BundleView, author: str | None = None) -> str:
    """A block to paste into a security review; tables hold any value without breaking.
    ``author`` (report --author), when given, is named as who reported it."""
    r = view.run
    exp, comp, ev = r.experiment, r.comparison, r.evidence
    fix = exp.fix
    env, host = r.env, r.host
    out = [f"## kvprobe evidence: {for_markdown(exp.id)}: {for_markdown(exp.title)}", ""]
    out += provenance_lines(view, author)
    release = f", first released in {for_markdown(fix.release)}" if fix.release else ""
    out += [
        f"- **Verdict:** **{for_markdown(r.verdict)}**: {for_markdown(counts_text(r))}",
        f"- **Evidence layer:** {code_span(ev.layer)}",
        f"- **Fix:** {prs_text(r, links=True)}{release}. {for_markdown(fix.summary)}",
        f"- **Upstream:** {for_markdown(exp.upstream or 'not recorded')}",
        f"- **Experiment:** {code_span(exp.id)} ({code_span(exp.file)}, sha256 {code_span(exp.sha256)})",
        f"- **Run:** {code_span(r.run_id)} at {for_markdown(r.created_utc)} by kvprobe "
        f"{for_markdown(r.tool.version)}; pin set {code_span(r.pin_set.name)} ({for_markdown(r.pin_set.kind)})",
    ]
    torch = env.torch or {}
    torch_text = f", torch {for_markdown(torch.get('version'))} from {for_markdown(env.torch_index)}" if torch else ""
    out.append(
        f"- **Environment:** Python {for_markdown(env.python)} on {for_markdown(host.get('system', '?'))} "
        f"{for_markdown(host.get('machine', '?'))}, profile {code_span(env.profile)}, lock "
        f"{code_span(env.lock_name or '-')} sha256 {code_span(env.lock_sha256 or '-')}{torch_text}"
    )
    out += ["", "### Pins", ""]
    out += _table(["side", "kind", "pin", "digest"], [_pin_row(r, side) for side in SIDES])

    if comp.reasons:
        out += [f"### Why the verdict is {for_markdown(r.verdict)}", ""]
        out += [f"- {for_markdown(reason)}" for reason in comp.reasons] + [""]

    out += _cases_section(comp)
    out += _tests_section(comp)
    out += _mocks_section(ev)
    out += scope_lines(ev)
    if ev.limits:
        out += ["**Limits:**", ""] + [f"- {for_markdown(item)}" for item in ev.limits] + [""]
    out += [
        "### Integrity",
        "",
        f"- **Bundle manifest sha256:** {code_span(view.manifest_sha256)} (sha256 of the bundle's manifest.json, "
        "which lists every other file with its sha256)",
        f"- **Receipt sha256:** {code_span(view.receipt_sha256)}",
        "- **Verify:**",
        "",
        "```sh",
        verify_command(view),
        "```",
        "",
    ]
    return "\n".join(out)


def _pin_row(r: Receipt, side: str) -> list[str]:
    pin = r.sides[side].pin
    if pin["kind"] == "wheel":
        return [
            side,
            "wheel",
            f"{code_cell(pin['filename'])} ({cell(pin['package'])} {cell(pin['version'])})",
            f"sha256 {code_cell(pin['sha256'])}",
        ]
    if pin["kind"] == "git":
        note = ""
        if side == "head" and r.pin_set.pr:
            note = f" (PR head, fetch via refs/pull/{r.pin_set.pr}/head)"
        return [side, "git", f"commit {code_cell(pin['commit'])}{note}", f"gitCommit {code_cell(pin['commit'])}"]
    switches = json.dumps(pin.get("switches"), sort_keys=True)
    return [side, cell(pin["kind"]), f"model switches {code_cell(switches)}", "—"]


def _cases_section(comp: Comparison) -> list[str]:
    cases = comp.cases
    by_case: dict[str, list[dict]] = {}
    for row in comp.observations:
        by_case.setdefault(row["case"], []).append(row)
    keys = sorted(set(by_case) | set(cases.get("base", {})) | set(cases.get("head", {})))
    if not keys:
        return ["### Probe cases", "", "No probe case ran.", ""]
    out = [
        "### Probe cases",
        "",
        '"behaviour": the case ran to its end and recorded what the code did; "raised": the code '
        'under test raised, and the exception type is itself an observation; "unobserved": the '
        'case never reached its decision point (set-up drift, with the reason); "not present": '
        "the release lacks the code path (the missing symbols). Neither of the last two is behaviour.",
        "",
    ]
    summary = []
    for key in keys:
        rows = by_case.get(key, [])
        declared = [x for x in rows if x["expected_base_declared"] or x["expected_head_declared"]]
        ok = sum(1 for x in declared if x["base_ok"] and x["head_ok"])
        summary.append(
            [
                code_cell(key),
                _case_outcome(cases.get("base", {}).get(key)),
                _case_outcome(cases.get("head", {}).get(key)),
                f"{ok}/{len(declared)}" + ("" if ok == len(declared) else " **mismatch**"),
                str(sum(1 for x in rows if x["changed"])),
            ]
        )
    out += _table(["case", "base", "head", "expected matched", "changed"], summary)
    out += [
        "Per case, every observation with a declared expectation or a base/head difference "
        '("—": no expectation declared; unchanged, undeclared observations are only in receipt.json).',
        "",
    ]
    for key in keys:
        shown = [
            x
            for x in by_case.get(key, [])
            if x["expected_base_declared"] or x["expected_head_declared"] or x["changed"]
        ]
        if not shown:
            continue
        out += [f"#### {code_span(key)}", ""]
        out += _table(
            ["observation", "base", "expected base", "head", "expected head", "check"],
            [
                [
                    code_cell(x["observation"]),
                    _observed(x, "base", cases.get("base", {}).get(key)),
                    _expected(x, "base"),
                    _observed(x, "head", cases.get("head", {}).get(key)),
                    _expected(x, "head"),
                    _check(x),
                ]
                for x in shown
            ],
        )
    return out


def _tests_section(comp: Comparison) -> list[str]:
    out = ["### Upstream tests", ""]
    if not comp.test_summary:
        return [*out, "No upstream test ran on these pins (see the limits below).", ""]
    rows = []
    for path, s in sorted(comp.test_summary.items()):
        moves = ", ".join(f"{n} {t}" for t, n in sorted(s.get("transitions", {}).items())) or "none"
        rows.append([code_cell(path), cell(moves), cell(_side_tests(s["base"])), cell(_side_tests(s["head"]))])
    out += _table(["file", "transitions", "base", "head"], rows)
    if comp.tests:
        out += _table(
            ["test", "base", "head", "transition"],
            [
                [
                    code_cell(t["test"]),
                    cell(_test_outcome(t, "base")),
                    cell(_test_outcome(t, "head")),
                    cell(t["transition"]),
                ]
                for t in comp.tests
            ],
        )
    return out


def _mocks_section(ev: EvidenceScope) -> list[str]:
    out = ["### Mock boundary", ""]
    if not ev.mocks:
        return [*out, "No probe declared mocks.", ""]
    out += ["What each probe replaced, as the probe declares it (receipt.evidence.mocks).", ""]
    rows = [
        [code_cell(probe), code_cell(target), cell(what)]
        for probe, mocks in sorted(ev.mocks.items())
        for target, what in sorted(mocks.items())
    ]
    return out + _table(["probe", "replaced", "with"], rows)

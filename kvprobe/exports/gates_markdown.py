"""The Markdown rendering of a gates bundle, for a change ticket: the overall result, each
gate and its checks, the operator's inputs by digest, the target SGLang and its fix markers.

Every value from the receipt is untrusted text and passes the same escaping as a run bundle's
Markdown (:func:`~kvprobe.exports.markdown.cell`, :func:`~kvprobe.exports.markdown.code_span`).
"""

from __future__ import annotations

from kvprobe.exports.bundle_view import BundleView, verify_command
from kvprobe.exports.markdown import cell, code_cell, code_span, provenance_lines, scope_lines
from kvprobe.model.gates_receipt import GatesReceipt
from kvprobe.text import for_markdown


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return [*lines, *("| " + " | ".join(row) + " |" for row in rows), ""]


def _inputs(r: GatesReceipt) -> list[list[str]]:
    rows = []
    for kind, entries in (("logs", r.inputs.logs), ("server_args", r.inputs.server_args)):
        for entry in entries:
            name = entry.name or entry.path or "?"
            redacted = ", ".join(entry.redacted_keys or []) or "none"
            rows.append(
                [
                    cell(kind.replace("_", " ")),
                    code_cell(str(name)),
                    cell(entry.role or "-"),
                    code_cell(str(entry.sha256)),
                    cell(redacted),
                ]
            )
    return rows


def markdown(view: BundleView, author: str | None = None) -> str:
    """A block to paste into a change ticket (exit code and gate statuses as the receipt
    records them; verify recomputed them from the checks before this runs)."""
    r = view.gates
    ev = r.evidence
    out = [f"## kvprobe gates: {for_markdown(r.overall)}", ""]
    out += provenance_lines(view, author)
    target = r.target
    target_text = f"{code_span(target.spec)} ({for_markdown(target.kind)})" if target else "none given (no --sglang)"
    out += [
        f"- **Overall:** **{for_markdown(r.overall)}** (exit {for_markdown(r.exit_code)})",
        f"- **Target SGLang:** {target_text}",
        f"- **Run:** {code_span(r.run_id)} at {for_markdown(r.created_utc)} by kvprobe {for_markdown(r.tool.version)}",
        "",
        "### Gates",
        "",
    ]
    out += _table(
        ["gate", "title", "status", "checks"],
        [
            [
                str(g.number),
                cell(g.title),
                f"**{cell(g.status)}**",
                cell(", ".join(f"{c.name}: {c.status}" for c in g.checks)),
            ]
            for g in r.gates
        ],
    )
    for g in r.gates:
        out += [f"#### Gate {g.number}: {for_markdown(g.title)}", ""]
        out += _table(
            ["check", "status", "decides", "detail", "evidence"],
            [
                [
                    code_cell(c.name),
                    cell(c.status),
                    "yes" if c.decides else "no",
                    cell(c.detail),
                    cell(c.evidence),
                ]
                for c in g.checks
            ],
        )
    rows = _inputs(r)
    out += ["### Inputs (by digest; the bundle does not copy them)", ""]
    out += _table(["kind", "name", "role", "sha256", "secret keys masked"], rows) if rows else ["None.", ""]
    if target and target.markers:
        out += ["### Fix markers in the target", ""]
        out += _table(
            ["PR", "gate", "title", "presence", "first release", "evidence"],
            [
                [
                    f"#{m.pr}",
                    str(m.gate),
                    cell(m.title),
                    cell(m.presence),
                    cell(m.first_release),
                    cell(m.evidence),
                ]
                for m in target.markers
            ],
        )
    out += scope_lines(ev)
    if ev.limits:
        out += ["**Limits:**", "", *(f"- {for_markdown(item)}" for item in ev.limits), ""]
    out += [
        "### Integrity",
        "",
        f"- **Bundle manifest sha256:** {code_span(view.manifest_sha256)}",
        f"- **Verify:** {code_span(verify_command(view))}",
        "",
    ]
    return "\n".join(out)

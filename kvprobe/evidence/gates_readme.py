"""README.md of a gates bundle: the summary `kvprobe gates` writes from the receipt, and that
`verify` holds the bundle's README.md to byte for byte (an operator attaches it to a change
ticket; nothing else ties its words to the receipt)."""

from __future__ import annotations

from kvprobe.model.gates_receipt import GatesReceipt
from kvprobe.text import for_markdown


def render_readme(receipt: GatesReceipt) -> str:
    lines = [
        f"# kvprobe gates: {receipt.overall}",
        "",
        f"Layer: deployment. Exit code: {receipt.exit_code} (0 all pass, 1 a gate failed, 3 could not decide).",
        "",
    ]
    for gate in receipt.gates:
        lines += [
            f"## Gate {gate.number}: {gate.status}",
            "",
            for_markdown(gate.title),  # the receipt's text: no link or HTML of its own
            "",
            "| check | status | detail | evidence |",
            "| --- | --- | --- | --- |",
        ]
        for c in gate.checks:
            status = c.status if c.decides else f"{c.status} (info)"
            name, detail, evidence = for_markdown(c.name), for_markdown(c.detail), for_markdown(c.evidence)
            lines.append(f"| {name} | {status} | {detail} | {evidence} |")
        lines.append("")
    lines += [
        "What this does not show:",
        *[f"- {x}" for x in receipt.evidence.does_not_show],
        "",
        "Check the files: `sha256sum -c --strict SHA256SUMS`.",
        "",
    ]
    return "\n".join(lines)

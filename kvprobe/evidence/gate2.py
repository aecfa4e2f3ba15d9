"""Gate 2's decision, pure: the probe outputs from the operator's SGLang and each gate-2
experiment's head expectations -> the gate's checks.

`kvprobe gates` decides gate 2 with it, and verify recomputes a gates receipt's gate 2 with
it from the bundled raw outputs and the bundled experiment files the receipt cites, so a
receipt that states another status than its raw outputs give is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvprobe.evidence import compare
from kvprobe.evidence.gate_status import Check, Status

# Which experiments gate 2 holds the operator's SGLang to: part of the decision, so here.
EXPERIMENTS = ("experiment-a", "experiment-b")

# The rule below, named in the receipt (bumped whenever its checks change for the same inputs).
ALGORITHM = "kvprobe.gate2/1"

NO_TARGET = Check("probes", Status.UNKNOWN, "no SGLang given: pass --sglang PATH|WHEEL|VERSION")


def experiment_checks(
    exp_id: str, prs: Sequence[int], head_expect: Mapping[str, Any], docs: Mapping[str, Any], problems: Sequence[str]
) -> list[Check]:
    """One experiment's head-side expectations against its probe outputs from the target:
    ``docs`` {probe name: output} of the probes that ran, ``problems`` of those that did not."""
    table = compare.case_table(docs)
    rows = compare.observation_rows({"head": head_expect}, {"base": {}, "head": table})
    label = f"{exp_id} (#{', #'.join(map(str, prs))})"
    if problems:
        return [Check(label, Status.UNKNOWN, "probe did not run to the end: " + "; ".join(problems))]
    if not table:
        return [Check(label, Status.UNKNOWN, "nothing ran: the probe reported no case")]
    return [_case_check(exp_id, case, table, rows) for case in sorted(head_expect)]


def _case_check(exp_id: str, case: str, table: dict[str, dict[str, Any]], rows: list[dict[str, Any]]) -> Check:
    name = f"{exp_id}: {case}"
    if table.get(case, {}).get("observation", compare.OBSERVED) != compare.OBSERVED:
        # set-up drift or a missing code path: neither fixed nor unfixed
        return Check(name, Status.UNKNOWN, compare.unobserved_text(table[case]))
    case_rows = [r for r in rows if r["case"] == case and r["expected_head_declared"]]
    bad = [r for r in case_rows if not r["head_ok"]]
    if not bad:
        return Check(name, Status.PASS, f"{len(case_rows)}/{len(case_rows)} observations as fixed")
    got = [
        f"{r['observation']} expected {r['expected_head']!r}, got {r['head']!r}"
        if r["head_recorded"]
        else f"{r['observation']} not recorded"
        for r in bad
    ]
    return Check(name, Status.FAIL, f"{len(case_rows) - len(bad)}/{len(case_rows)} as fixed; " + "; ".join(got[:4]))

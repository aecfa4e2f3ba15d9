"""The behavioural gates' decision, pure: probe outputs from the operator's SGLang and each
experiment's head expectations -> a gate's probe checks. One rule per behavioural gate
(:data:`RULES`): which experiments it runs and the algorithm id its receipt names.

Gate 2 (reject/admission) runs experiments A and B, gate 3 (transfer/read) experiment F
(#39500's handoff checksum), gate 4 (lifetime) experiments C, D and E (#40645 + #41402 drain
ACKs, #41404 deferred release after failures decode did not start, #41023 deferred release on
by default). `kvprobe gates` decides with :func:`experiment_checks`; verify recomputes each
behavioural gate's probe checks with it from the bundled raw outputs and experiment files.

A case observed as the head expects passes; observed otherwise fails (the fixed behaviour is
not there); a case that could not reach its decision point (set-up drift) is unknown. A case
*not present* on the target (the fix's code is absent) is unknown under gate 2's rule
(``kvprobe.gate2/1``, unchanged since receipts of that rule exist) and fails under gates 3 and
4's: the defence the gate asks for is not in that SGLang.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvprobe.rules import compare
from kvprobe.rules.gate_status import Check, Status


@dataclass(frozen=True)
class ProbeRule:
    """One behavioural gate: its experiments (run head side on the target) and its rule's id."""

    gate: int
    experiments: tuple[str, ...]
    algorithm: str  # bumped whenever the checks change for the same inputs
    absent_fails: bool  # a case not present on the target fails the gate (else: unknown)

    def owns(self, check_name: str) -> bool:
        """Is ``check_name`` one of this rule's probe checks (the ones verify recomputes)?"""
        if check_name == NO_TARGET.name:
            return True
        return any(check_name.startswith((f"{e}: ", f"{e} (#")) for e in self.experiments)


RULES: dict[int, ProbeRule] = {
    2: ProbeRule(2, ("experiment-a", "experiment-b"), "kvprobe.gate2/1", absent_fails=False),
    3: ProbeRule(3, ("experiment-f",), "kvprobe.gate3-probes/1", absent_fails=True),
    4: ProbeRule(4, ("experiment-c", "experiment-d", "experiment-e"), "kvprobe.gate4-probes/1", absent_fails=True),
}
BEHAVIOURAL = tuple(sorted(RULES))

NO_TARGET = Check("probes", Status.UNKNOWN, "no SGLang given: pass --sglang PATH|WHEEL|VERSION")
ABSENT = "the defence is absent"


def rule_for(algorithm: str) -> ProbeRule | None:
    """The rule a receipt names, or None for an id this kvprobe does not compute."""
    return next((r for r in RULES.values() if r.algorithm == algorithm), None)


def experiment_checks(
    rule: ProbeRule,
    exp_id: str,
    prs: Sequence[int],
    head_expect: Mapping[str, Any],
    docs: Mapping[str, Any],
    problems: Sequence[str],
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
    return [_case_check(rule, exp_id, case, table, rows) for case in sorted(head_expect)]


def _case_check(
    rule: ProbeRule, exp_id: str, case: str, table: dict[str, dict[str, Any]], rows: list[dict[str, Any]]
) -> Check:
    name = f"{exp_id}: {case}"
    seen = table.get(case, {}).get("observation", compare.OBSERVED)
    if seen == "not-present" and rule.absent_fails:
        return Check(name, Status.FAIL, f"{compare.unobserved_text(table[case])}: {ABSENT}")
    if seen != compare.OBSERVED:
        # set-up drift (or, under gate 2's rule, a missing code path): neither fixed nor unfixed
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

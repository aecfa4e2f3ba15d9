"""Gate 2's decision, pure: the probe outputs from the operator's SGLang and each gate-2
experiment's head expectations -> the gate's checks. Gate 2 is one of the behavioural gates
of :mod:`kvprobe.rules.gate_probes` (its rule ``kvprobe.gate2/1``); these names keep its
callers and the receipts written under that rule as they were.

`kvprobe gates` decides gate 2 with it, and verify recomputes a gates receipt's gate 2 with
it from the bundled raw outputs and the bundled experiment files the receipt cites, so a
receipt that states another status than its raw outputs give is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvprobe.rules import gate_probes
from kvprobe.rules.gate_status import Check

RULE = gate_probes.RULES[2]
# Which experiments gate 2 holds the operator's SGLang to: part of the decision, so here.
EXPERIMENTS = RULE.experiments
# The rule, named in the receipt (bumped whenever its checks change for the same inputs).
ALGORITHM = RULE.algorithm
NO_TARGET = gate_probes.NO_TARGET


def experiment_checks(
    exp_id: str, prs: Sequence[int], head_expect: Mapping[str, Any], docs: Mapping[str, Any], problems: Sequence[str]
) -> list[Check]:
    """One experiment's head-side expectations against its probe outputs from the target:
    ``docs`` {probe name: output} of the probes that ran, ``problems`` of those that did not."""
    return gate_probes.experiment_checks(RULE, exp_id, prs, head_expect, docs, problems)

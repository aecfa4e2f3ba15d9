"""A gate's status, its checks and how statuses combine: pure, shared by `kvprobe gates` and verify.

Verification recomputes every gate and the overall result of a gates receipt from its
checks with :func:`combine`, so it needs this rule and not the gates pipeline.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvprobe.model.gates_receipt import CheckRecord
from kvprobe.model.records import GateStatus

# The enum lives with the receipt model (a gates receipt's statuses are typed by it).
Status = GateStatus


# The ``exit_code`` a gates receipt records for its overall status: the CLI's exit codes
# (0 holds, 1 does not, 3 could not observe), written down so a reader of the receipt sees them.
RECORDED_EXIT_CODE = {Status.PASS: 0, Status.FAIL: 1, Status.UNKNOWN: 3}


def combine(statuses: Iterable[Status]) -> Status:
    """Any fail fails; nothing decided or anything unknown is unknown; else pass."""
    seen = set(statuses)
    if Status.FAIL in seen:
        return Status.FAIL
    if not seen or Status.UNKNOWN in seen:
        return Status.UNKNOWN
    return Status.PASS


@dataclass(frozen=True)
class Check:
    """One check of a gate, as decided; only checks that ``decides`` count towards its gate."""

    name: str
    status: Status
    detail: str
    evidence: str = "-"
    decides: bool = True

    def record(self) -> CheckRecord:
        return CheckRecord(self.name, self.status, self.detail, self.evidence, self.decides)

"""One verification step's result: what every step module returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kvprobe.defects import BundleDefect


class VerifyOutcome(StrEnum):
    """What a verification comes to (:attr:`kvprobe.verify.steps.Report.outcome`)."""

    VERIFIED = "verified"  # sound, and anchored outside the bundle
    SELF_CONSISTENT = "self-consistent"  # sound, but nothing outside the bundle vouches for it
    FAILED = "failed"
    COULD_NOT_RERUN = "could-not-rerun"  # the rerun could not observe; never a pass


STEP_NAMES = {1: "layout", 2: "documents", 3: "integrity", 4: "consistency", 5: "authenticity", 6: "rerun"}


@dataclass
class StepResult:
    number: int
    status: str  # pass | fail | skipped | self-consistent | could-not-run
    summary: str = ""
    defects: list[BundleDefect] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return STEP_NAMES[self.number]

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "name": self.name,
            "status": self.status,
            "summary": self.summary,
            "defects": [d.to_json() for d in self.defects],
            "notes": list(self.notes),
        }


def step_result(
    number: int, defects: Sequence[BundleDefect], summary: str, notes: list[str] | None = None
) -> StepResult:
    """``pass`` with no defects, else ``fail``."""
    return StepResult(number, "fail" if defects else "pass", summary, list(defects), notes or [])

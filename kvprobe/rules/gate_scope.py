"""What a gates receipt states its evidence shows, does not show, and its limits, pure: kvprobe's
own statement for each gates receipt version, and the host line from the receipt's host.

`kvprobe gates` writes it and `verify` holds every gates receipt to the statement of its version:
the Markdown export and README.md quote it as kvprobe's words ("that no cross-request KV exposure
happened or can happen" is what the evidence does NOT show), so a publisher must not be able to
drop a caveat or write its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvprobe.names import (
    GATES_RECEIPT_SCHEMA,
    GATES_RECEIPT_SCHEMA_1,
    GATES_RECEIPT_SCHEMA_2,
    GATES_RECEIPT_SCHEMA_3,
)

LAYER = "deployment"


@dataclass(frozen=True)
class Statement:
    """One version's words: the host line comes first among the limits (:func:`scope`)."""

    shows: str
    does_not_show: tuple[str, ...]
    limits: tuple[str, ...]


# Sentences more than one version wrote, word for word.
_SHOWS_AB = (
    "What this deployment's own startup logs, server arguments and SGLang code say about the "
    "four acceptance gates, and how the experiment A/B probes behave on that code (CPU, "
    "mocked transport)."
)
_NO_EXPOSURE = "that no cross-request KV exposure happened or can happen: nothing here serves a request"
_TRANSPORT_AB = "GPU, RDMA or transport behaviour: gate 2 probes mock the KV transport, pools and scheduler"
_DEFERRED_ENV = (
    "settings the process really ran with beyond what its log and the given files show: no "
    "SGLang release logs SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE, so deferred "
    "release is seen only in an environment given with --env (or an args file's env object)"
)
_LOGS_NOT_COPIED = (
    "operator logs and argument files are not copied into the bundle: their sha256 and the deciding lines are"
)

# By the version's number: the words kvprobe wrote under it (/1 and /2 wrote the same).
_BY_NUMBER: dict[str, Statement] = {
    "2": Statement(
        shows=_SHOWS_AB,
        does_not_show=(
            _NO_EXPOSURE,
            _TRANSPORT_AB,
            "settings the process really ran with beyond what its log and the given files show "
            "(environment variables are seen only when given)",
        ),
        limits=(
            "fix markers are code patterns measured on 0.5.19..0.5.22; a refactor may read as unknown",
            _LOGS_NOT_COPIED,
        ),
    ),
    "3": Statement(
        shows=_SHOWS_AB,
        does_not_show=(_NO_EXPOSURE, _TRANSPORT_AB, _DEFERRED_ENV),
        limits=(
            "fix markers are code patterns measured on 0.5.13..0.5.23; a refactor may read as unknown",
            _LOGS_NOT_COPIED,
        ),
    ),
    "4": Statement(
        shows=(
            "What this deployment's own startup logs, server arguments and SGLang code say about the "
            "four acceptance gates, and how the experiment A-F probes behave on that code, head side "
            "(CPU, mocked transport): A/B for gate 2, F for gate 3, C/D/E for gate 4."
        ),
        does_not_show=(
            _NO_EXPOSURE,
            "GPU, RDMA or transport behaviour: the gates' probes mock the KV transport, pools and "
            "scheduler (gate 3's checksum digest is a CPU stand-in for SGLang's CUDA kernel)",
            _DEFERRED_ENV,
        ),
        limits=(
            "fix markers are code patterns measured on 0.5.13..0.5.23, supporting detail only; a "
            "refactor may read as unknown",
            _LOGS_NOT_COPIED,
        ),
    ),
}
STATEMENTS: dict[str, Statement] = {
    GATES_RECEIPT_SCHEMA_1: _BY_NUMBER["2"],
    GATES_RECEIPT_SCHEMA_2: _BY_NUMBER["2"],
    GATES_RECEIPT_SCHEMA_3: _BY_NUMBER["3"],
    GATES_RECEIPT_SCHEMA: _BY_NUMBER["4"],
}


def scope(schema: str, host: Mapping[str, Any]) -> dict[str, Any]:
    """``{"layer", "shows", "does_not_show", "limits"}`` kvprobe states in a gates receipt of
    version ``schema`` made on ``host`` (its ``system`` and ``machine``); KeyError for a version
    it never wrote."""
    words = STATEMENTS[schema]
    return {
        "layer": LAYER,
        "shows": words.shows,
        "does_not_show": list(words.does_not_show),
        "limits": [f"host: {host.get('system')} {host.get('machine')}, CPU only", *words.limits],
    }

"""Gate 4's deferred-release checks, pure: what each worker ran with and what its release
offers -> one check per role.

No SGLang release logs SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE, so a startup log
alone never decides these checks: the worker's environment has to be given (an env file, a
container or pod spec, an "env" object in a server-arguments file). `kvprobe gates` decides
with this module and writes what it decided from into the receipt (``gate4``); verify
recomputes the checks from that record, so a receipt that states another status or detail
than its own basis gives is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvprobe.model.gates_receipt import Gate4Basis, ReleaseFacts, WorkerFacts
from kvprobe.rules.gate_status import Check, Status, combine

# The rule below, named in the receipt (bumped whenever its checks change for the same inputs).
ALGORITHM = "kvprobe.gate4-deferred/1"
ENV_KEY = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"
LOG_IS_NOT_ENOUGH = (
    f"no SGLang release logs {ENV_KEY}, so a log alone cannot decide this: give the worker's "
    "environment with --env [ROLE=]FILE (an env file, or a container/pod spec as JSON)"
)


def as_bool(value: Any) -> bool | None:
    """SGLang booleans as they appear in dumps, JSON, command lines and env values."""
    if isinstance(value, bool):
        return value
    if value is None:
        return None
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    return None


def worker_state(worker: WorkerFacts, release: ReleaseFacts | None) -> tuple[Status, str]:
    """One worker: deferred release on, and supported by its backend in its release?"""
    if release is not None and release.declared is False:
        return Status.FAIL, (
            f"not in this release: {release.evidence}; deferred KV release does not exist here, whatever the "
            "environment says: the defence is absent"
        )
    raw = worker.env_value
    if raw is None:
        default = "unknown" if release is None or release.default is None else ("on" if release.default else "off")
        return Status.UNKNOWN, f"not observed (release default: {default}): {LOG_IS_NOT_ENOUGH}"
    where = f" ({worker.env_source})" if worker.env_source else ""
    value = as_bool(raw)
    if value is None:
        return Status.UNKNOWN, f"{ENV_KEY}={raw!r}{where} is not a boolean SGLang reads"
    if not value:
        return Status.FAIL, f"off ({ENV_KEY}={raw}{where})"
    backend = worker.backend
    if release is None:
        return Status.UNKNOWN, f"on{where}; whether backend {backend!r} supports it is unknown without --sglang"
    if backend is None:
        return Status.UNKNOWN, f"on{where}; the transfer backend is not known (no server arguments name it)"
    if not release.capability_flag:
        return Status.UNKNOWN, (
            f"on{where}; this release declares no per-backend support, so whether backend "
            f"{backend!r} acks drains cannot be read from the code"
        )
    if backend not in release.backends:
        return Status.FAIL, (
            f"on{where}, but backend {backend!r} does not support it in this release (supported: "
            f"{', '.join(release.backends) or 'none'}): does not count as a defence"
        )
    return Status.PASS, f"on{where}, backend {backend!r} supports it"


def role_check(role: str, workers: Sequence[WorkerFacts], release: ReleaseFacts | None) -> Check:
    """Every worker of ``role`` must pass; the detail is the first worker's with the role's status."""
    name = f"{role}: deferred KV release"
    if not workers:
        if release is not None and release.declared is False:
            status, detail = worker_state(WorkerFacts(None, None, None, "-"), release)
            return Check(name, status, detail)
        return Check(
            name,
            Status.UNKNOWN,
            f"no server arguments or environment for the {role} worker (log line, --server-args or --env); "
            + LOG_IS_NOT_ENOUGH,
        )
    states = [(worker_state(w, release), w) for w in workers]
    status = combine(s for (s, _d), _w in states)
    (_, detail), worker = next((x for x in states if x[0][0] is status), states[0])
    return Check(name, status, detail + "".join(f"; {n}" for n in worker.notes), worker.evidence)


def checks_from_basis(basis: Gate4Basis) -> list[Check]:
    """The deferred-release checks a receipt's ``gate4`` record gives (verify's recomputation)."""
    return [role_check(role, workers, basis.release) for role, workers in basis.workers.by_role().items()]

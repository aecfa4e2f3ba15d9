"""`kvprobe sweep --executor ray --address ADDR`: each unit a Ray task on an existing cluster.

The only module that imports ray (an optional dependency: the `ray` extra). A task runs
:func:`kvprobe.run.sweep_unit.produce_unit` on a worker with that node's kvprobe, installed
experiments and cache, and returns the packed unit bundle; the driver verifies it
(sweep_unit.accept_unit). Each task gets one CPU and a time limit counted from its
submission; at most as many tasks are in flight as the cluster has CPUs, so a queued task
never uses up its limit waiting. A task that raises, dies or runs past its limit
(``ray.cancel(force=True)``) is that release's could-not-observe, with the reason.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator, Sequence
from typing import Any

from kvprobe.errors import KvprobeError, UsageError
from kvprobe.run.sweep_unit import UnitOutcome, UnitRequest, produce_unit


def _ray() -> Any:
    try:
        import ray
    except ModuleNotFoundError as exc:
        raise UsageError(
            "--executor ray needs Ray installed here and on every worker: pip install 'kvprobe[ray]'"
        ) from exc
    return ray


class RayExecutor:
    """Connected to the cluster at ``address`` from __enter__ to __exit__."""

    name = "ray"

    def __init__(self, address: str, unit_timeout_s: float) -> None:
        self.ray = _ray()
        self.address = address
        self.unit_timeout_s = unit_timeout_s

    def __enter__(self) -> RayExecutor:
        _reachable(self.address)
        try:
            self.ray.init(
                address=self.address,
                logging_level=logging.WARNING,
                log_to_driver=False,
                configure_logging=False,
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise UsageError(f"--address {self.address}: cannot connect to a Ray cluster ({exc})") from exc
        return self

    def __exit__(self, *exc: object) -> None:
        self.ray.shutdown()

    def run(self, requests: Sequence[UnitRequest]) -> Iterator[UnitOutcome]:
        task = self.ray.remote(num_cpus=1, max_retries=0)(produce_unit)
        slots = max(1, int(self.ray.cluster_resources().get("CPU", 1)))
        waiting = list(requests)
        running: dict[Any, tuple[UnitRequest, float]] = {}
        while waiting or running:
            while waiting and len(running) < slots:
                request = waiting.pop(0)
                running[task.remote(request)] = (request, time.monotonic() + self.unit_timeout_s)
            first_deadline = min(deadline for _, deadline in running.values())
            ready, _ = self.ray.wait(list(running), num_returns=1, timeout=max(0.0, first_deadline - time.monotonic()))
            for ref in ready:
                yield self._collect(ref, running.pop(ref)[0])
            now = time.monotonic()
            for ref in [ref for ref, (_, deadline) in running.items() if deadline <= now]:
                request, _ = running.pop(ref)
                self.ray.cancel(ref, force=True)
                yield UnitOutcome(
                    request, None, f"the unit ran past its {self.unit_timeout_s:.0f} s limit on the cluster"
                )

    def _collect(self, ref: Any, request: UnitRequest) -> UnitOutcome:
        try:
            value = self.ray.get(ref)
        except (self.ray.exceptions.RayError, KvprobeError) as exc:
            return UnitOutcome(request, None, f"the unit failed on the cluster: {_reason(exc)}")
        if not isinstance(value, bytes):
            return UnitOutcome(request, None, f"the unit returned a {type(value).__name__}, not a packed bundle")
        return UnitOutcome(request, value)


def _reachable(address: str, timeout_s: float = 10.0) -> None:
    """Fail fast on a wrong --address: ray.init retries an unreachable GCS for minutes."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UsageError(f"--address {address!r}: expected HOST:PORT of the Ray cluster's head")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise UsageError(f"--address {address}: no Ray head answers there ({exc})") from exc


def _reason(exc: BaseException) -> str:
    """One line: the worker's own exception where Ray wraps one."""
    cause = getattr(exc, "cause", None) or exc
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[-1] if text else ''}"[:500]

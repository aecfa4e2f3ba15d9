"""The limits a run receipt states (``evidence.limits``), pure: the words kvprobe writes from
the facts the receipt records (the host, the pin set's kind and tests commit, the env's torch).

`kvprobe run` writes them and `verify` recomputes them: the Markdown and OpenVEX exports quote
them as kvprobe's own caveats ("CPU only; no GPU, RDMA or model weights"), so a publisher must
not be able to drop one or write its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvprobe.model.records import SourceKind


def run_limits(
    host: Mapping[str, Any],
    pin_kind: SourceKind,
    tests_commit: str | None,
    torch: Mapping[str, Any] | None,
    torch_index: str | None,
) -> list[str]:
    """The limits of a run on ``host`` (its ``system`` and ``machine``) of a ``pin_kind`` pin
    set (a wheel pin set's upstream test files from ``tests_commit``), in an env with ``torch``
    from ``torch_index`` (None: no torch)."""
    limits = [f"host: {host.get('system')} {host.get('machine')}, CPU only; no GPU, RDMA or model weights"]
    if pin_kind is SourceKind.WHEEL and tests_commit is not None:
        limits.append(
            f"code from release wheels, test files from upstream commit {tests_commit}: "
            "the same tests on both sides, run against release code they were not written with"
        )
    elif pin_kind is SourceKind.WHEEL:
        limits.append("release wheels carry no upstream tests: only the probes ran on these pins")
    if torch:
        limits.append(
            f"torch {torch.get('version')} (cuda build {torch.get('cuda')}, cuda available: "
            f"{torch.get('cuda_available')}) from {torch_index}"
        )
    return limits

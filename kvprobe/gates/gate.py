"""A gate and its checks: what each gate decided, from which file or line, as data."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kvprobe.env.cache import default_cache_root
from kvprobe.model.gates_receipt import GateRecord
from kvprobe.rules.gate_status import Check, Status, combine


@dataclass(frozen=True)
class Gate:
    number: int
    title: str
    checks: tuple[Check, ...]

    @property
    def status(self) -> Status:
        return combine(c.status for c in self.checks if c.decides)

    def record(self) -> GateRecord:
        return GateRecord(self.number, self.title, self.status, tuple(c.record() for c in self.checks))


@dataclass
class GateOptions:
    logs: list[str] = field(default_factory=list)  # "FILE" or "prefill=FILE" / "decode=FILE"
    server_args: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)  # "FILE" or "prefill=FILE" / "decode=FILE": env file or JSON spec
    sglang: str | None = None
    out: Path | None = None
    cache_root: Path = field(default_factory=default_cache_root)
    bundles_dir: Path = field(default_factory=lambda: Path("bundles"))
    torch_index: str | None = None
    timeout_s: float = 900.0
    preload: bool = True  # gate 2's probes fork from one preloaded interpreter; False: a fresh one each

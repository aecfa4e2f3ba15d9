"""The operator's files: startup logs and server-argument files, by role, with their sha256.

The bundle never copies them (they can hold keys): it records their digests and the lines
that decided.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from kvprobe import files
from kvprobe.errors import UsageError
from kvprobe.gates import serverlog


def split_role(spec: str, what: str) -> tuple[str | None, Path]:
    """``prefill=FILE`` / ``decode=FILE`` / ``FILE``; UsageError for a missing file."""
    name, sep, rest = spec.partition("=")
    role: str | None = None
    path = Path(spec)
    if sep and name in serverlog.ROLES and rest:
        role, path = name, Path(rest)
    if not path.is_file():
        raise UsageError(f"{what} {spec!r}: no such file")
    return role, path


@dataclass(frozen=True)
class InputFile:
    path: Path
    role_flag: str | None
    sha256: str
    size: int

    def to_json(self, role: str | None) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "role_flag": self.role_flag,
            "role": role,
            "sha256": self.sha256,
            "size": self.size,
        }


def _input(role: str | None, path: Path) -> InputFile:
    return InputFile(path, role, files.sha256_file(path), path.stat().st_size)


_MAX_LINE_CHARS = 1 << 20  # a longer line is scanned in pieces of this size


def read_logs(specs: list[str]) -> list[tuple[InputFile, serverlog.WorkerLog]]:
    found = []
    for spec in specs:
        role, path = split_role(spec, "--log")
        with open(path, encoding="utf-8", errors="replace") as handle:
            log = serverlog.parse_log(_lines(handle), str(path), role)
        found.append((_input(role, path), log))
    return found


def _lines(handle: TextIO) -> Iterator[str]:
    """The log's lines as ``str.splitlines`` numbers them, read in bounded pieces (flat memory)."""
    while chunk := handle.readline(_MAX_LINE_CHARS):
        yield from chunk.splitlines()


def read_server_args(specs: list[str]) -> list[tuple[InputFile, str | None, serverlog.ServerArgs]]:
    """(file, role, args) per --server-args; the flag's role wins over the file's own."""
    found = []
    for spec in specs:
        role, path = split_role(spec, "--server-args")
        try:
            args = serverlog.read_args_file(path)
        except ValueError as exc:
            raise UsageError(f"--server-args {spec}: {exc}") from exc
        found.append((_input(role, path), role or args.role, args))
    return found

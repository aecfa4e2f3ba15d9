"""The operator's files: startup logs and server-argument files, by role, with their sha256.

The bundle never copies them (they can hold keys): it records their file names (never the
operator's paths), their digests, the lines that decided (secrets masked) and which secret
keys were masked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvprobe import files
from kvprobe.errors import UsageError
from kvprobe.gates import environment, serverlog
from kvprobe.model.gates_receipt import InputRecord


def split_role(spec: str, what: str) -> tuple[str | None, Path]:
    """``prefill=FILE`` / ``decode=FILE`` / ``FILE``; UsageError for a missing file."""
    name, sep, rest = spec.partition("=")
    role: str | None = None
    path = Path(spec)
    if sep and name in serverlog.ROLES and rest:
        role, path = name, Path(rest)
    if not path.is_file():
        try:
            found = f"{files.kind_of(path.stat().st_mode)}, not a regular file"
        except OSError:
            found = "no such file"
        raise UsageError(f"{what} {spec!r}: {found}")
    return role, path


@dataclass(frozen=True)
class InputFile:
    path: Path
    role_flag: str | None
    sha256: str
    size: int

    def record(self, role: str | None, redacted: frozenset[str] | set[str]) -> InputRecord:
        """Name and digest only: the operator's directory layout is not the bundle's business."""
        return InputRecord(
            self.role_flag, role, self.sha256, self.size, name=self.path.name, redacted_keys=tuple(sorted(redacted))
        )


def _input(role: str | None, path: Path) -> InputFile:
    return InputFile(path, role, files.sha256_file(path), path.stat().st_size)


def read_logs(specs: list[str]) -> list[tuple[InputFile, serverlog.WorkerLog]]:
    found = []
    for spec in specs:
        role, path = split_role(spec, "--log")
        found.append((_input(role, path), serverlog.read_log(path, path.name, role)))
    return found


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


def read_env(specs: list[str]) -> list[tuple[InputFile, environment.Environment]]:
    """(file, environment) per --env: an env file or a JSON container/pod spec."""
    found = []
    for spec in specs:
        role, path = split_role(spec, "--env")
        try:
            env = environment.read_env_file(path)
        except ValueError as exc:
            raise UsageError(f"--env {spec}: {exc}") from exc
        found.append((_input(role, path), env))
    return found

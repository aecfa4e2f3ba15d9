"""Run probe files inside a side's interpreter and read the one JSON document each writes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvprobe import proc, schema
from kvprobe.checks.forkserver import FORKED, FRESH, Execution, ForkServer, run_check
from kvprobe.errors import CheckRunError, SchemaError
from kvprobe.names import PROBE_OUTPUT_SCHEMA
from kvprobe.resources import probe_api_dir


@dataclass(frozen=True)
class ProbeRun:
    """One probe on one side: its output document, or why there is none."""

    name: str
    exit_code: int
    timed_out: bool
    duration_s: float
    output: dict[str, Any] | None
    problem: str | None
    execution: Execution = field(default_factory=lambda: Execution(FRESH))

    @property
    def ok(self) -> bool:
        return self.output is not None and self.problem is None


def run_probe(
    *,
    python: str,
    probe_file: Path,
    python_path: list[Path],
    out_json: Path,
    log_dir: Path,
    side_config: dict[str, Any],
    env_extra: dict[str, str],
    scratch: Path,
    timeout_s: float,
    server: ForkServer | None = None,
) -> ProbeRun:
    """Run ``probe_file --out out_json`` with the side's tree first on PYTHONPATH, in a fresh
    interpreter or, given a ``server``, in a child forked from its preloaded one.

    A probe that crashes, times out or writes an invalid document, or whose fork server
    fails, yields a ProbeRun with ``problem`` set: the comparison then reports an error,
    never a result.
    """
    name = probe_file.stem
    paths = [*map(str, python_path), str(probe_file.parent), str(probe_api_dir())]
    env = probe_env(paths, side_config, env_extra, scratch)
    stdout, stderr = log_dir / f"{name}.stdout", log_dir / f"{name}.stderr"
    # Through the probe API's runner: an import the probe's module cannot make is then
    # reported per case (not-present or unobserved), not a crashed process.
    argv = [str(probe_api_dir() / "kvprobe_probe.py"), str(probe_file), "--out", str(out_json)]
    try:
        result = run_check(
            [python, *argv],
            server=server,
            path=[Path(p) for p in paths],
            env=env,
            cwd=scratch,
            timeout_s=timeout_s,
            stdout_path=stdout,
            stderr_path=stderr,
            reset=lambda: out_json.unlink(missing_ok=True),
        )
    except CheckRunError as exc:
        return ProbeRun(name, -1, False, 0.0, None, f"probe {name}: {exc}", Execution(FORKED))
    output, problem = _read_output(out_json, name, result)
    return ProbeRun(name, result.returncode, result.timed_out, result.duration_s, output, problem, result.execution)


def probe_env(
    paths: list[str], side_config: dict[str, Any], env_extra: dict[str, str], scratch: Path
) -> dict[str, str]:
    """A probe's variables: ``paths`` as PYTHONPATH, the side's config, the profile's
    ``env_extra``, and ``scratch`` as HOME (a release's server imports with them too)."""
    return proc.clean_env(
        {
            "PYTHONPATH": ":".join(paths),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
            "KVPROBE_SIDE_CONFIG": json.dumps(side_config, sort_keys=True),
            **env_extra,
        },
        home=scratch,
    )


def _read_output(path: Path, name: str, result: proc.CommandResult) -> tuple[dict | None, str | None]:
    if result.timed_out:
        return None, f"probe {name} timed out after {result.duration_s:.0f}s"
    if result.returncode != 0 or not path.is_file():
        return None, f"probe {name} exited {result.returncode} without output: {result.summary()}"
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        check_output(document, name)
    except (ValueError, SchemaError) as exc:
        return None, f"probe {name} wrote an invalid document: {exc}"
    return document, None


def check_output(document: Any, name: str) -> None:
    """Schema-valid and about the probe that was asked for (file stem == probe name)."""
    schema.validate(document, PROBE_OUTPUT_SCHEMA, source=f"probe {name} output")
    if document["probe"] != name:
        raise SchemaError(f"probe output names {document['probe']!r}, expected {name!r}")
    names = [c["name"] for c in document["cases"]]
    if len(set(names)) != len(names):
        raise SchemaError(f"probe {name}: duplicate case names")

"""A worker's environment as the operator gives it: what no SGLang log shows.

Two shapes are read:

- an env file: ``KEY=VALUE`` lines (``export`` allowed, ``#`` comments, quoted values), as
  ``docker run --env-file`` and systemd's ``EnvironmentFile`` take them;
- JSON holding ``env`` lists: a container spec (``{"name": ..., "env": [{"name", "value"}]}``),
  a pod, a Deployment, a ``kubectl get ... -o json`` list, or ``docker inspect`` output
  (``Config.Env: ["KEY=VALUE"]``). Every container in it must agree on the keys kvprobe reads.

YAML is not read: kvprobe has no YAML parser among its dependencies, and a partial one would
misread what it does not understand. ``kubectl get pod NAME -o json`` gives the same spec.

Only the keys the gates read are kept (``serverlog.ENV_KEYS``); other keys' values are never
stored, and secret-looking key names are recorded as masked.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvprobe import strict_json
from kvprobe.defects import JsonDefect
from kvprobe.gates import serverlog

MAX_ENV_FILE_BYTES = 16 << 20
_ENV_LINE = re.compile(r"^(?:export\s+)?(?P<key>[A-Za-z_][A-Za-z0-9_.-]*)\s*=(?P<value>.*)$")


@dataclass(frozen=True)
class Environment:
    """The gate keys one input sets, where each was read, and what could not be seen."""

    values: dict[str, str]
    where: dict[str, str]  # key -> "file:line" or "file: container NAME"
    secrets: frozenset[str]
    notes: tuple[str, ...] = field(default=())


def read_env_file(path: Path) -> Environment:
    """An env file or a JSON spec; raises ValueError naming the file for anything else."""
    if path.stat().st_size > MAX_ENV_FILE_BYTES:
        raise ValueError(f"{path.name}: larger than {MAX_ENV_FILE_BYTES >> 20} MiB: not an environment file")
    data = path.read_bytes()
    text = data.decode("utf-8", errors="replace")
    head = text.lstrip()
    if head.startswith(("{", "[")):
        try:
            doc = strict_json.loads(data.strip(), path.name)
        except JsonDefect as defect:
            raise ValueError(f"{path.name}: not strict JSON: {defect.code}: {defect.detail}") from None
        return _from_json(doc, path.name)
    return _from_env_lines(text, path.name)


def _from_env_lines(text: str, name: str) -> Environment:
    values: dict[str, str] = {}
    where: dict[str, str] = {}
    secrets: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _ENV_LINE.match(line)
        if match is None:
            if re.match(r"^[\w-]+:(\s|$)", line) or line.startswith("- "):
                raise ValueError(
                    f"{name}:{number}: looks like YAML, which kvprobe does not read (no YAML parser among "
                    "its dependencies): give the spec as JSON (kubectl get pod NAME -o json) or an env file"
                )
            raise ValueError(f"{name}:{number}: not KEY=VALUE")
        key = match["key"]
        if serverlog.is_secret_key(key):
            secrets.add(key.lower())
        if key in serverlog.ENV_KEYS:
            values[key] = _unquote(match["value"].strip(), name, number)
            where[key] = f"{name}:{number}"
    return Environment(values, where, frozenset(secrets))


def _unquote(value: str, name: str, number: int) -> str:
    if value[:1] in "'\"":
        try:
            parts = shlex.split(value, comments=False)
        except ValueError as exc:
            raise ValueError(f"{name}:{number}: {exc}") from None
        return parts[0] if parts else ""
    return value.split(" #", 1)[0].strip()


def _from_json(doc: Any, name: str) -> Environment:
    """Every ``env`` list of {name, value} and every ``Env`` list of "KEY=VALUE" in the document."""
    containers: list[tuple[str, list[tuple[str, str | None]]]] = []
    secrets: set[str] = set()
    _collect(doc, "", containers)
    if not containers:
        raise ValueError(f"{name}: no 'env' list of a container (or 'Config.Env' of docker inspect) in this JSON")
    values: dict[str, str] = {}
    where: dict[str, str] = {}
    notes: list[str] = []
    for container, pairs in containers:
        for key, value in pairs:
            if serverlog.is_secret_key(key):
                secrets.add(key.lower())
            if key not in serverlog.ENV_KEYS:
                continue
            if value is None:
                notes.append(f"{key} is set from a secret or config map in {container}: its value is not in the spec")
                continue
            if key in values and values[key] != value:
                raise ValueError(
                    f"{name}: containers disagree on {key} ({where[key]}: {values[key]!r}, {container}: {value!r}): "
                    "give one worker's container spec"
                )
            values.setdefault(key, value)
            where.setdefault(key, f"{name}: {container}")
    return Environment(values, where, frozenset(secrets), tuple(notes))


def _collect(node: Any, path: str, out: list[tuple[str, list[tuple[str, str | None]]]]) -> None:
    if isinstance(node, dict):
        label = f"container {node['name']}" if isinstance(node.get("name"), str) else (path or "the document")
        env = node.get("env")
        if isinstance(env, list) and all(isinstance(e, dict) and isinstance(e.get("name"), str) for e in env):
            out.append((label, [(e["name"], _value(e)) for e in env]))
        docker_env = node.get("Env")
        if isinstance(docker_env, list) and all(isinstance(e, str) for e in docker_env):
            out.append((path or "Config", [(e.partition("=")[0], e.partition("=")[2]) for e in docker_env]))
        for key, value in node.items():
            if key not in ("env", "Env"):
                _collect(value, f"{path}.{key}" if path else str(key), out)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _collect(value, f"{path}[{i}]", out)


def _value(entry: dict[str, Any]) -> str | None:
    """A literal value; None for ``valueFrom`` (a secret or config map the spec does not hold)."""
    if "value" in entry:
        return str(entry["value"]) if entry["value"] is not None else ""
    return None if "valueFrom" in entry else ""

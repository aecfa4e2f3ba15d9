"""Probe-side API, imported INSIDE the target environment (stdlib only).

A probe file declares what it mocks, registers cases, and calls ``probe.main()``.
Each case receives an ``Observations`` object and records named, JSON-valued
observations. An exception inside a case is data: it is recorded with its type,
message and root cause, the observations made before it are kept, and the
remaining cases still run. The runner reads the one JSON document ``main``
writes; nothing is parsed from logs.

    import kvprobe_probe as kp
    probe = kp.Probe("admission", mocks={"sender": "MagicMock standing in for KV transport"})

    @probe.case("prefill.rejected_new", "an over-long prompt rejected before admission")
    def _(obs):
        obs.record("enqueued", True)

    if __name__ == "__main__":
        probe.main()
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

OUTPUT_SCHEMA = "kvprobe.probe-output/1"
_MAX_TRACEBACK_CHARS = 8000


SIDE_CONFIG_ENV = "KVPROBE_SIDE_CONFIG"


def side_config() -> dict[str, Any]:
    """The side's configuration the runner passed (synthetic experiments' switches).

    Diff probes on real code get ``{"side": "base"|"head", ...}``; they must not
    branch on it to change what they observe.
    """
    raw = os.environ.get(SIDE_CONFIG_ENV)
    return json.loads(raw) if raw else {}


class ObservationError(ValueError):
    """An observation that cannot be recorded faithfully (bad name, value or duplicate)."""


def _check_json_value(name: str, value: Any) -> None:
    """Reject values that JSON cannot carry exactly (NaN, sets, objects...)."""
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ObservationError(f"observation {name!r}: NaN/Infinity is not valid JSON")
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_json_value(name, item)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ObservationError(f"observation {name!r}: dict keys must be str")
            _check_json_value(name, item)
        return
    raise ObservationError(
        f"observation {name!r}: {type(value).__name__} is not a JSON value"
    )


class Observations:
    """What one case saw: ordered name -> JSON value, each name recorded once."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.notes: list[str] = []

    def record(self, name: str, value: Any) -> Any:
        """Record ``value`` under ``name``; returns it so calls can be inlined."""
        if not isinstance(name, str) or not name or not name.replace("_", "a").replace(".", "a").isalnum():
            raise ObservationError(f"observation name {name!r} must be [A-Za-z0-9_.]+")
        if name in self.values:
            raise ObservationError(f"observation {name!r} recorded twice")
        _check_json_value(name, value)
        self.values[name] = list(value) if isinstance(value, tuple) else value
        return value

    def note(self, text: str) -> None:
        """A free-text remark for humans; never compared."""
        self.notes.append(str(text))


def _qualname(exc_type: type) -> str:
    module = exc_type.__module__
    return exc_type.__qualname__ if module == "builtins" else f"{module}.{exc_type.__qualname__}"


def _root_cause(exc: BaseException) -> BaseException:
    """Walk __cause__/__context__ to the innermost exception (retry wrappers hide it)."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        nxt = exc.__cause__ or exc.__context__
        if nxt is None:
            break
        exc = nxt
    return exc


def describe_exception(exc: BaseException) -> dict[str, Any]:
    """Type, message, root cause and a bounded traceback of ``exc``."""
    root = _root_cause(exc)
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {
        "type": _qualname(type(exc)),
        "message": str(exc)[:2000],
        "root_type": _qualname(type(root)),
        "root_message": str(root)[:2000],
        "traceback": tb[-_MAX_TRACEBACK_CHARS:],
    }


class Probe:
    """A named set of cases plus the declaration of what the probe mocks."""

    def __init__(self, name: str, *, mocks: dict[str, str], description: str = "") -> None:
        if not mocks:
            raise ValueError("a probe must declare what it mocks (mocks={} is not allowed)")
        self.name = name
        self.mocks = dict(mocks)
        self.description = description
        self._cases: list[tuple[str, str, Callable[[Observations], None]]] = []
        self.facts: dict[str, Any] = {}

    def case(self, name: str, description: str = "") -> Callable:
        """Decorator registering one case; names are unique within the probe."""
        if any(existing == name for existing, _, _ in self._cases):
            raise ValueError(f"case {name!r} registered twice")

        def register(func: Callable[[Observations], None]) -> Callable[[Observations], None]:
            self._cases.append((name, description or (func.__doc__ or "").strip(), func))
            return func

        return register

    def fact(self, name: str, value: Any) -> None:
        """Context about the code under test (e.g. which file a class came from)."""
        _check_json_value(name, value)
        self.facts[name] = value

    def run_case(self, name: str, description: str, func: Callable) -> dict[str, Any]:
        obs = Observations()
        started = time.perf_counter()
        try:
            func(obs)
            status, error = "ok", None
        except Exception as exc:  # outcomes are data: record, keep going
            status, error = "raised", describe_exception(exc)
        return {
            "name": name,
            "description": description,
            "status": status,
            "observations": obs.values,
            "notes": obs.notes,
            "error": error,
            "duration_s": round(time.perf_counter() - started, 6),
        }

    def run(self, only: list[str] | None = None) -> dict[str, Any]:
        if not self._cases:
            raise RuntimeError(f"probe {self.name!r} registered no cases")
        selected = [c for c in self._cases if not only or c[0] in only]
        unknown = sorted(set(only or []) - {c[0] for c in self._cases})
        if unknown:
            raise RuntimeError(f"unknown case(s): {', '.join(unknown)}")
        results = [self.run_case(*c) for c in selected]
        return {
            "schema": OUTPUT_SCHEMA,
            "probe": self.name,
            "description": self.description,
            "mocks": self.mocks,
            "facts": self.facts,
            "python": platform.python_version(),
            "cases": results,
        }

    def main(self, argv: list[str] | None = None) -> None:
        """CLI entry used by kvprobe: ``python probe.py --out FILE [--case NAME]...``."""
        parser = argparse.ArgumentParser(description=self.description or self.name)
        parser.add_argument("--out", required=True, help="where to write the JSON output")
        parser.add_argument("--case", action="append", help="run only these cases")
        args = parser.parse_args(argv)
        document = self.run(args.case)
        data = json.dumps(document, indent=2, sort_keys=True, allow_nan=False) + "\n"
        directory = os.path.dirname(os.path.abspath(args.out))
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".probe-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(data)
        os.replace(tmp, args.out)
        sys.stdout.write(f"{self.name}: {len(document['cases'])} case(s) written to {args.out}\n")

"""``kvprobe run ID --record-expectations``: observed base/head values -> ``[expect...]`` tables.

Only the ``[expect...]`` tables of experiment.toml are replaced; every other byte of the
file is kept (comments above the first ``[expect...]`` table included; comments between
``[expect...]`` tables go with the old values). The rewrite is checked before it is
written: the new text must parse, hold exactly the same non-expectation data, hold exactly
the recorded values, and load as an experiment. Then temp file + ``os.replace``.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvprobe.errors import CheckRunError, ExperimentError, UsageError
from kvprobe.experiments import tomltext
from kvprobe.experiments.experiment import load_file
from kvprobe.files import write_atomic
from kvprobe.model.records import Experiment
from kvprobe.names import SIDES

_CASE_KEY_RE = re.compile(r"[a-z][a-z0-9_]*/[a-z0-9_.]+")
_NAME_RE = re.compile(r"[A-Za-z0-9_.]+")
_HEADER_RE = re.compile(
    r"""^[ \t]*\[\[?[ \t]*(?P<first>"(?:[^"\\\n]|\\.)*"|'[^'\n]*'|[A-Za-z0-9_-]+)"""
    r"""[^\n]*\]\]?[ \t]*(?:\#[^\n]*)?\r?\n?$"""
)


@dataclass(frozen=True)
class Recording:
    """What would be written: per side, per ``probe/case``, observation -> value."""

    experiment_id: str
    path: Path
    file_sha256: str
    run_id: str
    values: Mapping[str, Mapping[str, Mapping[str, Any]]]
    skipped: tuple[str, ...] = field(default=())

    @property
    def cases(self) -> list[str]:
        return sorted({key for side in SIDES for key in self.values.get(side, {})})

    @property
    def differs(self) -> bool:
        """True if any recorded observation tells base from head."""
        return any(
            not _same(self.values.get("base", {}).get(case), self.values.get("head", {}).get(case))
            for case in self.cases
        )


def plan(exp: Experiment, receipt: Mapping[str, Any]) -> Recording:
    """The expectations a finished run observed.

    Raises CheckRunError (exit 3) when the run ended in error (nothing honest to record)
    and UsageError when the probe still declares the template's mocks or nothing was observed.
    """
    if receipt["verdict"] == "error":
        reasons = "; ".join(receipt["comparison"]["reasons"][:3])
        raise CheckRunError(f"not recording expectations: the run ended in error ({reasons})")
    _refuse_template(receipt)
    values: dict[str, dict[str, dict[str, Any]]] = {}
    skipped: list[str] = []
    for side in SIDES:
        for key, case in sorted(receipt["comparison"]["cases"][side].items()):
            kept = _recordable(side, key, case["observations"], skipped)
            if kept:
                values.setdefault(side, {})[key] = kept
    if not values:
        raise UsageError(f"{exp.id}: no probe case recorded an observation: nothing to record")
    return Recording(
        exp.id, exp.directory / "experiment.toml", exp.file_sha256, receipt["run_id"], values, tuple(skipped)
    )


def _refuse_template(receipt: Mapping[str, Any]) -> None:
    from kvprobe.experiments.scaffold import TEMPLATE_MOCKS

    for probe, mocks in receipt["evidence"]["mocks"].items():
        if set(TEMPLATE_MOCKS) & set(mocks):
            raise UsageError(
                f"probe {probe} still declares the template's mocks {mocks!r}: write the probe "
                "(and declare what it really mocks) before recording its observations as expectations"
            )


def _recordable(side: str, key: str, observations: Mapping[str, Any], skipped: list[str]) -> dict[str, Any]:
    """The observations TOML can hold exactly; the rest are listed in ``skipped`` with why."""
    if not _CASE_KEY_RE.fullmatch(key):
        skipped.append(f"{side}: {key}: case name cannot be an expectation key ([a-z0-9_.])")
        return {}
    kept = {}
    for name, value in observations.items():
        if value is None:
            skipped.append(f"{side}: {key}: {name} is None (TOML has no null)")
            continue
        if not _NAME_RE.fullmatch(name):
            skipped.append(f"{side}: {key}: {name!r} is not an observation name")
            continue
        try:
            tomltext.value(value)
        except ValueError as exc:
            skipped.append(f"{side}: {key}: {name}: {exc}")
            continue
        kept[name] = value
    return kept


# --- rendering and rewriting -------------------------------------------------------------


def render_section(rec: Recording, newline: str = "\n") -> str:
    """``[expect.base."p/c"]`` / ``[expect.head."p/c"]`` per case, base then head."""
    lines: list[str] = []
    for key in rec.cases:
        for side in SIDES:
            observed = rec.values.get(side, {}).get(key)
            if not observed:
                continue
            lines.append(f"[expect.{side}.{tomltext.string(key)}]")
            if len(lines) == 1:  # inside the first table, so a re-record replaces it too
                lines.append(
                    f"# recorded by `kvprobe run {rec.experiment_id} --record-expectations` "
                    f"from run {rec.run_id}; review before committing"
                )
            lines += [f"{tomltext.key(name)} = {tomltext.value(v)}" for name, v in observed.items()]
        lines.append("")
    return newline.join(lines[:-1]) + newline


def replace_section(text: str, section: str) -> str:
    """``text`` with its ``[expect...]`` tables replaced by ``section`` (appended if none)."""
    lines = text.splitlines(keepends=True)
    spans = _expect_spans(lines)
    if not spans:
        head = text if not text or text.endswith("\n") else text + "\n"
        gap = "" if not head or head.endswith("\n\n") else "\n"
        return head + gap + section
    out = [*lines[: spans[0][0]], section]
    for (_start, end), nxt in zip(spans, [*spans[1:], (len(lines), len(lines))], strict=True):
        out += lines[end : nxt[0]]
    return "".join(out)


def _expect_spans(lines: list[str]) -> list[tuple[int, int]]:
    """[start, end) line spans of [expect...] tables; adjacent tables form one span."""
    headers = [i for i, line in enumerate(lines) if _HEADER_RE.match(line)]
    spans: list[tuple[int, int]] = []
    for n, start in enumerate(headers):
        if not _is_expect(lines[start]):
            continue
        stop = headers[n + 1] if n + 1 < len(headers) else len(lines)
        end = max((j + 1 for j in range(start, stop) if _is_content(lines[j])), default=start + 1)
        if spans and not any(_is_content(line) for line in lines[spans[-1][1] : start]):
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
    return spans


def _is_expect(line: str) -> bool:
    header = _HEADER_RE.match(line)
    return header is not None and header.group("first").strip("\"'") == "expect"


def _is_content(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


# --- writing -----------------------------------------------------------------------------


def write(rec: Recording) -> Path:
    """Replace the experiment's expectations with ``rec``, atomically.

    Raises UsageError if the file changed since the run, or if the rewrite would change
    anything but the expectations (nothing is written then).
    """
    raw = rec.path.read_bytes()
    if hashlib.sha256(raw).hexdigest() != rec.file_sha256:
        raise UsageError(f"{rec.path} changed since the run started; run again, then record")
    text = raw.decode("utf-8")
    newline = "\r\n" if "\r\n" in text else "\n"
    new_text = replace_section(text, render_section(rec, newline))
    _check_rewrite(rec, text, new_text)
    _replace_file(rec.path, new_text.encode("utf-8"))
    return rec.path


def _check_rewrite(rec: Recording, old_text: str, new_text: str) -> None:
    old = tomllib.loads(old_text)
    try:
        new = tomllib.loads(new_text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(
            f"{rec.path}: could not place the expectations ({exc}); "
            'write them as [expect.<side>."probe/case"] tables; nothing written'
        ) from exc
    old.pop("expect", None)
    recorded = new.pop("expect", None)
    if old != new or not _same(recorded, {s: v for s, v in rec.values.items() if v}):
        raise UsageError(
            f"{rec.path}: rewriting the [expect] tables would change other data or "
            "not read back exactly; nothing written"
        )


def _replace_file(path: Path, data: bytes) -> None:
    """Temp file beside ``path``, loaded as an experiment, then renamed over it."""
    write_atomic(path, data, mode=path.stat().st_mode & 0o7777, check=lambda tmp: _loads_as_experiment(tmp, path))


def _loads_as_experiment(tmp: Path, path: Path) -> None:
    try:
        load_file(tmp)
    except ExperimentError as exc:
        raise UsageError(f"{path}: the recorded expectations do not load: {exc.message}; nothing written") from exc


def _same(a: Any, b: Any) -> bool:
    """Deep equality that keeps bool apart from int and int apart from float."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b

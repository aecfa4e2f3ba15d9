"""Read SGLang startup logs and server arguments: pure parsing, no decisions.

The line formats come from SGLang's own source (0.5.19 .. 0.5.22 all print the same ones):

- ``managers/scheduler.py`` (tp_rank 0 of each DP group)::

      max_total_num_tokens=N, chunked_prefill_size=N, max_prefill_tokens=N,
      max_running_requests=N, context_len=N, available_gpu_mem=X.XX GB

- ``mem_cache/memory_pool.py`` ``_finalize_allocation_log`` (label is None, "Full" or "SWA")::

      [<label> ]KV Cache is allocated. dtype: D, #tokens: N, K size: X GB, V size: Y GB
      [<label> ]KV Cache is allocated. dtype: D, #tokens: N, KV size: X GB
      [<label> ]KV Cache VA upper bound. dtype: ...        (post-capture sizing: an upper bound)

- ``model_runner_components/kv_pool_runtime.py`` after post-capture resizing::

      Post-capture KV sizing: KV cache allocated. dtype: D, #tokens: N, KV size: X GB, avail mem=Y GB

- ``entrypoints/engine.py``: ``server_args={...}`` (a dict repr of ``resolved_dict()``); older
  releases printed ``server_args=ServerArgs(...)``.
- ``kv_canary/api.py``: ``install_canary: disaggregation_mode=M config=... ...`` when the canary runs.

Every line carries the logging prefix ``[YYYY-mm-dd HH:MM:SS[.mmm][ DPn][ TPn]...] ``.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROLES = ("prefill", "decode", "null")

SCHEDULER_RE = re.compile(
    r"max_total_num_tokens=(?P<pool>\d+), chunked_prefill_size=(?P<chunk>-?\d+|None), "
    r"max_prefill_tokens=(?P<max_prefill>\d+), max_running_requests=(?P<max_running>\d+), "
    r"context_len=(?P<context>\d+), available_(?:gpu|cpu)_mem=(?P<mem>[\d.]+) GB"
)
KV_RE = re.compile(
    r"(?:(?P<label>\w+) )?KV Cache (?P<kind>is allocated|VA upper bound)\. dtype: (?P<dtype>\S+), "
    r"#tokens: (?P<tokens>\d+), (?:K size: [\d.]+ GB, V size: [\d.]+ GB|KV size: [\d.]+ GB)"
)
POST_CAPTURE_RE = re.compile(
    r"Post-capture KV sizing: KV cache allocated\. dtype: (?P<dtype>\S+), #tokens: (?P<tokens>\d+), "
    r"KV size: [\d.]+ GB"
)
CANARY_RE = re.compile(r"install_canary: disaggregation_mode=(?P<mode>\w+) config=(?P<config>.*)")
PREFIX_RE = re.compile(r"^\[(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)(?P<ranks>[^\]]*)\] ")
ARGS_MARK = "server_args="
# Every line the scan reads holds one of these: other lines (nearly all of a serving log) are
# skipped before any regex runs.
_MARKS = ("max_total_num_tokens=", "KV Cache ", "KV cache allocated", "install_canary:", ARGS_MARK)

# Server-argument keys the gates read; nothing else is copied out of a log or args file.
KEYS = (
    "disaggregation_mode",
    "disaggregation_transfer_backend",
    "disaggregation_enable_kv_checksum",
    "kv_canary",
    "device",
    "context_length",
    "model_path",
    "served_model_name",
    "tp_size",
    "dp_size",
)
ENV_KEYS = (
    "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE",
    "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT",
)
# key names that hold secrets: api_key, admin_api_key, hf_token, *_secret, *password* (not tokenizer_path)
_SECRET_WORDS = r"(?:api_key|(?:^|_)tokens?(?:$|_)|secret|password|credential)"
_SECRET_RE = re.compile(_SECRET_WORDS, re.IGNORECASE)


@dataclass(frozen=True)
class Evidence:
    """Where a fact was read: file and 1-based line, plus the line (or an excerpt of it)."""

    file: str
    line: int | None
    text: str

    def cite(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.text}"


@dataclass(frozen=True)
class PoolLine:
    """One scheduler line: the pool and the context length one DP group declared."""

    pool_tokens: int
    context_len: int
    ranks: str
    evidence: Evidence


@dataclass(frozen=True)
class KvLine:
    label: str | None
    kind: str  # "allocated", "va-upper-bound", "post-capture"
    tokens: int
    evidence: Evidence


@dataclass(frozen=True)
class ServerArgs:
    """The subset of one worker's server arguments the gates read, and where from."""

    values: dict[str, Any]
    env: dict[str, str]
    full_dump: bool  # a resolved dump lists every field: a missing key is absent from the release
    evidence: Evidence

    @property
    def role(self) -> str | None:
        mode = self.values.get("disaggregation_mode")
        return str(mode) if mode in ROLES else None


@dataclass
class WorkerLog:
    """What one startup log says about its worker."""

    path: str
    role_flag: str | None = None
    role_from_log: str | None = None
    pools: list[PoolLine] = field(default_factory=list)
    kv_lines: list[KvLine] = field(default_factory=list)
    canary: Evidence | None = None
    args: ServerArgs | None = None
    problems: list[str] = field(default_factory=list)
    lines: int = 0

    @property
    def role(self) -> str | None:
        return self.role_flag or self.role_from_log


def parse_log(text: str | Iterable[str], path: str, role_flag: str | None = None) -> WorkerLog:
    """Scan one worker's startup log (its text, or its lines as a stream: a long-running server's
    log can be GBs); unknown lines are ignored, never guessed at."""
    log = WorkerLog(path=path, role_flag=role_flag)
    for number, raw in enumerate(text.splitlines() if isinstance(text, str) else text, start=1):
        log.lines = number
        _scan_line(log, raw.rstrip("\r"), number, path)
    if log.role_flag and log.role_from_log and log.role_flag != log.role_from_log:
        log.problems.append(f"--log says {log.role_flag} but the log's server args say {log.role_from_log}")
    return log


def _scan_line(log: WorkerLog, line: str, number: int, path: str) -> None:
    if not any(mark in line for mark in _MARKS):
        return
    prefix = PREFIX_RE.match(line)
    body = line[prefix.end() :] if prefix else line
    ranks = prefix["ranks"].strip() if prefix else ""
    if match := SCHEDULER_RE.search(body):
        log.pools.append(
            PoolLine(int(match["pool"]), int(match["context"]), ranks, Evidence(path, number, _clip(body)))
        )
    elif "max_total_num_tokens=" in body and "context_len=" not in body:
        log.problems.append(f"line {number}: scheduler line without context_len (truncated?)")
    if match := KV_RE.search(body):
        kind = "allocated" if match["kind"] == "is allocated" else "va-upper-bound"
        log.kv_lines.append(KvLine(match["label"], kind, int(match["tokens"]), Evidence(path, number, _clip(body))))
    elif match := POST_CAPTURE_RE.search(body):
        log.kv_lines.append(KvLine(None, "post-capture", int(match["tokens"]), Evidence(path, number, _clip(body))))
    if match := CANARY_RE.search(body):
        log.canary = Evidence(path, number, _clip(body))
        _set_role(log, match["mode"])
    if ARGS_MARK in body:
        args = parse_args_text(body[body.index(ARGS_MARK) + len(ARGS_MARK) :], path, number)
        if args is not None:
            log.args = args
            if args.role:
                _set_role(log, args.role)


def _set_role(log: WorkerLog, role: str) -> None:
    if role not in ROLES:
        return
    if log.role_from_log and log.role_from_log != role:
        log.problems.append(f"the log names two roles: {log.role_from_log} and {role}")
        return
    log.role_from_log = role


def _clip(text: str, limit: int = 240) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- server arguments ----------------------------------------------------------------------


def read_args_file(path: Path) -> ServerArgs:
    """A file holding one worker's arguments: JSON, a ``server_args=`` log line, or a command line.

    Raises ValueError when none of those formats is recognised.
    """
    text = path.read_text(encoding="utf-8", errors="replace")
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            doc = json.loads(stripped)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            return _from_mapping(doc, Evidence(str(path), None, "JSON server arguments"))
    for number, line in enumerate(text.splitlines(), start=1):
        if ARGS_MARK in line:
            found = parse_args_text(line[line.index(ARGS_MARK) + len(ARGS_MARK) :], str(path), number)
            if found is not None:
                return found
    if "--" in stripped:
        return _from_command_line(stripped, Evidence(str(path), None, "command-line server arguments"))
    raise ValueError(f"{path}: not JSON, a server_args= line or a command line")


def parse_args_text(text: str, path: str, line: int) -> ServerArgs | None:
    """``{...}`` (resolved dict repr) or ``ServerArgs(...)`` (dataclass repr) after ``server_args=``."""
    text = text.strip()
    evidence = Evidence(path, line, "server_args=" + _clip(_redact_text(text), 120))
    if text.startswith("{"):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            value = None
        if isinstance(value, dict):  # the engine logs the whole resolved dict: a full dump
            return _from_mapping(value, evidence, full=True)
        return _from_pairs(text, evidence, r"'(?P<key>\w+)':\s*")
    if text.startswith("ServerArgs("):
        return _from_pairs(text, evidence, r"\b(?P<key>\w+)=")
    return None


_VALUE = r"(?P<value>'[^']*'|\"[^\"]*\"|True|False|None|-?\d+(?:\.\d+)?)"


def _from_pairs(text: str, evidence: Evidence, key_pattern: str) -> ServerArgs:
    """Fallback for reprs that are not literals (an enum value, a truncated line): key by key."""
    values: dict[str, Any] = {}
    for match in re.finditer(key_pattern + _VALUE, text):
        if match["key"] in KEYS and match["key"] not in values:
            values[match["key"]] = ast.literal_eval(match["value"])
    complete = text.rstrip().endswith(("}", ")"))
    return ServerArgs(values, {}, complete and "disaggregation_mode" in values, evidence)


def _from_mapping(doc: dict[str, Any], evidence: Evidence, *, full: bool = False) -> ServerArgs:
    """``full``: the mapping is a whole resolved dump (a log line, or a /server_info-sized JSON)."""
    flat = _flatten(doc)
    env_doc = doc.get("env")
    if not isinstance(env_doc, dict):
        env_doc = {}
    env = {k: str(v) for k, v in {**flat, **env_doc}.items() if k in ENV_KEYS}
    values = {k: flat[k] for k in KEYS if k in flat}
    return ServerArgs(values, env, "disaggregation_mode" in flat and (full or len(flat) > 50), evidence)


def _flatten(doc: dict[str, Any]) -> dict[str, Any]:
    """Resolved dumps nest namespaces in some releases: the field names are unique either way."""
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        if isinstance(value, dict) and key != "env":
            for inner, inner_value in _flatten(value).items():
                flat.setdefault(inner, inner_value)
        else:
            flat.setdefault(str(key), value)
    return flat


def _from_command_line(text: str, evidence: Evidence) -> ServerArgs:
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError as exc:
        raise ValueError(f"{evidence.file}: cannot split the command line: {exc}") from exc
    values: dict[str, Any] = {}
    env: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if "=" in token and not token.startswith("-") and token.split("=", 1)[0] in ENV_KEYS:
            env_key, env_value = token.split("=", 1)
            env[env_key] = env_value
            continue
        if not token.startswith("--"):
            continue
        name, _, inline = token[2:].partition("=")
        key = name.replace("-", "_")
        if inline:
            value: Any = inline
        elif i < len(tokens) and not tokens[i].startswith("--"):
            value, i = tokens[i], i + 1
        else:
            value = True
        if key in KEYS:
            values[key] = value
    return ServerArgs(values, env, False, evidence)


def redacted(values: dict[str, Any]) -> dict[str, Any]:
    """What a receipt may carry: the gate keys only, anything secret-looking masked."""
    return {k: ("<redacted>" if _SECRET_RE.search(k) else v) for k, v in sorted(values.items())}


def _redact_text(text: str) -> str:
    def mask(match: re.Match) -> str:
        return match[1] + "'<redacted>'" if _SECRET_RE.search(match["key"]) else match[0]

    return re.sub(r"('(?P<key>\w+)':\s*)'[^']*'", mask, text)


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

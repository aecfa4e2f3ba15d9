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

Every line carries the logging prefix ``[YYYY-mm-dd HH:MM:SS[.mmm][ DPn][ TPn]...] ``
(``utils/common.py`` configure_logger), and each of these messages starts right after it. A
line counts only in that structure: a user's request logged while serving (``Receive:
obj=GenerateReqInput(text='KV Cache is allocated...')``) quotes the text mid-line and is
never read as the server's own line.

Secrets (API keys, tokens, passwords) are masked in every excerpt before it is kept, and
the keys masked are recorded, so nothing downstream can store or print them.
"""

from __future__ import annotations

import ast
import io
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from kvprobe import redaction, strict_json
from kvprobe.defects import JsonDefect, JsonMalformed

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
# A line that can decide, as bytes: the logging prefix, then how one of the messages above
# starts. Lines are found by the marks (bytes.find, C speed) and checked with the pattern,
# so the millions of lines a serving worker logs cost seconds, not minutes.
CANDIDATE_RE = re.compile(
    rb"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?[^\]\n]*\] "
    rb"(?:max_total_num_tokens=|(?:\w+ )?KV Cache |Post-capture KV sizing: KV cache |install_canary: |server_args=)"
)
_MARKS = (
    b"max_total_num_tokens=",
    b"KV Cache ",
    b"Post-capture KV sizing: KV cache ",
    b"install_canary: ",
    b"server_args=",
)
_BLOCK = 8 << 20

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
MAX_LINE_BYTES = 1 << 20  # a resolved server_args dump is ~10 KB; longer lines are cut here
MAX_ARGS_FILE_BYTES = 16 << 20


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
    redacted: frozenset[str] = frozenset()  # secret keys seen in the source and never kept

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
    redacted: set[str] = field(default_factory=set)

    @property
    def role(self) -> str | None:
        return self.role_flag or self.role_from_log


def parse_log(text: str, path: str, role_flag: str | None = None) -> WorkerLog:
    """Scan one worker's startup log held in memory (see ``read_log``)."""
    return _read(io.BytesIO(text.encode("utf-8", errors="replace")), path, role_flag)


def read_log(file: Path, name: str, role_flag: str | None = None) -> WorkerLog:
    """Scan a worker's startup log file; unknown lines are ignored, never guessed at."""
    with open(file, "rb") as handle:
        return _read(handle, name, role_flag)


def _read(handle: BinaryIO, path: str, role_flag: str | None) -> WorkerLog:
    """Block by block, so memory stays flat and a long-running server's log costs seconds:
    lines split on LF only (a CR or U+2028 in logged text starts no line), each line cut at
    MAX_LINE_BYTES, and only lines that can decide (CANDIDATE_RE) are decoded and read."""
    log = WorkerLog(path=path, role_flag=role_flag)
    carry, head = b"", None  # head: the start of an over-long line whose rest is skipped
    while data := handle.read(_BLOCK):
        if head is not None:
            newline = data.find(b"\n")
            if newline < 0:
                continue
            _scan_block(log, head)
            log.lines += 1
            head, data = None, data[newline + 1 :]
        block = carry + data
        cut = block.rfind(b"\n") + 1
        carry = block[cut:]
        _scan_block(log, block[:cut])
        log.lines += block.count(b"\n", 0, cut)
        if len(carry) > MAX_LINE_BYTES:
            head, carry = carry[:MAX_LINE_BYTES], b""
    tail = head if head is not None else carry
    if tail:
        _scan_block(log, tail)
        log.lines += 1
    if log.role_flag and log.role_from_log and log.role_flag != log.role_from_log:
        log.problems.append(f"--log says {log.role_flag} but the log's server args say {log.role_from_log}")
    return log


def _scan_block(log: WorkerLog, block: bytes) -> None:
    """Read each candidate line of ``block`` (whole lines, starting after line ``log.lines``)."""
    pos, number = 0, log.lines
    for start in _candidate_starts(block):
        number += block.count(b"\n", pos, start)
        pos = start
        end = block.find(b"\n", start)
        end = min(len(block) if end < 0 else end, start + MAX_LINE_BYTES)
        _scan_line(log, block[start:end].decode("utf-8", errors="replace").rstrip("\r"), number + 1, log.path)


def _candidate_starts(block: bytes) -> list[int]:
    """Where the lines holding a mark start, for those lines that match CANDIDATE_RE there."""
    starts = set()
    for mark in _MARKS:
        at = block.find(mark)
        while at >= 0:
            start = block.rfind(b"\n", 0, at) + 1
            if CANDIDATE_RE.match(block, start):
                starts.add(start)
            end = block.find(b"\n", at)
            at = -1 if end < 0 else block.find(mark, end)
    return sorted(starts)


def _scan_line(log: WorkerLog, line: str, number: int, path: str) -> None:
    """Only SGLang's own messages count: the logging prefix, then the message at its start."""
    prefix = PREFIX_RE.match(line)
    if prefix is None:
        return
    body = line[prefix.end() :]
    ranks = prefix["ranks"].strip()

    def evidence() -> Evidence:
        return Evidence(path, number, _excerpt(body, log.redacted))

    if match := SCHEDULER_RE.match(body):
        log.pools.append(PoolLine(int(match["pool"]), int(match["context"]), ranks, evidence()))
    elif body.startswith("max_total_num_tokens=") and "context_len=" not in body:
        log.problems.append(f"line {number}: scheduler line without context_len (truncated?)")
    if match := KV_RE.match(body):
        kind = "allocated" if match["kind"] == "is allocated" else "va-upper-bound"
        log.kv_lines.append(KvLine(match["label"], kind, int(match["tokens"]), evidence()))
    elif match := POST_CAPTURE_RE.match(body):
        log.kv_lines.append(KvLine(None, "post-capture", int(match["tokens"]), evidence()))
    if match := CANARY_RE.match(body):
        log.canary = evidence()
        _set_role(log, match["mode"])
    if body.startswith(ARGS_MARK):
        args = parse_args_text(body[len(ARGS_MARK) :], path, number)
        if args is not None:
            log.args = args
            log.redacted |= args.redacted
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


def _excerpt(text: str, redacted: set[str], limit: int = 240) -> str:
    """What may be kept of a line: secrets masked first (their keys added to ``redacted``), then clipped."""
    masked, keys = redact(text)
    redacted |= keys
    return _clip(masked, limit)


# Secrets are masked by kvprobe.redaction, one pass by key name and by value shape; the names
# stay here for serverlog's callers.
REDACTED = redaction.REDACTED
redact = redaction.redact
is_secret_key = redaction.is_secret_key


# --- server arguments ----------------------------------------------------------------------


def read_args_file(path: Path) -> ServerArgs:
    """A file holding one worker's arguments: JSON, a ``server_args=`` log line, or a command line.

    Raises ValueError when none of those formats is recognised, or for JSON that is not
    strict (nested too deep, duplicate keys, NaN) or a file too large to be arguments.
    """
    if path.stat().st_size > MAX_ARGS_FILE_BYTES:
        raise ValueError(f"{path.name}: larger than {MAX_ARGS_FILE_BYTES >> 20} MiB: not a server-arguments file")
    data = path.read_bytes()
    text = data.decode("utf-8", errors="replace")
    stripped = text.strip()
    if stripped.startswith("{"):
        doc = _strict_json(data, path.name)
        if isinstance(doc, dict):
            return _from_mapping(doc, Evidence(path.name, None, "JSON server arguments"))
    for number, line in enumerate(text.split("\n"), start=1):
        if ARGS_MARK in line:
            found = parse_args_text(line[line.index(ARGS_MARK) + len(ARGS_MARK) :], path.name, number)
            if found is not None:
                return found
    if "--" in stripped:
        return _from_command_line(stripped, Evidence(path.name, None, "command-line server arguments"))
    raise ValueError(f"{path.name}: not JSON, a server_args= line or a command line")


def _strict_json(data: bytes, name: str) -> Any:
    """The JSON document, or None when the text is not JSON at all (a dict repr, say)."""
    try:
        return strict_json.loads(data.strip(), name)
    except JsonMalformed:
        return None
    except JsonDefect as defect:
        raise ValueError(f"{name}: {defect.code}: {defect.detail}") from None


def parse_args_text(text: str, path: str, line: int) -> ServerArgs | None:
    """``{...}`` (resolved dict repr) or ``ServerArgs(...)`` (dataclass repr) after ``server_args=``."""
    text = text.strip()
    masked, keys = redact(text)
    evidence = Evidence(path, line, "server_args=" + _clip(masked, 120))
    if text.startswith("{"):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            value = None
        if isinstance(value, dict):  # the engine logs the whole resolved dict: a full dump
            return _from_mapping(value, evidence, full=True, redacted=keys)
        return _from_pairs(text, evidence, r"'(?P<key>\w+)':\s*", keys)
    if text.startswith("ServerArgs("):
        return _from_pairs(text, evidence, r"\b(?P<key>\w+)=", keys)
    return None


_VALUE = r"(?P<value>'[^']*'|\"[^\"]*\"|True|False|None|-?\d+(?:\.\d+)?)"


def _from_pairs(text: str, evidence: Evidence, key_pattern: str, redacted: frozenset[str]) -> ServerArgs:
    """Fallback for reprs that are not literals (an enum value, a truncated line): key by key."""
    values: dict[str, Any] = {}
    for match in re.finditer(key_pattern + _VALUE, text):
        if match["key"] in KEYS and match["key"] not in values:
            values[match["key"]] = ast.literal_eval(match["value"])
    complete = text.rstrip().endswith(("}", ")"))
    return ServerArgs(values, {}, complete and "disaggregation_mode" in values, evidence, redacted)


def _from_mapping(
    doc: dict[str, Any], evidence: Evidence, *, full: bool = False, redacted: frozenset[str] = frozenset()
) -> ServerArgs:
    """``full``: the mapping is a whole resolved dump (a log line, or a /server_info-sized JSON)."""
    flat = _flatten(doc)
    env_doc = doc.get("env")
    if not isinstance(env_doc, dict):
        env_doc = {}
    env = {k: str(v) for k, v in {**flat, **env_doc}.items() if k in ENV_KEYS}
    values = {k: flat[k] for k in KEYS if k in flat}
    secrets = redacted | {redaction.key_name(k) for k, v in {**flat, **env_doc}.items() if redaction.is_secret(k, v)}
    full_dump = "disaggregation_mode" in flat and (full or len(flat) > 50)
    return ServerArgs(values, env, full_dump, evidence, frozenset(secrets))


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
    secrets = {_key_of(t) for t in tokens if is_secret_key(_key_of(t))}
    return ServerArgs(values, env, False, evidence, frozenset(secrets))


def _key_of(token: str) -> str:
    """The key a command-line token names: ``--api-key=x`` / ``--api-key`` / ``HF_TOKEN=x``."""
    return token.lstrip("-").partition("=")[0].lower().replace("-", "_")


def redacted(values: dict[str, Any]) -> dict[str, Any]:
    """What a receipt may carry: the gate keys only, anything secret-looking masked."""
    return {k: (REDACTED if is_secret_key(k) else v) for k, v in sorted(values.items())}


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

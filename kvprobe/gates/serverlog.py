"""Read SGLang startup logs and server arguments: pure parsing, no decisions.

The line formats come from SGLang's own source; 0.5.13 .. 0.5.23 print the same ones, except
where noted:

- ``managers/scheduler.py`` (tp_rank 0 of each DP group)::

      max_total_num_tokens=N, chunked_prefill_size=N, max_prefill_tokens=N,
      max_running_requests=N, context_len=N, available_gpu_mem=X.XX GB

- ``mem_cache/memory_pool.py`` ``_finalize_allocation_log``: no label up to 0.5.16; from
  0.5.19 the pool's ``allocation_label`` ("Full", "SWA", 0.5.23's "MiniMax MSA-v1 main NVFP4"
  and "MiniMax MSA-v1 index"; none for most pools)::

      [<label> ]KV Cache is allocated. dtype: D, #tokens: N, K size: X GB, V size: Y GB
      [<label> ]KV Cache is allocated. dtype: D, #tokens: N, KV size: X GB
      [<label> ]KV Cache VA upper bound. dtype: ...        (post-capture sizing: an upper bound)

- sliding-window models (``model_executor/pool_configurator.py``, ``mem_cache/swa_memory_pool.py``):
  two allocation lines, unlabelled up to 0.5.16 (SWA pool first) and for MLA+SWA models in
  later releases; these lines say which is which::

      Use sliding window memory pool. full_layer_tokens=F, swa_layer_tokens=S
      Use sliding window memory pool (all SWA). swa_layer_tokens=S
      SWAKVPool mem usage: X GB, swa size: S, full size: F      ("VA upper bound" from 0.5.19)

- ``model_runner_components/kv_pool_runtime.py`` after post-capture resizing::

      Post-capture KV sizing: max_total_num_tokens=N, free memory=X GB          (0.5.16)
      Post-capture KV sizing: full_layer_tokens=F, swa_layer_tokens=S           (0.5.19+)
      Post-capture KV sizing: KV cache allocated. dtype: D, #tokens: N, KV size: X GB, avail mem=Y GB

- ``entrypoints/engine.py``: ``server_args={...}`` (a dict repr of ``resolved_dict()``); older
  releases printed ``server_args=ServerArgs(...)``. Each such line begins a startup.
- ``kv_canary/api.py``: ``install_canary: disaggregation_mode=M config=... ...`` when the canary runs.

Every line carries the logging prefix ``[YYYY-mm-dd HH:MM:SS[.mmm][ DPn][ TPn]...] ``
(``utils/common.py`` configure_logger), and each of these messages starts right after it. A
line counts only in that structure: a user's request logged while serving (``Receive:
obj=GenerateReqInput(text='KV Cache is allocated...')``) quotes the text mid-line and is
never read as the server's own line. Log collectors put their own text before the prefix
(docker compose, ``kubectl logs --timestamps``, journald, ANSI colour): those known wrappers
are stripped from a line's start, and the log records which.

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
from kvprobe.rules.gate4 import as_bool as as_bool  # SGLang's booleans: one rule, shared with verify

ROLES = ("prefill", "decode", "null")

SCHEDULER_RE = re.compile(
    r"max_total_num_tokens=(?P<pool>\d+), chunked_prefill_size=(?P<chunk>-?\d+|None), "
    r"max_prefill_tokens=(?P<max_prefill>\d+), max_running_requests=(?P<max_running>\d+), "
    r"context_len=(?P<context>\d+), available_(?:gpu|cpu)_mem=(?P<mem>[\d.]+) GB"
)
# ``{allocation_label} KV Cache ...``: the label is a word ("Full", "SWA") or several (0.5.23's
# "MiniMax MSA-v1 main NVFP4", "MiniMax MSA-v1 index"); none for most pools.
KV_RE = re.compile(
    r"(?:(?P<label>[A-Za-z0-9][\w.-]*(?: [A-Za-z0-9][\w.-]*){0,5}) )?KV Cache (?P<kind>is allocated|VA upper bound)\. "
    r"dtype: (?P<dtype>\S+), #tokens: (?P<tokens>\d+), (?:K size: [\d.]+ GB, V size: [\d.]+ GB|KV size: [\d.]+ GB)"
)
POST_CAPTURE_RE = re.compile(
    r"Post-capture KV sizing: KV cache allocated\. dtype: (?P<dtype>\S+), #tokens: (?P<tokens>\d+), "
    r"KV size: [\d.]+ GB"
    # 0.5.16's one post-capture line
    r"|Post-capture KV sizing: max_total_num_tokens=(?P<total>\d+), free memory=[\d.]+ GB"
)
# Sliding-window pools (model_executor/pool_configurator.py, mem_cache/swa_memory_pool.py,
# kv_pool_runtime.py): which allocation is the full pool and which the SWA pool.
SWA_SPLIT_RE = re.compile(
    r"Use sliding window memory pool\. full_layer_tokens=(?P<full>\d+), swa_layer_tokens=(?P<swa>\d+)"
)
SWA_ALL_RE = re.compile(r"Use sliding window memory pool \(all SWA\)\. swa_layer_tokens=(?P<swa>\d+)")
SWA_POOL_RE = re.compile(
    r"SWAKVPool (?:mem usage|VA upper bound): [\d.]+ GB, swa size: (?P<swa>\d+), full size: (?P<full>\d+)"
)
POST_CAPTURE_SPLIT_RE = re.compile(
    r"Post-capture KV sizing: full_layer_tokens=(?P<full>\d+), swa_layer_tokens=(?P<swa>\d+)"
)
CANARY_RE = re.compile(r"install_canary: disaggregation_mode=(?P<mode>\w+) config=(?P<config>.*)")
PREFIX_RE = re.compile(r"^\[(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)(?P<ranks>[^\]]*)\] ")
ARGS_MARK = "server_args="
# SGLang's logging prefix as bytes: at a line's start, and anywhere (behind a wrapper).
PREFIX_BYTES = rb"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?[^\]\n]*\] "
_PREFIX_AT_LINE = re.compile(rb"\n" + PREFIX_BYTES)  # blocks start at a line's start: match() for that
_PREFIX_ANYWHERE = re.compile(PREFIX_BYTES)
# A line is a candidate when the prefix's date and time stand before a mark (colour codes may
# sit inside the brackets); unwrap() and PREFIX_RE then hold it to the exact structure.
_STAMP_BYTES = re.compile(rb"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
# Lines are found by these marks (bytes.find, C speed); only a line holding one, and SGLang's
# prefix before it, is decoded and read, so the millions of lines a serving worker logs cost
# seconds, not minutes.
_MARKS = (
    b"max_total_num_tokens=",
    b"KV Cache ",
    b"Post-capture KV sizing: ",
    b"Use sliding window memory pool",
    b"SWAKVPool ",
    b"install_canary: ",
    b"server_args=",
)
_BLOCK = 8 << 20

# What operators' log collectors put before SGLang's own prefix. Stripped from a line's start
# only (never mid-line), and only until SGLang's prefix starts the line: a user's request text
# cannot become a server line this way, it sits after SGLang's prefix and a "Receive:".
ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
ANSI = "ANSI colour codes"
_STAMP_ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:?\d\d)"
WRAPPERS = (
    # journalctl (short, short-iso): "Sep 01 10:00:02 host python3[4121]: "
    (
        "journald",
        re.compile(
            rf"^(?:[A-Z][a-z]{{2}} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?|{_STAMP_ISO}) \S+ "
            r"(?P<source>[^\s\[\]:]+)(?:\[\d+\])?: "
        ),
    ),
    # kubectl logs --timestamps, docker logs -t: "2026-09-01T10:00:02.123456789Z "
    ("RFC 3339 timestamp (kubectl logs --timestamps)", re.compile(rf"^{_STAMP_ISO} ")),
    # docker compose logs: "sglang-prefill-1  | "
    ("docker compose", re.compile(r"^(?P<source>[A-Za-z0-9][\w.-]*) *\| ")),
    # kubectl logs --prefix: "[pod/sglang-prefill-0/sglang] "
    ("kubectl --prefix", re.compile(r"^\[(?P<source>pod/[^\]\s]+)\] ")),
)


def unwrap(line: str) -> tuple[str, tuple[str, ...], str | None]:
    """``line`` with known collector wrappers and colour codes removed from its start, the
    wrappers removed, and the container/unit the wrapper named (None when it named none)."""
    stripped: list[str] = []
    source = None
    if "\x1b" in line:
        line = ANSI_RE.sub("", line)
        stripped.append(ANSI)
    for _ in range(len(WRAPPERS)):
        if PREFIX_RE.match(line):
            break
        for name, pattern in WRAPPERS:
            if match := pattern.match(line):
                line = line[match.end() :]
                stripped.append(name)
                source = source or match.groupdict().get("source")
                break
        else:
            break
    return line, tuple(stripped), source


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
class SwaLine:
    """A line saying how a sliding-window model's KV is split: full-attention and SWA pools.

    ``source``: "configurator" (``Use sliding window memory pool``), "pool" (``SWAKVPool mem
    usage``) or "post-capture". An all-SWA model has ``full_tokens`` 0.
    """

    source: str
    full_tokens: int
    swa_tokens: int
    evidence: Evidence

    @property
    def all_swa(self) -> bool:
        return self.full_tokens == 0


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
class Startup:
    """One start of the server within a log: from a ``server_args=`` line to the next one
    (the first startup also holds what came before the first such line)."""

    number: int
    line: int | None  # the server_args= line that began it; None: the log's start
    pools: list[PoolLine] = field(default_factory=list)
    kv_lines: list[KvLine] = field(default_factory=list)
    swa: list[SwaLine] = field(default_factory=list)
    canary: Evidence | None = None
    args: ServerArgs | None = None
    role: str | None = None
    problems: list[str] = field(default_factory=list)

    def has_output(self) -> bool:
        """Did the server print anything past its arguments? (Engine() prints them twice.)"""
        return bool(self.pools or self.kv_lines or self.swa or self.canary)

    def where(self) -> str:
        return f"startup {self.number} (from line {self.line})" if self.line else f"startup {self.number}"

    def summary(self) -> str:
        """What this startup had, in words: its pools, canary, checksum and role."""
        parts = [f"role {self.role or 'unknown'}"]
        if self.pools:
            parts.append("pool " + "/".join(f"{p.pool_tokens:,}" for p in self.pools))
            parts.append("context " + "/".join(sorted({f"{p.context_len:,}" for p in self.pools})))
        else:
            parts.append("no scheduler line")
        parts.append("install_canary logged" if self.canary else "no install_canary")
        if self.args is not None and "disaggregation_enable_kv_checksum" in self.args.values:
            parts.append(f"disaggregation_enable_kv_checksum={self.args.values['disaggregation_enable_kv_checksum']}")
        if self.args is not None and "kv_canary" in self.args.values:
            parts.append(f"kv_canary={self.args.values['kv_canary']}")
        return ", ".join(parts)


@dataclass
class WorkerLog:
    """What one startup log says about its worker.

    A log can hold several startups (a restart appends to the same file): each
    ``server_args=`` line begins one. The gates decide on the last (the server that runs);
    ``pools``, ``kv_lines``, ``canary``, ``args`` and ``role_from_log`` are that startup's.
    """

    path: str
    role_flag: str | None = None
    startups: list[Startup] = field(default_factory=lambda: [Startup(1, None)])
    log_problems: list[str] = field(default_factory=list)  # about the file as a whole
    lines: int = 0
    redacted: set[str] = field(default_factory=set)
    wrappers: dict[str, int] = field(default_factory=dict)  # stripped wrapper -> lines
    sources: dict[str, int] = field(default_factory=dict)  # container/unit a wrapper named -> lines
    server_lines: int = 0  # lines read as SGLang's own (prefix, then a known message)
    prefixed: bool = False  # some line starts with SGLang's prefix (once known wrappers are stripped)
    prefix_behind: str | None = None  # else: what stood before the prefix on a line holding it

    @property
    def current(self) -> Startup:
        return self.startups[-1]

    @property
    def earlier(self) -> list[Startup]:
        return [s for s in self.startups[:-1] if s.has_output() or s.args is not None]

    @property
    def pools(self) -> list[PoolLine]:
        return self.current.pools

    @property
    def kv_lines(self) -> list[KvLine]:
        return self.current.kv_lines

    @property
    def swa(self) -> list[SwaLine]:
        return self.current.swa

    @property
    def canary(self) -> Evidence | None:
        return self.current.canary

    @property
    def args(self) -> ServerArgs | None:
        return self.current.args

    @property
    def role_from_log(self) -> str | None:
        return self.current.role

    @property
    def role(self) -> str | None:
        return self.role_flag or self.role_from_log

    @property
    def problems(self) -> list[str]:
        found = list(self.log_problems) + list(self.current.problems)
        if self.role_flag and self.role_from_log and self.role_flag != self.role_from_log:
            found.append(f"--log says {self.role_flag} but the log's server args say {self.role_from_log}")
        return found


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
    MAX_LINE_BYTES, and only lines holding a mark are decoded and read."""
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
    _describe(log)
    return log


def _describe(log: WorkerLog) -> None:
    """Problems of the file as a whole: no SGLang line, or lines of several containers."""
    if log.server_lines == 0 and not log.prefixed:
        if log.prefix_behind is not None:
            log.log_problems.append(
                "no line has SGLang's prefix at its start once known wrappers are stripped: it stands "
                f"behind {log.prefix_behind!r}, a wrapper kvprobe does not know (it strips "
                f"{', '.join(n for n, _p in WRAPPERS)} and {ANSI})"
            )
        else:
            log.log_problems.append(
                "no line has SGLang's prefix ('[YYYY-mm-dd HH:MM:SS ...] ', its logger's format): not an SGLang log "
                "(wrappers stripped when present: " + ", ".join(n for n, _p in WRAPPERS) + f", {ANSI})"
            )
    if len(log.sources) > 1:
        log.log_problems.append(
            f"lines of {len(log.sources)} containers or units in one log ({', '.join(sorted(log.sources))}): "
            "give each worker's log on its own (e.g. docker compose logs SERVICE)"
        )


def _scan_block(log: WorkerLog, block: bytes) -> None:
    """Read each candidate line of ``block`` (whole lines, starting after line ``log.lines``)."""
    if not log.prefixed:
        _look_for_prefix(log, block)
    pos, number = 0, log.lines
    for start in _candidate_starts(block):
        number += block.count(b"\n", pos, start)
        pos = start
        end = block.find(b"\n", start)
        end = min(len(block) if end < 0 else end, start + MAX_LINE_BYTES)
        _scan_line(log, block[start:end].decode("utf-8", errors="replace").rstrip("\r"), number + 1, log.path)


def _look_for_prefix(log: WorkerLog, block: bytes) -> None:
    """Does any line of ``block`` start with SGLang's prefix, known wrappers stripped? If not,
    keep what stands before the prefix on the first line that holds it (an unknown wrapper)."""
    if re.match(PREFIX_BYTES, block) or _PREFIX_AT_LINE.search(block):
        log.prefixed = True
        return
    for count, found in enumerate(_PREFIX_ANYWHERE.finditer(block)):
        if count >= 16:
            return
        start = block.rfind(b"\n", 0, found.start()) + 1
        end = block.find(b"\n", found.start())
        line = block[start : min(len(block) if end < 0 else end, found.end() + 1)].decode("utf-8", errors="replace")
        if PREFIX_RE.match(unwrap(line)[0]):
            log.prefixed = True
            return
        if log.prefix_behind is None:
            log.prefix_behind = _clip(block[start : found.start()].decode("utf-8", errors="replace"), 60)


def _candidate_starts(block: bytes) -> list[int]:
    """Where the lines holding a mark start, for those lines with a date and time before it."""
    starts = set()
    for mark in _MARKS:
        at = block.find(mark)
        while at >= 0:
            start = block.rfind(b"\n", 0, at) + 1
            if _STAMP_BYTES.search(block, start, at):
                starts.add(start)
            end = block.find(b"\n", at)
            at = -1 if end < 0 else block.find(mark, end)
    return sorted(starts)


def _scan_line(log: WorkerLog, line: str, number: int, path: str) -> None:
    """Only SGLang's own messages count: the logging prefix (once known wrappers are
    stripped from the line's start), then the message at its start."""
    line, stripped, source = unwrap(line)
    prefix = PREFIX_RE.match(line)
    if prefix is None:
        return
    body = line[prefix.end() :]
    ranks = prefix["ranks"].strip()
    startup = log.current

    def evidence() -> Evidence:
        return Evidence(path, number, _excerpt(body, log.redacted))

    read = True
    if match := SCHEDULER_RE.match(body):
        startup.pools.append(PoolLine(int(match["pool"]), int(match["context"]), ranks, evidence()))
    elif body.startswith("max_total_num_tokens=") and "context_len=" not in body:
        startup.problems.append(f"line {number}: scheduler line without context_len (truncated?)")
    elif match := KV_RE.match(body):
        kind = "allocated" if match["kind"] == "is allocated" else "va-upper-bound"
        startup.kv_lines.append(KvLine(match["label"], kind, int(match["tokens"]), evidence()))
    elif match := POST_CAPTURE_RE.match(body):
        tokens = int(match["tokens"] or match["total"])
        startup.kv_lines.append(KvLine(None, "post-capture", tokens, evidence()))
    elif match := SWA_SPLIT_RE.match(body):
        startup.swa.append(SwaLine("configurator", int(match["full"]), int(match["swa"]), evidence()))
    elif match := SWA_ALL_RE.match(body):
        startup.swa.append(SwaLine("configurator", 0, int(match["swa"]), evidence()))
    elif match := SWA_POOL_RE.match(body):
        startup.swa.append(SwaLine("pool", int(match["full"]), int(match["swa"]), evidence()))
    elif (match := POST_CAPTURE_SPLIT_RE.match(body)) and int(match["swa"]) > 0:
        startup.swa.append(SwaLine("post-capture", int(match["full"]), int(match["swa"]), evidence()))
    elif match := CANARY_RE.match(body):
        startup.canary = evidence()
        _set_role(startup, match["mode"])
    elif body.startswith(ARGS_MARK):
        args = parse_args_text(body[len(ARGS_MARK) :], path, number)
        read = args is not None
        if args is not None:
            if startup.has_output():  # a new server: what it prints from here on is its own
                startup = Startup(len(log.startups) + 1, number)
                log.startups.append(startup)
            elif startup.line is None:
                startup.line = number
            startup.args = args
            log.redacted |= args.redacted
            if args.role:
                _set_role(startup, args.role)
    else:
        read = False
    if read:
        log.server_lines += 1
        for name in stripped:
            log.wrappers[name] = log.wrappers.get(name, 0) + 1
        if source is not None:
            log.sources[source] = log.sources.get(source, 0) + 1


def _set_role(startup: Startup, role: str) -> None:
    if role not in ROLES:
        return
    if startup.role and startup.role != role:
        startup.problems.append(f"the log names two roles: {startup.role} and {role}")
        return
    startup.role = role


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

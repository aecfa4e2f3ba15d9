"""Gate 1 and 3 on logs as real deployments write them (issue #27): sliding-window pools,
multi-word allocation labels, restarts in one file, collectors' wrappers and colour.

Every SGLang line here is rendered from the format strings the release wheels' own code holds
(0.5.13, 0.5.16, 0.5.19, 0.5.21, 0.5.23; file and function named beside each), filled in with
``str.format``: no SGLang file is copied.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kvprobe.gates import pool, serverlog, settings
from kvprobe.rules.gate_status import Status

CONTEXT = 1_048_576
INCIDENT = 681_280
FULL = 1_200_000  # a hybrid model's full-attention pool: covers the context
SWA = 960_000  # its sliding-window pool: does not, and need not
RELEASES = ("0.5.13", "0.5.16", "0.5.19", "0.5.21", "0.5.23")

# utils/common.py configure_logger: f"[%(asctime)s{maybe_ms}{prefix}] %(message)s" (all releases)
PREFIX = "[{asctime}{maybe_ms}{prefix}] {message}"
# managers/scheduler.py, tp_rank 0 of each DP group (all releases)
SCHEDULER = (
    "max_total_num_tokens={max_total_num_tokens}, chunked_prefill_size={chunked_prefill_size}, "
    "max_prefill_tokens={max_prefill_tokens}, max_running_requests={max_running_requests}, "
    "context_len={context_len}, available_gpu_mem={mem:.2f} GB"
)
# mem_cache/memory_pool.py _finalize_allocation_log: 0.5.13/0.5.16 print "KV Cache is allocated";
# from 0.5.19 cache_name = f"{self.allocation_label} KV Cache" or "KV Cache", then
# {'VA upper bound' if self.post_capture_active else 'is allocated'}
KV_ALLOCATED = "{cache_name} is allocated. dtype: {dtype}, #tokens: {num_tokens}, KV size: {kv_size_GB:.2f} GB"
KV_ALLOCATED_KV = (
    "{cache_name} is allocated. dtype: {dtype}, #tokens: {num_tokens}, K size: {k_size_GB:.2f} GB, "
    "V size: {v_size_GB:.2f} GB"
)
# model_executor/pool_configurator.py _solve_pool_sizes (all releases)
SWA_HYBRID = "Use sliding window memory pool. full_layer_tokens={full_tokens}, swa_layer_tokens={swa_tokens}"
SWA_ALL = "Use sliding window memory pool (all SWA). swa_layer_tokens={swa_tokens}"
# mem_cache/swa_memory_pool.py SWAKVPool.__init__
# (0.5.19+: f"SWAKVPool {'VA upper bound' if ... else 'mem usage'}: ...")
SWA_POOL = "SWAKVPool mem usage: {mem_usage:.2f} GB, swa size: {size_swa}, full size: {size}"
# kv_canary/api.py (0.5.21+)
CANARY = "install_canary: disaggregation_mode={mode} config=CanaryConfig(mode=<CanaryMode.LOG: 'log'>)"
# entrypoints/engine.py: logger.info(f"{server_args=}") up to 0.5.16 (a dataclass repr),
# f"server_args={server_args.resolved_dict()}" from 0.5.19 (a dict repr)
RANK_PREFIXES = ("", " TP0", " DP0 TP0", " PP0 TP0", " DP0 ATTN_CP0 MOE_DP0 TP0 EP0")


@dataclass(frozen=True)
class Release:
    labels: bool  # allocation_label in _finalize_allocation_log (0.5.19+)
    swa_first: bool  # SWAKVPool allocates its SWA pool before the full one (0.5.13, 0.5.16)
    dict_args: bool  # server_args= prints resolved_dict() (0.5.19+)


SHAPES = {
    "0.5.13": Release(labels=False, swa_first=True, dict_args=False),
    "0.5.16": Release(labels=False, swa_first=True, dict_args=False),
    "0.5.19": Release(labels=True, swa_first=False, dict_args=True),
    "0.5.21": Release(labels=True, swa_first=False, dict_args=True),
    "0.5.23": Release(labels=True, swa_first=False, dict_args=True),
}


def args_fields(mode: str, *, checksum: bool = False, canary: str = "none") -> dict:
    return {
        "model_path": "google/gemma-3-27b-it",
        "device": "cuda",
        "tp_size": 8,
        "dp_size": 1,
        "kv_canary": canary,
        "disaggregation_transfer_backend": "mooncake",
        "disaggregation_mode": mode,
        "disaggregation_enable_kv_checksum": checksum,
    }


class Log:
    """A log as lines, each rendered with the logging prefix."""

    def __init__(self, ranks: str = " TP0", ms: bool = False) -> None:
        self.lines: list[str] = []
        self.ranks, self.ms = ranks, ms

    def add(self, message: str, ranks: str | None = None) -> Log:
        second = len(self.lines) % 60
        self.lines.append(
            PREFIX.format(
                asctime=f"2026-09-01 10:00:{second:02d}",
                maybe_ms=".123" if self.ms else "",
                prefix=self.ranks if ranks is None else ranks,
                message=message,
            )
        )
        return self

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def kv(release: str, tokens: int, label: str | None = None) -> str:
    cache_name = f"{label} KV Cache" if label and SHAPES[release].labels else "KV Cache"
    return KV_ALLOCATED.format(cache_name=cache_name, dtype="torch.bfloat16", num_tokens=tokens, kv_size_GB=12.5)


def server_args(release: str, mode: str, **kw) -> str:
    fields = args_fields(mode, **kw)
    if SHAPES[release].dict_args:
        return "server_args=" + repr(fields)
    return "server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"


def startup(
    log: Log,
    release: str,
    mode: str,
    *,
    model: str = "dense",
    full: int = FULL,
    swa: int = SWA,
    context: int = CONTEXT,
    canary: bool = False,
    checksum: bool = False,
    shape_lines: tuple[str, ...] = ("configurator", "pool"),
) -> Log:
    """One server start, in the order SGLang logs it. ``model``: "dense", "hybrid" (labelled
    Full/SWA from 0.5.19), "mla-swa" (unlabelled in every release: its configurator passes its
    own pool arguments) or "all-swa"."""
    log.add(server_args(release, mode, checksum=checksum, canary="log" if canary else "none"), ranks="")
    total = full
    if model == "dense":
        log.add(kv(release, full))
    else:
        all_swa = model == "all-swa"
        full_tokens = 0 if all_swa else full
        total = swa if all_swa else full
        if "configurator" in shape_lines:
            log.add(SWA_ALL.format(swa_tokens=swa) if all_swa else SWA_HYBRID.format(full_tokens=full, swa_tokens=swa))
        labelled = model == "hybrid"
        pools = [(full_tokens, "Full" if labelled else None), (swa, "SWA" if labelled else None)]
        for tokens, label in reversed(pools) if SHAPES[release].swa_first else pools:
            log.add(kv(release, tokens, label))
        if "pool" in shape_lines:
            log.add(SWA_POOL.format(mem_usage=25.0, size_swa=swa, size=full_tokens))
    if canary:
        log.add(CANARY.format(mode=mode))
    log.add(
        SCHEDULER.format(
            max_total_num_tokens=total,
            chunked_prefill_size=8192,
            max_prefill_tokens=16384,
            max_running_requests=128,
            context_len=context,
            mem=3.02,
        )
    )
    return log


def check_of(text: str, role: str | None = None):
    log = serverlog.parse_log(text, "worker.log", role)
    return log, pool.pool_check(log)


# --- sliding-window models ----------------------------------------------------------------------


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("model", ["hybrid", "mla-swa"])
@pytest.mark.parametrize("ranks", RANK_PREFIXES)
def test_a_hybrid_swa_pool_is_not_taken_for_the_context_pool(release, model, ranks):
    """The SWA pool (960,000) is not the context's pool: the full pool (1,200,000) covers
    1,048,576. Today the smallest unlabelled line, the SWA pool, fails the worker."""
    log, check = check_of(startup(Log(ranks, ms=ranks.startswith(" DP")), release, "prefill", model=model).text())
    assert check.status is Status.PASS, check.detail
    assert "pool 1,200,000 tokens, context 1,048,576 tokens" in check.detail
    assert "#tokens 960,000" in check.detail and "SWA pool" in check.detail  # said why it was left out
    assert pool.main_kv(log).tokens == FULL


@pytest.mark.parametrize("shape_lines", [("configurator",), ("pool",)])
def test_either_sliding_window_line_tells_the_pools_apart(shape_lines):
    _log, check = check_of(startup(Log(), "0.5.13", "decode", model="hybrid", shape_lines=shape_lines).text())
    assert check.status is Status.PASS, check.detail


@pytest.mark.parametrize("release", RELEASES)
def test_a_hybrid_whose_full_pool_is_short_fails_on_the_full_pool(release):
    _log, check = check_of(startup(Log(), release, "prefill", model="mla-swa", full=INCIDENT, swa=600_000).text())
    assert check.status is Status.FAIL
    assert "pool 681,280 tokens" in check.detail and "367,296 tokens short" in check.detail


def test_two_unlabelled_allocations_without_a_sliding_window_line_fail_with_the_reason():
    """No line says the smaller one is a SWA pool: it counts, and the receipt says why."""
    text = startup(Log(), "0.5.13", "prefill", model="mla-swa", shape_lines=()).text()
    _log, check = check_of(text)
    assert check.status is Status.FAIL
    assert "smaller than the scheduler's max_total_num_tokens=1,200,000" in check.detail
    assert "no sliding-window line says what it is" in check.detail
    assert "Use sliding window memory pool" in check.detail


@pytest.mark.parametrize("release", RELEASES)
def test_an_all_swa_model_is_not_failed_for_its_empty_full_pool(release):
    """An all-SWA model's full pool has #tokens 0; the scheduler's number is its pool."""
    log, check = check_of(startup(Log(), release, "decode", model="all-swa", swa=2_000_000).text())
    assert check.status is Status.PASS, check.detail
    assert "pool 2,000,000 tokens" in check.detail and "#tokens 0" in check.detail and "all-SWA" in check.detail
    classes = {a.line.tokens: a.pool for a in pool.classify(log.current)}
    assert classes == {0: pool.EMPTY_FULL, 2_000_000: pool.SWA}


def test_minimax_multi_word_labels_are_read_and_index_pools_left_out():
    """0.5.23's MiniMax pools: "MiniMax MSA-v1 main NVFP4" (the KV) and "MiniMax MSA-v1
    index" (mem_cache/minimax_m3_nvfp4_pool.py allocation_label); the index pool is kept out
    by its label."""
    log = Log()
    log.add(server_args("0.5.23", "decode"), ranks="")
    log.add(kv("0.5.23", FULL, "MiniMax MSA-v1 main NVFP4"))
    log.add(kv("0.5.23", 65_536, "MiniMax MSA-v1 index"))
    log.add(
        SCHEDULER.format(
            max_total_num_tokens=FULL,
            chunked_prefill_size=8192,
            max_prefill_tokens=16384,
            max_running_requests=128,
            context_len=CONTEXT,
            mem=3.0,
        )
    )
    parsed, check = check_of(log.text())
    assert [(k.label, k.tokens) for k in parsed.kv_lines] == [
        ("MiniMax MSA-v1 main NVFP4", FULL),
        ("MiniMax MSA-v1 index", 65_536),
    ]
    assert check.status is Status.PASS, check.detail
    assert "index pool" in check.detail
    short = serverlog.parse_log(log.text().replace(f"#tokens: {FULL}", f"#tokens: {INCIDENT}"), "w.log")
    failed = pool.pool_check(short)
    assert failed.status is Status.FAIL and "MiniMax MSA-v1 main NVFP4" in failed.detail


def test_a_kv_allocation_lowers_the_scheduler_pool_only_with_the_reason_stated():
    text = startup(Log(), "0.5.21", "prefill", full=CONTEXT).text()
    text = text.replace(f"#tokens: {CONTEXT}", f"#tokens: {INCIDENT}")
    _log, check = check_of(text)
    assert check.status is Status.FAIL
    assert "smaller than the scheduler's max_total_num_tokens=1,048,576, and the smaller counts" in check.detail


# --- restarts in one log --------------------------------------------------------------------------


def _two_startups(first: dict, second: dict, mode: str) -> str:
    log = Log()
    startup(log, "0.5.21", mode, **first)
    log.add("Scheduler hit an exception: Traceback (most recent call last):")
    startup(log, "0.5.21", mode, **second)
    return log.text()


SAFE = {"full": 2_040_000, "canary": True, "checksum": True}
UNSAFE = {"full": INCIDENT, "canary": False, "checksum": False}


def _gate3(texts: dict[str, str]):
    logs = [serverlog.parse_log(text, f"{role}.log") for role, text in texts.items()]
    sources = settings.collect_sources(logs, [])
    return logs, settings.gate3(sources, None, None, [])


def test_a_restart_without_the_defences_is_decided_on_the_server_that_runs():
    """Startup 1: canary and checksum on, pool 2,040,000; a crash; startup 2: neither, pool
    681,280. Today gate 3 passes on startup 1's canary and gate 1 mixes the two."""
    texts = {role: _two_startups(SAFE, UNSAFE, role) for role in ("prefill", "decode")}
    logs, gate3 = _gate3(texts)
    log = logs[0]
    assert [s.number for s in log.startups] == [1, 2] and log.canary is None
    assert log.args.values["disaggregation_enable_kv_checksum"] is False
    check = pool.pool_check(log)
    assert check.status is Status.FAIL and "pool 681,280 tokens" in check.detail
    assert "decided on startup 2" in check.detail and "1 earlier startup(s) seen" in check.detail
    assert "install_canary logged" in check.detail and "disaggregation_enable_kv_checksum=True" in check.detail
    assert gate3.status is Status.FAIL
    canary = next(c for c in gate3.checks if c.name == "prefill: KV canary")
    assert canary.status is Status.FAIL and "an earlier startup" in canary.detail
    checksum = next(c for c in gate3.checks if c.name == "decode: KV checksum")
    assert checksum.status is Status.FAIL and "decided on startup 2 (from line" in checksum.detail
    assert "disaggregation_enable_kv_checksum=True" in checksum.detail  # what startup 1 had


def test_a_restart_that_turned_the_defences_on_counts_them():
    texts = {role: _two_startups(UNSAFE, SAFE, role) for role in ("prefill", "decode")}
    logs, gate3 = _gate3(texts)
    assert pool.pool_check(logs[0]).status is Status.PASS
    assert "earlier startup(s) seen" in pool.pool_check(logs[0]).detail
    defence = next(c for c in gate3.checks if c.name == "read-integrity defence")
    assert defence.status is Status.PASS  # the gate waits on the #39500 marker: no code given here


def test_server_args_printed_twice_before_any_output_is_one_startup():
    """Engine() logs server_args in __init__ and again in _launch_subprocesses."""
    log = Log()
    log.add(server_args("0.5.21", "decode"), ranks="")
    startup(log, "0.5.21", "decode")
    parsed = serverlog.parse_log(log.text(), "d.log")
    assert len(parsed.startups) == 1 and not parsed.earlier
    assert parsed.current.line == 1


# --- logs as operators collect them -------------------------------------------------------------

WRAPS = {
    "docker compose": lambda line: f"sglang-prefill-1  | {line}",
    "RFC 3339 timestamp (kubectl logs --timestamps)": lambda line: f"2026-09-01T10:00:02.123456789Z {line}",
    "journald": lambda line: f"Sep 01 10:00:02 gpu-node-7 python3[4121]: {line}",
    "ANSI colour codes": lambda line: f"\x1b[32m{line}\x1b[0m",
}


@pytest.mark.parametrize("wrapper", sorted(WRAPS))
def test_wrapped_lines_are_read_and_the_incident_pool_fails(wrapper):
    text = startup(Log(), "0.5.21", "prefill", full=INCIDENT).text()
    wrapped = "".join(WRAPS[wrapper](line) + "\n" for line in text.splitlines())
    log, check = check_of(wrapped)
    assert log.role == "prefill"
    assert check.status is Status.FAIL and "pool 681,280 tokens" in check.detail
    assert f"stripped from the lines: {wrapper}" in check.detail
    assert log.wrappers == {wrapper: 3}


@pytest.mark.parametrize(
    ("wrap", "stripped"),
    [
        (lambda line: line.replace("] ", "]\x1b[0m ", 1).replace("[", "\x1b[1;32m[", 1), "ANSI colour codes"),
        (lambda line: f"Sep  1 10:00:02.123456 gpu-node-7 sglang[4121]: {line}", "journald"),  # short-precise
        (lambda line: f"2026-09-01T10:00:02+0000 gpu-node-7 python3[4121]: {line}", "journald"),  # short-iso
        (lambda line: f"[pod/sglang-decode-0/sglang] {line}", "kubectl --prefix"),
    ],
)
def test_other_wrapper_shapes(wrap, stripped):
    text = startup(Log(), "0.5.21", "decode", full=INCIDENT).text()
    log, check = check_of("".join(wrap(line) + "\n" for line in text.splitlines()))
    assert check.status is Status.FAIL and stripped in log.wrappers, check.detail


def test_wrappers_stack_compose_over_timestamps_in_colour():
    text = startup(Log(), "0.5.21", "decode", full=INCIDENT).text()
    wrapped = "".join(
        f"\x1b[36msglang-decode-1  |\x1b[0m 2026-09-01T10:00:02.1Z {line}\n" for line in text.splitlines()
    )
    log, check = check_of(wrapped)
    assert check.status is Status.FAIL
    kubectl = "RFC 3339 timestamp (kubectl logs --timestamps)"
    assert set(log.wrappers) == {"ANSI colour codes", "docker compose", kubectl}


def test_a_log_without_sglangs_prefix_says_so_in_those_words():
    text = startup(Log(), "0.5.21", "decode", full=INCIDENT).text()
    bare = "".join(line.split("] ", 1)[1] + "\n" for line in text.splitlines())
    _log, check = check_of(bare)
    assert check.status is Status.UNKNOWN
    assert "no line has SGLang's prefix" in check.detail


def test_an_unknown_wrapper_is_named_not_guessed_through():
    text = startup(Log(), "0.5.21", "decode", full=INCIDENT).text()
    wrapped = "".join(f"<14>1 collector: {line}\n" for line in text.splitlines())
    _log, check = check_of(wrapped)
    assert check.status is Status.UNKNOWN
    assert "a wrapper kvprobe does not know" in check.detail and "<14>1 collector:" in check.detail


def test_a_compose_log_of_several_workers_is_not_one_worker():
    prefill = startup(Log(), "0.5.21", "prefill").text().splitlines()
    decode = startup(Log(), "0.5.21", "decode").text().splitlines()
    mixed = "".join(f"sglang-prefill-1  | {p}\nsglang-decode-1   | {d}\n" for p, d in zip(prefill, decode, strict=True))
    _log, check = check_of(mixed)
    assert check.status is Status.UNKNOWN
    assert "2 containers or units" in check.detail and "sglang-decode-1" in check.detail


def test_request_text_behind_a_wrapper_is_still_not_a_server_line():
    forged = "Receive: obj=GenerateReqInput(text='KV Cache is allocated. dtype: x, #tokens: 4000000, KV size: 1 GB')"
    log = startup(Log(), "0.5.21", "decode", full=INCIDENT)
    log.add(forged, ranks="")
    log.lines.append(f"sglang-decode-1  | 2026-09-01T10:00:02Z {forged}")  # no SGLang prefix at all
    parsed, check = check_of("".join(f"sglang-decode-1  | {line}\n" for line in log.lines))
    assert [k.tokens for k in parsed.kv_lines] == [INCIDENT]
    assert check.status is Status.FAIL


def test_the_0_5_16_post_capture_line_is_a_pool_size():
    """model_runner_components/kv_pool_runtime.py (0.5.16): the resized pool after capture."""
    post = "Post-capture KV sizing: max_total_num_tokens={}, free memory={:.2f} GB"
    log = startup(Log(), "0.5.16", "decode", full=CONTEXT)
    log.add(post.format(INCIDENT, 1.5))
    parsed, check = check_of(log.text())
    assert [(k.kind, k.tokens) for k in parsed.kv_lines] == [("allocated", CONTEXT), ("post-capture", INCIDENT)]
    assert check.status is Status.FAIL and "the post-capture pool size" in check.detail

"""Gates 1, 3 and 4 from startup logs, server arguments and small fake SGLang trees.

The logs are written here, line by line, in the formats SGLang's own code prints
(scheduler.py, memory_pool.py _finalize_allocation_log, kv_pool_runtime.py post-capture
sizing, engine.py server_args=, kv_canary/api.py install_canary), with the logging prefix
of utils/common.py configure_logger. The formats are the same in 0.5.19 .. 0.5.22; what
differs per release is the server_args field set (0.5.21 added disaggregation_enable_kv_checksum).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from kvprobe.errors import SchemaError
from kvprobe.evidence.gates_readme import render_readme
from kvprobe.files import json_bytes
from kvprobe.gates import pool, serverlog, settings
from kvprobe.gates.fixmarkers import (
    MARKERS_FILE,
    CodeTree,
    Presence,
    code_settings,
    find,
    find_all,
    load_markers,
    markers,
)
from kvprobe.model.gates_receipt import GatesReceipt
from kvprobe.rules import gate_scope
from kvprobe.rules.gate_status import Status

GLM_CONTEXT = 1_048_576
INCIDENT_POOL = 681_280
RAISED_POOL = 2_040_000

# Field sets of resolved_dict() as far as the gates care, per release (engine.py logs all of them).
_BASE_FIELDS = {
    "model_path": "zai-org/GLM-5.3",
    "tokenizer_path": "zai-org/GLM-5.3",
    "host": "0.0.0.0",
    "port": 30000,
    "device": "cuda",
    "tp_size": 8,
    "dp_size": 1,
    "context_length": None,
    "page_size": 64,
    "mem_fraction_static": 0.88,
    "chunked_prefill_size": 16384,
    "kv_canary": "none",
    "kv_canary_real_data": "none",
    "kv_canary_sweep_interval": 0,
    "api_key": "sk-live-SECRET",
    "disaggregation_transfer_backend": "mooncake",
    "disaggregation_bootstrap_port": 8998,
    "disaggregation_ib_device": None,
    "num_reserved_decode_tokens": 512,
}
_NEW_IN = {
    "0.5.21": {"disaggregation_enable_kv_checksum": False},
    "0.5.22": {"disaggregation_enable_kv_checksum": False, "disaggregation_decode_allocation_policy": "early"},
}


def server_args_dict(version: str, mode: str, **overrides) -> dict:
    fields = dict(_BASE_FIELDS)
    fields.update(_NEW_IN.get(version, {}))
    fields["disaggregation_mode"] = mode
    fields.update(overrides)
    return fields


def startup_log(
    version: str,
    mode: str,
    pool: int,
    context: int,
    *,
    kv: str = "kv",
    tp: int = 8,
    dp: int = 1,
    canary: bool = False,
    args: dict | None = None,
    stop_after: str | None = None,
    ms: bool = False,
) -> str:
    """A worker's startup log in SGLang's formats; ``stop_after`` truncates after a line kind."""
    stamp = "2026-08-27 10:00:0{}" + (".123" if ms else "")
    lines: list[tuple[str, str]] = []

    def add(kind: str, text: str, ranks: str = "") -> None:
        lines.append((kind, f"[{stamp.format(len(lines) % 10)}{ranks}] {text}"))

    add("args", "server_args=" + repr(args if args is not None else server_args_dict(version, mode)))
    for dp_rank in range(dp):
        ranks = (f" DP{dp_rank}" if dp > 1 else "") + (" TP0" if tp > 1 else "")
        add(
            "weights",
            "Load weight end. elapsed=512.31 s, type=Glm5ForCausalLM, avail mem=31.20 GB, mem usage=44.10 GB.",
            ranks,
        )
        if kv == "kv":
            add("kv", f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {pool}, KV size: 27.31 GB", ranks)
        elif kv == "kv_split":
            add(
                "kv",
                f"KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: {pool}, K size: 13.66 GB, "
                "V size: 13.66 GB",
                ranks,
            )
        elif kv == "swa":
            add("kv", f"Full KV Cache is allocated. dtype: torch.bfloat16, #tokens: {pool}, KV size: 20.00 GB", ranks)
            add("kv", "SWA KV Cache is allocated. dtype: torch.bfloat16, #tokens: 65536, KV size: 2.00 GB", ranks)
        elif kv == "post_capture":
            add("kv", f"KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: {pool * 2}, KV size: 54.62 GB", ranks)
            add("kv", f"Post-capture KV sizing: full_layer_tokens={pool}, swa_layer_tokens=0", ranks)
            add(
                "kv",
                f"Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: {pool}, "
                "KV size: 27.31 GB, avail mem=3.02 GB",
                ranks,
            )
        add("pool_end", "Memory pool end. avail mem=3.02 GB", ranks)
        if canary:
            add(
                "canary",
                f"install_canary: disaggregation_mode={mode} config=CanaryConfig(mode=<CanaryMode.LOG: "
                "'log'>) perturb_config=None launch_capacities=... n_buffer_groups=1 buffer_group_kinds=['MHA'] "
                "swa_window_size=0 speculative_num_steps=1",
                ranks,
            )
        add(
            "scheduler",
            f"max_total_num_tokens={pool}, chunked_prefill_size=16384, max_prefill_tokens=16384, "
            f"max_running_requests=128, context_len={context}, available_gpu_mem=3.02 GB",
            ranks,
        )
    add("ready", "The server is fired up and ready to roll!")
    out = []
    for kind, text in lines:
        out.append(text)
        if kind == stop_after:
            break
    return "\n".join(out) + "\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def parse(text: str, role: str | None = None) -> serverlog.WorkerLog:
    return serverlog.parse_log(text, "worker.log", role)


# --- log parsing --------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.5.19", "0.5.20", "0.5.21", "0.5.22"])
@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_each_release_and_role_is_read_from_the_log(version, mode):
    log = parse(startup_log(version, mode, RAISED_POOL, GLM_CONTEXT))
    assert log.role == mode and log.role_flag is None
    assert [(p.pool_tokens, p.context_len, p.ranks) for p in log.pools] == [(RAISED_POOL, GLM_CONTEXT, "TP0")]
    assert [(k.label, k.kind, k.tokens) for k in log.kv_lines] == [(None, "allocated", RAISED_POOL)]
    assert log.args.values["disaggregation_mode"] == mode
    assert ("disaggregation_enable_kv_checksum" in log.args.values) == (version >= "0.5.21")
    check = pool.pool_check(log)
    assert check.status is Status.PASS
    assert "pool 2,040,000 tokens, context 1,048,576 tokens" in check.detail
    assert check.evidence.startswith("worker.log:")


@pytest.mark.parametrize("kv", ["kv", "kv_split", "swa", "post_capture"])
def test_every_kv_allocation_format_is_recognised(kv):
    log = parse(startup_log("0.5.22", "decode", RAISED_POOL, GLM_CONTEXT, kv=kv, ms=True))
    assert pool.main_kv(log).tokens == RAISED_POOL  # SWA window and VA upper bound are not the pool
    assert pool.pool_check(log).status is Status.PASS


def test_the_incident_pool_fails_gate_1_with_both_numbers():
    log = parse(startup_log("0.5.20", "prefill", INCIDENT_POOL, GLM_CONTEXT))
    check = pool.pool_check(log)
    assert check.status is Status.FAIL
    assert "pool 681,280 tokens, context 1,048,576 tokens" in check.detail
    assert "367,296 tokens short" in check.detail
    assert "max_total_num_tokens=681280" in check.evidence


def test_a_kv_allocation_smaller_than_the_scheduler_number_decides():
    text = startup_log("0.5.21", "decode", RAISED_POOL, GLM_CONTEXT).replace(
        f"#tokens: {RAISED_POOL}", f"#tokens: {INCIDENT_POOL}"
    )
    check = pool.pool_check(parse(text))
    assert check.status is Status.FAIL and "KV Cache is allocated" in check.evidence


def test_one_short_dp_group_fails_the_worker():
    text = startup_log("0.5.22", "prefill", RAISED_POOL, GLM_CONTEXT, dp=2)
    text = text.replace(f"max_total_num_tokens={RAISED_POOL}", f"max_total_num_tokens={INCIDENT_POOL}", 1)
    log = parse(text)
    assert [p.ranks for p in log.pools] == ["DP0 TP0", "DP1 TP0"]
    assert pool.pool_check(log).status is Status.FAIL


@pytest.mark.parametrize("stop_after", ["args", "weights", "kv", "pool_end"])
def test_a_truncated_log_is_unknown_never_pass(stop_after):
    log = parse(startup_log("0.5.22", "prefill", RAISED_POOL, GLM_CONTEXT, stop_after=stop_after))
    check = pool.pool_check(log)
    assert check.status is Status.UNKNOWN
    assert "partial log" in check.detail


def test_a_scheduler_line_cut_mid_way_is_unknown():
    text = startup_log("0.5.22", "prefill", RAISED_POOL, GLM_CONTEXT)
    cut = text[: text.index("context_len=")]
    log = parse(cut)
    assert not log.pools and any("truncated" in p for p in log.problems)
    assert pool.pool_check(log).status is Status.UNKNOWN


def test_a_non_pd_server_is_reported_not_counted():
    log = parse(startup_log("0.5.22", "null", INCIDENT_POOL, GLM_CONTEXT, tp=1))
    check = pool.pool_check(log)
    assert check.status is Status.INFO and not check.decides
    assert "not a PD worker" in check.detail
    gate = pool.gate1([log])
    assert gate.status is Status.UNKNOWN  # no prefill or decode log: nothing decided
    assert {c.name for c in gate.checks if c.status is Status.UNKNOWN} == {"prefill: (no log)", "decode: (no log)"}


def test_role_flag_fills_in_and_a_conflict_is_unknown():
    text = startup_log("0.5.22", "prefill", RAISED_POOL, GLM_CONTEXT)
    no_args = "\n".join(ln for ln in text.splitlines() if "server_args=" not in ln)
    unnamed = parse(no_args)
    assert unnamed.role is None and pool.pool_check(unnamed).status is Status.UNKNOWN
    assert pool.pool_check(parse(no_args, "prefill")).status is Status.PASS
    conflict = parse(text, "decode")
    assert pool.pool_check(conflict).status is Status.UNKNOWN
    assert "--log says decode" in pool.pool_check(conflict).detail


def test_an_unrelated_file_is_unknown():
    log = parse("hello\nthis is not sglang\n")
    assert pool.pool_check(log).status is Status.UNKNOWN


def test_gate_1_needs_both_sides_and_fails_on_the_mismatch():
    prefill = parse(startup_log("0.5.22", "prefill", INCIDENT_POOL, GLM_CONTEXT))
    decode = parse(startup_log("0.5.22", "decode", RAISED_POOL, GLM_CONTEXT))
    assert pool.gate1([prefill, decode]).status is Status.FAIL
    fixed = parse(startup_log("0.5.22", "prefill", RAISED_POOL, GLM_CONTEXT))
    assert pool.gate1([fixed, decode]).status is Status.PASS
    assert pool.gate1([fixed]).status is Status.UNKNOWN


# --- server arguments ---------------------------------------------------------------------------


def test_server_args_formats(tmp_path):
    as_json = write(
        tmp_path,
        "p.json",
        json.dumps(
            {**server_args_dict("0.5.22", "prefill"), "env": {"SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE": "1"}}
        ),
    )
    parsed = serverlog.read_args_file(as_json)
    assert parsed.role == "prefill" and parsed.env == {"SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE": "1"}

    line = write(tmp_path, "d.log", "[2026-08-27 10:00:00] server_args=" + repr(server_args_dict("0.5.20", "decode")))
    parsed = serverlog.read_args_file(line)
    assert parsed.role == "decode" and parsed.full_dump
    assert "disaggregation_enable_kv_checksum" not in parsed.values
    assert "SECRET" not in parsed.evidence.text and "api_key" not in parsed.values

    older = write(
        tmp_path,
        "old.txt",
        "server_args=ServerArgs(model_path='m', disaggregation_mode='prefill', "
        "kv_canary='log', attention_backend=<AttentionBackend.FA3: 'fa3'>, device='cuda')",
    )
    parsed = serverlog.read_args_file(older)
    assert parsed.values == {"model_path": "m", "disaggregation_mode": "prefill", "kv_canary": "log", "device": "cuda"}

    cmd = write(
        tmp_path,
        "cmd.sh",
        "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=0 python -m sglang.launch_server "
        "--model-path m --disaggregation-mode decode --disaggregation-enable-kv-checksum "
        "--disaggregation-transfer-backend=nixl\n",
    )
    parsed = serverlog.read_args_file(cmd)
    assert parsed.values["disaggregation_enable_kv_checksum"] is True
    assert parsed.values["disaggregation_transfer_backend"] == "nixl"
    assert parsed.role == "decode" and parsed.env["SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"] == "0"

    with pytest.raises(ValueError):
        serverlog.read_args_file(write(tmp_path, "junk.txt", "nothing here"))


def test_a_non_literal_args_dump_falls_back_to_the_keys_that_matter():
    text = "{'model_path': 'm', 'attention_backend': <AttentionBackend.FA3: 'fa3'>, 'disaggregation_mode': 'decode'}"
    parsed = serverlog.parse_args_text(text, "x.log", 3)
    assert parsed.role == "decode" and parsed.values["model_path"] == "m"


def test_redaction_keeps_only_gate_keys_and_masks_secrets_in_quoted_lines():
    assert "api_key" not in serverlog.KEYS  # only the gate keys are ever extracted
    assert serverlog.redacted({"hf_token": "t", "device": "cuda"}) == {"device": "cuda", "hf_token": "<redacted>"}
    line = serverlog.parse_args_text(
        "{'api_key': 'sk-1', 'hf_token': 'hf_x', 'tokenizer_path': 'tok', 'disaggregation_mode': 'prefill'}", "x.log", 1
    )
    assert "sk-1" not in line.evidence.text and "hf_x" not in line.evidence.text
    assert "'tokenizer_path': 'tok'" in line.evidence.text


# --- fix markers on small fake trees ------------------------------------------------------------

D = "sglang/srt/disaggregation"


def fake_tree(root: Path, *, fixed: bool, deferred_backends=("mooncake", "nixl"), checksum_flag=None) -> Path:
    """The few files the markers read, pre- or post-fix (not SGLang code: just the patterns)."""
    checksum_flag = fixed if checksum_flag is None else checksum_flag
    files = {
        f"{D}/decode.py": "class DecodePreallocQueue:\n    pass\n\ndef _defer_release(self):\n    pass\n"
        + (
            "def _verify_kv_checksums(self, batch):\n    pass\nx.kv_receiver.ensure_abort_notified(force_arm=True)\n"
            if fixed
            else ""
        ),
        f"{D}/common/conn.py": "def _maybe_ack_drained_abort(self, room):\n    pass\n"
        + (
            "self.kv_mgr._maybe_ack_drained_abort(self.bootstrap_room)\n"
            "def _send_abort_acks(self, room, targets):\n    pass\n"
            if fixed
            else "self.kv_mgr._deferred_ack_targets.pop(self.bootstrap_room, None)\n"
        ),
        "sglang/srt/environ.py": "    SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE = EnvBool("
        f"{'True' if fixed else 'False'})\n",
        "sglang/srt/arg_groups/fields/disagg.py": "class Disagg:\n    disaggregation_mode: str = 'null'\n"
        + ("    disaggregation_enable_kv_checksum: A[bool, 'x'] = False\n" if checksum_flag else ""),
        "sglang/srt/server_args.py": "    kv_canary: A[str, Arg(choices=['none', 'log', 'raise'])] = 'none'\n",
    }
    if fixed:
        files[f"{D}/checksum.py"] = "class KvChecksumComputer:\n    pass\n"
        files[f"{D}/base/conn.py"] = "class BaseKVManager:\n    supports_deferred_decode_kv_release: bool = False\n"
        for backend in deferred_backends:
            files[f"{D}/{backend}/conn.py"] = "class M:\n    supports_deferred_decode_kv_release = True\n"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_markers_absent_before_present_after(tmp_path):
    before = CodeTree(fake_tree(tmp_path / "before", fixed=False))
    after = CodeTree(fake_tree(tmp_path / "after", fixed=True))
    assert {f.marker.pr: f.presence for f in find_all(before)} == {m.pr: Presence.ABSENT for m in markers()}
    assert {f.marker.pr: f.presence for f in find_all(after)} == {m.pr: Presence.PRESENT for m in markers()}
    assert {m.pr for m in markers()} == {39500, 40645, 41402, 41404, 41023}


def test_a_bad_markers_file_is_an_error_naming_the_file_and_the_field(tmp_path):
    shipped = MARKERS_FILE.read_text(encoding="utf-8")
    no_anchor = tmp_path / "no-anchor.toml"
    no_anchor.write_text(shipped.replace('anchor = { file = "sglang/srt/environ.py"', 'anchr = { file = "x"', 1))
    with pytest.raises(SchemaError, match=r"no-anchor\.toml: marker\.4: 'anchor' is a required property"):
        load_markers(no_anchor)
    not_toml = tmp_path / "not-toml.toml"
    not_toml.write_text(shipped.replace("pr = 39500", "pr = ", 1))
    with pytest.raises(SchemaError, match=r"not-toml\.toml: not a readable fix-markers TOML file"):
        load_markers(not_toml)


def test_a_marker_survives_reformatting_and_an_unrecognisable_tree_is_unknown(tmp_path):
    root = fake_tree(tmp_path / "t", fixed=True)
    conn = root / D / "decode.py"
    conn.write_text(
        conn.read_text().replace(
            "ensure_abort_notified(force_arm=True)", "ensure_abort_notified(\n        force_arm=True\n    )"
        )
    )
    marker = next(m for m in markers() if m.pr == 41404)
    assert find(CodeTree(root), marker).presence is Presence.PRESENT
    empty = tmp_path / "empty" / "sglang" / "srt"
    empty.mkdir(parents=True)
    findings = find_all(CodeTree(empty.parent.parent))
    assert all(f.presence is Presence.UNKNOWN for f in findings)
    assert "anchor" in findings[0].evidence


def test_code_settings_read_from_the_tree(tmp_path):
    before = code_settings(CodeTree(fake_tree(tmp_path / "b", fixed=False)))
    assert not before.has_checksum_flag and before.deferred_default is False
    assert not before.deferred_capability_flag
    after = code_settings(CodeTree(fake_tree(tmp_path / "a", fixed=True, deferred_backends=("mooncake", "mori"))))
    assert after.has_checksum_flag and after.deferred_default is True
    assert after.deferred_backends == ("mooncake", "mori") and after.has_canary_flag


# --- gates 3 and 4 ------------------------------------------------------------------------------


def sources_for(
    prefill_args: dict | None, decode_args: dict | None, *, canary=(False, False), version="0.5.22"
) -> settings.Sources:
    logs = []
    for mode, args, can in (("prefill", prefill_args, canary[0]), ("decode", decode_args, canary[1])):
        if args is not None:
            logs.append(parse(startup_log(version, mode, RAISED_POOL, GLM_CONTEXT, args=args, canary=can)))
    return settings.collect_sources(logs, [])


def test_gate_3_checksum_on_both_sides_passes_on_fixed_code(tmp_path):
    tree = CodeTree(fake_tree(tmp_path / "t", fixed=True))
    on = {"disaggregation_enable_kv_checksum": True}
    src = sources_for(server_args_dict("0.5.22", "prefill", **on), server_args_dict("0.5.22", "decode", **on))
    gate = settings.gate3(src, tree, code_settings(tree), [])
    assert gate.status is Status.PASS, [c for c in gate.checks]


def test_gate_3_fails_when_no_defence_is_active(tmp_path):
    tree = CodeTree(fake_tree(tmp_path / "t", fixed=True))
    src = sources_for(server_args_dict("0.5.22", "prefill"), server_args_dict("0.5.22", "decode"))
    gate = settings.gate3(src, tree, code_settings(tree), [])
    assert gate.status is Status.FAIL
    defence = next(c for c in gate.checks if c.name == "read-integrity defence")
    assert defence.status is Status.FAIL and "neither" in defence.detail


def test_gate_3_checksum_flag_missing_from_the_release_is_said_so(tmp_path):
    old = server_args_dict("0.5.20", "prefill")
    src = sources_for(old, server_args_dict("0.5.20", "decode"))
    tree = CodeTree(fake_tree(tmp_path / "t", fixed=False))
    gate = settings.gate3(src, tree, code_settings(tree), [])
    checksum = next(c for c in gate.checks if c.name == "prefill: KV checksum")
    assert "not present in this release" in checksum.detail
    assert next(c for c in gate.checks if c.name == "#39500 in code").status is Status.FAIL
    # without the code, the resolved dump alone shows the field does not exist
    gate = settings.gate3(src, None, None, [])
    assert "not present in this release" in next(c for c in gate.checks if c.name == "prefill: KV checksum").detail


def test_gate_3_unsupported_device_does_not_count(tmp_path):
    tree = CodeTree(fake_tree(tmp_path / "t", fixed=True))
    on = {"disaggregation_enable_kv_checksum": True, "device": "npu"}
    src = sources_for(server_args_dict("0.5.22", "prefill", **on), server_args_dict("0.5.22", "decode", **on))
    gate = settings.gate3(src, tree, code_settings(tree), [])
    row = next(c for c in gate.checks if c.name == "decode: KV checksum")
    assert row.status is Status.FAIL and "does not count" in row.detail
    assert gate.status is Status.FAIL


def test_gate_3_canary_counts_only_when_the_log_shows_it(tmp_path):
    tree = CodeTree(fake_tree(tmp_path / "t", fixed=True))
    args = {m: server_args_dict("0.5.22", m, kv_canary="log") for m in ("prefill", "decode")}
    shown = settings.gate3(
        sources_for(args["prefill"], args["decode"], canary=(True, True)), tree, code_settings(tree), []
    )
    assert shown.status is Status.PASS
    not_shown = settings.gate3(
        sources_for(args["prefill"], args["decode"], canary=(True, False)), tree, code_settings(tree), []
    )
    row = next(c for c in not_shown.checks if c.name == "decode: KV canary")
    assert row.status is Status.FAIL and "configured (kv_canary=log)" in row.detail


def test_gate_4_deferred_release(tmp_path):
    tree = CodeTree(fake_tree(tmp_path / "t", fixed=True))
    code = code_settings(tree)
    src = sources_for(server_args_dict("0.5.22", "prefill"), server_args_dict("0.5.22", "decode"))
    gate = settings.gate4(src, tree, code, [])[0]
    assert gate.status is Status.UNKNOWN  # env not observed
    assert "release default: on" in next(c for c in gate.checks if c.name == "decode: deferred KV release").detail

    def with_env(value, backend="mooncake"):
        found = {}
        for mode in ("prefill", "decode"):
            path = write(
                tmp_path,
                f"{mode}-{value}-{backend}.json",
                json.dumps(
                    {
                        **server_args_dict("0.5.22", mode, disaggregation_transfer_backend=backend),
                        "env": {"SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE": value},
                    }
                ),
            )
            found[mode] = serverlog.read_args_file(path)
        return settings.collect_sources([], [(None, found[m].role, found[m]) for m in found])

    assert settings.gate4(with_env("1"), tree, code, [])[0].status is Status.PASS
    assert settings.gate4(with_env("0"), tree, code, [])[0].status is Status.FAIL
    unsupported = settings.gate4(with_env("1", backend="ascend"), tree, code, [])[0]
    assert unsupported.status is Status.FAIL
    assert "does not count" in next(c for c in unsupported.checks if c.name == "decode: deferred KV release").detail
    old = CodeTree(fake_tree(tmp_path / "old", fixed=False))
    old_gate = settings.gate4(with_env("1"), old, code_settings(old), [])[0]
    markers = [c for c in old_gate.checks if c.name.endswith(" in code")]
    assert markers and {c.status for c in markers} == {Status.FAIL}  # absent, recorded...
    assert not any(c.decides for c in markers)  # ...but the probes decide, never a marker (issue #23)


def test_gates_3_and_4_without_code_are_unknown():
    src = sources_for(None, None)
    assert settings.gate3(src, None, None, []).status is Status.UNKNOWN
    gate4 = settings.gate4(src, None, None, [])[0]
    assert gate4.status is Status.UNKNOWN
    assert all("no code to read" in c.detail for c in gate4.checks if c.name.startswith("#"))


# --- the command, without gate 2 (no --sglang: gate 2 is unknown) -------------------------------


def test_cli_writes_a_receipt_and_exits_1_on_the_incident_pool(tmp_path):
    p = write(tmp_path, "prefill.log", startup_log("0.5.22", "prefill", INCIDENT_POOL, GLM_CONTEXT))
    d = write(tmp_path, "decode.log", startup_log("0.5.22", "decode", RAISED_POOL, GLM_CONTEXT))
    out = tmp_path / "bundle"
    result = CliRunner().invoke(
        main, ["gates", "--log", str(p), "--log", f"decode={d}", "--out", str(out), "--json"], catch_exceptions=False
    )
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert [g["status"] for g in doc["gates"]] == ["fail", "unknown", "fail", "unknown"]
    receipt = json.loads((out / "receipt.json").read_text())
    assert receipt["schema"] == "kvprobe.gates-receipt/4" and receipt["layer"] == "deployment"
    assert json_bytes(GatesReceipt.from_json(receipt).to_json()) == (out / "receipt.json").read_bytes()
    assert receipt["workers"][0]["pools"][0]["pool_tokens"] == INCIDENT_POOL
    assert receipt["inputs"]["logs"][1]["role_flag"] == "decode"
    assert (out / "manifest.json").is_file() and (out / "SHA256SUMS").is_file()
    bundle_text = "".join(p.read_text() for p in out.rglob("*") if p.is_file())
    assert "sk-live-SECRET" not in bundle_text  # operator secrets never reach the bundle


def test_gates_bundle_verifies_and_a_forged_gate_fails(tmp_path):
    from kvprobe.evidence import manifest

    p = write(tmp_path, "prefill.log", startup_log("0.5.22", "prefill", INCIDENT_POOL, GLM_CONTEXT))
    d = write(tmp_path, "decode.log", startup_log("0.5.22", "decode", RAISED_POOL, GLM_CONTEXT))
    out = tmp_path / "bundle"
    CliRunner().invoke(
        main, ["gates", "--log", str(p), "--log", f"decode={d}", "--out", str(out)], catch_exceptions=False
    )
    verified = CliRunner().invoke(main, ["verify", str(out), "--json"], catch_exceptions=False)
    assert verified.exit_code == 0, verified.stdout
    receipt = json.loads((out / "receipt.json").read_text())
    receipt["gates"][0]["status"] = "pass"  # forge gate 1 and re-hash: the checks still say fail
    (out / "receipt.json").write_text(json.dumps(receipt, indent=2, sort_keys=True) + "\n")
    manifest.write(out)
    forged = CliRunner().invoke(main, ["verify", str(out), "--json"], catch_exceptions=False)
    assert forged.exit_code == 1
    assert "forged-verdict" in forged.stdout and "gate 1" in forged.stdout


def _gates_bundle(tmp_path: Path) -> Path:
    tmp_path.mkdir(exist_ok=True)
    p = write(tmp_path, "prefill.log", startup_log("0.5.22", "prefill", INCIDENT_POOL, GLM_CONTEXT))
    out = tmp_path / "bundle"
    CliRunner().invoke(main, ["gates", "--log", str(p), "--out", str(out)], catch_exceptions=False)
    return out


def _rewrite_receipt(bundle: Path, change) -> str:
    """Change the receipt, re-hash the bundle, and return `kvprobe verify`'s outcome."""
    from kvprobe.evidence import manifest

    receipt = json.loads((bundle / "receipt.json").read_text())
    readme = bundle / "README.md"
    derived = readme.is_file() and readme.read_text() == render_readme(GatesReceipt.from_json(receipt))
    change(receipt)
    (bundle / "receipt.json").write_text(json.dumps(receipt, indent=2, sort_keys=True) + "\n")
    if derived:  # kvprobe renders README.md from the receipt it wrote
        with contextlib.suppress(KeyError, TypeError, ValueError, AttributeError):
            readme.write_text(render_readme(GatesReceipt.from_json(receipt)))
    manifest.write(bundle)
    result = CliRunner().invoke(main, ["verify", str(bundle), "--json"], catch_exceptions=False)
    return json.loads(result.stdout)["outcome"]


def _as_schema_3(receipt: dict) -> None:
    """A receipt as kvprobe wrote /3: gate 2 the only behavioural gate (its basis ``gate2``, probes
    without ``gate``), gates 3 and 4 decided by their fix markers."""
    receipt["schema"] = "kvprobe.gates-receipt/3"
    receipt["evidence"] = gate_scope.scope(receipt["schema"], receipt["host"])  # /3's words
    basis = next(b for b in receipt.pop("behaviour") if b["gate"] == 2)
    receipt["gate2"] = {"algorithm": basis["algorithm"], "experiments": basis["experiments"]}
    receipt["probes"] = [{k: v for k, v in p.items() if k != "gate"} for p in receipt["probes"] if p["gate"] == 2]
    for gate in receipt["gates"]:
        if gate["number"] in (3, 4):
            gate["checks"] = [c for c in gate["checks"] if c["name"] != "probes"]
            for check in gate["checks"]:
                check["decides"] = check["decides"] or check["name"].endswith(" in code")


def _as_schema_2(receipt: dict) -> None:
    """A receipt as kvprobe wrote /2: no --env inputs, no gate4 basis."""
    _as_schema_3(receipt)
    receipt["schema"] = "kvprobe.gates-receipt/2"
    receipt["evidence"] = gate_scope.scope(receipt["schema"], receipt["host"])
    del receipt["gate4"]
    del receipt["inputs"]["env"]


def _as_schema_1(receipt: dict) -> None:
    """A receipt as kvprobe wrote /1 after inputs went by name: no gate2 basis."""
    _as_schema_2(receipt)
    receipt["schema"] = "kvprobe.gates-receipt/1"
    receipt["evidence"] = gate_scope.scope(receipt["schema"], receipt["host"])
    del receipt["gate2"]


def _as_first_shape(receipt: dict) -> None:
    """A receipt as kvprobe first wrote /1: inputs by (absolute) path, no redacted_keys."""
    _as_schema_1(receipt)
    for entry in receipt["inputs"]["logs"]:
        entry["path"] = "/var/log/sglang/" + entry.pop("name")
        del entry["redacted_keys"]


@pytest.mark.parametrize(
    ("shape", "version"),
    [(_as_first_shape, 1), (_as_schema_1, 1), (_as_schema_2, 2), (_as_schema_3, 3)],
)
def test_the_gates_receipt_model_reads_each_earlier_version_as_written(tmp_path, shape, version):
    receipt = json.loads((_gates_bundle(tmp_path) / "receipt.json").read_text())
    shape(receipt)
    typed = GatesReceipt.from_json(receipt)
    assert typed.to_json() == receipt  # nothing added, nothing lost
    assert typed.behaviour is None and all(p.gate is None for p in typed.probes)
    assert (typed.gate2 is not None) == (version in (2, 3)) and (typed.gate4 is not None) == (version == 3)
    assert (typed.inputs.env is not None) == (version == 3)
    if shape is _as_first_shape:
        assert [(i.name, i.redacted_keys) for i in typed.inputs.logs] == [(None, None)]
        assert typed.inputs.logs[0].path == "/var/log/sglang/prefill.log"


def test_gates_receipts_of_schema_1_verify_by_their_own_schema(tmp_path):
    first = _gates_bundle(tmp_path / "first")
    assert _rewrite_receipt(first, _as_first_shape) == "self-consistent"
    # /1 receipts written after inputs went by name, before the id was bumped
    later = _gates_bundle(tmp_path / "later")
    assert _rewrite_receipt(later, _as_schema_1) == "self-consistent"


def test_gates_receipts_of_schema_2_verify_by_their_own_schema(tmp_path):
    assert _rewrite_receipt(_gates_bundle(tmp_path), _as_schema_2) == "self-consistent"


def test_gates_receipts_of_schema_3_verify_by_their_own_schema(tmp_path):
    bundle = _gates_bundle(tmp_path)
    assert _rewrite_receipt(bundle, _as_schema_3) == "self-consistent"
    result = CliRunner().invoke(main, ["verify", str(bundle), "--json"], catch_exceptions=False)
    notes = json.loads(result.stdout)["steps"][3]["notes"]  # said, so no reader takes /3's gates 3-4 for probes
    assert any("gates 3 and 4 were decided by code markers" in n for n in notes), notes


def test_a_gates_receipt_of_schema_3_cannot_carry_gate_3_and_4_probes(tmp_path):
    def probes_under_3(receipt: dict) -> None:
        behaviour = receipt["behaviour"]
        _as_schema_3(receipt)
        receipt["behaviour"] = behaviour  # /4's part under /3's id

    assert _rewrite_receipt(_gates_bundle(tmp_path), probes_under_3) == "failed"


def test_a_gates_receipt_of_schema_4_must_carry_its_gate4_basis(tmp_path):
    def without_basis(receipt: dict) -> None:
        del receipt["gate4"]

    assert _rewrite_receipt(_gates_bundle(tmp_path), without_basis) == "failed"


@pytest.mark.parametrize("gate", [2, 3, 4])
def test_a_gates_receipt_of_schema_4_must_carry_each_behavioural_gates_basis(tmp_path, gate):
    def without_basis(receipt: dict) -> None:
        receipt["behaviour"] = [b for b in receipt["behaviour"] if b["gate"] != gate]

    assert _rewrite_receipt(_gates_bundle(tmp_path / str(gate)), without_basis) == "failed"


def test_a_marker_stated_as_deciding_under_schema_4_is_refused(tmp_path):
    def marker_decides(receipt: dict) -> None:
        gate = next(g for g in receipt["gates"] if g["number"] == 4)
        next(c for c in gate["checks"] if c["name"].endswith(" in code"))["decides"] = True

    assert _rewrite_receipt(_gates_bundle(tmp_path), marker_decides) == "failed"


def test_a_gates_receipt_whose_env_is_no_env_record_is_refused_in_step_2(tmp_path):
    """The schema leaves a gates receipt's ``env`` open; verify reads the receipt through its
    model, so one it cannot read is a defect (exit 1), not a crash."""
    bundle = _gates_bundle(tmp_path)
    assert _rewrite_receipt(bundle, lambda r: r.update(env={"python": "3.11.7"})) == "failed"
    result = CliRunner().invoke(main, ["verify", str(bundle), "--json"], catch_exceptions=False)
    report = json.loads(result.stdout)
    (defect,) = report["steps"][1]["defects"]
    assert result.exit_code == 1 and (defect["code"], defect["path"]) == ("schema-violation", "receipt.json")
    assert "does not read as a kvprobe.gates-receipt document: KeyError" in defect["detail"]
    assert [s["status"] for s in report["steps"][2:4]] == ["pass", "skipped"]


def test_a_gates_receipt_of_schema_2_must_have_the_second_shape(tmp_path):
    def path_shape_as_2(receipt: dict) -> None:
        gate2 = next(b for b in receipt["behaviour"] if b["gate"] == 2)
        basis = {"algorithm": gate2["algorithm"], "experiments": gate2["experiments"]}
        _as_first_shape(receipt)  # /1's inputs under /2's id
        receipt.update(schema="kvprobe.gates-receipt/2", gate2=basis)  # only the inputs' shape is /1's

    assert _rewrite_receipt(_gates_bundle(tmp_path), path_shape_as_2) == "failed"


def test_cli_exits_3_when_nothing_failed_but_something_is_unknown(tmp_path):
    args = server_args_dict("0.5.22", "prefill", disaggregation_enable_kv_checksum=True)
    p = write(
        tmp_path, "prefill.log", startup_log("0.5.22", "prefill", RAISED_POOL, GLM_CONTEXT, stop_after="kv", args=args)
    )
    result = CliRunner().invoke(main, ["gates", "--log", str(p), "--out", str(tmp_path / "b")], catch_exceptions=False)
    assert result.exit_code == 3, result.stderr
    receipt = json.loads((tmp_path / "b" / "receipt.json").read_text())
    assert [g["status"] for g in receipt["gates"]] == ["unknown"] * 4 and receipt["overall"] == "unknown"


def test_cli_usage_errors_exit_2(tmp_path):
    runner = CliRunner()
    assert runner.invoke(main, ["gates"], catch_exceptions=False).exit_code == 2
    assert runner.invoke(main, ["gates", "--log", str(tmp_path / "missing.log")], catch_exceptions=False).exit_code == 2
    log = write(tmp_path, "x.log", startup_log("0.5.22", "prefill", RAISED_POOL, GLM_CONTEXT))
    result = runner.invoke(
        main, ["gates", "--log", str(log), "--sglang", "latest", "--out", str(tmp_path / "o")], catch_exceptions=False
    )
    assert result.exit_code == 2 and "not a directory holding sglang/" in result.stderr
    assert not (tmp_path / "o").exists()


def test_every_gates_receipt_version_loads_to_the_model_and_writes_back_the_same_document(tmp_path):
    """model.load reads what verify accepts: /4 and the /3, /2 and both /1 shapes written before it."""
    import copy

    from kvprobe import schema
    from kvprobe.model.load import load
    from kvprobe.model.records import GateStatus

    written = json.loads((_gates_bundle(tmp_path) / "receipt.json").read_text())
    for shape in (None, _as_schema_3, _as_schema_2, _as_schema_1, _as_first_shape):
        doc = copy.deepcopy(written)
        if shape is not None:
            shape(doc)
        assert schema.errors(doc, doc["schema"]) == [], doc["schema"]
        typed = load(doc)
        assert isinstance(typed, GatesReceipt) and typed.to_json() == doc
        assert isinstance(typed.overall, GateStatus) and all(isinstance(g.status, GateStatus) for g in typed.gates)
        assert (typed.behaviour is None) == (doc["schema"] != "kvprobe.gates-receipt/4")
        assert (typed.gate2 is None) == (doc["schema"] not in ("kvprobe.gates-receipt/2", "kvprobe.gates-receipt/3"))

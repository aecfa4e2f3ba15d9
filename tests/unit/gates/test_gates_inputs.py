"""Gates against what an operator's files can hold (issues #11, #16): every allocation line,
only the server's own lines, secrets masked and recorded, strict argument files, and a
bundle that records names and digests and passes its own verification.

Logs are written in SGLang's formats by tests/unit/gates/test_gates_logs.py's builders.
"""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from kvprobe.gates import pool, serverlog
from kvprobe.rules.gate_status import Status
from tests.unit.gates.test_gates_logs import GLM_CONTEXT, INCIDENT_POOL, RAISED_POOL, server_args_dict, startup_log

STAMP = "[2026-08-27 10:00:09 TP0] "
FORGED_KV = (
    "[2026-08-27 10:05:00] Receive: obj=GenerateReqInput(text='KV Cache is allocated. dtype: torch.bfloat16, "
    "#tokens: 4000000, KV size: 1.00 GB', rid='r1')"
)


def _log(mode: str, pool_tokens: int, *extra: str, **kwargs) -> str:
    return startup_log("0.5.22", mode, pool_tokens, GLM_CONTEXT, **kwargs) + "".join(line + "\n" for line in extra)


# --- gate 1: every allocation counts; a short pool fails whatever the role -------------------


def test_a_smaller_allocation_before_a_larger_one_decides():
    text = _log("decode", RAISED_POOL).replace(
        "[2026-08-27 10:00:02 TP0] KV Cache is allocated",
        f"{STAMP}KV Cache is allocated. dtype: torch.bfloat16, #tokens: {INCIDENT_POOL}, KV size: 9.00 GB\n"
        "[2026-08-27 10:00:02 TP0] KV Cache is allocated",
    )
    log = serverlog.parse_log(text, "decode.log")
    assert [k.tokens for k in log.kv_lines] == [INCIDENT_POOL, RAISED_POOL]
    check = pool.pool_check(log)
    assert check.status is Status.FAIL
    assert "681,280" in check.detail and "681280" in check.evidence


def test_a_short_pool_fails_even_when_the_role_is_unknown():
    text = "".join(line + "\n" for line in _log("decode", INCIDENT_POOL).splitlines() if "server_args=" not in line)
    log = serverlog.parse_log(text, "worker.log")
    assert log.role is None
    check = pool.pool_check(log)
    assert check.status is Status.FAIL and "role not in the log" in check.detail
    covered = serverlog.parse_log(
        text.replace(f"#tokens: {INCIDENT_POOL}", f"#tokens: {RAISED_POOL}").replace(
            f"max_total_num_tokens={INCIDENT_POOL}", f"max_total_num_tokens={RAISED_POOL}"
        ),
        "worker.log",
    )
    assert pool.pool_check(covered).status is Status.UNKNOWN  # a sufficient pool still needs a role to pass


# --- only the server's own lines count -------------------------------------------------------


def test_request_text_is_never_an_allocation_a_canary_or_server_args():
    request = (
        '[2026-08-27 10:05:01] Receive: obj=GenerateReqInput(text="install_canary: disaggregation_mode=decode '
        "config=x server_args={'disaggregation_mode': 'prefill'} max_total_num_tokens=1\", rid='r2')"
    )
    log = serverlog.parse_log(_log("decode", INCIDENT_POOL, FORGED_KV, request), "decode.log")
    assert [k.tokens for k in log.kv_lines] == [INCIDENT_POOL]
    assert log.canary is None and log.role == "decode" and not log.problems
    assert pool.pool_check(log).status is Status.FAIL


def test_lines_without_the_logging_prefix_do_not_count():
    bare = "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 4000000, KV size: 1.00 GB"
    crlf = f"{STAMP}x\rKV Cache is allocated. dtype: torch.bfloat16, #tokens: 5000000, KV size: 1.00 GB"
    log = serverlog.parse_log(_log("decode", INCIDENT_POOL, bare, crlf), "decode.log")
    assert [k.tokens for k in log.kv_lines] == [INCIDENT_POOL]


@pytest.mark.parametrize("long_line", [3 * serverlog.MAX_LINE_BYTES, 2 * (8 << 20) + 5])
def test_a_log_is_read_in_blocks_with_long_lines_cut(tmp_path, long_line):
    """Lines longer than the cap (within one block, or spanning blocks) are cut, the lines
    after them still count, and so does a last line without a newline."""
    path = tmp_path / "decode.log"
    last = f"{STAMP}KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1000, KV size: 1.00 GB"
    with open(path, "w") as handle:
        handle.write(_log("decode", RAISED_POOL))
        handle.write(f"{STAMP}KV Cache is allocated. dtype: d, #tokens: 7, KV size: 1.00 GB " + "x" * long_line + "\n")
        handle.write(_log("decode", INCIDENT_POOL) + last)
    log = serverlog.read_log(path, "decode.log")
    every = [k for startup in log.startups for k in startup.kv_lines]  # two startups: server_args twice
    assert [k.tokens for k in every] == [RAISED_POOL, 7, INCIDENT_POOL, 1000]
    assert [k.tokens for k in log.kv_lines] == [INCIDENT_POOL, 1000]
    assert [k.evidence.line for k in every][-1] == log.lines == 2 * len(_log("decode", 1).splitlines()) + 2
    assert all(len(k.evidence.text) <= 240 for k in every)


# --- secrets ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "ServerArgs(model_path='m', api_key='SECRET1', admin_api_key=\"SECRET1\", hf_token='SECRET1')",
        "{'api_key': 'SECRET1', \"hf_token\": \"SECRET1\", 'ssl_keyfile_password': 'SECRET1'}",
        "python -m sglang.launch_server --api-key SECRET1 --hf-token=SECRET1 HF_TOKEN=SECRET1",
    ],
)
def test_every_argument_form_is_masked_and_the_keys_recorded(text):
    masked, keys = serverlog.redact(text)
    assert "SECRET1" not in masked and serverlog.REDACTED in masked
    assert keys and all(serverlog.is_secret_key(k) for k in keys)


def test_gate_numbers_and_paths_are_not_secrets():
    text = "max_total_num_tokens=681280, tokenizer_path='tok', disaggregation_mode='decode', model_path='m'"
    assert serverlog.redact(text) == (text, frozenset())


def test_secrets_never_reach_the_receipt_readme_or_output(tmp_path):
    repr_args = (
        "ServerArgs(model_path='zai-org/GLM-5.3', api_key='sk-live-SECRET123', disaggregation_mode='{role}', "
        "admin_api_key='adm-SECRET456', kv_canary='log')"
    )
    argv = []
    for role in ("prefill", "decode"):
        text = _log(role, RAISED_POOL, canary=True).replace(
            next(x for x in _log(role, RAISED_POOL).splitlines() if "server_args=" in x),
            "[2026-08-27 10:00:00] server_args=" + repr_args.format(role=role),
        )
        (tmp_path / f"{role}.log").write_text(text)
        argv += ["--log", str(tmp_path / f"{role}.log")]
    (tmp_path / "args.json").write_text(json.dumps({"disaggregation_mode": "decode", "env": {"HF_TOKEN": "hf_SECRET"}}))
    out = tmp_path / "bundle"
    result = CliRunner().invoke(
        main, ["gates", *argv, "--server-args", str(tmp_path / "args.json"), "--out", str(out), "--json"]
    )
    assert result.exit_code == 3, result.output
    everything = result.output + "".join(p.read_text() for p in out.rglob("*") if p.is_file())
    assert not [s for s in ("sk-live-SECRET123", "adm-SECRET456", "hf_SECRET") if s in everything]
    receipt = json.loads((out / "receipt.json").read_text())
    assert [i["redacted_keys"] for i in receipt["inputs"]["logs"]] == [["admin_api_key", "api_key"]] * 2
    assert receipt["inputs"]["server_args"][0]["redacted_keys"] == ["hf_token"]


# --- argument files ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "defect"),
    [
        ('{"a": ' * 5000 + "1" + "}" * 5000, "json-too-deep"),
        ('{"disaggregation_mode": "decode", "disaggregation_mode": "prefill"}', "json-duplicate-key"),
        ('{"disaggregation_mode": "decode", "x": NaN}', "json-non-finite"),
    ],
)
def test_argument_json_that_is_not_strict_is_bad_input(tmp_path, text, defect):
    (tmp_path / "args.json").write_text(text)
    result = CliRunner().invoke(
        main, ["gates", "--server-args", str(tmp_path / "args.json"), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and defect in result.stderr and "args.json" in result.stderr
    assert not (tmp_path / "o").exists()


# --- the bundle: names and digests, verified before it is published ---------------------------


def test_relative_log_paths_round_trip_through_verify(tmp_path, monkeypatch):
    """#16: a gates bundle made with relative --log paths passes its own `kvprobe verify`."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "prefill.log").write_text(_log("prefill", INCIDENT_POOL))
    (tmp_path / "logs" / "decode.log").write_text(_log("decode", RAISED_POOL))
    (tmp_path / "logs" / "decode-args.json").write_text(json.dumps(server_args_dict("0.5.22", "decode")))
    made = CliRunner().invoke(
        main,
        [
            "gates",
            "--log",
            "logs/prefill.log",
            "--log",
            "decode=logs/decode.log",
            "--server-args",
            "decode=logs/decode-args.json",
        ],
    )
    assert made.exit_code == 1, made.output
    (bundle,) = (tmp_path / "bundles").iterdir()
    verified = CliRunner().invoke(main, ["verify", str(bundle), "--json"])
    assert verified.exit_code == 0, verified.stdout
    assert json.loads(verified.stdout)["outcome"] == "self-consistent"
    text = "".join(p.read_text() for p in bundle.rglob("*") if p.is_file())
    assert str(tmp_path) not in text and "logs/" not in text
    receipt = json.loads((bundle / "receipt.json").read_text())
    assert [i["name"] for i in receipt["inputs"]["logs"]] == ["prefill.log", "decode.log"]
    assert receipt["workers"][0]["log"] == "prefill.log"


def test_bad_input_writes_no_bundles_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "args.txt").write_text("nothing to read here\n")
    result = CliRunner().invoke(main, ["gates", "--server-args", "args.txt"])
    assert result.exit_code == 2
    assert os.listdir(tmp_path) == ["args.txt"]

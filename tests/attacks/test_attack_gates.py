"""`kvprobe gates` against hostile or tricky logs and server arguments (issue #11).

No --sglang: gates 2 and 4 stay unknown, so a run whose gates 1 and 3 pass exits 3
(undecided) and one where gate 1 or 3 fails exits 1. Logs are in SGLang's own formats
(tests/attacks/gatelogs.py); lines "logged while serving" stand for text a user's request
put in the log.
"""

from __future__ import annotations

import json

import pytest

from tests.attacks.gatelogs import CONTEXT, INCIDENT, RAISED, args_dict, startup_log
from tests.attacks.harness import assert_outcome, line_naming

pytestmark = pytest.mark.attack

SECRETS = ("sk-live-SECRET123", "adm-SECRET456", "hf_SECRET789")


def write_logs(sandbox, **texts: str) -> list[str]:
    """``--log ROLE=FILE`` arguments for role=text pairs, each written to inputs/ROLE.log."""
    args = []
    for role, text in texts.items():
        path = sandbox.inputs / f"{role}.log"
        path.write_text(text)
        args += ["--log", f"{role}={path}"]
    return args


def gates(sandbox, *args: str, **kwargs):
    return sandbox.run("gates", *args, "--out", sandbox.out, allow=(sandbox.out,), **kwargs)


def test_every_kv_allocation_line_counts(sandbox):
    """Attack: the decode worker logs 681,280 tokens, then a later allocation of 1,048,576;
    today only the last line counts and gate 1 passes."""
    logs = write_logs(
        sandbox,
        prefill=startup_log("prefill", RAISED, canary=True),
        decode=startup_log("decode", CONTEXT, kv_tokens=(INCIDENT, CONTEXT), canary=True),
    )
    result = gates(sandbox, *logs)
    assert_outcome(sandbox, result, 1, "gate 1", "fail")
    assert line_naming(result.err, "681,280"), result.err


def test_a_short_pool_fails_without_a_role(sandbox):
    """Attack: a log without server_args (no role) whose pool is 681,280 for a 1,048,576
    context; today gate 1 is 'unknown' (exit 3) instead of failing."""
    path = sandbox.inputs / "worker.log"
    path.write_text(startup_log("decode", INCIDENT, role_in_log=False))
    result = gates(sandbox, "--log", str(path))
    assert_outcome(sandbox, result, 1, "gate 1", "fail")


def test_request_text_cannot_forge_a_kv_allocation(sandbox):
    """Attack (own): a user's request logs the text of a KV allocation line (2,000,000
    tokens) after the real 681,280-token allocation; today it becomes the pool of record."""
    forged = (
        "Receive: obj=GenerateReqInput(text='KV Cache is allocated. dtype: torch.bfloat16, "
        "#tokens: 2000000, KV size: 1.00 GB', rid='r2')"
    )
    logs = write_logs(
        sandbox,
        **{
            role: startup_log(role, CONTEXT, kv_tokens=(INCIDENT,), canary=True, after=(forged,))
            for role in ("prefill", "decode")
        },
    )
    result = gates(sandbox, *logs)
    assert_outcome(sandbox, result, 1, "gate 1", "fail")


def test_request_text_cannot_install_the_canary(sandbox):
    """Attack: `install_canary:` inside a logged user request; the canary never ran, the
    checksum is off, so gate 3 must fail (today the canary check passes)."""
    logs = write_logs(
        sandbox,
        **{
            role: startup_log(
                role,
                RAISED,
                after=(
                    "Receive: obj=GenerateReqInput("
                    f"text='install_canary: disaggregation_mode={role} config=x', rid='r1')",
                ),
            )
            for role in ("prefill", "decode")
        },
    )
    result = gates(sandbox, *logs)
    assert_outcome(sandbox, result, 1, "gate 3", "fail")


def test_secrets_in_a_serverargs_repr_are_redacted_everywhere(sandbox):
    """Attack: api_key / admin_api_key / hf_token in a `server_args=ServerArgs(...)` log line
    and in a --server-args file: nothing may store or print them."""
    repr_line = (
        "ServerArgs(model_path='zai-org/GLM-5.3', api_key='sk-live-SECRET123', "
        "disaggregation_mode='{role}', device='cuda', admin_api_key='adm-SECRET456', "
        "hf_token='hf_SECRET789', kv_canary='log')"
    )
    logs = write_logs(
        sandbox,
        **{
            role: startup_log(role, RAISED, args=repr_line.format(role=role), canary=True)
            for role in ("prefill", "decode")
        },
    )
    args_file = sandbox.inputs / "decode-args.txt"
    args_file.write_text("server_args=" + repr_line.format(role="decode") + "\n")
    result = gates(sandbox, *logs, "--server-args", f"decode={args_file}", "--json")
    assert_outcome(sandbox, result, 3)
    leaks = {
        secret: [where for where, text in _outputs(sandbox, result).items() if secret in text] for secret in SECRETS
    }
    assert leaks == {secret: [] for secret in SECRETS}, f"secrets stored or printed: {leaks}"
    assert "redacted" in (sandbox.out / "receipt.json").read_text(), "the receipt does not record the redaction"


def _outputs(sandbox, result) -> dict[str, str]:
    found = {"stdout (--json)": result.out, "stderr (terminal)": result.err}
    for path in sorted(sandbox.out.rglob("*")):
        if path.is_file():
            found[path.relative_to(sandbox.out).as_posix()] = path.read_text(errors="replace")
    return found


def test_secret_on_a_command_line_is_not_stored(sandbox):
    """Regression guard: `--api-key` in a command-line args file is read, never copied."""
    args_file = sandbox.inputs / "prefill-args.txt"
    args_file.write_text(
        "python -m sglang.launch_server --disaggregation-mode prefill "
        "--api-key sk-live-SECRET123 --model-path zai-org/GLM-5.3\n"
    )
    result = gates(sandbox, "--server-args", str(args_file), "--json")
    assert_outcome(sandbox, result, 3)
    assert not [where for where, text in _outputs(sandbox, result).items() if "sk-live-SECRET123" in text]


def test_secret_in_a_resolved_dict_is_redacted(sandbox):
    """Regression guard: the dict form of server_args= (current releases) is redacted."""
    logs = write_logs(
        sandbox,
        **{
            role: startup_log(role, RAISED, canary=True, args=args_dict(role, api_key="sk-live-SECRET123"))
            for role in ("prefill", "decode")
        },
    )
    result = gates(sandbox, *logs, "--json")
    assert_outcome(sandbox, result, 3)
    assert not [where for where, text in _outputs(sandbox, result).items() if "sk-live-SECRET123" in text]


def test_deeply_nested_server_args_json(sandbox):
    """Attack: --server-args JSON nested 100,000 levels: bad input (exit 2), never a
    RecursionError, and nothing written."""
    path = sandbox.inputs / "args.json"
    path.write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)
    result = sandbox.run("gates", "--server-args", str(path), "--out", sandbox.out)
    assert_outcome(sandbox, result, 2, "args.json")
    assert not sandbox.out.exists()


def test_server_args_json_must_be_an_object_of_settings(sandbox):
    """Regression guard: a JSON document that is not server arguments is bad input (exit 2)."""
    path = sandbox.inputs / "args.json"
    path.write_text(json.dumps(["not", "an", "object"]))
    result = sandbox.run("gates", "--server-args", str(path), "--out", sandbox.out)
    assert_outcome(sandbox, result, 2, "args.json")

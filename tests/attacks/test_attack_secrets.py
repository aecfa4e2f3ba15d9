"""Secrets in an operator's logs are redacted whatever their spelling (issue #28), and numbers
whose names end in "token" are not secrets (issue #27): nothing of them reaches the gates
receipt, its README, --json or the terminal."""

from __future__ import annotations

import json

import pytest

from tests.attacks.gatelogs import RAISED, startup_log
from tests.attacks.harness import assert_outcome
from tests.attacks.test_attack_gates import _outputs, gates, write_logs

pytestmark = pytest.mark.attack


# Every spelling of a secret found by the second hostile round (issue #28), and the secret
# text of each; and a numeric key whose name ends in "token" (issue #27), kept.
SPELLED = (
    ("repo_url='https://user:ghp_0123456789abcdefghijABCDEFGHIJ012345@github.com/o/r.git'", "ghp_0123456789abcd"),
    ('json_model_override_args=\'{"hf_token": "hf_JSONinSTRINGsecret0123456789"}\'', "JSONinSTRINGsecret"),
    ("api_key = 'sk-spaced-SECRET'", "sk-spaced-SECRET"),
    ("authorization='Bearer bearer-SECRET'", "bearer-SECRET"),
    ("database_url='postgres://admin:pg-SECRET@db.internal:5432/app'", "pg-SECRET"),
    ("aws_access_key_id='AKIAIOSFODNN7EXAMPLE'", "AKIAIOSFODNN7EXAMPLE"),
    ("admin_api_key=adm)paren-SECRET", "paren-SECRET"),
)


@pytest.mark.parametrize("forms", [SPELLED[i : i + 2] for i in range(0, len(SPELLED), 2)])
def test_secrets_are_redacted_whatever_their_spelling(sandbox, forms):
    """Attack: each spelling opens a worker's `server_args=ServerArgs(...)` line (where the
    receipt's excerpt of it is taken from): none reaches the receipt, the README, --json or
    the terminal; the bucket list whose name ends in "token" is not taken for a secret."""
    lines = [
        f"ServerArgs({form}, model_path='zai-org/GLM-5.3', disaggregation_mode='ROLE', device='cuda', "
        "bucket_time_to_first_token=[0.1, 0.5, 1.0], kv_canary='log')"
        for form, _ in forms
    ]
    logs = write_logs(
        sandbox,
        **{
            role: startup_log(role, RAISED, args=line.replace("ROLE", role), canary=True)
            for role, line in zip(("prefill", "decode"), (lines * 2)[:2], strict=True)
        },
    )
    result = gates(sandbox, *logs, "--json")
    assert_outcome(sandbox, result, 3)
    secrets = [secret for _, secret in forms]
    leaks = {s: [where for where, text in _outputs(sandbox, result).items() if s in text] for s in secrets}
    assert leaks == {s: [] for s in secrets}, f"secrets stored or printed: {leaks}"
    receipt = json.loads((sandbox.out / "receipt.json").read_text())
    recorded = {k for e in receipt["inputs"]["logs"] for k in e["redacted_keys"]}
    assert recorded and "bucket_time_to_first_token" not in recorded

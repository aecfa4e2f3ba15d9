"""One redaction pass, by key name and by value shape (issue #28), and numbers left alone
(issue #27): a corpus of every spelling a secret was found in, and of names that only look
like secrets."""

from __future__ import annotations

import pytest

from kvprobe.gates import serverlog
from kvprobe.redaction import REDACTED, is_secret, is_secret_key, redact

# (line, the secret text that must not survive, what the pass names)
SECRETS = [
    (
        "repo='https://user:ghp_0123456789abcdefghijABCDEFGHIJ012345@github.com/o/r.git'",
        "ghp_0123456789abcdefghijABCDEFGHIJ012345",
        "url_credentials",
    ),
    ("DATABASE_URL=postgres://admin:pw-SECRET@db.internal:5432/app", "pw-SECRET", "url_credentials"),
    (
        "ServerArgs(model_path='m', json_model_override_args='{\"hf_token\": \"hf_SECRETinJSONstring\"}', tp_size=8)",
        "SECRETinJSONstring",
        "hf_token",
    ),
    ('json_model_override_args=\'{\\"hf_token\\": \\"escaped-SECRET\\"}\'', "escaped-SECRET", "hf_token"),
    ("ServerArgs(api_key = 'sk-spaced-SECRET', tp_size=8)", "sk-spaced-SECRET", "api_key"),
    ("api-key: header-SECRET", "header-SECRET", "api_key"),
    ("x-api-key: other-header-SECRET", "other-header-SECRET", "x_api_key"),
    ("ServerArgs(authorization='Bearer bearer-SECRET', tp_size=8)", "bearer-SECRET", "authorization"),
    ("Authorization: Bearer unquoted-bearer-SECRET", "unquoted-bearer-SECRET", "authorization"),
    ("curl -H 'X-Upstream: Bearer eyJhbGciOi.eyJzdWIiOi.c2lnbmF0dXJl'", "eyJhbGciOi", "bearer_token"),
    ("aws_access_key_id='AKIAIOSFODNN7EXAMPLE'", "AKIAIOSFODNN7EXAMPLE", "aws_access_key_id"),
    ("creds AKIAIOSFODNN7EXAMPLE in the middle of a line", "AKIAIOSFODNN7EXAMPLE", "aws_access_key_id"),
    ("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI", "aws_secret_access_key"),
    ("ServerArgs(api_key=sk)paren-SECRET, tp_size=8)", "paren-SECRET", "api_key"),
    ("ServerArgs(api_key='sk)quoted-paren-SECRET', tp_size=8)", "quoted-paren-SECRET", "api_key"),
    ("--api-key cli)paren-SECRET --tp 8", "paren-SECRET", "api_key"),
    ("--api-key=cli-SECRET99 --tp 8", "cli-SECRET99", "api_key"),
    ("HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123 python -m sglang.launch_server", "hf_abcdefghij", "hf_token"),
    ("{'admin_api_key': 'adm-SECRET456', 'device': 'cuda'}", "adm-SECRET456", "admin_api_key"),
    ('{"apiKey": "camel-SECRET"}', "camel-SECRET", "api_key"),
    ("ssl_keyfile_password='hunter2-SECRET'", "hunter2-SECRET", "ssl_keyfile_password"),
    ("password=123456", "123456", "password"),  # a number is still a password's value
    ("loading with token hf_abcdefghijklmnopqrstuvwxyz0123 now", "hf_abcdefghij", "huggingface_token"),
    ("OPENAI key sk-proj-abcdefghijklmnopqrstuvwx in a message", "sk-proj-abcdefghij", "openai_key"),
    ("glpat-abcdefghijklmnopqrst", "glpat-abcdefghij", "gitlab_token"),
    ("SLACK xoxb-123456-abcdefSECRET", "abcdefSECRET", "slack_token"),
    ("-----BEGIN RSA PRIVATE KEY----- MIIEowIBAAKCAQEA", "MIIEowIBAAKCAQEA", "private_key"),
]

# Lines with secret-looking names whose values are not secrets: kept as they are.
NOT_SECRETS = [
    "ServerArgs(bucket_time_to_first_token=[0.1, 0.2, 0.5], bucket_inter_token_latency=[0.1, 0.2])",
    "{'bucket_time_to_first_token': [0.1, 0.2], 'max_total_num_tokens': 681280}",
    "ServerArgs(api_key=None, hf_token=None, tokenizer_path='tok', eos_token='</s>')",
    "num_reserved_decode_tokens=512 first_token=5 sort_key=3",
    "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 681280, KV size: 1.00 GB",
    "max_total_num_tokens=681280, chunked_prefill_size=8192, context_len=1048576",
    "url=http://127.0.0.1:30000/generate",
]


@pytest.mark.parametrize(("line", "secret", "named"), SECRETS, ids=[s[2] + f"-{i}" for i, s in enumerate(SECRETS)])
def test_every_spelling_of_a_secret_is_masked_and_named(line, secret, named):
    masked, names = redact(line)
    assert secret not in masked and REDACTED in masked, masked
    assert named in names
    assert redact(masked)[0] == masked  # masking twice changes nothing


@pytest.mark.parametrize("line", NOT_SECRETS)
def test_numbers_and_names_that_only_look_secret_are_kept(line):
    assert redact(line) == (line, frozenset())


def test_the_rest_of_the_line_survives_the_mask():
    masked, _ = redact("ServerArgs(api_key=sk)SECRET, tp_size=8, disaggregation_mode='prefill')")
    assert masked == "ServerArgs(api_key=<redacted>, tp_size=8, disaggregation_mode='prefill')"
    masked, _ = redact("DATABASE_URL=postgres://admin:pw@db.internal:5432/app")
    assert masked == "DATABASE_URL=postgres://<redacted>@db.internal:5432/app"


def test_key_names_by_word_not_by_suffix():
    assert is_secret_key("hf_token") and is_secret_key("HF_TOKEN") and is_secret_key("--api-key")
    assert is_secret_key("aws_access_key_id") and is_secret_key("Authorization")
    assert not is_secret_key("bucket_time_to_first_token") and not is_secret_key("eos_token")
    assert not is_secret_key("max_total_num_tokens") and not is_secret_key("tokenizer_path")
    assert not is_secret("some_token", [0.1, 0.2]) and is_secret("some_token", "abc")
    assert not is_secret("api_key", None) and is_secret("api_key", 1234)


def test_a_resolved_dump_records_only_the_keys_that_held_secrets():
    """The dict form of server_args=: a numeric bucket list is no secret, an hf_token is."""
    args = serverlog.parse_args_text(
        "{'bucket_time_to_first_token': [0.1, 0.2], 'hf_token': 'hf_x', 'api_key': None, "
        "'disaggregation_mode': 'prefill'}",
        "x.log",
        1,
    )
    assert args.redacted == frozenset({"hf_token"})
    assert "[0.1, 0.2]" in args.evidence.text and "hf_x" not in args.evidence.text


def test_every_name_the_pass_records_is_a_secret_key_the_receipt_accepts():
    """What `redacted_keys` records: keys the gates receipt schema takes (^[a-z0-9_.]+$), each
    itself a secret name (value kinds included: url_credentials, jwt_token, ...)."""
    import re

    names = set().union(*(redact(line)[1] for line, _, _ in SECRETS))
    assert names and all(re.fullmatch(r"[a-z0-9_.]+", n) and is_secret_key(n) for n in names), names

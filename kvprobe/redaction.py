"""Secrets masked in text kvprobe did not write (an operator's log line, an arguments file)
before any of it is stored or printed: one pass, by key name and by value shape.

By key name: the value after a secret key is masked whatever the spelling around it:
``api_key='x'``, ``api_key = 'x'``, ``'api_key': 'x'``, ``"hf_token": "x"`` (inside another
value's JSON string too, escaped quotes included), ``api-key: x``, ``--api-key x``,
``--api-key=x``, ``HF_TOKEN=x``, ``authorization='Bearer x'``, an unquoted value holding
``)``. A name is secret when it says so (api key, secret, password, credential, private or
access key, authorization); a name that only ends in ``token`` or ``key`` is secret unless
it names a count, a time or a tokenizer's special token (``bucket_time_to_first_token``,
``eos_token``), and its value is masked unless it is a number, a list of numbers, a
boolean or None: redact secrets, not numbers.

By value shape, wherever it stands: credentials in a URL (``scheme://user:pw@host``:
``DATABASE_URL=postgres://admin:pw@db``), ``Bearer``/``Basic`` credentials, and the token
formats of the services an inference host talks to. The shapes follow the plugins of
Yelp's detect-secrets 1.5.0 (aws, basic_auth, github_token, gitlab_token, jwt, openai,
private_key, pypi_token, npm, sendgrid, slack, stripe), with Hugging Face tokens added. The
library itself is not used: it scans files and reports findings per line (it masks
nothing), needs requests and PyYAML, and its keyword plugin leaves out ``token`` names on
purpose, which are the ones SGLang's arguments use (``hf_token``).
"""

from __future__ import annotations

import re

REDACTED = "<redacted>"

_STRONG = re.compile(
    r"api_?key|secret|passw(?:or)?d|passphrase|credential|private_?key|access_?key|auth_?token|bearer"
    r"|(?:^|_)(?:authorization|auth|pwd|passwd|cookie|dsn)$"
)
_WEAK = re.compile(r"(?:^|_)(?:token|key)$")
# Weak names that say what a number or a tokenizer's token is, never a credential.
_NOT_SECRET = re.compile(
    r"(?:^|_)(?:first|last|next|per|num|max|min|eos|bos|pad|unk|sep|cls|mask|special|stop|start|end"
    r"|image|video|audio|think|tool|reasoning|sort|cache|hash|routing|partition)_(?:token|key)$"
    r"|(?:^|_)time_to_"
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_NOT_KEY_CHAR = re.compile(r"[^a-z0-9_.]")

_QUOTED = r"'(?:[^'\\\n]|\\.)*'?|\"(?:[^\"\\\n]|\\.)*\"?|\\\"(?:[^\"\\\n]|\\[^\"])*(?:\\\")?"
_SCHEME_WORD = r"(?:Bearer|Basic|Token|Digest)\s+[^\s,'\"]+"
# 'key': v / "key": v / \"key\": v (dict repr, JSON, JSON in a string), key=v and key = v
# (dataclass repr, env, config), key: v (YAML, HTTP headers), --key v / --key=v (command line)
_LEAD = re.compile(
    r"(?P<lead>(?P<q>\\?['\"])(?P<k1>[A-Za-z_][\w.-]*)(?P=q)\s*:\s*"
    r"|(?<![\w-])--(?P<k3>[A-Za-z][\w-]*)(?:=|\s+(?!-))"
    r"|(?<![\w.-])(?P<k2>[A-Za-z_][\w.-]*)\s*(?:=(?!=)|:(?![:/]))\s*)",
    re.ASCII,
)
_VALUE = re.compile(rf"{_SCHEME_WORD}|{_QUOTED}|[^\s,]+")
_NOT_A_SECRET_VALUE = re.compile(
    r"(?:-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|True|False|true|false|None|null|\[[\d\s.,eE+-]*\]?)[)\]}]*"
)

# Value shapes (after detect-secrets' plugins); each masks the whole match and names its kind.
_SHAPES = re.compile(
    r"(?P<url_credentials>(?<=://)[^\s/@:'\"]+:[^\s/@'\"]+(?=@))"
    r"|(?P<bearer_token>(?<=Bearer )[A-Za-z0-9._~+/=-]{8,}|(?<=Basic )[A-Za-z0-9+/=]{8,})"
    r"|(?P<aws_access_key_id>\b(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b)"
    r"|(?P<github_token>\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9_]{36,}|\bgithub_pat_[A-Za-z0-9_]{22,})"
    r"|(?P<gitlab_token>\bgl(?:pat|dt|ft|soat|rt|cbt)-[A-Za-z0-9_-]{20,})"
    r"|(?P<huggingface_token>\bhf_[A-Za-z0-9]{30,})"
    r"|(?P<openai_key>\bsk-(?:proj-|svcacct-|admin-|ant-)?[A-Za-z0-9_-]{20,})"
    r"|(?P<stripe_key>\b[rs]k_live_[0-9A-Za-z]{24,})"
    r"|(?P<slack_token>\bxox[abposr]-(?:\d+-)+[A-Za-z0-9]+)"
    r"|(?P<jwt_token>\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*)"
    r"|(?P<pypi_token>\bpypi-AgE[A-Za-z0-9_-]{50,})"
    r"|(?P<npm_token>\bnpm_[A-Za-z0-9]{36})"
    r"|(?P<sendgrid_key>\bSG\.[\w-]{22}\.[\w-]{43})"
    r"|(?P<private_key>-----BEGIN [A-Z ]*PRIVATE KEY-----.*)"
)


def key_name(key: str) -> str:
    """A key as the receipt records it: ``apiKey``, ``--api-key`` and ``API_KEY`` are ``api_key``."""
    snake = _CAMEL.sub("_", key.strip("-_")).lower().replace("-", "_")
    return _NOT_KEY_CHAR.sub("_", snake) or "_"


def is_secret_key(key: str) -> bool:
    """Whether a value under ``key`` is a secret, by its name alone (see the module docstring)."""
    name = key_name(key)
    return bool(_STRONG.search(name)) or (bool(_WEAK.search(name)) and not _NOT_SECRET.search(name))


def is_secret(key: str, value: object) -> bool:
    """Whether ``value`` under ``key`` is a secret: a secret name, and for a name that only
    ends in token or key, a value that is not a number, a boolean or None."""
    name = key_name(key)
    if value is None or (isinstance(value, str) and value.strip() in ("", "None", "null")):
        return False
    if _STRONG.search(name):
        return True
    if not is_secret_key(key):
        return False
    if isinstance(value, (bool, int, float)):
        return False
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
        return False
    return not _NOT_A_SECRET_VALUE.fullmatch(str(value).strip())


def redact(text: str) -> tuple[str, frozenset[str]]:
    """``text`` with every secret masked (``<redacted>``), by key name and by value shape, and
    the names of what was masked: the keys (as :func:`key_name` spells them) and the value
    kinds (``url_credentials``, ``aws_access_key_id``, ...)."""
    found: set[str] = set()
    out: list[str] = []
    pos = 0
    while (match := _LEAD.search(text, pos)) is not None:
        key = match["k1"] or match["k2"] or match["k3"]
        value = _VALUE.match(text, match.end())
        if value is None or not is_secret_key(key):
            out.append(text[pos : match.end()])  # its value is scanned like the rest of the text
            pos = match.end()
            continue
        raw = value[0]
        body = raw if raw[:1] in "'\"\\" or raw[:1].isspace() else raw.rstrip(")]}")
        if not is_secret(key, body.strip("'\"\\")):
            out.append(text[pos : match.end()])
            pos = match.end()
            continue
        found.add(key_name(key))
        quote = raw[:2] if raw.startswith("\\") else raw[:1] if raw[:1] in "'\"" else ""
        out.append(text[pos : match.end()] + f"{quote}{REDACTED}{quote}")
        pos = value.start() + len(body)
    out.append(text[pos:])
    masked = "".join(out)

    def shape(match: re.Match[str]) -> str:
        found.add(str(match.lastgroup))
        return REDACTED

    return _SHAPES.sub(shape, masked), frozenset(found)

"""Is a fix in the code that runs? Grep-able markers in an SGLang tree, not version numbers.

Each marker names an *anchor* (code the fix changed, present before and after it) and the
*marker* (text only the fixed code has). Anchor found, marker not: the fix is absent. Anchor
not found: the code was reorganised beyond recognition and the answer is ``unknown``.
Whitespace is normalised before matching, so reformatting does not hide a marker.

``first_release`` was measured on the release wheels 0.5.19 .. 0.5.22 (see the tests).
``basis`` says how sure the PR attribution is: "pr-text" when the PR's own description
names the change, "domain" when it rests on DOMAIN.md's one-line summary and the code's
comments (the PR thread was not readable from here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

DISAGG = "sglang/srt/disaggregation"


class Presence(str, Enum):
    PRESENT = "present"
    ABSENT = "absent"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Marker:
    pr: int
    gate: int
    title: str
    anchor: tuple[str, str]  # (relative file, text)
    all_of: tuple[tuple[str, str], ...] = ()
    any_of: tuple[tuple[str, str], ...] = ()
    first_release: str = ""
    basis: str = "domain"


@dataclass(frozen=True)
class Finding:
    marker: Marker
    presence: Presence
    evidence: str


MARKERS: tuple[Marker, ...] = (
    Marker(
        pr=39500,
        gate=3,
        title="optional handoff KV checksum (--disaggregation-enable-kv-checksum)",
        anchor=(f"{DISAGG}/decode.py", "class DecodePreallocQueue"),
        all_of=(
            (f"{DISAGG}/checksum.py", "class KvChecksumComputer"),
            (f"{DISAGG}/decode.py", "def _verify_kv_checksums("),
        ),
        first_release="0.5.21",
        basis="pr-text",
    ),
    Marker(
        pr=40645,
        gate=4,
        title="abort ACK kept until in-flight KV writes drain (sender clear() no longer drops it)",
        anchor=(f"{DISAGG}/common/conn.py", "def _maybe_ack_drained_abort("),
        all_of=((f"{DISAGG}/common/conn.py", "self.kv_mgr._maybe_ack_drained_abort(self.bootstrap_room)"),),
        first_release="0.5.21",
        basis="pr-text",
    ),
    Marker(
        pr=41402,
        gate=4,
        title="drain ACK fanned out to every decode peer of a room",
        anchor=(f"{DISAGG}/common/conn.py", "def _maybe_ack_drained_abort("),
        any_of=(
            (f"{DISAGG}/common/conn.py", "def _abort_ack_fanout_targets("),  # 0.5.21 form
            (f"{DISAGG}/common/conn.py", "def _send_abort_acks("),
        ),  # 0.5.22 form (per-endpoint targets)
        first_release="0.5.21",
        basis="domain",
    ),
    Marker(
        pr=41404,
        gate=4,
        title="deferred release also for transfer failures decode did not initiate",
        anchor=(f"{DISAGG}/decode.py", "def _defer_release("),
        all_of=((f"{DISAGG}/decode.py", "ensure_abort_notified(force_arm=True)"),),
        first_release="0.5.21",
        basis="domain",
    ),
    Marker(
        pr=41023,
        gate=4,
        title="deferred KV release on by default for backends that support it",
        anchor=("sglang/srt/environ.py", "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"),
        all_of=(
            (f"{DISAGG}/base/conn.py", "supports_deferred_decode_kv_release: bool = False"),
            ("sglang/srt/environ.py", "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE = EnvBool(True)"),
        ),
        first_release="0.5.21",
        basis="domain",
    ),
)


class CodeTree:
    """Read-only view of an SGLang tree (the directory holding ``sglang/``), files cached."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[str, str | None] = {}

    def text(self, rel: str) -> str | None:
        """Whitespace-normalised file text, or None when the file does not exist."""
        if rel not in self._cache:
            path = self.root / rel
            self._cache[rel] = _squash(path.read_text(encoding="utf-8", errors="replace")) if path.is_file() else None
        return self._cache[rel]

    def has(self, rel: str, needle: str) -> bool:
        text = self.text(rel)
        return text is not None and _squash(needle) in text

    def files_containing(self, under: str, needle: str) -> list[str]:
        """Relative paths of ``*.py`` under ``under`` that contain ``needle``."""
        base = self.root / under
        if not base.is_dir():
            return []
        return sorted(
            p.relative_to(self.root).as_posix()
            for p in base.rglob("*.py")
            if self.has(p.relative_to(self.root).as_posix(), needle)
        )


def _squash(text: str) -> str:
    """One space for any whitespace run, none inside brackets' edges, no trailing commas (black)."""
    text = re.sub(r"\s+", " ", text)
    text = re.sub(r"([(\[{]) ", r"\1", text)
    text = re.sub(r" ?,? ?([)\]}])", r"\1", text)
    return text


def find(tree: CodeTree, marker: Marker) -> Finding:
    """Present, absent (anchor there, marker not) or unknown (anchor not recognisable)."""
    anchor_file, anchor_text = marker.anchor
    if not tree.has(anchor_file, anchor_text):
        return Finding(
            marker,
            Presence.UNKNOWN,
            f"anchor {anchor_text!r} not found in {anchor_file}: code reorganised or not SGLang",
        )
    missing = [f"{t!r} in {f}" for f, t in marker.all_of if not tree.has(f, t)]
    hits = [f"{t!r} in {f}" for f, t in marker.any_of if tree.has(f, t)]
    if missing or (marker.any_of and not hits):
        what = "; ".join(missing) or " or ".join(f"{t!r} in {f}" for f, t in marker.any_of)
        return Finding(marker, Presence.ABSENT, f"not found: {what} (anchor {anchor_text!r} is there)")
    found = [f"{t!r} in {f}" for f, t in marker.all_of] + hits
    return Finding(marker, Presence.PRESENT, "found " + "; ".join(found))


def find_all(tree: CodeTree, gate: int | None = None) -> list[Finding]:
    return [find(tree, m) for m in MARKERS if gate is None or m.gate == gate]


# --- settings the running code offers -------------------------------------------------------


@dataclass(frozen=True)
class CodeSettings:
    """What this release's code says about the three defences' settings."""

    has_checksum_flag: bool
    checksum_evidence: str
    has_canary_flag: bool
    deferred_default: bool | None
    deferred_evidence: str
    deferred_capability_flag: bool  # does the release declare per-backend support at all?
    deferred_backends: tuple[str, ...]


_ENV_DEFAULT_RE = re.compile(r"SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE = EnvBool\((True|False)\)")


def code_settings(tree: CodeTree) -> CodeSettings:
    flag_files = tree.files_containing("sglang/srt/arg_groups", "disaggregation_enable_kv_checksum:") + (
        ["sglang/srt/server_args.py"]
        if tree.has("sglang/srt/server_args.py", "disaggregation_enable_kv_checksum:")
        else []
    )
    canary = bool(tree.files_containing("sglang/srt/arg_groups", "kv_canary:")) or tree.has(
        "sglang/srt/server_args.py", "kv_canary:"
    )
    env_text = tree.text("sglang/srt/environ.py") or ""
    default = _ENV_DEFAULT_RE.search(env_text)
    backends = tuple(
        sorted(
            Path(rel).parent.name
            for rel in tree.files_containing(DISAGG, "supports_deferred_decode_kv_release = True")
            if rel.endswith("/conn.py")
        )
    )
    return CodeSettings(
        has_checksum_flag=bool(flag_files),
        checksum_evidence=(
            f"field disaggregation_enable_kv_checksum in {', '.join(flag_files)}"
            if flag_files
            else "no disaggregation_enable_kv_checksum field in sglang/srt/arg_groups or server_args.py"
        ),
        has_canary_flag=canary,
        deferred_default=None if default is None else default.group(1) == "True",
        deferred_evidence=(
            f"sglang/srt/environ.py: {default.group(0)}"
            if default
            else "sglang/srt/environ.py declares no SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"
        ),
        deferred_capability_flag=tree.has(f"{DISAGG}/base/conn.py", "supports_deferred_decode_kv_release"),
        deferred_backends=backends,
    )

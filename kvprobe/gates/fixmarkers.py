"""Is a fix in the code that runs? Grep-able markers in an SGLang tree, not version numbers.

Each marker names an *anchor* (code the fix changed, present before and after it) and the
*marker* (text only the fixed code has). Anchor found, marker not: the fix is absent. Anchor
not found: the code was reorganised beyond recognition and the answer is ``unknown``.
Whitespace is normalised before matching, so reformatting does not hide a marker.

The markers are data about upstream PRs, kept in ``fixmarkers.toml`` beside this module
(shipped in the wheel, checked against schemas/fix-markers.schema.json when first read).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from enum import Enum
from functools import cache
from pathlib import Path

from kvprobe import schema
from kvprobe.errors import SchemaError
from kvprobe.names import FIX_MARKERS_SCHEMA
from kvprobe.rules.markers import not_in_release, older_than

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


MARKERS_FILE = Path(__file__).with_name("fixmarkers.toml")


@cache
def markers() -> tuple[Marker, ...]:
    """The markers kvprobe ships (``fixmarkers.toml``), read and validated once per process."""
    return load_markers(MARKERS_FILE)


def load_markers(path: Path) -> tuple[Marker, ...]:
    """Markers from a fix-markers TOML file; raises SchemaError naming the file and what is wrong."""
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SchemaError(f"{path}: not a readable fix-markers TOML file: {exc}") from exc
    schema.validate(doc, FIX_MARKERS_SCHEMA, source=str(path))
    return tuple(
        Marker(
            pr=row["pr"],
            gate=row["gate"],
            title=row["title"],
            anchor=_text_in_file(row["anchor"]),
            all_of=tuple(map(_text_in_file, row.get("all_of", ()))),
            any_of=tuple(map(_text_in_file, row.get("any_of", ()))),
            first_release=row["first_release"],
            basis=row["basis"],
        )
        for row in doc["marker"]
    )


def _text_in_file(spot: dict[str, str]) -> tuple[str, str]:
    return spot["file"], spot["text"]


class CodeTree:
    """Read-only view of an SGLang tree (the directory holding ``sglang/``), files cached.

    ``release``: the version this code is (the pinned wheel's, the dist-info's), when known.
    """

    def __init__(self, root: Path, release: str | None = None) -> None:
        self.root = root
        self.release = release
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
    """Present, absent (anchor there, marker not; or a release before the fix's first) or
    unknown (anchor not recognisable in a release that should have it, or of no known version)."""
    anchor_file, anchor_text = marker.anchor
    if not tree.has(anchor_file, anchor_text):
        if older_than(tree.release, marker.first_release):
            return Finding(
                marker,
                Presence.ABSENT,
                f"{not_in_release(marker.first_release, tree.release)} (and {anchor_file} has no "
                f"{anchor_text!r}): the defence is absent",
            )
        return Finding(
            marker,
            Presence.UNKNOWN,
            f"anchor {anchor_text!r} not found in {anchor_file}: code reorganised or not SGLang",
        )
    missing = [f"{t!r} in {f}" for f, t in marker.all_of if not tree.has(f, t)]
    hits = [f"{t!r} in {f}" for f, t in marker.any_of if tree.has(f, t)]
    if missing or (marker.any_of and not hits):
        what = "; ".join(missing) or " or ".join(f"{t!r} in {f}" for f, t in marker.any_of)
        older = (
            f"; {not_in_release(marker.first_release, tree.release)}"
            if older_than(tree.release, marker.first_release)
            else ""
        )
        return Finding(marker, Presence.ABSENT, f"not found: {what} (anchor {anchor_text!r} is there){older}")
    found = [f"{t!r} in {f}" for f, t in marker.all_of] + hits
    return Finding(marker, Presence.PRESENT, "found " + "; ".join(found))


def find_all(tree: CodeTree, gate: int | None = None) -> list[Finding]:
    return [find(tree, m) for m in markers() if gate is None or m.gate == gate]


# --- settings the running code offers -------------------------------------------------------


@dataclass(frozen=True)
class CodeSettings:
    """What this release's code says about the three defences' settings."""

    has_checksum_flag: bool
    checksum_evidence: str
    has_canary_flag: bool
    deferred_default: bool | None
    deferred_evidence: str
    deferred_declared: bool | None  # does environ.py declare the variable (0.5.19+)? None: no environ.py
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
        deferred_declared=(
            None
            if tree.text("sglang/srt/environ.py") is None
            else "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE" in env_text
        ),
        deferred_capability_flag=tree.has(f"{DISAGG}/base/conn.py", "supports_deferred_decode_kv_release"),
        deferred_backends=backends,
    )

"""Step 3: every listed file is there with its size and sha256, nothing else is, and
manifest.json and SHA256SUMS are the writer's canonical renderings of the same list."""

from __future__ import annotations

import re
from typing import Any

from kvprobe.defects import (
    BundleDefect,
    DuplicateEntry,
    FileDigestMismatch,
    ManifestNotCanonical,
    MissingFile,
    NotRegular,
    OversizedClaim,
    ReservedEntry,
    SizeMismatch,
    SumsBsdStyle,
    SumsCrlf,
    SumsMalformed,
    SumsMismatch,
    SumsNotCanonical,
    SumsUppercaseHex,
    UnlistedFile,
    UnsafePath,
)
from kvprobe.evidence import manifest as manifest_mod
from kvprobe.evidence.reader import Bundle, read_bytes
from kvprobe.evidence.safetree import NotRegularFile, path_problem
from kvprobe.names import MANIFEST, SUMS

_SUMS_LINE = re.compile(r"([0-9A-Fa-f]{64}) ([ *])(.*)")
_BSD_LINE = re.compile(r"SHA256 ?\((.*)\) ?= ?([0-9A-Fa-f]{64})")


def integrity_defects(bundle: Bundle) -> list[BundleDefect]:
    defects = manifest_form_defects(bundle)
    safe = _checked_entries(bundle, defects)
    for entry in safe:
        defects += file_defects(bundle, entry)
    defects += unlisted_defects(bundle)
    defects += sums_defects(bundle)
    return defects


def manifest_form_defects(bundle: Bundle) -> list[BundleDefect]:
    found: list[BundleDefect] = []
    if manifest_mod.render_manifest(bundle.accepted_manifest) != bundle.manifest_bytes:
        found.append(
            ManifestNotCanonical(
                MANIFEST, "not byte-identical to the writer's rendering (sorted keys, 2-space indent, final LF)"
            )
        )
    paths = [f["path"] for f in bundle.accepted_manifest["files"]]
    if paths != sorted(paths):
        found.append(ManifestNotCanonical(MANIFEST, "files are not sorted by path"))
    return found


def _checked_entries(bundle: Bundle, defects: list[BundleDefect]) -> list[dict[str, Any]]:
    """Entries safe to look at: canonical, unique, not reserved, within the size caps."""
    limits, seen, safe, claimed = bundle.limits, set(), [], 0
    for entry in bundle.accepted_manifest["files"]:
        rel = entry["path"]
        problem = path_problem(rel, limits)
        if problem:
            defects.append(UnsafePath(rel, f"listed in {MANIFEST}: {problem}"))
        elif rel in seen:
            defects.append(DuplicateEntry(rel, f"listed twice in {MANIFEST}"))
        elif rel in (MANIFEST, SUMS):
            defects.append(ReservedEntry(rel, f"{MANIFEST} must not list itself or {SUMS}"))
        elif entry["size"] > limits.max_file_bytes:
            defects.append(
                OversizedClaim(
                    rel,
                    f"{MANIFEST} claims {entry['size']} bytes > cap "
                    f"{limits.max_file_bytes}; not read (raise with --max-file-bytes)",
                )
            )
        else:
            claimed += entry["size"]
            safe.append(entry)
        seen.add(rel)
    if claimed > limits.max_total_bytes:
        defects.append(
            OversizedClaim(
                MANIFEST,
                f"claims {claimed} bytes in total > cap {limits.max_total_bytes}; not read (raise with --max-bytes)",
            )
        )
        return []
    return safe


def file_defects(bundle: Bundle, entry: dict[str, Any]) -> list[BundleDefect]:
    """Exists, regular, listed size (checked before hashing), listed sha256 (streamed)."""
    rel, size = entry["path"], entry["size"]
    found = bundle.scanned.entries.get(rel)
    if found is None:
        return [MissingFile(rel, f"listed in {MANIFEST} but missing")]
    if found.kind != "file":
        return [NotRegular(rel, f"listed in {MANIFEST} but is a {found.kind}; not opened")]
    if found.size != size:
        return [SizeMismatch(rel, f"{found.size} bytes, {MANIFEST} lists {size}; not hashed")]
    try:
        digest, count = bundle.tree.sha256(rel, size)
    except (NotRegularFile, OSError) as exc:
        return [NotRegular(rel, f"cannot be opened as a regular file without following links: {exc}")]
    if count != size:
        return [SizeMismatch(rel, f"changed while being read ({count} bytes, listed {size})")]
    if digest != entry["sha256"]:
        return [FileDigestMismatch(rel, f"sha256 {digest}, {MANIFEST} lists {entry['sha256']}")]
    return []


def reread_defects(bundle: Bundle) -> list[BundleDefect]:
    """Every listed file verify parsed (receipt, raw outputs, experiment, README) had the
    manifest's sha256 in the bytes it parsed: step 3 hashes a second read, and a file served
    differently to the two reads (a hostile or changing file system) must not pass."""
    listed = bundle.listed()
    return [
        FileDigestMismatch(
            rel,
            f"the bytes verify parsed have sha256 {digest}, {MANIFEST} lists {listed[rel]['sha256']}: "
            "the file changed while it was read",
        )
        for rel, digest in sorted(bundle.read_digests.items())
        if rel in listed and listed[rel].get("sha256") != digest
    ]


def unlisted_defects(bundle: Bundle) -> list[BundleDefect]:
    listed = set(bundle.listed()) | {MANIFEST, SUMS}
    return [
        UnlistedFile(rel, f"regular file not listed in {MANIFEST}")
        for rel in sorted(bundle.scanned.files())
        if rel not in listed
    ]


# --- SHA256SUMS --------------------------------------------------------------------------


def sums_defects(bundle: Bundle) -> list[BundleDefect]:
    """Byte-identical to the canonical render; when not, say exactly how it differs."""
    defects: list[BundleDefect] = []
    # every SHA256SUMS line is shorter than its manifest entry: the manifest's size caps it
    data = read_bytes(bundle, SUMS, len(bundle.manifest_bytes or b""), defects)
    if data is None:
        return [SumsMalformed(SUMS, d.detail) for d in defects]
    canonical = manifest_mod.render_sums(bundle.accepted_manifest).encode("utf-8")
    if data == canonical:
        return []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [SumsMalformed(SUMS, f"not UTF-8 (byte {exc.start})")]
    found = _sums_format_defects(text)
    parsed, line_defects = parse_sums(text)
    found += line_defects
    found += _sums_agreement(parsed, bundle.accepted_manifest)
    if not found:
        found.append(SumsNotCanonical(SUMS, "not byte-identical to the writer's rendering (line order)"))
    return found


def _sums_format_defects(text: str) -> list[BundleDefect]:
    found: list[BundleDefect] = []
    if "\r" in text:
        found.append(SumsCrlf(SUMS, "CR/CRLF line endings (the writer uses LF only)"))
    if text and not text.endswith("\n"):
        found.append(SumsNotCanonical(SUMS, "no final newline"))
    if not text:
        found.append(SumsMalformed(SUMS, "empty"))
    return found


def parse_sums(text: str) -> tuple[dict[str, str], list[BundleDefect]]:
    """{path: lowercase digest} of the parsable lines, and a defect per bad line."""
    parsed: dict[str, str] = {}
    found: list[BundleDefect] = []
    lines = text.replace("\r\n", "\n").split("\n")
    if lines[-1] == "":
        lines.pop()  # after the final LF
    for number, line in enumerate(lines, 1):
        where = f"line {number}"
        if _BSD_LINE.fullmatch(line):
            found.append(SumsBsdStyle(SUMS, f"{where}: BSD-style 'SHA256 (path) = hex' line: {line[:100]!r}"))
            continue
        match = _SUMS_LINE.fullmatch(line)
        if not match:
            found.append(SumsMalformed(SUMS, f"{where}: not '<64 hex>  <path>': {line[:100]!r}"))
            continue
        hexdigest, mode, rel = match.groups()
        found += _line_defects(where, hexdigest, mode, rel, parsed)
        parsed.setdefault(rel, hexdigest.lower())
    return parsed, found


def _line_defects(where: str, hexdigest: str, mode: str, rel: str, parsed: dict[str, str]) -> list[BundleDefect]:
    found: list[BundleDefect] = []
    if hexdigest != hexdigest.lower():
        found.append(SumsUppercaseHex(SUMS, f"{where}: uppercase hex for {rel!r} (the writer uses lowercase)"))
    if mode == "*":
        found.append(SumsNotCanonical(SUMS, f"{where}: binary-mode marker '*' before {rel!r}"))
    problem = path_problem(rel)
    if problem:
        found.append(UnsafePath(SUMS, f"{where}: {rel!r}: {problem}"))
    if rel in parsed:
        found.append(DuplicateEntry(SUMS, f"{where}: {rel!r} listed twice"))
    return found


def _sums_agreement(parsed: dict[str, str], manifest: dict[str, Any]) -> list[BundleDefect]:
    listed = {f["path"]: f["sha256"] for f in manifest["files"]}
    found: list[BundleDefect] = []
    for rel in sorted(set(parsed) - set(listed)):
        found.append(SumsMismatch(rel, f"in {SUMS}, not in {MANIFEST}"))
    for rel in sorted(set(listed) - set(parsed)):
        found.append(SumsMismatch(rel, f"in {MANIFEST}, not in {SUMS}"))
    for rel in sorted(set(listed) & set(parsed)):
        if listed[rel] != parsed[rel]:
            found.append(SumsMismatch(rel, f"{SUMS} says {parsed[rel]}, {MANIFEST} says {listed[rel]}"))
    return found

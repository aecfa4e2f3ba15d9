"""manifest.json and SHA256SUMS for a bundle directory."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from kvprobe.files import sha256_file
from kvprobe.names import MANIFEST, MANIFEST_SCHEMA, SUMS


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def bundle_files(root: Path) -> list[str]:
    """POSIX relative paths of every file except the manifest and checksum list."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            rel = Path(dirpath, name).relative_to(root).as_posix()
            if rel not in (MANIFEST, SUMS):
                found.append(rel)
    return sorted(found)


def build(root: Path) -> dict:
    """The manifest document for the files under ``root``."""
    files = []
    for rel in bundle_files(root):
        path = root / rel
        files.append({"path": rel, "size": path.stat().st_size, "sha256": sha256_file(path)})
    return {"schema": MANIFEST_SCHEMA, "files": files}


def render_sums(manifest: dict) -> str:
    """``sha256sum`` text format: lowercase hex, two spaces, path, LF."""
    return "".join(f"{f['sha256']}  {f['path']}\n" for f in manifest["files"])


def render_manifest(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode("utf-8")


def write(root: Path) -> str:
    """Write manifest.json and SHA256SUMS; returns manifest.json's sha256 (the bundle digest)."""
    from kvprobe import schema

    manifest = build(root)
    schema.validate(manifest, MANIFEST_SCHEMA, source=str(root / MANIFEST))
    data = render_manifest(manifest)
    (root / MANIFEST).write_bytes(data)
    (root / SUMS).write_text(render_sums(manifest), encoding="utf-8")
    return sha256_bytes(data)

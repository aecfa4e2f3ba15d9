"""manifest.json and SHA256SUMS in the writer's canonical formats."""

from __future__ import annotations

import hashlib
import json

from kvprobe import files
from kvprobe.evidence import manifest


def test_manifest_and_sums_cover_every_other_file(tmp_path):
    (tmp_path / "raw" / "base").mkdir(parents=True)
    (tmp_path / "raw" / "base" / "p.json").write_bytes(b"{}\n")
    (tmp_path / "receipt.json").write_bytes(b'{"a": 1}\n')
    digest = manifest.write(tmp_path)
    data = (tmp_path / "manifest.json").read_bytes()
    assert digest == hashlib.sha256(data).hexdigest()
    doc = json.loads(data)
    assert [f["path"] for f in doc["files"]] == ["raw/base/p.json", "receipt.json"]
    assert doc["files"][0] == {"path": "raw/base/p.json", "size": 3, "sha256": hashlib.sha256(b"{}\n").hexdigest()}
    sums = (tmp_path / "SHA256SUMS").read_text()
    assert sums == "".join(f"{f['sha256']}  {f['path']}\n" for f in doc["files"])


def test_streaming_hash_matches_hashlib(tmp_path):
    blob = bytes(range(256)) * 10000
    (tmp_path / "f").write_bytes(blob)
    assert files.sha256_file(tmp_path / "f") == hashlib.sha256(blob).hexdigest()

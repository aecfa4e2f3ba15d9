"""Build small, valid wheel files for tests (RECORD with real digests)."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(
    directory: Path,
    name: str = "minipkg",
    version: str = "1.0",
    files: dict[str, str] | None = None,
    *,
    unrecorded: dict[str, str] | None = None,
    phantoms: tuple[str, ...] = (),
) -> Path:
    """A pure-Python wheel ``name-version-py3-none-any.whl`` holding ``files``. For tamper
    tests: ``unrecorded`` files are in the zip but not in RECORD, ``phantoms`` are RECORD
    lines for files the zip does not hold."""
    files = files or {f"{name}/__init__.py": f"VERSION = {version!r}\n"}
    dist_info = f"{name}-{version}.dist-info"
    members = {path: text.encode() for path, text in files.items()}
    members[f"{dist_info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    members[f"{dist_info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: kvprobe-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = "".join(f"{path},{_digest(data)},{len(data)}\n" for path, data in members.items())
    record += "".join(f"{path},{_digest(b'gone')},4\n" for path in phantoms)
    record += f"{dist_info}/RECORD,,\n"
    members[f"{dist_info}/RECORD"] = record.encode()
    members.update({path: text.encode() for path, text in (unrecorded or {}).items()})
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in members.items():
            archive.writestr(zipfile.ZipInfo(member, date_time=(2026, 1, 1, 0, 0, 0)), data)
    return path

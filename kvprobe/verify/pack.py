"""Bundle archives: a deterministic .tar.gz of a bundle that verifies.

Entries sorted by path under one top directory named after the run id; mtime 0, uid/gid 0,
empty owner names, modes 0755/0644, PAX format; gzip header with mtime 0 and no file name.
The same bundle gives the same bytes. Reading an archive back is
:mod:`kvprobe.evidence.archive`.
"""

from __future__ import annotations

import gzip
import os
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kvprobe.defects import NotABundle
from kvprobe.errors import BundleExistsError, UsageError
from kvprobe.evidence.safetree import Limits, Tree, path_problem
from kvprobe.files import input_refusal, output_refusal
from kvprobe.verify.steps import VerifyOptions, verify_dir

_DIR_MODE, _FILE_MODE = 0o755, 0o644


@dataclass(frozen=True)
class PackResult:
    archive: Path
    sha256: str
    manifest_sha256: str
    top: str


# --- pack --------------------------------------------------------------------------------


def default_output(bundle: Path) -> Path:
    return bundle.resolve().with_name(bundle.resolve().name + ".tar.gz")


def pack(bundle: Path, out: Path | None = None, limits: Limits = Limits(), *, force: bool = False) -> PackResult:
    """Verify ``bundle`` (a directory), then write its deterministic archive to ``out``.

    Raises NotABundle, UsageError (the bundle does not verify), BundleExistsError (``out``
    exists and ``force`` is not set).
    """
    if not Path(bundle).is_dir():
        raise NotABundle(f"{bundle}: not a bundle directory")
    inside = input_refusal(Path(out), Path(bundle)) if out else None
    if inside is not None:
        raise UsageError(inside)
    report = verify_dir(Path(bundle), VerifyOptions(limits=limits))
    if not report.ok:
        raise UsageError(
            f"{bundle} does not verify; refusing to pack it", hints=[d.message for d in report.defects[:20]]
        )
    top = report.run_id
    if not top or path_problem(top) or "/" in top:
        raise UsageError(f"{bundle}: run_id {top!r} cannot name the archive's top directory")
    out = Path(out) if out else default_output(Path(bundle))
    refusal = output_refusal(out, force)  # the one rule of every -o (kvprobe.files)
    if refusal is not None:
        raise BundleExistsError(refusal)
    digest = _write_atomic(Path(bundle), out, top, limits)
    return PackResult(out, digest, report.manifest_sha256 or "", top)


def _write_atomic(bundle: Path, out: Path, top: str, limits: Limits) -> str:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.tmp-")
    try:
        with os.fdopen(fd, "wb") as raw:
            _write_archive(bundle, raw, top, limits)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    from kvprobe.files import sha256_file

    return sha256_file(out)


def _write_archive(bundle: Path, raw: BinaryIO, top: str, limits: Limits) -> None:
    with (
        Tree(bundle) as tree,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8") as tar,
    ):
        tar.addfile(_info(top, tarfile.DIRTYPE, 0))
        for rel, entry in sorted(tree.scan(limits).entries.items()):
            if entry.kind == "dir":
                tar.addfile(_info(f"{top}/{rel}", tarfile.DIRTYPE, 0))
            else:
                fd = tree.open_regular(rel)
                with os.fdopen(fd, "rb") as handle:
                    tar.addfile(_info(f"{top}/{rel}", tarfile.REGTYPE, os.fstat(fd).st_size), handle)


def _info(name: str, kind: bytes, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mtime = kind, size, 0
    info.mode = _DIR_MODE if kind == tarfile.DIRTYPE else _FILE_MODE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info

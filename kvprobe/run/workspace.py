"""The bundle workspace of run, sweep and gates: where a bundle is made, and how it is published.

A :class:`Workspace` is a private work dir (trees, the fork server's files, scratch) and a
staging dir the bundle is written in; :meth:`Workspace.seal` validates the receipt, writes the
README and manifest, verifies the staged bundle as a reader would and only then renames it
into place. However the pipeline ends (an error, an interrupt), closing the workspace removes
both: nothing half-written is left. :func:`bundle_path` is the ``--out`` rule.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from kvprobe.env.cache import default_cache_root
from kvprobe.errors import BundleExistsError, CheckRunError, UsageError
from kvprobe.evidence.bundle import seal_bundle
from kvprobe.verify.steps import VerifyOptions, verify

R = TypeVar("R")

# The comparison with kvprobe's installed copy left out: a project may run its own edit of an experiment.
OWN_EDITS = VerifyOptions(check_installed=False)


@dataclass(frozen=True)
class SealedBundle(Generic[R]):
    """A bundle sealed, verified and in place: its path, its receipt, manifest.json's sha256."""

    bundle: Path
    receipt: R
    manifest_sha256: str


def bundle_path(out: Path | None, bundles_dir: Path, name: str) -> Path:
    """Where a bundle goes: ``--out`` (BundleExistsError when it exists and is not an empty
    directory; UsageError inside kvprobe's cache, whose `cache prune` removes what it does not
    know there), else ``bundles_dir/name``."""
    if out is not None:
        cache = Path(os.path.realpath(default_cache_root()))
        if cache in Path(os.path.realpath(out)).parents or Path(os.path.realpath(out)) == cache:
            raise UsageError(
                f"--out {out} is inside kvprobe's cache ({cache}): `kvprobe cache prune` removes a directory "
                "it does not know there; write the bundle outside the cache"
            )
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise BundleExistsError(f"--out {out} exists and is not empty; refusing to overwrite")
        return out.resolve()
    return (bundles_dir / name).resolve()


class Workspace:
    """Where one bundle is made before it is published at ``final``; a context manager
    (closing removes the work dir and a staging dir left unpublished)."""

    def __init__(self, final: Path, prefix: str) -> None:
        self.final = final
        self.work = Path(tempfile.mkdtemp(prefix=prefix))
        self._staging: Path | None = None

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stage(self, beside: bool = False) -> Path:
        """Make the staging dir: in the work dir, or ``beside`` the final path (a sweep's,
        which its units' outputs are merged into: published by a rename on one file system)."""
        if beside:
            self.final.parent.mkdir(parents=True, exist_ok=True)
            self._staging = Path(tempfile.mkdtemp(dir=self.final.parent, prefix=f".{self.final.name}.tmp-"))
        else:
            self._staging = self.work / "bundle"
            self._staging.mkdir()
        return self._staging

    @property
    def staging(self) -> Path:
        assert self._staging is not None, "stage() made the staging dir"
        return self._staging

    def seal(
        self, receipt: R, doc: dict[str, Any], schema: str, readme: str, options: VerifyOptions = OWN_EDITS
    ) -> SealedBundle[R]:
        """Seal the staged bundle with ``doc`` (``receipt`` as JSON, held to ``schema``) and
        ``readme``, verify it with ``options`` as a reader would, and publish it at ``final``."""

        def check(staging: Path) -> None:
            _verify_on_write(staging, options)

        digest = seal_bundle(doc, schema, readme, self.staging, self.final, check=check)
        return SealedBundle(self.final, receipt, digest)

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
        if self._staging is not None and self._staging.exists():
            shutil.rmtree(self._staging, ignore_errors=True)


def _verify_on_write(staging: Path, options: VerifyOptions) -> None:
    """The bundle must pass the same offline verification a reader will run on it."""
    report = verify(staging, options)
    if not report.ok:
        details = "; ".join(str(d) for d in report.defects[:3])
        raise CheckRunError(f"the new bundle failed its own verification: {details}")

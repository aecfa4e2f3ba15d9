"""The one bundle reader: a bundle directory read as untrusted input, within limits.

Files are opened through :class:`~kvprobe.evidence.safetree.Tree` (no symlink is followed,
nothing outside the root is reached) and JSON is parsed strictly
(:mod:`kvprobe.strict_json`). A read that fails is a defect appended to the
caller's list, never an exception: verification reports every defect it finds.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass, field
from typing import Any

from kvprobe.defects import BundleDefect, TomlMalformed, Unreadable
from kvprobe.evidence.safetree import Limits, NotRegularFile, Scan, Tree, path_problem
from kvprobe.strict_json import depth, value_bound
from kvprobe.strict_json import loads as strict_loads


@dataclass
class Bundle:
    """What has been read of one bundle; later readers use what earlier ones could read."""

    tree: Tree
    limits: Limits
    scan: Scan | None = None
    receipt: dict[str, Any] | None = None
    manifest: dict[str, Any] | None = None
    manifest_bytes: bytes | None = None
    experiment: dict[str, Any] | None = None
    experiment_bytes: bytes | None = None
    raw_docs: dict[str, Any] = field(default_factory=dict)
    # a gates receipt's gate-2 experiment files, by bundle path (step 2 read and schema-checked them)
    experiment_docs: dict[str, Any] = field(default_factory=dict)
    receipt_family: str = "kvprobe.receipt"
    # the sha256 of the bytes each read_bytes returned, by path: what was parsed must be what
    # the manifest lists, not only what a second read for hashing found (verify/integrity)
    read_digests: dict[str, str] = field(default_factory=dict)

    def listed(self) -> dict[str, dict[str, Any]]:
        return {f["path"]: f for f in (self.manifest or {}).get("files", [])}

    # Later steps run only when an earlier one read what they need; these say so to the type checker.

    @property
    def scanned(self) -> Scan:
        """The step 1 scan (every step after 1 runs on it)."""
        assert self.scan is not None, "step 1 has not scanned the bundle"
        return self.scan

    @property
    def accepted_receipt(self) -> dict[str, Any]:
        """The receipt step 2 accepted (steps 4 and 6 run only when it did)."""
        assert self.receipt is not None, "step 2 did not accept the receipt"
        return self.receipt

    @property
    def accepted_manifest(self) -> dict[str, Any]:
        """The manifest step 2 accepted (steps 3 and 4 run only when it did)."""
        assert self.manifest is not None, "step 2 did not accept the manifest"
        return self.manifest


def read_bytes(bundle: Bundle, rel: str, cap: int, defects: list[BundleDefect]) -> bytes | None:
    """The bytes at ``rel`` (at most ``cap``), or None with an Unreadable defect appended."""
    problem = path_problem(rel, bundle.limits)
    if problem:
        defects.append(Unreadable(str(rel), problem))
        return None
    try:
        data = bundle.tree.read_bytes(rel, cap)
        bundle.read_digests[rel] = hashlib.sha256(data).hexdigest()
        return data
    except FileNotFoundError:
        defects.append(Unreadable(rel, "missing"))
    except NotRegularFile as exc:
        defects.append(Unreadable(rel, str(exc)))
    except ValueError as exc:
        defects.append(Unreadable(rel, f"too large to read: {exc}"))
    except OSError as exc:
        defects.append(Unreadable(rel, f"cannot open without following links ({exc.strerror})"))
    return None


def read_json(bundle: Bundle, rel: str, defects: list[BundleDefect]) -> Any:
    """Strictly parsed document at ``rel``, or None with the defect appended."""
    return parse_json(bundle, rel, read_bytes(bundle, rel, bundle.limits.max_json_bytes, defects), defects)


def parse_json(bundle: Bundle, rel: str, data: bytes | None, defects: list[BundleDefect]) -> Any:
    if data is None:
        return None
    try:
        return strict_loads(
            data,
            rel,
            max_bytes=bundle.limits.max_json_bytes,
            max_depth=bundle.limits.max_json_depth,
            max_values=bundle.limits.max_json_values,
        )
    except BundleDefect as defect:
        defects.append(defect)
        return None


def read_toml(bundle: Bundle, rel: str, defects: list[BundleDefect]) -> tuple[bytes | None, Any]:
    """(bytes, parsed document) of a TOML file within the TOML caps; (bytes or None, None) with
    the defect appended. tomllib recurses, so nesting is bounded before parsing it."""
    data = read_bytes(bundle, rel, bundle.limits.max_toml_bytes, defects)
    if data is None:
        return None, None
    if value_bound(data) > bundle.limits.max_json_values:
        defects.append(TomlMalformed(rel, f"more than {bundle.limits.max_json_values} values"))
        return data, None
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        defects.append(TomlMalformed(rel, f"not valid TOML: {exc}"))
        return data, None
    except RecursionError:
        doc = None
    if doc is None or depth(doc) > bundle.limits.max_json_depth:
        defects.append(TomlMalformed(rel, f"nested deeper than {bundle.limits.max_json_depth}"))
        return data, None
    return data, doc

"""Step 5's trust anchor: a bundle of an experiment kvprobe ships, compared with the installed copy.

A bundle that agrees with itself proves only that. When it names an experiment the installed
kvprobe ships, its experiment file and probe sources must be that copy's bytes, file by file.
The copy is kvprobe's own ``probes/`` (:func:`kvprobe.resources.builtin_probes_dir`), never
``$KVPROBE_PROBES_PATH`` or ``./probes``: a bundle, or the directory it is verified from, can
supply those.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from kvprobe import __version__
from kvprobe.defects import BundleDefect, DiffersFromInstalled
from kvprobe.evidence.reader import Bundle
from kvprobe.experiments.experiment import bundled_files
from kvprobe.model.receipt import Receipt
from kvprobe.model.records import ID_RE
from kvprobe.model.sweep_receipt import SweepReceipt
from kvprobe.names import PROBES_DIR
from kvprobe.resources import builtin_probes_dir


@dataclass
class Anchor:
    """The outcome of comparing one bundle with the installed experiment of the same id."""

    experiment: str
    installed: Path
    defects: list[BundleDefect] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"kvprobe {__version__}'s {self.experiment}"


def installed_experiment(exp_id: str) -> Path | None:
    """kvprobe's own directory of experiment ``exp_id``, or None when kvprobe does not ship it."""
    if not isinstance(exp_id, str) or not ID_RE.match(exp_id):
        return None
    directory = builtin_probes_dir() / exp_id
    return directory if (directory / "experiment.toml").is_file() else None


def installed_digests(directory: Path) -> dict[str, str]:
    """{name: sha256} of what a run copies into a bundle: experiment.toml and the .py beside it."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in bundled_files(directory)}


def compare_installed(bundle: Bundle, receipt: Receipt | SweepReceipt) -> Anchor | None:
    """The bundle's ``probes/<id>/`` against the installed copy (digests from the manifest,
    which step 3 checked); None when the bundle's experiment is not one kvprobe ships."""
    return compare_experiment(bundle, receipt.experiment.id, receipt.tool.version)


def compare_experiment(bundle: Bundle, exp_id: str, made_by: str) -> Anchor | None:
    """The bundle's ``probes/<exp_id>/`` against the installed copy (``made_by``: the kvprobe
    version that wrote the bundle); None when kvprobe does not ship it."""
    directory = installed_experiment(exp_id)
    if directory is None or bundle.manifest is None:
        return None
    anchor = Anchor(exp_id, directory)
    want = installed_digests(directory)
    prefix = f"{PROBES_DIR}/{exp_id}/"
    have = {rel[len(prefix) :]: e["sha256"] for rel, e in bundle.listed().items() if rel.startswith(prefix)}
    other = f" (the bundle was made by kvprobe {made_by})" if made_by != __version__ else ""
    for name in sorted(set(have) | set(want)):
        rel = prefix + name
        if name not in want:
            detail = f"not in {anchor.label}: an extra file beside its probes{other}"
        elif name not in have:
            detail = f"missing: {anchor.label} has it{other}"
        elif have[name] != want[name]:
            detail = f"differs from {anchor.label}: sha256 {have[name]}, installed {want[name]}{other}"
        else:
            continue
        anchor.defects.append(DiffersFromInstalled(rel, detail))
    return anchor

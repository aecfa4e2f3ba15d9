"""The operator's SGLang for gates 2-4: a pinned release version, a wheel file or an installed path."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvprobe import files
from kvprobe.errors import UsageError
from kvprobe.evidence import manifest
from kvprobe.progress import Reporter
from kvprobe.rules import gate_probes

VERSION_RE = re.compile(r"^\d+\.\d+\.\d+(?:\.post\d+|rc\d+)?$")


@dataclass(frozen=True)
class Target:
    """The operator's SGLang as a directory to put first on PYTHONPATH (it holds ``sglang/``)."""

    spec: str
    kind: str  # "version", "wheel", "path"
    import_root: Path
    code_root: Path
    identity: dict[str, Any]


def release_pins() -> dict[str, Any]:
    """version -> WheelPin for every sglang wheel the behavioural gates' experiments pin."""
    from kvprobe.experiments import experiment
    from kvprobe.model.records import WheelPin

    pins: dict[str, Any] = {}
    for exp_id in (e for rule in gate_probes.RULES.values() for e in rule.experiments):
        for pin_set in experiment.load(exp_id).pin_sets.values():
            for pin in (pin_set.base, pin_set.head):
                if isinstance(pin, WheelPin):  # a wheel pin set's sides
                    pins.setdefault(pin.version, pin)
    return pins


def resolve_target(spec: str, work: Path, cache_root: Path, reporter: Reporter) -> Target:
    """A release version, a wheel file or an installed package path; UsageError otherwise."""
    path = Path(spec)
    if path.is_dir():
        return _target_from_dir(spec, path, work)
    if path.is_file() and path.suffix == ".whl":
        return _target_from_wheel(spec, path, work)
    if VERSION_RE.match(spec):
        return _target_from_release(spec, work, cache_root, reporter)
    raise UsageError(f"--sglang {spec!r}: not a directory holding sglang/, a .whl file or a version like 0.5.22")


def _target_from_release(version: str, work: Path, cache_root: Path, reporter: Reporter) -> Target:
    """A version the experiments pin is fetched by its pinned digest; any other release on the
    index is resolved by version and its digest recorded (issue #12: gates on any release)."""
    from kvprobe.sources import releases
    from kvprobe.sources.wheel import WheelSource

    source = WheelSource(cache_root, reporter=reporter)
    pin = release_pins().get(version)
    pinned_by = "experiment pin"
    if pin is None:
        with reporter.step(f"resolving sglang {version} on the index"):
            try:
                pin = releases.resolve("sglang", version, ["--only-binary=:all:"], work / "resolve")
            except UsageError as exc:
                raise UsageError(f"--sglang {version}: {exc.message}") from None
        pinned_by = "index (resolved by version: the sha256 the index publishes, the bytes received checked against it)"
    tree = work / "target" / "tree"
    tree.parent.mkdir(parents=True)
    with reporter.step(f"materializing {pin.filename}"):
        identity = source.materialize(pin, tree)
    if not (tree / "sglang" / "srt").is_dir():
        raise UsageError(f"--sglang {version}: the wheel {pin.filename} holds no sglang/srt package")
    return Target(version, "version", tree, tree, {**identity, "pinned_by": pinned_by})


def _target_from_dir(spec: str, path: Path, work: Path) -> Target:
    path = path.resolve()
    if (path / "sglang" / "srt").is_dir():
        root = path
    elif path.name == "sglang" and (path / "srt").is_dir():
        root = path.parent
    else:
        raise UsageError(f"--sglang {spec}: neither {path}/sglang/srt nor {path}/srt exists")
    # Only sglang/ goes on PYTHONPATH: a whole site-packages would shadow the env's torch & co.
    link_root = work / "target" / "import"
    link_root.mkdir(parents=True)
    (link_root / "sglang").symlink_to(root / "sglang", target_is_directory=True)
    identity = {
        "kind": "path",
        "path": root.name,  # the directory's name only: the operator's layout is not the bundle's
        "version": _dist_version(root),
        "tree_sha256": _tree_digest(root / "sglang"),
    }
    return Target(spec, "path", link_root, root, identity)


def _target_from_wheel(spec: str, path: Path, work: Path) -> Target:
    from kvprobe.sources.wheel import pin_for_file, safe_unzip

    pin = pin_for_file(path)
    tree = work / "target" / "tree"
    tree.mkdir(parents=True)
    safe_unzip(path, tree)
    if not (tree / "sglang" / "srt").is_dir():
        raise UsageError(f"--sglang {spec}: the wheel holds no sglang/srt package")
    return Target(spec, "wheel", tree, tree, {**pin.identity(), "fetched_via": "local file"})


def _dist_version(root: Path) -> str | None:
    for meta in sorted(root.glob("sglang-*.dist-info/METADATA")):
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def _tree_digest(package: Path) -> str:
    """sha256 over (relative path, sha256) of every .py file: names the code that ran."""
    lines = [
        f"{files.sha256_file(p)}  {p.relative_to(package).as_posix()}\n"
        for p in sorted(package.rglob("*.py"))
        if p.is_file()
    ]
    return manifest.sha256_bytes("".join(lines).encode())

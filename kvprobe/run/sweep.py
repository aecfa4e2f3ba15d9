"""`kvprobe sweep`: one experiment's probes on every release of a range, into one bundle.

Each (experiment, release) unit is independent: resolve the release's wheel on the index
(sha256 recorded), unpack it, run the probes in the profile's env, classify (pure,
evidence/sweep). Units run in parallel with --jobs; the env is built once per lock and
each wheel fetched once per digest (both through the cache).
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kvprobe import __version__
from kvprobe.checks import probes
from kvprobe.env.cache import default_cache_root
from kvprobe.env.venv import load_profile
from kvprobe.errors import BundleExistsError, CheckoutError, CheckRunError, DigestMismatch, FetchError, UsageError
from kvprobe.evidence import sweep as classify
from kvprobe.evidence.bundle import file_ref, seal_bundle
from kvprobe.evidence.sweep_view import TIMELINE, render_readme, timeline_svg
from kvprobe.files import write_atomic
from kvprobe.model.receipt import EnvRecord
from kvprobe.model.records import Experiment, PinSet, SourceKind, WheelPin
from kvprobe.names import LOGS_DIR, PROBES_DIR, RAW_DIR, SIDES, SWEEP_RECEIPT_SCHEMA
from kvprobe.progress import Reporter
from kvprobe.run.side import environment
from kvprobe.sources import releases
from kvprobe.sources.wheel import WheelSource, platform_args
from kvprobe.verify.steps import verify


@dataclass
class SweepOptions:
    releases: str | None = None  # --releases SPEC; None: every release the profile serves
    out: Path | None = None
    cache_root: Path = field(default_factory=lambda: default_cache_root())
    torch_index: str | None = None
    jobs: int = field(default_factory=lambda: min(2, os.cpu_count() or 1))
    timeout_s: float = 900.0
    bundles_dir: Path = field(default_factory=lambda: Path("bundles"))


@dataclass(frozen=True)
class SweepResult:
    bundle: Path
    receipt: dict[str, Any]
    manifest_sha256: str


@dataclass(frozen=True)
class UnitContext:
    """What every (experiment, release) unit of one sweep shares."""

    exp: Experiment
    package: str
    flags: list[str]
    python: str
    env_vars: dict[str, str]
    staging: Path
    work: Path
    wheels: WheelSource
    timeout_s: float


def sweep_experiment(exp: Experiment, opts: SweepOptions, reporter: Reporter | None = None) -> SweepResult:
    """Run ``exp``'s probes on each selected release and write the sweep bundle."""
    reporter = reporter or Reporter()
    pin_set = wheel_pin_set(exp)
    if not any(exp.expectations.get(side) for side in SIDES):
        raise UsageError(f"{exp.id} declares no [expect] tables: a sweep classifies releases against them")
    profile = load_profile(exp.profile)
    assert isinstance(pin_set.head, WheelPin), "wheel_pin_set returns a wheel pin set"
    package, flags = pin_set.head.package, platform_args(pin_set.head.filename)
    started = datetime.now(UTC)
    final = _final_path(opts, exp, started)
    work = Path(tempfile.mkdtemp(prefix="kvprobe-sweep-"))
    held = contextlib.ExitStack()
    staging: Path | None = None
    try:
        with reporter.step(f"{package}: releases on the index"):
            available = releases.index_versions(package, flags, work / "index")
        chosen = releases.select(opts.releases, available) if opts.releases else available
        served = [v for v in chosen if releases.serves(profile.serves, v)]
        unserved = [v for v in chosen if v not in served]
        if not served:
            raise UsageError(
                f"no selected release is served by profile {profile.name!r} (serves {profile.serves}); "
                f"selected: {', '.join(chosen) or 'none'}"
            )
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.tmp-"))
        clock = time.monotonic()
        env, python, env_vars = environment(exp, pin_set, opts, reporter, held)
        timings = {"environment_s": time.monotonic() - clock}
        _copy_probes(exp, staging)
        wheels = WheelSource(opts.cache_root, reporter=reporter)
        ctx = UnitContext(exp, package, flags, python, env_vars, staging, work, wheels, opts.timeout_s)
        clock = time.monotonic()
        with (
            reporter.step(f"sweeping {len(served)} releases ({opts.jobs} at a time)"),
            ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool,
        ):
            units = list(pool.map(lambda version: run_unit(ctx, version, reporter), served))
        timings["units_s"] = time.monotonic() - clock
        receipt = _receipt(exp, profile.name, profile.serves, opts, started, env, env_vars, units, unserved, timings)
        write_atomic(staging / TIMELINE, timeline_svg(receipt).encode("utf-8"))
        digest = seal_bundle(
            receipt, SWEEP_RECEIPT_SCHEMA, render_readme(receipt), staging, final, check=_verify_on_write
        )
        return SweepResult(final, receipt, digest)
    finally:
        held.close()
        shutil.rmtree(work, ignore_errors=True)
        if staging is not None and staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def wheel_pin_set(exp: Experiment) -> PinSet:
    """The experiment's wheel pin set (its default if that is one): it names the package and
    the wheel tags (platform, Python) every release is resolved for."""
    ordered = [exp.pin_sets[exp.default_pin_set], *exp.pin_sets.values()]
    for pin_set in ordered:
        if pin_set.kind is SourceKind.WHEEL:
            return pin_set
    raise UsageError(f"{exp.id} has no wheel pin set: a sweep runs release wheels of the package a wheel pin names")


def _final_path(opts: SweepOptions, exp: Experiment, started: datetime) -> Path:
    if opts.out is not None:
        if opts.out.exists() and (not opts.out.is_dir() or any(opts.out.iterdir())):
            raise BundleExistsError(f"--out {opts.out} exists and is not empty; refusing to overwrite")
        return opts.out.resolve()
    return (opts.bundles_dir / f"{exp.id}-sweep-{started.strftime('%Y%m%dT%H%M%SZ')}").resolve()


def _copy_probes(exp: Experiment, staging: Path) -> None:
    probe_dir = staging / PROBES_DIR / exp.id
    probe_dir.mkdir(parents=True)
    shutil.copy2(exp.directory / "experiment.toml", probe_dir / "experiment.toml")
    for source in sorted(p for p in exp.directory.glob("*.py") if p.is_file() and not p.is_symlink()):
        shutil.copy2(source, probe_dir / source.name)


def run_unit(ctx: UnitContext, version: str, reporter: Reporter) -> dict[str, Any]:
    """One release: its wheel (resolved, fetched, RECORD-checked), its probes, their raw
    outputs under raw/<version>/, and its classification."""
    clock = time.monotonic()
    scratch = ctx.work / "units" / version
    scratch.mkdir(parents=True)
    entry: dict[str, Any] = {"version": version, "wheel": None, "problem": None, "probes": []}
    held = contextlib.ExitStack()  # probes write nothing into the tree: the cached one, used in place
    try:
        reporter.update(f"{version}: wheel")
        pin = releases.resolve(ctx.package, version, ctx.flags, scratch / "resolve")
        identity = ctx.wheels.materialize(pin, scratch / "tree", python=ctx.python, hold=held)
        entry["wheel"] = {
            "package": pin.package,
            "version": pin.version,
            "file": pin.filename,
            "sha256": pin.sha256,
            "fetched_via": identity["fetched_via"],
        }
    except (FetchError, DigestMismatch, CheckoutError, UsageError) as exc:
        entry["problem"] = f"wheel: {exc}"
    docs: dict[str, dict[str, Any]] = {}
    if entry["problem"] is None:
        for check in ctx.exp.probes:
            reporter.update(f"{version}: probe {check.name}")
            record, doc = _probe(ctx, version, scratch, check.name, check.path)
            entry["probes"].append(record)
            if doc is not None:
                docs[check.name] = doc
    held.close()  # the lease: `cache prune` may remove the tree again
    expect = {side: ctx.exp.expectations.get(side, {}) for side in SIDES}
    entry["classification"] = classify.classify_release(expect, docs, classify.release_problems(entry))
    entry["duration_s"] = round(time.monotonic() - clock, 3)
    return entry


def _probe(
    ctx: UnitContext, version: str, scratch: Path, name: str, path: str
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    raw_dir = ctx.staging / RAW_DIR / version / "probes"
    log_dir = ctx.staging / LOGS_DIR / version / "probes"
    raw_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    out = raw_dir / f"{name}.json"
    home = scratch / "home"
    home.mkdir(exist_ok=True)
    run = probes.run_probe(
        python=ctx.python,
        probe_file=ctx.exp.directory / path,
        python_path=[scratch / "tree"],
        out_json=out,
        log_dir=log_dir,
        side_config={"side": "release", "release": version},
        env_extra=ctx.env_vars,
        scratch=home,
        timeout_s=ctx.timeout_s,
    )
    if not run.ok and out.exists():
        out.rename(out.with_suffix(".invalid.json"))
    record = {
        "name": name,
        "source": file_ref(ctx.staging / PROBES_DIR / ctx.exp.id / path, ctx.staging),
        "raw": file_ref(out, ctx.staging) if run.ok else None,
        "exit_code": run.exit_code,
        "problem": run.problem,
    }
    return record, run.output if run.ok else None


def _receipt(
    exp: Experiment,
    profile: str,
    serves: str | None,
    opts: SweepOptions,
    started: datetime,
    env: EnvRecord,
    env_vars: dict[str, str],
    units: list[dict[str, Any]],
    unserved: list[str],
    timings: dict[str, float],
) -> dict[str, Any]:
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    per_release = [u["duration_s"] for u in units]
    timings = {**timings, "release_max_s": max(per_release), "release_min_s": min(per_release)}
    return {
        "schema": SWEEP_RECEIPT_SCHEMA,
        "tool": {"name": "kvprobe", "version": __version__},
        "run_id": f"{exp.id}-sweep-{stamp}-{uuid.uuid4().hex[:6]}",
        "created_utc": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "experiment": {
            "id": exp.id,
            "title": exp.title,
            "file": f"{PROBES_DIR}/{exp.id}/experiment.toml",
            "sha256": exp.file_sha256,
            "upstream": exp.upstream,
            "fix": {"prs": list(exp.fix.prs), "release": exp.fix.release, "summary": exp.fix.summary},
            **({"vulnerability": exp.vulnerability.to_json()} if exp.vulnerability else {}),
        },
        "profile": {"name": profile, "serves": serves},
        "spec": opts.releases,
        "algorithm": classify.ALGORITHM,
        "env": env.to_json(),
        "host": {
            "system": platform.system(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "cpus": os.cpu_count() or 0,
            "jobs": opts.jobs,
        },
        "settings": dict(sorted(env_vars.items())),
        "expectations": {side: exp.expectations.get(side, {}) for side in SIDES},
        "releases": units,
        "unserved": unserved,
        "summary": classify.summary(units),
        "evidence": {
            "shows": exp.scope.shows,
            "does_not_show": list(exp.scope.does_not_show),
            "limits": [
                f"host: {platform.system()} {platform.machine()}, CPU only; no GPU, RDMA or model weights",
                "release wheels carry no upstream tests: only the probes ran on each release",
                f"releases the {profile} profile does not serve ({serves}) were not run: see unserved",
            ],
        },
        "timings": {k: round(v, 3) for k, v in timings.items()},
    }


def _verify_on_write(staging: Path) -> None:
    """The sweep bundle must pass the same offline verification a reader will run on it."""
    report = verify(staging)
    if report.outcome != "verified":
        details = "; ".join(str(d) for d in report.defects[:3])
        raise CheckRunError(f"the new sweep bundle failed its own verification: {details}")

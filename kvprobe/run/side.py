"""One side's checks: shared by `kvprobe run` and the gates' probes (their env and fork
server are the caller's :class:`kvprobe.run.session.CheckSession`).

A side is one materialized tree (base or head); its checks are the upstream test files
(head's version on both sides) and the experiment's probes. Raw outputs go to
``raw/<side>/...`` and logs to ``logs/<side>/...`` of the bundle being staged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvprobe.checks import probes, upstream
from kvprobe.checks.forkserver import ForkServer
from kvprobe.files import write_json
from kvprobe.model.records import Experiment, ModelPin, PinSet, ProbeCheck, Side
from kvprobe.names import LOGS_DIR, RAW_DIR, TEST_RUN_SCHEMA
from kvprobe.progress import Reporter


@dataclass(frozen=True)
class CheckContext:
    """What every check of one run needs: the experiment, its env, where outputs go."""

    exp: Experiment
    pin_set: PinSet
    python: str
    env_vars: dict[str, str]
    staging: Path
    work: Path
    timeout_s: float
    server: ForkServer | None = None  # checks fork from its preloaded interpreter; None: fresh ones
    repeat: int = 1  # run --repeat N: each probe runs N times


@dataclass(frozen=True)
class CheckPaths:
    """Where one side's checks import from and write to: raw outputs, logs, a scratch home."""

    side: Side
    python_path: list[Path]
    raw: Path
    logs: Path
    scratch: Path

    def sub(self, kind: str) -> CheckPaths:
        """The same, writing under ``raw/<kind>`` and ``logs/<kind>`` (tests, probes)."""
        return replace(self, raw=self.raw / kind, logs=self.logs / kind)


def run_side(
    ctx: CheckContext, side: Side, materialized: dict[str, Any], head_tests: dict[str, bytes], reporter: Reporter
) -> dict[str, Any]:
    tree = materialized["tree"]
    scratch = ctx.work / side.value / "home"
    scratch.mkdir(parents=True, exist_ok=True)
    paths = CheckPaths(
        side,
        [tree / p for p in ctx.pin_set.python_path],
        ctx.staging / RAW_DIR / side.value,
        ctx.staging / LOGS_DIR / side.value,
        scratch,
    )
    tests: list[dict[str, Any]] = []
    probe_runs: list[dict[str, Any]] = []
    with reporter.step(f"{side.value}: running checks"):
        for rel, data in head_tests.items():
            reporter.update(f"{side.value}: pytest {rel}")
            tests.append(run_test(ctx, paths.sub("tests"), tree, rel, data))
        for check in ctx.exp.probes:
            reporter.update(f"{side.value}: probe {check.name}")
            probe_runs.append(run_probe(ctx, paths.sub("probes"), check))
            again = []
            for run in range(2, ctx.repeat + 1):  # run --repeat N: the same probe, same server, again
                reporter.update(f"{side.value}: probe {check.name} (run {run} of {ctx.repeat})")
                again.append(run_probe(ctx, paths.sub("probes"), check, run))
            if again:
                probe_runs[-1]["repeats"] = again
    return {"tests": tests, "probes": probe_runs}


def run_test(ctx: CheckContext, paths: CheckPaths, tree: Path, rel: str, data: bytes) -> dict[str, Any]:
    raw_dir = paths.raw
    raw_dir.mkdir(parents=True, exist_ok=True)
    run = upstream.run_test_file(
        python=Path(ctx.python),
        tree=tree,
        rootdir_hint=None,
        test_rel=rel,
        head_test_bytes=data,
        python_path=paths.python_path,
        out_dir=raw_dir,
        log_dir=paths.logs,
        timeout_s=ctx.timeout_s,
        env_extra=ctx.env_vars,
        server=ctx.server,
    )
    report = None
    if run.report_path and Path(run.report_path).is_file():
        report = json.loads(Path(run.report_path).read_text(encoding="utf-8"))
        Path(run.report_path).unlink()  # embedded below: one raw document per check per side
    # timeouts and crashes are inside the report as per-test results; these two are not results
    problem = None if report is not None else f"pytest left no report (exit {run.exit_code})"
    if run.exit_code == 5:
        problem = "pytest collected no tests (exit 5): nothing ran"
    doc = {
        "schema": TEST_RUN_SCHEMA,
        "path": rel,
        "side": paths.side.value,
        "exit_code": run.exit_code,
        "timed_out": run.timed_out,
        "overlay": run.overlay,
        "problem": problem,
        "report": report,
    }
    raw_path = raw_dir / f"{_safe_name(rel)}.json"
    write_json(raw_path, doc)
    junit = Path(run.junit_path) if run.junit_path else None
    return {
        "path": rel,
        "doc": doc,
        "raw": raw_path,
        "junit": junit if junit and junit.is_file() else None,
        "duration_s": run.duration_s,
        "execution": run.execution,
    }


def run_probe(ctx: CheckContext, paths: CheckPaths, check: ProbeCheck, nth: int = 1) -> dict[str, Any]:
    """One run of a probe on one side; run 2..N (``run --repeat``) write ``<name>.repeat-<run>.json``."""
    if nth > 1:
        paths = replace(paths, logs=paths.logs / f"repeat-{nth}")
    paths.raw.mkdir(parents=True, exist_ok=True)
    paths.logs.mkdir(parents=True, exist_ok=True)
    out = paths.raw / (f"{check.name}.json" if nth == 1 else f"{check.name}.repeat-{nth}.json")
    pin = ctx.pin_set.pin(paths.side)
    side_config: dict[str, Any] = {"side": paths.side.value}
    if isinstance(pin, ModelPin):  # the synthetic pin set's sides are model switches
        side_config["switches"] = dict(pin.switches)
    run = probes.run_probe(
        python=ctx.python,
        probe_file=ctx.exp.directory / check.path,
        python_path=paths.python_path,
        out_json=out,
        log_dir=paths.logs,
        side_config=side_config,
        env_extra=ctx.env_vars,
        scratch=paths.scratch,
        timeout_s=ctx.timeout_s,
        server=ctx.server,
    )
    if not run.ok and out.exists():
        out.rename(out.with_suffix(".invalid.json"))
    return {"name": check.name, "path": check.path, "run": run, "raw": out if run.ok else None}


def _safe_name(rel: str) -> str:
    return rel.replace("/", "__")

"""`kvprobe run` and `kvprobe sweep`: experiments into run and sweep bundles, one or several."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kvprobe.cli.base import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_UNOBSERVED,
    emit_json,
    guarded,
    json_summary,
    main,
    streams_for,
    sweep_exit,
    torch_index_option,
    verdict_exit,
)
from kvprobe.cli.experiment_cmds import warn_shadowing, warn_unfinished
from kvprobe.errors import KvprobeError
from kvprobe.text import for_terminal

if TYPE_CHECKING:
    from rich.console import Console

    from kvprobe.cli.console import Output
    from kvprobe.model.receipt import Receipt
    from kvprobe.model.records import Experiment
    from kvprobe.model.sweep_receipt import SweepReceipt
    from kvprobe.run.runner import RunOptions
    from kvprobe.run.sweep_runner import SweepOptions
    from kvprobe.run.workspace import SealedBundle


def _run_options(
    pins: str | None,
    out: Path | None,
    repo: str | None,
    torch_index: str | None,
    jobs: int | None,
    timeout: int,
    preload: bool = True,
    keep_server_s: float | None = None,
    repeat: int = 1,
) -> RunOptions:
    from kvprobe.run.runner import RunOptions

    opts = RunOptions(
        pin_set=pins,
        out=out,
        repo=repo,
        torch_index=torch_index,
        timeout_s=float(timeout),
        preload=preload,
        keep_server_s=keep_server_s,
        repeat=repeat,
    )
    if jobs is not None:
        opts.jobs = jobs
    return opts


_several_out = click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Bundle directory (must not exist or be empty); with several experiments, the directory "
    "that holds one bundle per experiment, DIR/ID.",
)
_all_experiments = click.option(
    "--all",
    "every",
    is_flag=True,
    help="Every experiment kvprobe ships that runs in an env (all but `model`).",
)


def _chosen(ids: tuple[str, ...], every: bool) -> list[str]:
    """The experiment ids an invocation names: IDs, or --all (never both, never none, no repeats)."""
    from kvprobe.errors import UsageError
    from kvprobe.experiments.experiment import shipped_ids

    if every and ids:
        raise UsageError("give experiment ids or --all, not both")
    if not every and not ids:
        raise UsageError("give an experiment id (or several), or --all")
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise UsageError(f"experiment {repeated[0]} is named twice")
    return shipped_ids() if every else list(ids)


def _worst(codes: list[int]) -> int:
    """Several experiments' exit codes as one: the worst, 2 (bad input) over 3 (could not
    observe) over 1 (does not hold) over 0; 4 and interrupts are never reached here."""
    order = (EXIT_OK, EXIT_FAIL, EXIT_UNOBSERVED, 2)
    return max(codes, key=order.index)


@main.command("run")
@click.argument("experiment_ids", nargs=-1, metavar="ID [ID ...]")
@_all_experiments
@click.option("--pins", help="Pin set to run (default: the experiment's default; one experiment only).")
@_several_out
@click.option("--repo", help="Git URL or local path of a mirror/clone to fetch pins from (one experiment only).")
@torch_index_option("Index for torch/torchvision, https:// or file:// (e.g. https://download.pytorch.org/whl/cpu).")
@click.option(
    "--jobs",
    type=click.IntRange(1, 2),
    help="Run base and head in parallel (2) or in turn (1); default: 2 where there are 2+ cores.",
)
@click.option("--timeout", default=1800, show_default=True, type=click.IntRange(1), help="Seconds per check.")
@click.option(
    "--no-preload",
    is_flag=True,
    help="Run each check in a fresh interpreter, not forked from one that preloaded the "
    "profile's third-party modules (torch, transformers, ...).",
)
@click.option(
    "--keep-server",
    is_flag=True,
    help="Fork the checks from a preloaded interpreter kept between runs: the one a previous "
    "--keep-server run left running, or a new one that stays up after this run "
    "(`kvprobe cache servers` lists and stops them).",
)
@click.option(
    "--server-idle",
    type=click.IntRange(1),
    metavar="SECONDS",
    help="With --keep-server: a new kept server exits after this long with no run using it [default: 600].",
)
@json_summary
@click.option(
    "--record-expectations",
    "record",
    is_flag=True,
    help="After the run, show the observed values and write them into the experiment "
    "as its [expect] tables (exit 0 written, 1 declined).",
)
@click.option("--yes", is_flag=True, help="With --record-expectations: write without asking.")
@click.option(
    "--repeat",
    default=1,
    show_default=True,
    type=click.IntRange(1),
    metavar="N",
    help="Run each side's probes N times (upstream tests run once); a case whose observations "
    "differ between runs is unstable: never a match, and could-not-observe where expected.",
)
@guarded
def run_cmd(
    experiment_ids: tuple[str, ...],
    pins: str | None,
    out: Path | None,
    repo: str | None,
    torch_index: str | None,
    jobs: int | None,
    timeout: int,
    as_json: bool,
    record: bool = False,
    yes: bool = False,
    no_preload: bool = False,
    keep_server: bool = False,
    server_idle: int | None = None,
    every: bool = False,
    repeat: int = 1,
) -> int:
    """Reproduce experiments into evidence bundles, one per experiment (exit 0 reproduced, 1 not,
    3 could not observe; with several, the worst of them: 2 over 3 over 1 over 0).

    Several ids (or --all) run in turn, those of one profile sharing one env and one fork
    server; one verdict block per experiment on stdout, in order."""
    from kvprobe.cli.console import print_run_diagnostics, print_run_summary
    from kvprobe.errors import UsageError
    from kvprobe.experiments import experiment
    from kvprobe.model.records import Verdict
    from kvprobe.run.runner import run_experiment

    if keep_server and no_preload:
        raise UsageError("--keep-server keeps a preloaded interpreter: it cannot go with --no-preload")
    if server_idle is not None and not keep_server:
        raise UsageError("--server-idle is the idle limit of a kept server: it needs --keep-server")
    ids = _chosen(experiment_ids, every)
    keep_s = float(server_idle or 600) if keep_server else None
    if len(ids) > 1 or every:
        for flag, given in (("--pins", pins), ("--repo", repo), ("--record-expectations", record or None)):
            if given is not None:
                raise UsageError(f"{flag} applies to one experiment: run it with one id")
        opts = [
            _run_options(
                None, out / i if out else None, None, torch_index, jobs, timeout, not no_preload, keep_s, repeat
            )
            for i in ids
        ]
        return _run_several(ids, opts, as_json)
    exp = experiment.load(ids[0])
    streams = streams_for(as_json)
    warn_shadowing(streams, exp.id)
    result = run_experiment(
        exp,
        _run_options(pins, out, repo, torch_index, jobs, timeout, not no_preload, keep_s, repeat),
        streams.reporter(),
    )
    if streams.verbosity > -2:
        print_run_diagnostics(streams.err, result.receipt)
    if streams.results:
        print_run_summary(streams.out, result.receipt, str(result.bundle), result.manifest_sha256, streams.verbosity)
    if result.receipt.verdict is Verdict.REPRODUCED:
        warn_unfinished(streams, exp)
    if as_json:
        emit_json(run_summary(result))
    if record:
        return _record_expectations(exp, result.receipt, streams.err, yes)
    return verdict_exit(result.receipt.verdict)


def _several_error(experiment_id: str, exc: KvprobeError, streams: Output) -> dict[str, Any]:
    """One experiment of several that ended without a bundle: its error on stderr, a line in
    its place on stdout; its --json entry returned."""
    lines = [for_terminal(line) for line in exc.diagnostics()]
    streams.error(f"{experiment_id}: {lines[0]}")
    streams.result(f"{experiment_id}: no bundle ({lines[0]})")
    return {"experiment": experiment_id, "error": exc.message, "exit": exc.exit_code}


def _several(
    ids: list[str],
    opts: list[Any],
    as_json: bool,
    *,
    kind: str,
    check: Callable[[Any, Any], object],
    outcomes_of: Callable[[list[tuple[Any, Any]], Any], Any],
    report: Callable[[Output, str, Any], tuple[int, dict[str, Any]]],
) -> int:
    """`kvprobe run|sweep A B ...`: every experiment checked before any starts, then each in
    turn (``outcomes_of`` yields (experiment, result or KvprobeError)), its block printed by
    ``report`` as it ends (which returns its exit code and JSON summary); the worst exit code."""
    from kvprobe.experiments import experiment

    exps = [experiment.load(i) for i in ids]
    streams = streams_for(as_json)
    for exp, o in zip(exps, opts, strict=True):
        warn_shadowing(streams, exp.id)
        check(exp, o)
    codes, documents = [], []
    # closing: the shared servers stop here, not whenever the generator is collected
    with contextlib.closing(outcomes_of(list(zip(exps, opts, strict=True)), streams.reporter())) as ran:
        for exp, outcome in ran:
            if isinstance(outcome, KvprobeError):
                codes.append(outcome.exit_code)
                documents.append(_several_error(exp.id, outcome, streams))
                continue
            if streams.results:
                streams.out.print(f"experiment: {exp.id}", highlight=False, markup=False)
            code, summary = report(streams, exp.id, outcome)
            codes.append(code)
            documents.append({**summary, "exit": code})
    if as_json:
        emit_json({kind: documents, "exit": _worst(codes)})
    return _worst(codes)


def _run_several(ids: list[str], opts: list[RunOptions], as_json: bool) -> int:
    """`kvprobe run A B ...` (runner.run_experiments): one verdict block per experiment."""
    from kvprobe.cli.console import print_run_diagnostics, print_run_summary
    from kvprobe.run.runner import check_run, run_experiments

    def report(streams: Output, _exp_id: str, result: SealedBundle[Receipt]) -> tuple[int, dict[str, Any]]:
        if streams.verbosity > -2:
            print_run_diagnostics(streams.err, result.receipt)
        if streams.results:
            print_run_summary(
                streams.out, result.receipt, str(result.bundle), result.manifest_sha256, streams.verbosity
            )
        return verdict_exit(result.receipt.verdict), run_summary(result)

    return _several(ids, opts, as_json, kind="runs", check=check_run, outcomes_of=run_experiments, report=report)


@main.command("sweep")
@click.argument("experiment_ids", nargs=-1, metavar="ID [ID ...]")
@_all_experiments
@click.option(
    "--releases",
    "spec",
    help="Releases to run: ranges and lists, e.g. 0.5.13..0.5.23, 0.5.19,0.5.23 or >=0.5.20 "
    "(default: every release on the index the experiment's profile serves).",
)
@_several_out
@torch_index_option("Index for torch/torchvision (e.g. https://download.pytorch.org/whl/cpu).", checked=False)
@click.option("--jobs", type=click.IntRange(1), help="Releases run at a time (default: min(2, cores)).")
@click.option("--timeout", default=900, show_default=True, type=click.IntRange(1), help="Seconds per probe.")
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Where units run: threads here, or Ray tasks on the cluster at --address (needs kvprobe[ray]).",
)
@click.option("--address", help="The Ray cluster, HOST:PORT (with --executor ray).")
@click.option(
    "--unit-timeout",
    type=click.IntRange(1),
    help="Seconds a Ray unit (one release) may take (default: --timeout per probe + 600).",
)
@click.option(
    "--no-preload",
    is_flag=True,
    help="Run each probe in a fresh interpreter, not forked from the sweep's one that preloaded the "
    "profile's third-party modules (local units; units on Ray workers always run fresh).",
)
@click.option(
    "--no-reuse",
    is_flag=True,
    help="Observe every release again, taking no unit from the kvprobe cache (what it observes is "
    "still kept there). By default a unit the cache holds for the same experiment, wheel, env, "
    "kvprobe and settings is checked as a fresh one is and reused.",
)
@click.option(
    "--repeat",
    default=1,
    show_default=True,
    type=click.IntRange(1),
    metavar="N",
    help="Run each release's probes N times (a sweep runs no upstream tests); a release with a case "
    "whose observations differ between runs is could-not-observe (unstable), never affected or fixed.",
)
@json_summary
@guarded
def sweep_cmd(
    experiment_ids: tuple[str, ...],
    spec: str | None,
    out: Path | None,
    torch_index: str | None,
    jobs: int | None,
    timeout: int,
    executor: str,
    address: str | None,
    unit_timeout: int | None,
    no_preload: bool,
    no_reuse: bool,
    as_json: bool,
    every: bool = False,
    repeat: int = 1,
) -> int:
    """Classify each release in a range as affected, fixed, mixed, could not observe or not
    present, into one sweep bundle per experiment (exit 0 every release observed, 3 some could
    not be; with several, the worst of them: 2 over 3 over 0).

    Results on stdout (one line per release, the bundle, its manifest sha256); progress on
    stderr, a line per release as it is classified. Several ids (or --all) sweep in turn,
    sharing the index's listing, each release's wheel, and per profile one env and fork server."""
    from kvprobe.cli.console import print_sweep_summary
    from kvprobe.experiments import experiment
    from kvprobe.run.sweep_runner import SweepOptions, sweep_experiment

    ids = _chosen(experiment_ids, every)

    def options(bundle: Path | None) -> SweepOptions:
        opts = SweepOptions(
            releases=spec,
            out=bundle,
            torch_index=torch_index,
            timeout_s=timeout,
            executor=executor,
            address=address,
            unit_timeout_s=unit_timeout,
            preload=not no_preload,
            reuse=not no_reuse,
            repeat=repeat,
        )
        if jobs is not None:
            opts.jobs = jobs
        return opts

    if len(ids) > 1 or every:
        return _sweep_several(ids, [options(out / i if out else None) for i in ids], as_json)
    opts = options(out)
    exp = experiment.load(ids[0])
    streams = streams_for(as_json)
    warn_shadowing(streams, exp.id)
    result = sweep_experiment(exp, opts, streams.reporter())
    receipt = result.receipt
    if streams.results:
        print_sweep_summary(streams.out, receipt, str(result.bundle), result.manifest_sha256)
    if as_json:
        emit_json(_sweep_summary(result))
    return _sweep_exit(result)


def _sweep_summary(result: SealedBundle[SweepReceipt]) -> dict[str, Any]:
    receipt = result.receipt
    return {
        "bundle": str(result.bundle),
        "manifest_sha256": result.manifest_sha256,
        "summary": receipt.summary,
        "unserved": list(receipt.unserved),
    }


def _sweep_exit(result: SealedBundle[SweepReceipt]) -> int:
    return sweep_exit(result.receipt.summary, result.receipt.unserved)


def _sweep_several(ids: list[str], opts: list[SweepOptions], as_json: bool) -> int:
    """`kvprobe sweep A B ...` (run.sweep_runner.sweep_experiments): one sweep block per experiment."""
    from kvprobe.cli.console import print_sweep_summary
    from kvprobe.run.sweep_runner import check_sweep, sweep_experiments

    def report(streams: Output, exp_id: str, result: SealedBundle[SweepReceipt]) -> tuple[int, dict[str, Any]]:
        if streams.results:
            print_sweep_summary(streams.out, result.receipt, str(result.bundle), result.manifest_sha256)
        return _sweep_exit(result), {"experiment": exp_id, **_sweep_summary(result)}

    return _several(ids, opts, as_json, kind="sweeps", check=check_sweep, outcomes_of=sweep_experiments, report=report)


def run_summary(result: SealedBundle[Receipt]) -> dict[str, Any]:
    receipt = result.receipt
    comparison = receipt.comparison
    return {
        "verdict": receipt.verdict,
        "bundle": str(result.bundle),
        "manifest_sha256": result.manifest_sha256,
        "experiment": receipt.experiment.id,
        "pin_set": receipt.pin_set.name,
        "reasons": list(comparison.reasons),
        "observations": comparison.observations,
        "tests": comparison.tests,
        "test_summary": comparison.test_summary,
    }


def _record_expectations(exp: Experiment, receipt: Receipt, console: Console, yes: bool) -> int:
    """Show what the run observed, confirm, write it as the experiment's expectations."""
    from kvprobe.cli.console import data, print_recording
    from kvprobe.experiments import expectations

    recording = expectations.plan(exp, receipt)
    print_recording(console, recording)
    if not yes and not click.confirm(f"Write these expectations into {recording.path}?", default=False, err=True):
        console.print("nothing written")
        return EXIT_FAIL
    path = expectations.write(recording)
    console.print(f"expectations written to {data(path)}; check them with: kvprobe run {exp.id}")
    return EXIT_OK

"""The click CLI: arguments -> core call -> render -> exit code. The only place that exits."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kvprobe import __version__, names
from kvprobe.errors import Interrupted, KvprobeError
from kvprobe.text import for_shell, for_terminal

if TYPE_CHECKING:
    from rich.console import Console

    from kvprobe.cli.console import Output
    from kvprobe.evidence.safetree import Limits
    from kvprobe.model.receipt import Receipt
    from kvprobe.model.records import Experiment, GateStatus, Verdict
    from kvprobe.run.runner import RunOptions, RunResult
    from kvprobe.run.sweep import SweepOptions, SweepResult
    from kvprobe.verify.attestation import SignedStatement
    from kvprobe.verify.result import VerifyOutcome

EXIT_OK, EXIT_FAIL, EXIT_UNOBSERVED = 0, 1, 3  # 2 (usage) comes from UsageError.exit_code
EXIT_INTERNAL = 4  # a bug in kvprobe: never to be read as "the verdict does not hold" (1)


# The exit tables, keyed by the enums they map; built on use: `--help` imports no model.
def _verdict_exit(verdict: Verdict) -> int:
    from kvprobe.model.records import Verdict

    return {
        Verdict.REPRODUCED: EXIT_OK,
        Verdict.NOT_REPRODUCED: EXIT_FAIL,
        Verdict.NO_EXPECTATIONS: EXIT_FAIL,
        Verdict.COULD_NOT_OBSERVE: EXIT_UNOBSERVED,
        Verdict.ERROR: EXIT_UNOBSERVED,
    }[verdict]


def _gates_exit(status: GateStatus) -> int:
    from kvprobe.model.records import GateStatus

    return {GateStatus.PASS: EXIT_OK, GateStatus.FAIL: EXIT_FAIL, GateStatus.UNKNOWN: EXIT_UNOBSERVED}[status]


def _sweep_exit_of(summary: Mapping[str, list[str]]) -> int:
    """3 when a release could not be observed or lacked the probed code, else 0."""
    from kvprobe.model.records import SweepClass

    return EXIT_UNOBSERVED if {SweepClass.UNOBSERVED, SweepClass.NOT_PRESENT} & set(summary) else EXIT_OK


# self-consistent exits 0: exit 1 means "defects found", and a bundle that was just written is
# only ever self-consistent; a gate that must know who published it passes --require-anchor.
def _verify_exit(outcome: VerifyOutcome) -> int:
    from kvprobe.verify.result import VerifyOutcome

    return {
        VerifyOutcome.VERIFIED: EXIT_OK,
        VerifyOutcome.SELF_CONSISTENT: EXIT_OK,
        VerifyOutcome.FAILED: EXIT_FAIL,
        VerifyOutcome.COULD_NOT_RERUN: EXIT_UNOBSERVED,
    }[outcome]


def _fail(exc: KvprobeError, debug: bool) -> None:
    """One line (plus hints) on stderr, then the error's exit code."""
    if debug:
        import traceback

        traceback.print_exception(exc)
    lines = [for_terminal(line) for line in exc.diagnostics()]
    click.echo(f"kvprobe: error: {lines[0]}", err=True)
    for hint in lines[1:]:
        click.echo(f"  {hint}", err=True)
    sys.exit(exc.exit_code)


def _internal(exc: BaseException, debug: bool) -> None:
    """A crash (a bug, or memory or recursion exhausted): one line, exit 4; the traceback with --debug."""
    if debug:
        import traceback

        traceback.print_exception(exc)
    detail = " ".join(str(exc).split())[:200]
    click.echo(f"kvprobe: internal error: {type(exc).__name__}: {detail}", err=True)
    if not debug:
        click.echo("  this is a bug in kvprobe; rerun with --debug for the traceback", err=True)
    sys.exit(EXIT_INTERNAL)


def _on_signal(signum: int, frame: object) -> None:
    """SIGINT or SIGTERM: stop every process kvprobe is waiting for (so that threads waiting
    on them return), start no new one, and unwind the main thread through its ``finally``s."""
    from kvprobe import proc

    proc.interrupt(signum)
    raise Interrupted(signum)


def _catch_signals() -> dict[int, Any]:
    """Install :func:`_on_signal` for SIGINT and SIGTERM (main thread only); the previous handlers."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    previous: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, _on_signal)
    return previous


def _restore_signals(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _interrupted(signum: int) -> None:
    """One line: which signal, what it stopped, and what is left behind; exit 128 + signum."""
    from kvprobe import proc

    name = signal.Signals(signum).name
    proc.interrupt(signum)  # a KeyboardInterrupt from Python's own handler stopped nothing yet
    left = []
    try:
        from kvprobe.env.cache import default_cache_root, stale_builds

        left = [str(p) for p in stale_builds(default_cache_root())]
    except Exception:  # reporting what is left must not turn an interrupt into a crash
        left = []
    behind = (
        f"left behind: {', '.join(for_terminal(p) for p in left)} (`kvprobe cache prune` removes it)"
        if left
        else "nothing half-written was kept (writes are atomic, temporary files removed) and the cache "
        "holds only complete entries"
    )
    click.echo(f"kvprobe: interrupted by {name}: stopped the processes it started; {behind}", err=True)
    proc.reset_interrupt()
    sys.exit(128 + signum)


def _warn_probes_path() -> None:
    """One line per $KVPROBE_PROBES_PATH entry the search leaves out (it cannot be read)."""
    from kvprobe.resources import probes_path_skipped

    for entry, why in probes_path_skipped():
        click.echo(f"kvprobe: warning: KVPROBE_PROBES_PATH entry {for_terminal(entry)} skipped: {why}", err=True)


def guarded(func: Callable[..., int]) -> Callable[..., None]:
    """Run a command body; map KvprobeError to its exit code, the body's int to the exit."""
    import functools

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        debug = click.get_current_context().meta.get(_DEBUG, False)
        _warn_probes_path()
        previous = _catch_signals()
        try:
            code = func(*args, **kwargs)
        except KvprobeError as exc:
            if kwargs.get("as_json"):
                emit_json_error(_error_code(exc), exc.message, exc.exit_code, exc.hints)
            _fail(exc, debug)
        except (Interrupted, KeyboardInterrupt) as exc:
            _interrupted(exc.signum if isinstance(exc, Interrupted) else signal.SIGINT)
        except (click.exceptions.Exit, click.Abort, click.ClickException):
            raise
        except Exception as exc:  # the catch-all that keeps a crash off exit 1
            if kwargs.get("as_json"):
                emit_json_error("internal-error", f"{type(exc).__name__}: {exc}"[:300], EXIT_INTERNAL)
            _internal(exc, debug)
        finally:
            _restore_signals(previous)
        sys.exit(code or 0)

    return wrapper


def _https_index(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--torch-index (or KVPROBE_TORCH_INDEX): https or file:// only, refused before anything runs."""
    from kvprobe.env.venv import check_index_url

    try:
        return check_index_url(value)
    except KvprobeError as exc:
        raise click.BadParameter(exc.message, ctx, param) from None


# Options several commands share, declared once so that their names, types and help agree.
_json_document = click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
_json_summary = click.option("--json", "as_json", is_flag=True, help="One JSON summary on stdout.")
_bundle_out = click.option(
    "--out", type=click.Path(file_okay=False, path_type=Path), help="Bundle directory (must not exist or be empty)."
)


def _torch_index(text: str, *, checked: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--torch-index (default KVPROBE_TORCH_INDEX); ``checked``: refused before anything runs
    (sweep checks it when it builds the env, verify only with --rerun)."""
    return click.option(
        "--torch-index", envvar="KVPROBE_TORCH_INDEX", callback=_https_index if checked else None, help=text
    )


def _results(as_json: bool) -> bool:
    """Whether the human result is printed on stdout: not under --json, not with -qq."""
    return _streams(as_json).results


CLI_JSON_VERSION = 1  # of every `--json` document: kvprobe.cli.<command>/1, kvprobe.cli.error/1


def json_schema_id(name: str | None = None) -> str:
    """``kvprobe.cli.<name>/N``; ``name`` defaults to the running command's (``cache-ls``)."""
    if name is None:
        name = "-".join(_parent_names(click.get_current_context(silent=True))) or "kvprobe"
    return f"kvprobe.cli.{name}/{CLI_JSON_VERSION}"


def emit_json(document: dict[str, Any]) -> None:
    """One JSON document on stdout, an object whose ``schema`` names the command that wrote
    it (a contract scripts can check: ``jq 'select(.schema == "kvprobe.cli.verify/1")'``)."""
    click.echo(json.dumps({"schema": json_schema_id(), **document}, indent=2, sort_keys=True))


def emit_json_error(
    code: str, message: str, exit_code: int, hints: list[str] | None = None, *, command: str | None = None
) -> None:
    """Under --json, an error is a document on stdout as well as the line on stderr: a script
    piping into jq gets an object to read, not empty input."""
    doc = {
        "schema": json_schema_id("error"),
        "command": command or json_schema_id().removeprefix("kvprobe.cli.").rsplit("/", 1)[0],
        "code": code,
        "message": message,
        "hints": list(hints or []),
        "exit": exit_code,
    }
    click.echo(json.dumps(doc, indent=2, sort_keys=True))


def _error_code(exc: BaseException) -> str:
    """``VerificationFailed`` -> ``verification-failed``: the error's class, as a JSON code."""
    import re

    return re.sub(r"(?<!^)(?=[A-Z])", "-", type(exc).__name__).lower()


_DEBUG, _VERBOSE, _QUIET = "kvprobe.debug", "kvprobe.verbose", "kvprobe.quiet"


def _remember(key: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    """Store a common option in ctx.meta (shared by a command and its group), so that
    ``kvprobe -v verify`` and ``kvprobe verify -v`` mean the same; counts add up."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if isinstance(value, bool):
            ctx.meta[key] = ctx.meta.get(key, False) or value
        else:
            ctx.meta[key] = ctx.meta.get(key, 0) + value

    return callback


def _common_params() -> list[click.Parameter]:
    """-q, -v and --debug: accepted before or after the subcommand."""
    return [
        click.Option(list(names), expose_value=False, callback=_remember(key), help=text, **kind)
        for names, key, kind, text in _COMMON_OPTIONS
    ]


_COMMON_OPTIONS: tuple[tuple[tuple[str, ...], str, dict[str, bool], str], ...] = (
    (
        ("-q", "--quiet"),
        _QUIET,
        {"count": True},
        "Less output: -q no progress, -qq no results either (errors and the exit code only).",
    ),
    (("-v", "--verbose"), _VERBOSE, {"count": True}, "More output: every row and every defect, not a summary."),
    (("--debug",), _DEBUG, {"is_flag": True}, "Show tracebacks for errors."),
)


class _Command(click.Command):
    """A kvprobe command: the common options, and its whole first help line in `--help`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.extend(_common_params())

    def get_short_help_str(self, limit: int = 45) -> str:
        return " ".join((self.short_help or (self.help or "").split("\n\n")[0]).split())

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        """A usage error click finds (a bad option or value) is a JSON error too under --json."""
        given = list(args)  # click's parser consumes ``args``
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.ClickException as exc:
            if "--json" in given and any(p.name == "as_json" for p in self.params):
                name = "-".join([*_parent_names(parent), self.name or ""])
                emit_json_error("usage-error", exc.format_message(), exc.exit_code, command=name)
            raise


def _parent_names(ctx: click.Context | None) -> list[str]:
    names: list[str] = []
    while ctx is not None and ctx.parent is not None:
        names.insert(0, ctx.command.name or "")
        ctx = ctx.parent
    return names


class _Group(click.Group):
    command_class = _Command

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.extend(_common_params())

    get_short_help_str = _Command.get_short_help_str


_Group.group_class = _Group


def _streams(as_json: bool = False) -> Output:
    """The current command's streams and verbosity (cli.console.Output)."""
    from kvprobe.cli.console import Output

    meta = click.get_current_context().meta
    return Output(meta.get(_VERBOSE, 0) - meta.get(_QUIET, 0), as_json=as_json)


_EPILOG = """\b
Streams: results on stdout; progress, warnings and errors on stderr; --json puts one
JSON document on stdout. On a pipe, output is plain lines, one record per line.

\b
Environment:
  KVPROBE_CACHE_DIR    where the cache lives (default: the platform's user cache dir)
  KVPROBE_PROBES_PATH  extra experiment folders (':'-separated), searched before ./probes
                       and the built-in experiments
  KVPROBE_TORCH_INDEX  default for --torch-index (run, gates, verify --rerun)
  NO_COLOR             no colours on a terminal

\b
Shell completion (bash; zsh and fish likewise):
  eval "$(_KVPROBE_COMPLETE=bash_source kvprobe)"
"""


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]}, epilog=_EPILOG)
@click.version_option(__version__, "-V", "--version", prog_name="kvprobe")
def main() -> None:
    """Turn an upstream security fix into a pinned, checkable evidence bundle.

    Exit codes: 0 the verdict asked for holds; 1 it does not; 2 usage or bad input;
    3 could not observe (network, git, pip, timeout, broken environment); 4 internal error
    (a bug in kvprobe: one line, the traceback with --debug).
    """


@main.command("list")
@_json_document
@guarded
def list_cmd(as_json: bool) -> int:
    """List the experiments kvprobe knows."""
    from kvprobe.experiments import experiment

    exps = [experiment.load(i, validate=False) for i in experiment.list_ids()]  # fast start
    out = None if as_json else _streams(as_json)  # --json: rich is imported only to warn
    for exp in exps:
        _warn_shadowing(out, exp.id)
    if out is None:
        emit_json(
            {
                "experiments": [
                    {
                        "id": e.id,
                        "title": e.title,
                        "layer": e.layer.value,
                        "prs": list(e.fix.prs),
                        "pin_sets": list(e.pin_sets),
                        "default_pins": e.default_pin_set,
                        "source": e.source,
                    }
                    for e in exps
                ]
            }
        )
    elif out.results:
        from kvprobe.cli.console import emit, experiments_table

        emit(out.out, experiments_table(exps))
    return EXIT_OK


def _warn_shadowing(out: Output | None, experiment_id: str) -> None:
    """Say so on stderr when the experiment used hides a different one of the same id (a
    project's ./probes or KVPROBE_PROBES_PATH over kvprobe's built-in one), and how to run
    the other; a copy with the same files (a checkout's own probes/) is not worth a word.
    ``out`` None: this command's streams, made only then."""
    from kvprobe.experiments import experiment

    found = experiment.sources(experiment_id)
    if len(found) < 2:
        return
    used, used_source = found[0]
    differ = [(folder, source, experiment.differing_files(used, folder)) for folder, source in found[1:]]
    differ = [d for d in differ if d[2]]
    if not differ:
        return
    from kvprobe.cli.console import data
    from kvprobe.resources import SOURCE_ENV

    out = out or _streams(as_json=True)
    choose = (
        "unset KVPROBE_PROBES_PATH (or drop that folder from it)"
        if used_source == SOURCE_ENV
        else "run from a directory without ./probes/" + experiment_id
    )
    for folder, source, changed in differ:
        out.warn(
            f"experiment {data(experiment_id)} from {data(used_source)} ({data(used)}) "
            f"shadows the {data(source)} one ({data(folder)}), which differs in {data(', '.join(changed))}: "
            f"the first on the search path runs; to run the {data(source)} one, {data(choose)}"
        )


@main.command("show")
@click.argument("experiment_id")
@_json_document
@guarded
def show_cmd(experiment_id: str, as_json: bool) -> int:
    """Show one experiment in full: pins, checks, expectations, scope."""
    from kvprobe.experiments import experiment

    exp = experiment.load(experiment_id)
    out = _streams(as_json)
    _warn_shadowing(out, exp.id)
    if as_json:
        emit_json(
            {
                "id": exp.id,
                "source": exp.source,
                "directory": str(exp.directory),
                "title": exp.title,
                "layer": exp.layer.value,
                "upstream": exp.upstream,
                "fix": {"prs": list(exp.fix.prs), "release": exp.fix.release, "summary": exp.fix.summary},
                "pins": {
                    n: {"kind": p.kind.value, "base": p.base.identity(), "head": p.head.identity(), "pr": p.pr}
                    for n, p in exp.pin_sets.items()
                },
                "default_pins": exp.default_pin_set,
                "profile": exp.profile,
                "tests": [t.path for t in exp.tests],
                "probes": [p.path for p in exp.probes],
                "expect": exp.expectations,
                "scope": {"shows": exp.scope.shows, "does_not_show": list(exp.scope.does_not_show)},
            }
        )
    elif out.results:
        from kvprobe.cli.console import print_experiment

        print_experiment(out.out, exp)
    return EXIT_OK


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
@_torch_index("Index for torch/torchvision, https:// or file:// (e.g. https://download.pytorch.org/whl/cpu).")
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
@_json_summary
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
    streams = _streams(as_json)
    _warn_shadowing(streams, exp.id)
    result = run_experiment(
        exp,
        _run_options(pins, out, repo, torch_index, jobs, timeout, not no_preload, keep_s, repeat),
        streams.reporter(),
    )
    if streams.verbosity > -2:
        print_run_diagnostics(streams.err, result.receipt)
    if streams.results:
        print_run_summary(streams.out, result.receipt, str(result.bundle), result.manifest_sha256, streams.verbosity)
    if as_json:
        emit_json(run_summary(result))
    if record:
        return _record_expectations(exp, result.receipt, streams.err, yes)
    return _verdict_exit(result.receipt.verdict)


def _several_error(experiment_id: str, exc: KvprobeError, streams: Output) -> dict[str, Any]:
    """One experiment of several that ended without a bundle: its error on stderr, a line in
    its place on stdout; its --json entry returned."""
    lines = [for_terminal(line) for line in exc.diagnostics()]
    click.echo(f"kvprobe: error: {experiment_id}: {lines[0]}", err=True)
    if streams.results:
        click.echo(f"{experiment_id}: no bundle ({lines[0]})")
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
    streams = _streams(as_json)
    for exp, o in zip(exps, opts, strict=True):
        _warn_shadowing(streams, exp.id)
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

    def report(streams: Output, _exp_id: str, result: RunResult) -> tuple[int, dict[str, Any]]:
        if streams.verbosity > -2:
            print_run_diagnostics(streams.err, result.receipt)
        if streams.results:
            print_run_summary(
                streams.out, result.receipt, str(result.bundle), result.manifest_sha256, streams.verbosity
            )
        return _verdict_exit(result.receipt.verdict), run_summary(result)

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
@_torch_index("Index for torch/torchvision (e.g. https://download.pytorch.org/whl/cpu).", checked=False)
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
@_json_summary
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
    as_json: bool,
    every: bool = False,
) -> int:
    """Classify each release in a range as affected, fixed, mixed, could not observe or not
    present, into one sweep bundle per experiment (exit 0 every release observed, 3 some could
    not be; with several, the worst of them: 2 over 3 over 0).

    Results on stdout (one line per release, the bundle, its manifest sha256); progress on
    stderr, a line per release as it is classified. Several ids (or --all) sweep in turn,
    sharing the index's listing, each release's wheel, and per profile one env and fork server."""
    from kvprobe.cli.console import print_sweep_summary
    from kvprobe.experiments import experiment
    from kvprobe.run.sweep import SweepOptions, sweep_experiment

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
        )
        if jobs is not None:
            opts.jobs = jobs
        return opts

    if len(ids) > 1 or every:
        return _sweep_several(ids, [options(out / i if out else None) for i in ids], as_json)
    opts = options(out)
    exp = experiment.load(ids[0])
    streams = _streams(as_json)
    _warn_shadowing(streams, exp.id)
    result = sweep_experiment(exp, opts, streams.reporter())
    receipt = result.receipt
    if streams.results:
        print_sweep_summary(streams.out, receipt, str(result.bundle), result.manifest_sha256)
    if as_json:
        emit_json({"bundle": str(result.bundle), "manifest_sha256": result.manifest_sha256, "summary": receipt.summary})
    return _sweep_exit_of(receipt.summary)


def _sweep_summary(result: SweepResult) -> dict[str, Any]:
    return {"bundle": str(result.bundle), "manifest_sha256": result.manifest_sha256, "summary": result.receipt.summary}


def _sweep_exit(result: SweepResult) -> int:
    return _sweep_exit_of(result.receipt.summary)


def _sweep_several(ids: list[str], opts: list[SweepOptions], as_json: bool) -> int:
    """`kvprobe sweep A B ...` (run.sweep.sweep_experiments): one sweep block per experiment."""
    from kvprobe.cli.console import print_sweep_summary
    from kvprobe.run.sweep import check_sweep, sweep_experiments

    def report(streams: Output, exp_id: str, result: SweepResult) -> tuple[int, dict[str, Any]]:
        if streams.results:
            print_sweep_summary(streams.out, result.receipt, str(result.bundle), result.manifest_sha256)
        return _sweep_exit(result), {"experiment": exp_id, **_sweep_summary(result)}

    return _several(ids, opts, as_json, kind="sweeps", check=check_sweep, outcomes_of=sweep_experiments, report=report)


def run_summary(result: RunResult) -> dict[str, Any]:
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


def _limit_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--max-files / --max-file-bytes / --max-bytes: caps that keep a hostile bundle cheap."""
    for flag, default, text in _LIMIT_OPTIONS:
        option = click.option(flag, type=click.IntRange(1), default=default, show_default=True, help=text)
        func = option(func)
    return func


# (option, default: Limits' own, from names so that --help needs no bundle reader, help):
# applied in this order, so --help lists them reversed
_LIMIT_OPTIONS = (
    ("--max-bytes", names.MAX_BUNDLE_BYTES, "Cap on the bundle's total bytes."),
    ("--max-file-bytes", names.MAX_BUNDLE_FILE_BYTES, "Cap on any one file's bytes."),
    ("--max-files", names.MAX_BUNDLE_FILES, "Cap on the number of files and directories."),
)


def _limits(max_files: int, max_file_bytes: int, max_bytes: int) -> Limits:
    from kvprobe.evidence.safetree import Limits

    return Limits(max_files=max_files, max_file_bytes=max_file_bytes, max_total_bytes=max_bytes)


@main.command("report")
@click.argument("bundle", type=click.Path(path_type=Path))
@_limit_options
@click.option(
    "--format",
    "fmt",
    default="markdown",
    show_default=True,
    type=click.Choice(["markdown", "openvex", "intoto", "osv"]),
    help="markdown: a block for a security review or change ticket (every bundle kind); openvex: OpenVEX "
    "v0.2.0 (run and sweep bundles); intoto: in-toto Statement v1 with the receipt as predicate (every "
    "bundle kind); osv: an OSV 1.7.5 record (sweep bundles).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write here (atomically) instead of stdout; an existing file is kept unless --force.",
)
@click.option("--force", is_flag=True, help="With -o: replace an existing file.")
@click.option(
    "--expect-manifest-sha256",
    "expect_digest",
    metavar="HEX",
    help="The bundle digest published elsewhere: the export is then anchored to it (as verify checks it). "
    "Without it or --attestation, the export says it is drawn from a bundle that only agrees with itself.",
)
@click.option(
    "--attestation",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A DSSE-signed in-toto statement of the bundle, checked with --key: anchors the export to the "
    "digest it signs.",
)
@click.option(
    "--key", type=click.Path(dir_okay=False, path_type=Path), help="With --attestation: the signer's PEM public key."
)
@click.option(
    "--author",
    help="Who states it, e.g. 'Security Team <sec@example.com>': required by openvex (the document's "
    "author), named by markdown, ignored by intoto and osv (they have no author field; a signature says who).",
)
@click.option("--author-role", help="With --author, for openvex: the author's role, e.g. 'Document Creator'.")
@click.option(
    "--subject-archive",
    type=click.Path(dir_okay=False, path_type=Path),
    help="intoto: the bundle's packed .tar.gz (`kvprobe bundle pack`), added as a subject by sha256.",
)
@click.option(
    "--osv-id",
    metavar="ID",
    help="osv: the id the record is published under (CVE-, GHSA-, PYSEC-, ...) when the experiment "
    "declares none with a prefix OSV lists; its declared ids become aliases.",
)
@click.option(
    "--allow-unanchored",
    is_flag=True,
    help="osv/openvex: write the record even for an experiment kvprobe does not ship from a bundle nothing "
    "anchors (refused otherwise, exit 1); its caveats are stated inside it.",
)
@guarded
def report_cmd(
    bundle: Path,
    max_files: int,
    max_file_bytes: int,
    max_bytes: int,
    fmt: str,
    output: Path | None,
    force: bool,
    expect_digest: str | None,
    attestation: Path | None,
    key: Path | None,
    author: str | None,
    author_role: str | None,
    subject_archive: Path | None,
    osv_id: str | None,
    allow_unanchored: bool,
) -> int:
    """Render a bundle (directory or .tar.gz) that verifies for a security review (exit 1: it
    does not verify, as `kvprobe verify` says; 2: not a bundle, or nothing to state).

    An export drawn from a bundle that is not anchored (no --expect-manifest-sha256 or
    --attestation), or from an experiment kvprobe does not ship, says so inside itself
    (Markdown text, OpenVEX status notes, OSV details and database_specific) and on stderr.
    An OSV or OpenVEX record of an unshipped experiment from an unanchored bundle is refused
    (exit 1) unless --allow-unanchored.

    OpenVEX's document timestamp is when it is issued (now, or SOURCE_DATE_EPOCH); each
    statement's is the run's (the receipt's created_utc)."""
    import os
    from datetime import UTC, datetime

    from kvprobe.errors import UsageError
    from kvprobe.exports.bundle_view import load
    from kvprobe.exports.render import ExportOptions, render, write_atomic
    from kvprobe.verify.steps import parse_digest

    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch is not None and not _epoch_seconds(epoch):
        raise UsageError(f"SOURCE_DATE_EPOCH={epoch!r} is not a number of seconds")
    issued = datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if epoch else None
    opts = ExportOptions(
        author=author,
        role=author_role,
        issued=issued,
        archive=subject_archive,
        osv_id=osv_id,
        allow_unanchored_advisory=allow_unanchored,
    )
    expected = parse_digest(expect_digest)
    signed = _signed_statement(attestation, key, expected)
    anchor = (
        f"a DSSE attestation signed with key {signed.keyid} signs this manifest sha256" if signed is not None else None
    )
    view = load(
        bundle,
        _limits(max_files, max_file_bytes, max_bytes),
        expect_manifest_sha256=signed.manifest_sha256 if signed else expected,
        anchor=anchor,
    )
    text = render(view, fmt, opts)
    for caveat in view.provenance.caveats():
        click.echo(f"warning: {for_terminal(caveat)}", err=True)
    if output is None:
        click.echo(text, nl=False)
    else:
        write_atomic(output, text, force=force)
        click.echo(f"wrote {for_terminal(output)} ({fmt})", err=True)
    return EXIT_OK


@main.command("attest")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option(
    "--key",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The signer's PEM private key (ECDSA, RSA or Ed25519; an encrypted one's password in "
    "$KVPROBE_KEY_PASSWORD). Its public half checks the envelope: `verify --attestation FILE --key PUB`.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the envelope here (atomically) instead of stdout; an existing file is kept unless --force.",
)
@click.option("--force", is_flag=True, help="With -o: replace an existing file.")
@click.option(
    "--subject-archive",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The bundle's packed .tar.gz (`kvprobe bundle pack`), added as a subject by sha256.",
)
@_limit_options
@guarded
def attest_cmd(
    bundle: Path,
    key: Path,
    output: Path | None,
    force: bool,
    subject_archive: Path | None,
    max_files: int,
    max_file_bytes: int,
    max_bytes: int,
) -> int:
    """Sign a bundle's in-toto statement (run, sweep or gates bundle) into a DSSE envelope.

    The bundle must verify first (steps 1-5, as `kvprobe verify`; exit 1 when it does not).
    The statement is `report --format intoto`'s; anyone with the public key checks the
    envelope offline with `kvprobe verify BUNDLE --attestation FILE --key PUB`, which then
    says `verified` (anchored by the attestation)."""
    from kvprobe.exports.attest import attest, load_signer
    from kvprobe.exports.bundle_view import load
    from kvprobe.exports.render import write_atomic

    if output is not None and output.exists() and not force:
        from kvprobe.errors import BundleExistsError

        raise BundleExistsError(f"{output} exists; refusing to overwrite it (--force replaces it)")
    signer = load_signer(key)  # a bad key is refused before the bundle is read
    view = load(bundle, _limits(max_files, max_file_bytes, max_bytes))
    signed = attest(view, signer, archive=subject_archive)
    if output is None:
        click.echo(signed.text, nl=False)
    else:
        write_atomic(output, signed.text, force=force)
    where = for_terminal(str(output)) if output is not None else "stdout"
    click.echo(
        f"signed the in-toto statement of manifest sha256 {signed.manifest_sha256} with key {signed.keyid} -> {where}",
        err=True,
    )
    return EXIT_OK


@main.command("gates")
@click.option(
    "--log",
    "logs",
    multiple=True,
    metavar="[ROLE=]FILE",
    help="A worker's startup log (repeat per worker); ROLE is prefill or decode when the log does not say.",
)
@click.option(
    "--sglang",
    metavar="PATH_OR_VERSION",
    help="The SGLang that runs: an installed package path (holding sglang/), a wheel, or a release version "
    "(any on the index; its wheel's sha256 is recorded).",
)
@click.option(
    "--server-args",
    "server_args",
    multiple=True,
    metavar="[ROLE=]FILE",
    help='A worker\'s server arguments: JSON (optionally with an "env" object), a server_args= line, '
    "or a command line.",
)
@click.option(
    "--env",
    "env",
    multiple=True,
    metavar="[ROLE=]FILE",
    help="A worker's environment, which no log shows (gate 4's deferred release): an env file (KEY=VALUE) "
    "or a container/pod spec as JSON (kubectl get pod NAME -o json); without ROLE it applies to every worker.",
)
@_bundle_out
@_torch_index("Index for torch/torchvision (the env of gates 2-4's probes), https:// or file://.")
@click.option(
    "--no-preload",
    is_flag=True,
    help="Run each probe of gates 2-4 in a fresh interpreter, not forked from one that preloaded the "
    "profile's third-party modules (torch, transformers, ...).",
)
@_json_document
@guarded
def gates_cmd(
    logs: tuple[str, ...],
    sglang: str | None,
    server_args: tuple[str, ...],
    env: tuple[str, ...],
    out: Path | None,
    torch_index: str | None,
    no_preload: bool,
    as_json: bool,
) -> int:
    """Check a deployment against the four acceptance gates (exit 0 all pass, 1 a gate failed, 3 undecided)."""
    from kvprobe.cli.console import print_gate_diagnostics, print_gates
    from kvprobe.gates.gate import GateOptions
    from kvprobe.gates.pipeline import run_gates

    streams = _streams(as_json)
    opts = GateOptions(
        logs=list(logs),
        server_args=list(server_args),
        env=list(env),
        sglang=sglang,
        out=out,
        torch_index=torch_index,
        preload=not no_preload,
    )
    result = run_gates(opts, streams.reporter())
    if streams.verbosity > -2:
        print_gate_diagnostics(streams.err, result.receipt)
    if streams.results:
        print_gates(streams.out, result.receipt, str(result.bundle), result.manifest_sha256)
    code = _gates_exit(result.overall)
    if as_json:
        receipt = result.receipt
        emit_json(
            {
                "overall": result.overall.value,
                "exit_code": code,
                "bundle": str(result.bundle),
                "manifest_sha256": result.manifest_sha256,
                "gates": [g.to_json() for g in receipt.gates],
                "workers": list(receipt.workers),
                "target": None if receipt.target is None else receipt.target.to_json(),
            }
        )
    return code


# --- verify and bundle archives ----------------------------------------------------------


@main.command("verify")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option(
    "--expect-manifest-sha256",
    "expect_digest",
    metavar="HEX",
    help="The bundle digest (manifest.json's sha256) published elsewhere: checks authenticity.",
)
@click.option(
    "--rerun",
    is_flag=True,
    help="Run the experiment again and compare check by check: kvprobe's installed copy when it "
    "ships the experiment, else the bundle's own code (needs --trust-bundle-code or a yes at a terminal).",
)
@click.option(
    "--trust-bundle-code",
    is_flag=True,
    help="With --rerun: allow running the bundle's own probe code (its sha256 digests are printed first).",
)
@click.option(
    "--attestation",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A DSSE-signed in-toto statement of the bundle (a DSSE envelope or cosign's --bundle output); "
    "checked offline with --key, then the bundle is held to the manifest digest it signs.",
)
@click.option(
    "--key", type=click.Path(dir_okay=False, path_type=Path), help="With --attestation: the signer's PEM public key."
)
@click.option(
    "--require-anchor",
    is_flag=True,
    help="Exit 1 unless the outcome is verified: a bundle that only agrees with itself "
    "(self-consistent; exit 0 without this flag) fails, as a CI gate on a published bundle wants.",
)
@click.option("--repo", help="With --rerun: git URL or local path to fetch pins from.")
@click.option(
    "--release",
    "rerun_releases",
    multiple=True,
    metavar="SPEC",
    help="With --rerun of a sweep bundle: re-run only these of its releases (repeatable; a version, "
    "A..B or a specifier, as sweep's --releases). Default: all.",
)
@_torch_index("With --rerun: index for torch, https:// or file://.", checked=False)
@click.option(
    "--timeout", default=1800, show_default=True, type=click.IntRange(1), help="With --rerun: seconds per check."
)
@_limit_options
@_json_document
@guarded
def verify_cmd(
    bundle: Path,
    expect_digest: str | None,
    rerun: bool,
    trust_bundle_code: bool,
    attestation: Path | None,
    key: Path | None,
    require_anchor: bool,
    repo: str | None,
    rerun_releases: tuple[str, ...],
    torch_index: str | None,
    timeout: int,
    max_files: int,
    max_file_bytes: int,
    max_bytes: int,
    as_json: bool,
) -> int:
    """Check a bundle directory or .tar.gz as untrusted input.

    \b
    Outcomes: verified (no defect, and anchored: the --expect-manifest-sha256 digest matched,
    a checked --attestation signs it, or a --rerun reproduced it), self-consistent (no defect,
    but nothing outside the bundle vouches for it), failed, could-not-rerun.
    Exit 0 verified or self-consistent (1 with --require-anchor), 1 failed, 2 not a bundle,
    3 could not re-run."""
    from kvprobe.cli.console import data, print_verify_diagnostics, print_verify_report
    from kvprobe.env.venv import check_index_url
    from kvprobe.errors import UsageError
    from kvprobe.run.rerun import RerunOptions, rerun_step
    from kvprobe.verify.result import VerifyOutcome
    from kvprobe.verify.steps import Anchoring, VerifyOptions, parse_digest, verify

    if rerun:  # only a rerun uses the index: a plain verify never refuses over it
        check_index_url(torch_index)
    streams = _streams(as_json)
    expected = parse_digest(expect_digest)
    signed = _signed_statement(attestation, key, expected)
    if signed is not None:
        streams.err.print(
            f"attestation: signature verified with key {data(signed.keyid)}; "
            f"it signs manifest sha256 {signed.manifest_sha256}"
        )
    consent = _bundle_code_consent(streams.err, trust_bundle_code)
    if rerun_releases and not rerun:
        raise UsageError("--release goes with --rerun: it names the sweep releases to re-run")
    spec = ",".join(rerun_releases) if rerun_releases else None
    rerun_opts = RerunOptions(repo, torch_index, float(timeout), consent=consent, releases=spec)
    step6 = rerun_step(rerun_opts, streams.reporter()) if rerun else None
    digest_from = (
        *(
            [Anchoring("attestation", f"a DSSE attestation signed with key {signed.keyid} signs the manifest sha256")]
            if signed
            else []
        ),
        *(
            [Anchoring("expect-manifest-sha256", "manifest sha256 matches --expect-manifest-sha256")]
            if expected
            else []
        ),
    )
    opts = VerifyOptions(
        limits=_limits(max_files, max_file_bytes, max_bytes),
        expect_manifest_sha256=signed.manifest_sha256 if signed else expected,
        rerun=step6,
        digest_from=digest_from,
    )
    report = verify(Path(bundle), opts)
    if streams.verbosity > -2:
        print_verify_diagnostics(streams.err, report, None if streams.verbosity > 0 else 200)
    if streams.results:
        print_verify_report(streams.out, report)
    if as_json:
        emit_json({**report.to_json(), **({"attestation": signed.to_json()} if signed else {})})
    if require_anchor and report.outcome is VerifyOutcome.SELF_CONSISTENT:
        if streams.verbosity > -2:
            streams.err.print("--require-anchor: the bundle is only self-consistent; nothing anchors it (exit 1)")
        return EXIT_FAIL
    return _verify_exit(report.outcome)


def _signed_statement(attestation: Path | None, key: Path | None, expected: str | None) -> SignedStatement | None:
    """The checked attestation (None without one); UsageError when --attestation and --key
    are not given together, or the signed digest is not --expect-manifest-sha256's."""
    from kvprobe.errors import UsageError
    from kvprobe.verify import attestation as signed_statement

    if attestation is None and key is None:
        return None
    if attestation is None or key is None:
        raise UsageError("--attestation and --key go together (the signed statement and the signer's public key)")
    signed = signed_statement.check(attestation, key)
    if expected is not None and expected != signed.manifest_sha256:
        raise UsageError(
            f"--attestation signs manifest sha256 {signed.manifest_sha256}, "
            f"but --expect-manifest-sha256 is {expected}: they cannot both hold"
        )
    return signed


_MAX_EPOCH = 253402300799  # 9999-12-31T23:59:59Z: the last second a timestamp can name


def _epoch_seconds(epoch: str) -> bool:
    """Whether SOURCE_DATE_EPOCH is ASCII digits; UsageError for a number of seconds no date
    has (past the year 9999: ``datetime`` overflows, and Python refuses very long numbers)."""
    from kvprobe.errors import UsageError

    if not (epoch.isascii() and epoch.isdigit()):
        return False
    if len(epoch) > len(str(_MAX_EPOCH)) or int(epoch) > _MAX_EPOCH:
        raise UsageError(f"SOURCE_DATE_EPOCH={epoch[:40]!r} is out of range (a date before the year 10000)")
    return True


def _bundle_code_consent(console: Console, trusted: bool) -> Callable[[list[tuple[str, str]]], bool]:
    """Consent to run a bundle's own code: the flag, or a yes typed at a terminal; never a pipe."""

    def consent(files: list[tuple[str, str]]) -> bool:
        if not trusted and not (sys.stdin.isatty() and sys.stderr.isatty()):
            return False
        console.print("the rerun will execute the bundle's own code, and what it names:", markup=False, highlight=False)
        for what, identity in files:
            console.print(f"  {identity}  {for_terminal(what)}", markup=False, highlight=False)
        return trusted or click.confirm("Run this code as you, on this machine?", default=False, err=True)

    return consent


@main.group("bundle")
def bundle_group() -> None:
    """Bundle archives."""


@bundle_group.command("pack")
@click.argument("bundle_dir", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Archive to write (default: BUNDLE_DIR.tar.gz next to it); an existing file is kept unless --force.",
)
@click.option("--force", is_flag=True, help="Replace an existing archive.")
@_limit_options
@_json_document
@guarded
def bundle_pack_cmd(
    bundle_dir: Path,
    output: Path | None,
    force: bool,
    max_files: int,
    max_file_bytes: int,
    max_bytes: int,
    as_json: bool,
) -> int:
    """Verify BUNDLE_DIR, then write a deterministic .tar.gz of it (same bundle, same bytes)."""
    from kvprobe.verify.pack import pack

    result = pack(bundle_dir, output, _limits(max_files, max_file_bytes, max_bytes), force=force)
    if _results(as_json):
        click.echo(
            f"wrote {for_terminal(result.archive)} (sha256 {result.sha256}; manifest sha256 {result.manifest_sha256})"
        )
    if as_json:
        emit_json(
            {
                "archive": str(result.archive),
                "sha256": result.sha256,
                "manifest_sha256": result.manifest_sha256,
                "top": result.top,
            }
        )
    return EXIT_OK


# --- cache -------------------------------------------------------------------------------


def _cache_root() -> Path:
    from kvprobe.env.cache import default_cache_root

    return default_cache_root()


@main.group("cache")
def cache_group() -> None:
    """The cache of git stores, wheels, trees, envs and uv's downloads ($KVPROBE_CACHE_DIR overrides its place)."""


@cache_group.command("ls")
@_json_document
@guarded
def cache_ls_cmd(as_json: bool) -> int:
    """List cache entries: kind, key, size, last used."""
    import time

    from kvprobe.env import cache

    root = _cache_root()
    entries = cache.scan(root)
    if as_json:
        emit_json(
            {"root": str(root), "total_size": cache.total_size(entries), "entries": [e.to_json() for e in entries]}
        )
    elif _results(as_json):
        from kvprobe.cli.console import print_cache, stdout_console

        print_cache(stdout_console(), str(root), entries, time.time())
    return EXIT_OK


@cache_group.command("prune")
@click.option(
    "--older-than",
    "older_than",
    type=click.FloatRange(0),
    metavar="DAYS",
    help="Also remove entries not used for DAYS days.",
)
@click.option("--all", "everything", is_flag=True, help="Remove every entry not in use.")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@_json_document
@guarded
def cache_prune_cmd(older_than: float | None, everything: bool, dry_run: bool, as_json: bool) -> int:
    """Free space without breaking a run in progress.

    Leftovers (interrupted builds and downloads, incomplete envs) always go; complete
    entries go with --older-than or --all. Entries whose lock is held, envs a run is
    using, uv's cache while an env build uses it, and builds younger than a few hours
    are skipped and named.
    """
    from kvprobe.env import cache

    outcomes = cache.prune(_cache_root(), older_than_days=older_than, everything=everything, dry_run=dry_run)
    if as_json:
        emit_json(
            {
                "dry_run": dry_run,
                "outcomes": [o.to_json() for o in outcomes],
                "freed": sum(o.entry.size for o in outcomes if o.action == "deleted"),
            }
        )
    elif _results(as_json):
        from kvprobe.cli.console import print_prune, stdout_console

        print_prune(stdout_console(), outcomes, dry_run)
    return EXIT_OK


@cache_group.command("servers")
@click.option("--stop", is_flag=True, help="Stop them (a check one of them is running is killed).")
@_json_document
@guarded
def cache_servers_cmd(stop: bool, as_json: bool) -> int:
    """List the preloaded fork servers kept between runs (`kvprobe run --keep-server`), or stop them.

    A socket whose reply is not a kept server's is skipped and named. With --stop, exit 1
    when a server's process still runs after it was asked to stop (each is named).
    """
    import dataclasses

    from kvprobe.checks.keptserver import Skipped, StopOutcome, stop_all, survey

    if stop:
        found = stop_all()
    else:
        listed = survey()
        found = StopOutcome(listed.servers, [], listed.skipped)
    servers, skipped = found.stopped, found.skipped
    if as_json:
        emit_json(
            {
                "stopped": stop,
                "servers": [dataclasses.asdict(s) for s in servers],
                "not_stopped": [dataclasses.asdict(s) for s in found.not_stopped],
                "skipped": [dataclasses.asdict(s) for s in skipped],
            }
        )
    elif _results(as_json):
        for s in servers:  # what a kept server says of itself is its own text: escaped
            click.echo(
                f"{'stopped' if stop else 'running'}  pid {s.pid}  since {for_terminal(s.started_utc)}"
                f"  idle limit {s.idle_s:.0f}s  checks {s.served}  runs attached {s.attached}  {for_terminal(s.python)}"
            )
        if not servers and not found.not_stopped:
            click.echo("no kept fork server is running", err=True)
    rows: list[tuple[str, Skipped]] = [("NOT STOPPED", n) for n in found.not_stopped]
    rows += [("skipped", k) for k in skipped]
    for label, row in rows:
        click.echo(f"{label}  {for_terminal(row.socket)}: {for_terminal(row.reason)}", err=True)
    return EXIT_FAIL if found.not_stopped else EXIT_OK


@cache_group.command("verify")
@_json_document
@guarded
def cache_verify_cmd(as_json: bool) -> int:
    """Re-hash every file of every cached tree against its listing.

    Exit 0 when all trees are intact, 1 when one is not (the next run rebuilds it).
    """
    from kvprobe.sources import treecache

    report = {e.name: [str(p) for p in treecache.verify(e)] for e in treecache.entries(_cache_root())}
    if as_json:
        emit_json({"trees": report, "intact": not any(report.values())})
    else:
        for name, problems in report.items():
            click.echo(f"{'ok' if not problems else 'DAMAGED'}  {name}", err=True)
            for problem in problems[:20]:  # file names come from a wheel: escaped, not printed raw
                click.echo(f"    {problem!r}", err=True)
    return EXIT_FAIL if any(report.values()) else EXIT_OK


# --- new: scaffold an experiment, record its expectations --------------------------------


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


@main.command("new")
@click.argument("experiment_id")
@click.option(
    "--base",
    help="Full 40-hex SHA of the commit before the fix (git pins; required unless "
    "--release-base/--release-head are given).",
)
@click.option("--head", help="Full 40-hex SHA of the commit with the fix (goes with --base).")
@click.option(
    "--pr",
    type=int,
    help="Pull request number. SGLang squash-merges: the PR's own head commit is then on no branch "
    "and is fetched via refs/pull/N/head; give that commit as --head (or the squash commit on main "
    "with its parent as --base).",
)
@click.option(
    "--upstream",
    default="https://github.com/sgl-project/sglang",
    show_default=True,
    help="Canonical upstream repository URL, written into the experiment.",
)
@click.option(
    "--repo",
    help="Where to fetch the commits from (a mirror: https://, file:// or a local clone); "
    "never written into the experiment. Default: --upstream.",
)
@click.option(
    "--test",
    "tests",
    multiple=True,
    metavar="PATH",
    help="Upstream test file (path at head) to run on both sides; repeatable; needs --base/--head.",
)
@click.option(
    "--tests-only",
    is_flag=True,
    help="The upstream tests are the evidence: scaffold no probe (needs --test).",
)
@click.option(
    "--release-base",
    metavar="VERSION",
    help="Released version without the fix (wheel pins); with --release-head and no "
    "--base/--head, the experiment uses release wheels only and runs no git.",
)
@click.option("--release-head", metavar="VERSION", help="First released version with the fix.")
@click.option(
    "--tests-commit",
    metavar="SHA",
    help="With --release-base/--release-head and --test: also write a release-tests pin set that "
    "runs this upstream commit's test files (e.g. the PR head's) against the release wheels.",
)
@click.option("--package", default="sglang", show_default=True, help="PyPI / import package of the upstream.")
@click.option(
    "--profile", default="sglang-cpu", show_default=True, help="Dependency profile (probes/profiles/NAME.toml)."
)
@click.option("--title", help="One-line title (default: a TODO to replace).")
@click.option(
    "--vulnerability-id",
    metavar="ID",
    help="What the evidence is about: CVE-..., GHSA-..., PYSEC-... or KVPROBE-YYYY-NNNN "
    "(docs/vulnerability-ids.md); default: a TODO.",
)
@click.option("--alias", "aliases", multiple=True, metavar="ID", help="Another id of it; repeatable.")
@click.option(
    "--fix-kind",
    type=click.Choice(["security", "hardening", "performance", "correctness"]),
    help="With --vulnerability-id: what the fix is; only a security fix is exported as OpenVEX.",
)
@click.option(
    "--dir",
    "probes_dir",
    default="probes",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder to create ID/ in.",
)
@guarded
def new_cmd(
    experiment_id: str,
    base: str | None,
    head: str | None,
    pr: int | None,
    upstream: str,
    repo: str | None,
    tests: tuple[str, ...],
    tests_only: bool,
    release_base: str | None,
    release_head: str | None,
    tests_commit: str | None,
    package: str,
    profile: str,
    title: str | None,
    vulnerability_id: str | None,
    aliases: tuple[str, ...],
    fix_kind: str | None,
    probes_dir: Path,
) -> int:
    """Scaffold a new PR-pair experiment: checked pins, a runnable probe template (exit 0).

    Pins are git commits (--base/--head), release wheels (--release-base/--release-head), or
    both. Wheel-only needs just PyPI (no git is run): the probe runs on both wheels, and there
    are no upstream tests, since wheels carry none.
    """
    from kvprobe.cli.console import data
    from kvprobe.env.cache import default_cache_root
    from kvprobe.experiments import scaffold

    spec = scaffold.NewSpec(
        experiment_id,
        base,
        head,
        pr=pr,
        repo=repo,
        tests=tuple(tests),
        release_base=release_base,
        release_head=release_head,
        package=package,
        profile=profile,
        probes_dir=probes_dir,
        title=title,
        vulnerability_id=vulnerability_id,
        aliases=tuple(aliases),
        fix_kind=fix_kind,
        upstream=upstream,
        tests_only=tests_only,
        tests_commit=tests_commit,
    )
    streams = _streams()
    created = scaffold.create(spec, cache_root=default_cache_root(), reporter=streams.reporter())
    if streams.results:
        streams.out.print(f"created {data(created.experiment_file)}")
        if created.probe_file is not None:
            streams.out.print(f"created {data(created.probe_file)}")
    if not created.on_search_path:
        streams.err.print(
            f"[yellow]note[/]: {data(created.directory.parent)} is not on the experiment search path; "
            f"set KVPROBE_PROBES_PATH={data(created.directory.parent)}"
        )
    run = f"kvprobe run {experiment_id}" + (f" --repo {for_shell(repo)}" if repo is not None else "")
    if tests_only:
        streams.err.print(f"next: review the tests' transitions and record them: {data(run)} --record-expectations")
    else:
        streams.err.print(
            f"next: {data(run)}   (no expectations yet: exit 1, verdict no-expectations)\n"
            f"then write the probe, run again, review, and: {data(run)} --record-expectations"
        )
    return EXIT_OK

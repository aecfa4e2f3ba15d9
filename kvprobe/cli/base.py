"""What every command shares: the exit tables, the guarded runner (the only place that exits),
the common and shared options, the stream rule (``streams_for``, ``emit_json``) and the root
group ``main``. The commands themselves live in the ``*_cmds`` modules, registered on ``main``
when ``kvprobe.cli`` imports them; arguments -> core call -> render -> exit code."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kvprobe import __version__, names
from kvprobe.errors import Interrupted, KvprobeError
from kvprobe.text import for_terminal

if TYPE_CHECKING:
    from kvprobe.cli.console import Output
    from kvprobe.evidence.safetree import Limits
    from kvprobe.model.records import GateStatus, Verdict
    from kvprobe.verify.result import VerifyOutcome

EXIT_OK, EXIT_FAIL, EXIT_UNOBSERVED = 0, 1, 3  # 2 (usage) comes from UsageError.exit_code
EXIT_INTERNAL = 4  # a bug in kvprobe: never to be read as "the verdict does not hold" (1)


# The exit tables, keyed by the enums they map; built on use: `--help` imports no model.
def verdict_exit(verdict: Verdict) -> int:
    from kvprobe.model.records import Verdict

    return {
        Verdict.REPRODUCED: EXIT_OK,
        Verdict.NOT_REPRODUCED: EXIT_FAIL,
        Verdict.NO_EXPECTATIONS: EXIT_FAIL,
        Verdict.COULD_NOT_OBSERVE: EXIT_UNOBSERVED,
        Verdict.ERROR: EXIT_UNOBSERVED,
    }[verdict]


def gates_exit(status: GateStatus) -> int:
    from kvprobe.model.records import GateStatus

    return {GateStatus.PASS: EXIT_OK, GateStatus.FAIL: EXIT_FAIL, GateStatus.UNKNOWN: EXIT_UNOBSERVED}[status]


def sweep_exit(summary: Mapping[str, list[str]], unserved: Sequence[str] = ()) -> int:
    """3 when a release could not be observed or lacked the probed code, or a selected one was
    not run at all (``unserved``: the profile cannot import it), else 0."""
    from kvprobe.model.records import SweepClass

    if unserved:
        return EXIT_UNOBSERVED
    return EXIT_UNOBSERVED if {SweepClass.UNOBSERVED, SweepClass.NOT_PRESENT} & set(summary) else EXIT_OK


# self-consistent exits 0: exit 1 means "defects found", and a bundle that was just written is
# only ever self-consistent; a gate that must know who published it passes --require-anchor.
def verify_exit(outcome: VerifyOutcome) -> int:
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
    if _parent_names(click.get_current_context(silent=True))[:1] == ["sweep"]:
        behind += "; the units it finished are kept in the cache, and the same sweep run again resumes from them"
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
json_document = click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
json_summary = click.option("--json", "as_json", is_flag=True, help="One JSON summary on stdout.")
bundle_out = click.option(
    "--out", type=click.Path(file_okay=False, path_type=Path), help="Bundle directory (must not exist or be empty)."
)


def torch_index_option(text: str, *, checked: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--torch-index (default KVPROBE_TORCH_INDEX); ``checked``: refused before anything runs
    (sweep checks it when it builds the env, verify only with --rerun)."""
    return click.option(
        "--torch-index", envvar="KVPROBE_TORCH_INDEX", callback=_https_index if checked else None, help=text
    )


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


def streams_for(as_json: bool = False) -> Output:
    """The current command's streams and verbosity (cli.console.Output): the one path its
    results, progress, diagnostics and warnings take (a --json document: :func:`emit_json`)."""
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


def limit_options(func: Callable[..., Any]) -> Callable[..., Any]:
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


def bundle_limits(max_files: int, max_file_bytes: int, max_bytes: int) -> Limits:
    from kvprobe.evidence.safetree import Limits

    return Limits(max_files=max_files, max_file_bytes=max_file_bytes, max_total_bytes=max_bytes)

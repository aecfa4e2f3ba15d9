"""The click CLI: arguments -> core call -> render -> exit code. The only place that exits."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

import click

from kvprobe import __version__
from kvprobe.errors import KvprobeError

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_UNOBSERVED = 0, 1, 2, 3
_VERDICT_EXIT = {"reproduced": EXIT_OK, "not-reproduced": EXIT_FAIL,
                 "no-expectations": EXIT_FAIL, "error": EXIT_UNOBSERVED}


def _fail(exc: KvprobeError, debug: bool) -> None:
    """One line (plus hints) on stderr, then the error's exit code."""
    if debug:
        import traceback

        traceback.print_exception(exc)
    lines = exc.diagnostics()
    click.echo(f"kvprobe: error: {lines[0]}", err=True)
    for hint in lines[1:]:
        click.echo(f"  {hint}", err=True)
    sys.exit(exc.exit_code)


def guarded(func: Callable[..., int]) -> Callable[..., None]:
    """Run a command body; map KvprobeError to its exit code, the body's int to the exit."""
    import functools

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        debug = click.get_current_context().find_root().params.get("debug", False)
        try:
            code = func(*args, **kwargs)
        except KvprobeError as exc:
            _fail(exc, debug)
        sys.exit(code or 0)

    return wrapper


def emit_json(document: Any) -> None:
    click.echo(json.dumps(document, indent=2, sort_keys=True))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kvprobe")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
def main(debug: bool) -> None:
    """Turn an upstream security fix into a pinned, checkable evidence bundle.

    Exit codes: 0 the verdict asked for holds; 1 it does not; 2 usage or bad input;
    3 could not observe (network, git, pip, timeout, broken environment).
    """


@main.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@guarded
def list_cmd(as_json: bool) -> int:
    """List the experiments kvprobe knows."""
    from kvprobe import experiment

    exps = [experiment.load(i) for i in experiment.list_ids()]
    if as_json:
        emit_json([{"id": e.id, "title": e.title, "layer": e.layer.value, "prs": list(e.fix.prs),
                    "pin_sets": list(e.pin_sets), "default_pins": e.default_pin_set} for e in exps])
    else:
        from kvprobe.console import Console, experiments_table

        Console(highlight=False).print(experiments_table(exps))
    return EXIT_OK


@main.command("show")
@click.argument("experiment_id")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@guarded
def show_cmd(experiment_id: str, as_json: bool) -> int:
    """Show one experiment in full: pins, checks, expectations, scope."""
    from kvprobe import experiment

    exp = experiment.load(experiment_id)
    if as_json:
        emit_json({
            "id": exp.id, "title": exp.title, "layer": exp.layer.value, "upstream": exp.upstream,
            "fix": {"prs": list(exp.fix.prs), "release": exp.fix.release, "summary": exp.fix.summary},
            "pins": {n: {"kind": p.kind.value, "base": p.base.identity(), "head": p.head.identity(),
                         "pr": p.pr} for n, p in exp.pin_sets.items()},
            "default_pins": exp.default_pin_set, "profile": exp.profile,
            "tests": [t.path for t in exp.tests], "probes": [p.path for p in exp.probes],
            "expect": exp.expectations,
            "scope": {"shows": exp.scope.shows, "does_not_show": list(exp.scope.does_not_show)},
        })
    else:
        from kvprobe.console import Console, print_experiment

        print_experiment(Console(highlight=False), exp)
    return EXIT_OK


def _run_options(pins, out, repo, torch_index, jobs, timeout):
    from kvprobe.runner import RunOptions

    opts = RunOptions(pin_set=pins, out=Path(out) if out else None, repo=repo,
                      torch_index=torch_index, timeout_s=float(timeout))
    if jobs is not None:
        opts.jobs = jobs
    return opts


@main.command("run")
@click.argument("experiment_id")
@click.option("--pins", help="Pin set to run (default: the experiment's default).")
@click.option("--out", type=click.Path(file_okay=False), help="Bundle directory (must not exist or be empty).")
@click.option("--repo", help="Git URL or local path of a mirror/clone to fetch pins from.")
@click.option("--torch-index", envvar="KVPROBE_TORCH_INDEX",
              help="Index for torch/torchvision (e.g. https://download.pytorch.org/whl/cpu).")
@click.option("--jobs", type=click.IntRange(1, 2), help="Run base and head in parallel (2) or in turn (1).")
@click.option("--timeout", default=1800, show_default=True, type=click.IntRange(1), help="Seconds per check.")
@click.option("--json", "as_json", is_flag=True, help="One JSON summary on stdout.")
@guarded
def run_cmd(experiment_id, pins, out, repo, torch_index, jobs, timeout, as_json) -> int:
    """Reproduce one experiment into an evidence bundle (exit 0 reproduced, 1 not)."""
    from kvprobe import experiment
    from kvprobe.console import RichReporter, print_run_summary, stderr_console
    from kvprobe.runner import run_experiment

    exp = experiment.load(experiment_id)
    console = stderr_console()
    result = run_experiment(exp, _run_options(pins, out, repo, torch_index, jobs, timeout),
                            RichReporter(console))
    print_run_summary(console, result.receipt, str(result.bundle), result.manifest_sha256)
    if as_json:
        emit_json(run_summary(result))
    return _VERDICT_EXIT[result.receipt["verdict"]]


def run_summary(result) -> dict[str, Any]:
    receipt = result.receipt
    return {
        "verdict": receipt["verdict"], "bundle": str(result.bundle),
        "manifest_sha256": result.manifest_sha256, "experiment": receipt["experiment"]["id"],
        "pin_set": receipt["pin_set"]["name"], "reasons": receipt["comparison"]["reasons"],
        "observations": receipt["comparison"]["observations"],
        "tests": receipt["comparison"]["tests"], "test_summary": receipt["comparison"]["test_summary"],
    }


@main.command("report")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--format", "fmt", required=True, type=click.Choice(["markdown", "openvex", "intoto"]),
              help="markdown: a block for a security review; openvex: OpenVEX v0.2.0; "
                   "intoto: in-toto Statement v1 with the receipt as predicate.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write here (atomically) instead of stdout.")
@click.option("--author", default="kvprobe", show_default=True, help="OpenVEX document author.")
@guarded
def report_cmd(bundle: Path, fmt: str, output: Path | None, author: str) -> int:
    """Render a bundle's receipt for a security review (exit 2: not a bundle or malformed)."""
    from kvprobe import report

    text = report.render(report.load(bundle), fmt, author=author)
    if output is None:
        click.echo(text, nl=False)
    else:
        report.write_atomic(output, text)
        click.echo(f"wrote {output} ({fmt})", err=True)
    return EXIT_OK

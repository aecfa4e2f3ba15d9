"""`kvprobe list`, `show` and `new`: the experiments kvprobe knows, and a new one scaffolded."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from kvprobe.cli.base import EXIT_OK, emit_json, guarded, json_document, main, streams_for
from kvprobe.text import for_shell

if TYPE_CHECKING:
    from kvprobe.cli.console import Output
    from kvprobe.model.records import Experiment


@main.command("list")
@json_document
@guarded
def list_cmd(as_json: bool) -> int:
    """List the experiments kvprobe knows."""
    from kvprobe.experiments import experiment

    exps = [experiment.load(i, validate=False) for i in experiment.list_ids()]  # fast start
    out = None if as_json else streams_for(as_json)  # --json: rich is imported only to warn
    for exp in exps:
        warn_shadowing(out, exp.id)
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


def warn_shadowing(out: Output | None, experiment_id: str) -> None:
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

    out = out or streams_for(as_json=True)
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


def warn_unfinished(out: Output, exp: Experiment) -> None:
    """After a reproduced run: say which scaffold TODOs the bundle quotes as its text."""
    from kvprobe.cli.console import data
    from kvprobe.experiments.scaffold import unfinished

    todo = unfinished(exp)
    if todo:
        out.warn(
            f"{data(exp.id)} reproduced, but its {data(', '.join(todo))} still say TODO and the bundle "
            f"quotes them as its description: write them in {data(exp.directory / 'experiment.toml')} "
            "and run again before publishing"
        )


@main.command("show")
@click.argument("experiment_id")
@json_document
@guarded
def show_cmd(experiment_id: str, as_json: bool) -> int:
    """Show one experiment in full: pins, checks, expectations, scope."""
    from kvprobe.experiments import experiment

    exp = experiment.load(experiment_id)
    out = streams_for(as_json)
    warn_shadowing(out, exp.id)
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


@main.command("new")
@click.argument("experiment_id")
@click.option(
    "--base",
    help="Full 40-hex SHA of the commit before the fix, an ancestor of --head (else a warning; git pins: "
    "required unless --release-base/--release-head are given).",
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
    streams = streams_for()
    created = scaffold.create(spec, cache_root=default_cache_root(), reporter=streams.reporter())
    if streams.results:
        streams.out.print(f"created {data(created.experiment_file)}")
        if created.probe_file is not None:
            streams.out.print(f"created {data(created.probe_file)}")
    if not created.on_search_path:
        streams.diagnostic(
            f"[yellow]note[/]: {data(created.directory.parent)} is not on the experiment search path; "
            f"set KVPROBE_PROBES_PATH={data(created.directory.parent)}"
        )
    run = f"kvprobe run {experiment_id}" + (f" --repo {for_shell(repo)}" if repo is not None else "")
    if tests_only:
        streams.diagnostic(f"next: review the tests' transitions and record them: {data(run)} --record-expectations")
    else:
        streams.diagnostic(
            f"next: {data(run)}   (no expectations yet: exit 1, verdict no-expectations)\n"
            f"then write the probe, run again, review, and: {data(run)} --record-expectations"
        )
    return EXIT_OK

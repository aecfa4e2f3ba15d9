"""`kvprobe cache ls|prune|servers|verify`: the shared cache and the kept fork servers."""

from __future__ import annotations

from pathlib import Path

import click

from kvprobe.cli.base import EXIT_FAIL, EXIT_OK, emit_json, guarded, json_document, main, streams_for
from kvprobe.text import for_terminal


def _cache_root() -> Path:
    from kvprobe.env.cache import default_cache_root

    return default_cache_root()


@main.group("cache")
def cache_group() -> None:
    """The cache of git stores, wheels, trees, envs, sweep units and uv's downloads
    ($KVPROBE_CACHE_DIR overrides its place)."""


@cache_group.command("ls")
@json_document
@guarded
def cache_ls_cmd(as_json: bool) -> int:
    """List cache entries: kind, key, size, last used."""
    import time

    from kvprobe.env import cache

    root = _cache_root()
    entries = cache.scan(root)
    streams = streams_for(as_json)
    if as_json:
        emit_json(
            {
                "root": str(root),
                "total_size": cache.total_size(entries),
                "counts": cache.counts(entries),
                "entries": [e.to_json() for e in entries],
            }
        )
    elif streams.results:
        from kvprobe.cli.console import print_cache

        print_cache(streams.out, str(root), entries, time.time())
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
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    type=click.Choice(["git", "wheel", "env", "tree", "unit", "uv"]),
    help="Only entries of this kind (repeatable), e.g. --kind unit: the sweep units kept for reuse.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@json_document
@guarded
def cache_prune_cmd(
    older_than: float | None, everything: bool, kinds: tuple[str, ...], dry_run: bool, as_json: bool
) -> int:
    """Free space without breaking a run in progress.

    Leftovers (interrupted builds and downloads, incomplete envs) always go; complete
    entries go with --older-than or --all. Entries whose lock is held, envs a run is
    using, uv's cache while an env build uses it, and builds younger than a few hours
    are skipped and named.
    """
    from kvprobe.env import cache

    outcomes = cache.prune(
        _cache_root(), older_than_days=older_than, everything=everything, dry_run=dry_run, kinds=kinds
    )
    streams = streams_for(as_json)
    if as_json:
        emit_json(
            {
                "dry_run": dry_run,
                "outcomes": [o.to_json() for o in outcomes],
                "freed": sum(o.entry.size for o in outcomes if o.action == "deleted"),
            }
        )
    elif streams.results:
        from kvprobe.cli.console import print_prune

        print_prune(streams.out, outcomes, dry_run)
    return EXIT_OK


@cache_group.command("servers")
@click.option("--stop", is_flag=True, help="Stop them (a check one of them is running is killed).")
@json_document
@guarded
def cache_servers_cmd(stop: bool, as_json: bool) -> int:
    """List the preloaded fork servers kept between runs (`kvprobe run --keep-server`), or stop them.

    A socket whose reply is not a kept server's is skipped and named. With --stop, exit 1
    when a server's process still runs after it was asked to stop (each is named).
    """
    import dataclasses

    from kvprobe.checks.keptserver import StopOutcome, stop_all, survey

    if stop:
        found = stop_all()
    else:
        listed = survey()
        found = StopOutcome(listed.servers, [], listed.skipped)
    servers, skipped = found.stopped, found.skipped
    streams = streams_for(as_json)
    if as_json:
        emit_json(
            {
                "stopped": stop,
                "servers": [dataclasses.asdict(s) for s in servers],
                "not_stopped": [dataclasses.asdict(s) for s in found.not_stopped],
                "skipped": [dataclasses.asdict(s) for s in skipped],
            }
        )
    else:
        for s in servers:  # what a kept server says of itself is its own text: escaped
            streams.result(
                f"{'stopped' if stop else 'running'}  pid {s.pid}  since {for_terminal(s.started_utc)}"
                f"  idle limit {s.idle_s:.0f}s  checks {s.served}  runs attached {s.attached}  {for_terminal(s.python)}"
            )
        if not servers and not found.not_stopped:
            streams.result("no kept fork server is running")
    from kvprobe.cli.console import data

    for row in found.not_stopped:  # a process that outlived its stop request: always said
        streams.warn(f"NOT STOPPED  {data(row.socket)}: {data(row.reason)}")
    for row in skipped:
        streams.diagnostic(f"skipped  {data(row.socket)}: {data(row.reason)}")
    return EXIT_FAIL if found.not_stopped else EXIT_OK


@cache_group.command("verify")
@json_document
@guarded
def cache_verify_cmd(as_json: bool) -> int:
    """Re-hash every file of every cached tree against its listing.

    Results on stdout: a line per tree (ok or DAMAGED) and a count; on stderr, what differs
    in a damaged tree (its first 20 files; every one with -v). Exit 0 when all trees are
    intact, 1 when one is not (the next run rebuilds it).
    """
    from kvprobe.cli.console import data
    from kvprobe.sources import treecache

    report = {e.name: [str(p) for p in treecache.verify(e)] for e in treecache.entries(_cache_root())}
    streams = streams_for(as_json)
    if as_json:
        emit_json({"trees": report, "intact": not any(report.values())})
    damaged = [name for name, problems in report.items() if problems]
    for name, problems in report.items():
        streams.result(f"{'DAMAGED' if problems else 'ok'}  {for_terminal(name)}")
        # file names come from a wheel: escaped, not printed raw
        for problem in problems if streams.verbosity > 0 else problems[:20]:
            streams.diagnostic(f"{data(name)}: {data(problem)}")
    streams.result(f"{len(report)} trees: {len(report) - len(damaged)} intact, {len(damaged)} damaged")
    return EXIT_FAIL if any(report.values()) else EXIT_OK

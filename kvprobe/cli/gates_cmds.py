"""`kvprobe gates`: a deployment checked against the four acceptance gates."""

from __future__ import annotations

from pathlib import Path

import click

from kvprobe.cli.base import (
    bundle_out,
    emit_json,
    gates_exit,
    guarded,
    json_document,
    main,
    streams_for,
    torch_index_option,
)


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
@bundle_out
@torch_index_option("Index for torch/torchvision (the env of gates 2-4's probes), https:// or file://.")
@click.option(
    "--no-preload",
    is_flag=True,
    help="Run each probe of gates 2-4 in a fresh interpreter, not forked from one that preloaded the "
    "profile's third-party modules (torch, transformers, ...).",
)
@json_document
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

    streams = streams_for(as_json)
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
    receipt = result.receipt
    code = gates_exit(receipt.overall)
    if as_json:
        emit_json(
            {
                "overall": receipt.overall.value,
                "exit_code": code,
                "bundle": str(result.bundle),
                "manifest_sha256": result.manifest_sha256,
                "gates": [g.to_json() for g in receipt.gates],
                "workers": list(receipt.workers),
                "target": None if receipt.target is None else receipt.target.to_json(),
            }
        )
    return code

"""The click CLI and its rich rendering: the only place that prints or exits."""

# Each *_cmds module registers its commands on main when imported: all of them, here, so that
# `kvprobe.cli:main` (the entry point) is the whole CLI. Their imports of kvprobe's core stay
# inside the command bodies, so `kvprobe --help` loads click and these modules only.
from kvprobe.cli import cache_cmds, experiment_cmds, gates_cmds, report_cmds, run_cmds, verify_cmds  # noqa: F401
from kvprobe.cli.base import main

__all__ = ["main"]

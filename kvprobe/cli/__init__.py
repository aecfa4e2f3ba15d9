"""The click CLI and its rich rendering: the only place that prints or exits."""

from kvprobe.cli.commands import main

__all__ = ["main"]

"""The README's command table says what the CLI takes: every command it names exists and every
option it shows is one that command accepts (a renamed or dropped flag fails here, not a user)."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from kvprobe.cli import main

README = Path(__file__).resolve().parents[3] / "README.md"
_OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[a-zA-Z])\b")


def _table_cells() -> list[str]:
    """The first cell of each row of the README's `## Commands` table."""
    text = README.read_text()
    section = text[text.index("## Commands") :]
    section = section[: section.index("\n## ", 1)]
    return [line.split(" | ")[0].lstrip("| ") for line in section.splitlines() if line.startswith("| `kvprobe ")]


def _usages(cell: str) -> list[str]:
    """Each `kvprobe ...` usage in a cell (a cell may name two: `list` / `show ID`)."""
    return re.findall(r"`(kvprobe [^`]+)`", cell.replace("\\|", "|"))


def _command(words: list[str]) -> tuple[click.Command, list[str]]:
    """The click command a usage names, and the path to it."""
    command: click.Command = main
    path: list[str] = []
    for word in words:
        if not isinstance(command, click.Group) or word not in command.commands:
            break
        command = command.commands[word]
        path.append(word)
    return command, path


USAGES = [u for cell in _table_cells() for u in _usages(cell)]


def test_the_table_names_the_commands_users_script_against():
    named = {" ".join(_command(u.split()[1:])[1]) for u in USAGES}
    assert {"list", "show", "run", "sweep", "verify", "report", "new", "gates", "attest", "bundle pack"} <= named


@pytest.mark.parametrize("usage", USAGES)
def test_every_option_the_readme_shows_is_accepted(usage):
    command, path = _command(usage.split()[1:])
    assert path, f"{usage!r} names no kvprobe command"
    accepted = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    accepted |= {"--help"}
    shown = set(_OPTION.findall(usage))
    assert shown - accepted == set(), f"`kvprobe {' '.join(path)}` does not take {sorted(shown - accepted)}"

"""The progress interface the core is handed; console.py implements it with rich."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class Reporter:
    """No-op reporter: the core calls these, the CLI decides what a human sees."""

    @contextmanager
    def step(self, title: str) -> Iterator[None]:
        """A long step (fetch, env build, a side's checks)."""
        yield

    def update(self, text: str) -> None:
        """Progress inside the current step (e.g. the package pip is installing)."""

    def note(self, text: str) -> None:
        """A line worth keeping in the scrollback (a cache hit, a result)."""

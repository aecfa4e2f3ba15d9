"""Fixtures of the unit tier; the forge they wrap is tests/forge.py (importable from every tier).
Scratch files go to RAM (tests/scratch.py): ``tmp_path`` and ``tmp_path_factory`` are
overridden here for this tier only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import forge, scratch


@pytest.fixture(scope="session")
def tmp_path_factory() -> Iterator[scratch.Scratch]:
    yield from scratch.session("unit")


@pytest.fixture
def tmp_path(request, tmp_path_factory: scratch.Scratch) -> Path:
    return tmp_path_factory.mktemp(request.node.name)


@pytest.fixture
def bundle(tmp_path) -> Path:
    """A valid forged run bundle (the forge's experiment, verdict reproduced) at tmp_path/b,
    the test's own to tamper with."""
    return forge.build(tmp_path / "b")

"""Fixtures of the unit tier; the forge they wrap is tests/forge.py (importable from every tier)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import forge


@pytest.fixture
def bundle(tmp_path) -> Path:
    """A valid forged run bundle (the forge's experiment, verdict reproduced) at tmp_path/b,
    the test's own to tamper with."""
    return forge.build(tmp_path / "b")

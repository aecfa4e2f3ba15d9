"""Fixtures of the attack tier; the harness itself is tests/attacks/harness.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import forge
from tests.attacks.harness import Sandbox, arm


@pytest.fixture
def sandbox(tmp_path) -> Sandbox:
    return Sandbox(tmp_path)


@pytest.fixture
def forged(sandbox) -> Path:
    """A valid forged bundle of an experiment kvprobe does not ship, its probe armed."""
    bundle = forge.build(sandbox.inputs / "forged-bundle")
    arm(bundle, sandbox.marker)
    return bundle

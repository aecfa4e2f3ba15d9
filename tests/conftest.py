"""Shared fixtures and the test tiers.

Tiers are markers that mean what they say, applied here by folder so no test can forget:
``unit`` (tests/unit: pure, no subprocess, no network, no venv: seconds), ``integration``
(tests/integration: real git repositories, real virtualenvs, real pytest runs), ``attack``
(tests/attacks: hostile bundles through the CLI). ``slow`` (minutes: real SGLang code) and
``network`` (needs PyPI) are set by the tests that need them, on top of their tier.

Fixtures live in the conftest.py of the folder whose tests use them (the fake upstream in
tests/integration/, the attack sandbox in tests/attacks/, a forged run bundle in tests/unit/);
the helpers they wrap stay importable from every folder as ``tests.<module>`` (tests/forge.py,
tests/fakeupstream.py).
"""

from __future__ import annotations

from pathlib import Path

_TESTS = Path(__file__).resolve().parent
_TIERS = {"unit": "unit", "integration": "integration", "attacks": "attack"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        folder = Path(str(item.fspath)).resolve().relative_to(_TESTS).parts[0]
        tier = _TIERS.get(folder)
        if tier is not None:
            item.add_marker(tier)

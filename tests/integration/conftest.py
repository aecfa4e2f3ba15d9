"""Fixtures of the integration tier."""

from __future__ import annotations

import pytest

from tests.fakeupstream import FakeUpstream, build_fake_upstream


@pytest.fixture(scope="session")
def fake_upstream(tmp_path_factory) -> FakeUpstream:
    """One fake upstream for the session; tests that change it build their own."""
    return build_fake_upstream(tmp_path_factory.mktemp("fake-upstream"))

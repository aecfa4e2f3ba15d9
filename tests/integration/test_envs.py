"""Virtualenvs per dependency lock: real virtualenv + pip, built once, locked, reused."""

from __future__ import annotations

import json
import subprocess
import threading

import pytest

from kvprobe.env.venv import MARKER, EnvManager, Profile, load_profile, split_lock
from kvprobe.errors import EnvBuildError
from kvprobe.progress import Reporter

# Builds the pytest-minimal env from its hash-pinned lock: pip needs the package index.
pytestmark = pytest.mark.network


class Counting(Reporter):
    def __init__(self) -> None:
        self.builds = 0
        self.cached = 0

    def step(self, title):  # type: ignore[override]
        if title.startswith("building env"):
            self.builds += 1
        return super().step(title)

    def note(self, text: str) -> None:
        self.cached += "cached" in text


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    reporter = Counting()
    manager = EnvManager(cache, reporter=reporter)
    profile = load_profile("pytest-minimal")
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(manager.ensure(profile))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return cache, manager, profile, reporter, results


def test_concurrent_builders_build_once_and_share(built):
    cache, _, _, reporter, results = built
    assert reporter.builds == 1 and reporter.cached == 1
    assert len({r.path for r in results}) == 1
    envs = [p for p in (cache / "envs").iterdir() if p.is_dir() and not p.name.endswith(".users")]
    assert [p.name for p in envs] == [results[0].path.name]  # no .build-* leftovers


def test_env_is_real_pinned_and_describes_itself(built):
    _, _, _, _, results = built
    info = results[0]
    assert info.packages["pytest"] == "9.2.0"
    out = subprocess.run(
        [str(info.path / "bin" / "python"), "-c", "import pytest; print(pytest.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "9.2.0"
    marker = json.loads((info.path / MARKER).read_text())
    assert marker["lock_sha256"] == info.lock_sha256


def test_incomplete_env_without_marker_is_rebuilt(built):
    _, manager, profile, reporter, results = built
    (results[0].path / MARKER).unlink()
    before = reporter.builds
    again = manager.ensure(profile)
    assert reporter.builds == before + 1 and (again.path / MARKER).is_file()


def test_lock_content_is_the_key(built):
    _, manager, profile, _, _ = built
    other = Profile(profile.name, "", profile.python, profile.lock_name, profile.lock_bytes + b"\n# changed\n")
    from kvprobe.env.venv import find_python

    python = find_python(profile.python)
    assert manager.key(profile, python, None) != manager.key(other, python, None)
    assert manager.key(profile, python, None) != manager.key(profile, python, "https://example.org/cpu")


def test_torch_index_moves_torch_lines_out_of_the_hashed_lock():
    profile = load_profile("sglang-cpu")
    text, extra = split_lock(profile, "https://download.pytorch.org/whl/cpu")
    assert extra == ["torch==2.14.1+cpu", "torchvision==0.29.1+cpu"]
    assert "torch==" not in text and "nvidia-" not in text and "triton==" not in text
    assert "numpy==" in text and "--hash=sha256:" in text
    with pytest.raises(EnvBuildError):
        split_lock(load_profile("pytest-minimal"), "https://example.org/cpu")

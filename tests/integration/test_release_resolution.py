"""The one version resolver (sources/releases.resolve), used by `kvprobe sweep`, `verify --rerun`
of a sweep and `kvprobe gates --sglang VERSION` (issue #12 §5): pip's dry-run report names the
wheel the index serves and the sha256 the index publishes for it; the bytes are then fetched and
checked against that digest. The index here is a local find-links folder of wheels built by the
test; one network test asks PyPI for a real release.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from kvprobe.errors import DigestMismatch, FetchError, UsageError
from kvprobe.gates.target import resolve_target
from kvprobe.progress import Reporter
from kvprobe.sources.releases import resolve, versions_offered
from kvprobe.sources.wheel import WheelSource
from tests.wheelfactory import build_wheel

SGLANG_FILES = {"sglang/__init__.py": "", "sglang/srt/__init__.py": "", "sglang/version.py": "__version__ = '0.5.99'\n"}


@pytest.fixture
def index(tmp_path: Path) -> Path:
    folder = tmp_path / "index"
    build_wheel(folder, "sglang", "0.5.98", {"sglang/__init__.py": ""})
    build_wheel(folder, "sglang", "0.5.99", SGLANG_FILES)
    return folder


@pytest.fixture
def local_index(index, monkeypatch) -> Path:
    """pip (through kvprobe's clean env, which passes PIP_*) sees only the local folder."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    return index


def _flags(index: Path) -> list[str]:
    return ["--no-index", "--find-links", str(index)]


def test_a_release_is_pinned_by_the_index_digest_and_fetched_once(tmp_path, index):
    pin = resolve("sglang", "0.5.99", _flags(index), tmp_path / "resolve")
    wheel = index / "sglang-0.5.99-py3-none-any.whl"
    assert (pin.package, pin.version, pin.filename) == ("sglang", "0.5.99", wheel.name)
    assert pin.sha256 == hashlib.sha256(wheel.read_bytes()).hexdigest()
    source = WheelSource(tmp_path / "cache", pip_args=_flags(index))
    assert source.materialize(pin, tmp_path / "tree")["fetched_via"] == "download"
    assert source.cached_path(pin).read_bytes() == wheel.read_bytes()
    wheel.unlink()  # the index is gone: the pin now materializes from the cache
    assert source.materialize(pin, tmp_path / "tree2")["fetched_via"] == "cache"


def test_bytes_that_are_not_the_resolved_digest_are_refused(tmp_path, index):
    """The index's digest and the bytes received must agree: a wheel swapped after resolution
    (same name, other bytes) is refused and nothing is cached."""
    pin = resolve("sglang", "0.5.99", _flags(index), tmp_path / "resolve")
    build_wheel(index, "sglang", "0.5.99", {**SGLANG_FILES, "sglang/extra.py": "X = 1\n"})
    source = WheelSource(tmp_path / "cache", pip_args=_flags(index))
    with pytest.raises(DigestMismatch, match=f"pinned {pin.sha256}"):
        source.materialize(pin, tmp_path / "tree")
    assert not source.cached_path(pin).exists()


def test_a_version_the_index_does_not_have_is_bad_input_naming_what_it_has(tmp_path, index):
    with pytest.raises(UsageError, match=r"sglang 9\.9\.9: no such release on the index \(it has 0\.5\.98, 0\.5\.99\)"):
        resolve("sglang", "9.9.9", _flags(index), tmp_path / "resolve")


def test_an_index_that_cannot_be_asked_is_could_not_observe(tmp_path):
    with pytest.raises(FetchError) as caught:
        resolve("sglang", "0.5.99", _flags(tmp_path / "nothing"), tmp_path / "resolve")
    assert caught.value.exit_code == 3


@pytest.mark.parametrize(
    ("stderr", "offered"),
    [
        ("ERROR: Could not find a version that satisfies the requirement sglang==9 (from versions: none)", None),
        ("ERROR: ... (from versions: 0.1, 0.2)\nERROR: No matching distribution found", "0.1, 0.2"),
        ("ERROR: ... (from versions: " + ", ".join(f"0.{i}" for i in range(20)) + ")", "0.0 .. 0.19"),
        ("WARNING: Retrying ... NewConnectionError", None),
    ],
)
def test_versions_offered_tells_a_missing_release_from_a_missing_index(stderr, offered):
    assert versions_offered(stderr) == offered


def test_gates_target_for_an_unpinned_release_records_its_digest(tmp_path, local_index):
    target = resolve_target("0.5.99", tmp_path / "work", tmp_path / "cache", Reporter())
    wheel = local_index / "sglang-0.5.99-py3-none-any.whl"
    assert target.kind == "version" and (target.code_root / "sglang" / "srt").is_dir()
    assert target.identity["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert target.identity["filename"] == wheel.name and target.identity["pinned_by"].startswith("index")


def test_a_release_without_sglang_srt_is_bad_input(tmp_path, local_index):
    with pytest.raises(UsageError, match="holds no sglang/srt"):
        resolve_target("0.5.98", tmp_path / "work", tmp_path / "cache", Reporter())


@pytest.mark.network
def test_a_real_release_on_pypi_resolves_by_version(tmp_path):
    """One real sglang release the experiments do not pin (~10 MB from PyPI); pip picks the
    wheel for this host (0.5.23 ships platform wheels), and its digest is what is recorded."""
    target = resolve_target("0.5.23", tmp_path / "work", tmp_path / "cache", Reporter())
    assert target.identity["filename"].startswith("sglang-0.5.23-") and target.identity["filename"].endswith(".whl")
    assert len(target.identity["sha256"]) == 64 and (target.code_root / "sglang" / "srt").is_dir()

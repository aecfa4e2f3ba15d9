"""WheelSource against a real pip download from a local find-links directory."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from kvprobe.errors import CheckoutError, DigestMismatch, FetchError, UsageError
from kvprobe.model.records import WheelPin
from kvprobe.sources.wheel import WheelSource, pin_for_file, platform_args, safe_unzip
from tests.wheelfactory import build_wheel


def _pin(wheel: Path, sha256: str | None = None) -> WheelPin:
    digest = sha256 or hashlib.sha256(wheel.read_bytes()).hexdigest()
    return WheelPin("minipkg", "1.0", wheel.name, digest)


@pytest.fixture
def index(tmp_path: Path) -> Path:
    return tmp_path / "index"


def _source(tmp_path: Path, index: Path) -> WheelSource:
    return WheelSource(tmp_path / "cache", pip_args=["--no-index", "--find-links", str(index)])


def test_download_verify_unpack_and_reuse_cache(tmp_path, index):
    wheel = build_wheel(index)
    pin = _pin(wheel)
    source = _source(tmp_path, index)
    identity = source.materialize(pin, tmp_path / "base")
    assert identity["fetched_via"] == "download"
    assert identity["sha256"] == pin.sha256
    assert (tmp_path / "base" / "minipkg" / "__init__.py").read_text() == "VERSION = '1.0'\n"
    wheel.unlink()  # the index is gone: a second side must come from the cache
    again = source.materialize(pin, tmp_path / "head")
    assert again["fetched_via"] == "cache"
    assert (tmp_path / "head" / "minipkg" / "__init__.py").is_file()


def test_digest_mismatch_names_both_digests_and_caches_nothing(tmp_path, index):
    wheel = build_wheel(index)
    actual = hashlib.sha256(wheel.read_bytes()).hexdigest()
    pin = _pin(wheel, sha256="0" * 64)
    source = _source(tmp_path, index)
    with pytest.raises(DigestMismatch) as caught:
        source.materialize(pin, tmp_path / "base")
    assert "0" * 64 in caught.value.message and actual in caught.value.message
    assert caught.value.exit_code == 3
    assert not source.cached_path(pin).exists()
    assert not (tmp_path / "base").exists()
    leftovers = [p.name for p in (tmp_path / "cache" / "wheels").iterdir() if not p.name.endswith(".lock")]
    assert leftovers == []


def test_truncated_download_fails_unobserved_and_caches_nothing(tmp_path, index):
    wheel = build_wheel(index)
    pin = _pin(wheel)
    data = wheel.read_bytes()
    wheel.write_bytes(data[: len(data) // 2])
    source = _source(tmp_path, index)
    # pip may refuse the broken zip itself, or hand it over and fail our digest check
    with pytest.raises((DigestMismatch, FetchError)) as caught:
        source.materialize(pin, tmp_path / "base")
    assert caught.value.exit_code == 3
    assert not source.cached_path(pin).exists() and not (tmp_path / "base").exists()


def test_truncated_cache_entry_is_detected(tmp_path, index):
    wheel = build_wheel(index)
    pin = _pin(wheel)
    source = _source(tmp_path, index)
    cached, _ = source.fetch(pin)
    cached.write_bytes(cached.read_bytes()[:100])
    wheel.unlink()  # nothing to re-download from: the damaged entry must not be used
    with pytest.raises(FetchError):
        source.fetch(pin)
    assert not cached.exists()


def test_corrupted_cache_entry_is_kept_aside_and_refetched(tmp_path, index):
    wheel = build_wheel(index)
    pin = _pin(wheel)
    source = _source(tmp_path, index)
    source.fetch(pin)
    cached = source.cached_path(pin)
    cached.write_bytes(b"garbage")
    path, via = source.fetch(pin)
    assert via == "download" and hashlib.sha256(path.read_bytes()).hexdigest() == pin.sha256
    assert cached.with_name(cached.name + ".corrupt").read_bytes() == b"garbage"


def test_missing_version_is_a_fetch_error(tmp_path, index):
    build_wheel(index)
    pin = WheelPin("minipkg", "9.9", "minipkg-9.9-py3-none-any.whl", "a" * 64)
    with pytest.raises(FetchError) as caught:
        _source(tmp_path, index).fetch(pin)
    assert "minipkg-9.9-py3-none-any.whl" in caught.value.message


def test_record_mismatch_is_refused(tmp_path, index):
    wheel = build_wheel(index)
    import zipfile

    tampered = tmp_path / "t" / wheel.name
    tampered.parent.mkdir()
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tampered, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info, b"VERSION = 'evil'\n" if info.filename.endswith("__init__.py") else data)
    tampered.replace(wheel)
    with pytest.raises(CheckoutError, match="RECORD"):
        _source(tmp_path, index).materialize(_pin(wheel), tmp_path / "base")


def test_platform_args_select_the_pinned_file():
    args = platform_args("sglang-0.5.21-cp311-cp311-manylinux_2_34_x86_64.whl")
    assert args == [
        "--only-binary=:all:",
        "--platform",
        "manylinux_2_34_x86_64",
        "--python-version",
        "311",
        "--implementation",
        "cp",
        "--abi",
        "cp311",
    ]
    assert platform_args("minipkg-1.0-py3-none-any.whl") == ["--only-binary=:all:"]


def test_file_missing_from_record_is_refused_and_nothing_is_unpacked(tmp_path, index):
    wheel = build_wheel(index, unrecorded={"minipkg/_extra.py": "import os\n"})
    source = _source(tmp_path, index)
    with pytest.raises(CheckoutError) as caught:
        source.materialize(_pin(wheel), tmp_path / "base")
    assert caught.value.exit_code == 3
    assert caught.value.message == (
        f"{wheel.name}: does not match its RECORD: minipkg/_extra.py is not mentioned in RECORD"
    )
    assert not (tmp_path / "base").exists()


def test_record_entry_for_a_missing_file_is_refused_in_one_line(tmp_path, index):
    wheel = build_wheel(index, phantoms=("minipkg/gone.py",))
    with pytest.raises(CheckoutError) as caught:
        _source(tmp_path, index).materialize(_pin(wheel), tmp_path / "base")
    assert caught.value.message == f"{wheel.name}: RECORD lists 'minipkg/gone.py', which the wheel does not hold"
    assert "\n" not in caught.value.message
    assert not (tmp_path / "base").exists()


def test_wheel_without_a_record_is_refused(tmp_path):
    import zipfile

    good = build_wheel(tmp_path / "good")
    bare = tmp_path / "bare" / good.name
    bare.parent.mkdir()
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bare, "w") as dst:
        for info in src.infolist():
            if not info.filename.endswith("/RECORD"):
                dst.writestr(info, src.read(info))
    with pytest.raises(CheckoutError, match="does not match its RECORD"):
        safe_unzip(bare, tmp_path / "tree")


def test_pin_for_file_parses_the_name_with_packaging(tmp_path):
    wheel = build_wheel(tmp_path, name="Mini_Pkg", version="2.0.post1")
    pin = pin_for_file(wheel)
    assert (pin.package, pin.version, pin.filename) == ("mini-pkg", "2.0.post1", wheel.name)
    assert pin.sha256 == hashlib.sha256(wheel.read_bytes()).hexdigest()
    bad = tmp_path / "not-a-wheel.whl"
    bad.write_bytes(b"")
    with pytest.raises(UsageError, match="not a wheel file name"):
        pin_for_file(bad)

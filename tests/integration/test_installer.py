"""uv builds the same env from a hash-pinned lock as pip does, and falls back to pip.

Real virtualenvs, real uv and pip, local ``file://`` indexes built by the test (no network).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kvprobe.env import cache, installer
from kvprobe.env.venv import MARKER, EnvManager, Profile, load_profile
from tests.wheelfactory import build_wheel

needs_uv = pytest.mark.skipif(installer.find_uv() is None, reason="uv is not installed")


def simple_index(root: Path, wheel: Path) -> str:
    """A one-package PEP 503 index under ``root`` whose page links ``wheel`` with its sha256."""
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    page = root / "minipkg"
    page.mkdir(parents=True)
    target = page / wheel.name
    target.write_bytes(wheel.read_bytes())
    (page / "index.html").write_text(
        f'<html><body><a href="{wheel.name}#sha256={digest}">{wheel.name}</a></body></html>'
    )
    return root.as_uri()


@pytest.fixture
def two_indexes(tmp_path, monkeypatch):
    """Index "first" holds another file of minipkg 1.0; "second" holds the pinned one.

    uv alone would take the first index's file for version 1.0 (astral-sh/uv#14000) and
    fail on its hash; pip pools both indexes and picks the file by hash.
    """
    other = build_wheel(tmp_path / "w-other", files={"minipkg/__init__.py": "ORIGIN = 'other'\n"})
    pinned = build_wheel(tmp_path / "w-pinned", files={"minipkg/__init__.py": "ORIGIN = 'pinned'\n"})
    first = simple_index(tmp_path / "first", other)
    second = simple_index(tmp_path / "second", pinned)
    monkeypatch.setenv("PIP_INDEX_URL", second)
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", first)  # uv asks extra indexes before index-url
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    lock = f"minipkg==1.0 \\\n    --hash=sha256:{hashlib.sha256(pinned.read_bytes()).hexdigest()}\n"
    return Profile("minipkg", "", "3", "minipkg.txt", lock.encode())


def origin(python: Path) -> str:
    out = subprocess.run([str(python), "-c", "import minipkg; print(minipkg.ORIGIN)"], capture_output=True, text=True)
    return out.stdout.strip()


@needs_uv
def test_uv_and_pip_build_identical_envs_from_a_small_lock(tmp_path, monkeypatch):
    profile = load_profile("pytest-minimal")
    via_uv = EnvManager(tmp_path / "uv-cache").ensure(profile)
    monkeypatch.setenv(installer.INSTALLER_VAR, "pip")
    via_pip = EnvManager(tmp_path / "pip-cache").ensure(profile)
    assert via_uv.build["installer"]["tool"] == "uv" and via_pip.build["installer"] == {"tool": "pip"}
    assert via_uv.packages == via_pip.packages and via_uv.packages["pytest"] == "9.2.0"
    assert (tmp_path / "uv-cache" / "uv").is_dir()  # the download cache lives in the kvprobe cache


@needs_uv
def test_uv_installs_the_pinned_file_when_an_earlier_index_has_another(two_indexes, tmp_path, monkeypatch):
    via_uv = EnvManager(tmp_path / "uv-cache").ensure(two_indexes)
    monkeypatch.setenv(installer.INSTALLER_VAR, "pip")
    via_pip = EnvManager(tmp_path / "pip-cache").ensure(two_indexes)
    assert via_uv.build["installer"]["tool"] == "uv"
    assert origin(via_uv.path / "bin" / "python") == origin(via_pip.path / "bin" / "python") == "pinned"
    assert via_uv.packages == via_pip.packages


@needs_uv
def test_uv_failure_falls_back_to_pip_and_says_so(two_indexes, tmp_path, monkeypatch):
    """A uv that cannot install (here: one that always fails) leaves the build to pip."""
    fake = tmp_path / "bin" / "uv"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'uv 0.0.0'\n[ \"$1\" = --version ] && exit 0\necho 'broken uv' >&2\nexit 2\n")
    fake.chmod(0o755)
    monkeypatch.setattr(installer, "find_uv", lambda: str(fake))
    info = EnvManager(tmp_path / "cache").ensure(two_indexes)
    marker = json.loads((info.path / MARKER).read_text())
    assert marker["installer"]["tool"] == "pip" and "broken uv" in marker["installer"]["fallback_from_uv"]
    assert origin(info.path / "bin" / "python") == "pinned"


def test_lock_parser_reads_every_pinned_entry_of_the_real_lock():
    reqs = installer.parse_lock(load_profile("sglang-cpu").lock_bytes.decode())
    names = {r.name for r in reqs}
    assert len(reqs) == len(names) == 118 and {"torch", "multiprocess", "PyYAML"} <= names
    assert all(r.version and all(len(h) == 64 for h in r.hashes) for r in reqs)


def test_local_index_names_the_file_by_hash_and_uv_lines_keep_the_hashes(tmp_path):
    pinned = build_wheel(tmp_path / "w")
    url = simple_index(tmp_path / "idx", pinned)
    digest = hashlib.sha256(pinned.read_bytes()).hexdigest()
    wanted = installer.Requirement("MiniPkg", "1.0", (digest,))
    stranger = installer.Requirement("minipkg", "1.0", ("0" * 64,))
    config = installer.IndexConfig(index_url="https://pypi.org/simple", extra_index_urls=(url,))
    direct = installer.local_files([wanted], config)
    assert direct == {"MiniPkg": f"{url}/minipkg/{pinned.name}"}
    assert installer.local_files([stranger], config) == {}
    text = installer.uv_requirements([wanted, installer.Requirement("b", "2", ("1" * 64,))], direct)
    assert text.splitlines() == [
        f"MiniPkg @ {direct['MiniPkg']} --hash=sha256:{digest}",
        f"b==2 --hash=sha256:{'1' * 64}",
    ]


def test_installer_choice_can_be_forced_to_pip(monkeypatch):
    monkeypatch.setenv(installer.INSTALLER_VAR, "pip")
    assert installer.find_uv() is None


@needs_uv
def test_cache_prune_leaves_uv_cache_alone_while_an_env_build_uses_it(two_indexes, tmp_path, monkeypatch):
    """A real uv build paused half way (a wrapper waits before running uv): prune skips uv's cache."""
    root = tmp_path / "cache"
    EnvManager(root).ensure(two_indexes)  # fills uv's cache
    shutil.rmtree(root / "envs")
    wrapper = tmp_path / "bin" / "uv"
    wrapper.parent.mkdir()
    started, go = tmp_path / "started", tmp_path / "go"
    wrapper.write_text(
        f'#!/bin/sh\n[ "$1" = --version ] || {{ touch {started}; while [ ! -e {go} ]; do sleep 0.05; done; }}\n'
        f'exec {installer.find_uv()} "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setattr(installer, "find_uv", lambda: str(wrapper))
    with ThreadPoolExecutor(1) as pool:
        build = pool.submit(EnvManager(root).ensure, two_indexes)
        deadline = time.monotonic() + 120
        while not started.exists():
            assert time.monotonic() < deadline and not build.done(), "uv never started"
            time.sleep(0.05)
        during = {o.entry.kind: o for o in cache.prune(root, everything=True)}
        go.touch()
        info = build.result(timeout=300)
    assert during["uv"].action == "skipped" and "env build in progress" in during["uv"].reason
    assert info.build["installer"]["tool"] == "uv" and origin(info.path / "bin" / "python") == "pinned"
    after = {o.entry.kind: o.action for o in cache.prune(root, everything=True)}
    assert after == {"uv": "deleted", "env": "deleted"} and not (root / "uv").exists()


def test_env_key_for_kvprobes_own_python_is_the_key_its_process_reports(tmp_path):
    """kvprobe's own interpreter is identified without starting it; another path to the same
    binary is started and asked, and both give the same key (cached envs keep their names)."""
    other = tmp_path / "python"
    other.symlink_to(sys.executable)
    manager, profile = EnvManager(tmp_path / "cache"), load_profile("pytest-minimal")
    assert manager.key(profile, sys.executable, None) == manager.key(profile, str(other), None)

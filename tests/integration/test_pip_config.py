"""pip's index settings for uv: asked of a real pip in a real virtualenv, and not asked when
pip has no configuration at all (then the answer is PyPI, pip's default)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from kvprobe import proc
from kvprobe.env import installer
from kvprobe.errors import ObserveError

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the file list is pip's on Linux")


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A virtualenv seeded with pip, as EnvManager creates one."""
    root = tmp_path_factory.mktemp("pipcfg")
    env_dir = root / "env"
    result = proc.run(
        [sys.executable, "-m", "virtualenv", "--no-download", "--no-periodic-update", "--quiet", str(env_dir)],
        timeout_s=300,
        env=proc.clean_env(),
        stdout_path=root / "out",
        stderr_path=root / "err",
    )
    assert result.ok, result.summary()
    return env_dir


@pytest.fixture
def bare(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """No PIP_* variable, an empty HOME and an empty stand-in for /etc: (home, system)."""
    for key in list(os.environ):
        if key.startswith("PIP_"):
            monkeypatch.delenv(key)
    home, system = tmp_path / "home", tmp_path / "etc"
    home.mkdir()
    system.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home, system


def write_conf(path: Path, **settings: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("[global]\n" + "".join(f"{k} = {v}\n" for k, v in settings.items()))


def test_the_files_checked_are_the_files_pip_reads(venv, bare):
    home, _ = bare
    out = proc.capture(
        [str(venv / "bin" / "python"), "-m", "pip", "config", "debug"],
        timeout_s=120,
        env=proc.clean_env({"PYTHONDONTWRITEBYTECODE": "1"}),
    )
    assert out.ok, out.summary()
    listed = re.findall(r"^\s+(/\S+), exists: (?:True|False)$", out.stdout, re.MULTILINE)
    assert sorted(listed) == sorted(str(p) for p in installer.pip_config_files(venv, home))


def test_no_configuration_means_pypi_without_starting_pip(tmp_path, bare, monkeypatch):
    _, system = bare
    monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "pip-cache"))  # settings uv is not handed
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "60")
    no_python = tmp_path / "no-env"  # starting pip here would raise ObserveError
    assert installer.pip_config(no_python, system=system) == installer.IndexConfig()


@pytest.mark.parametrize(
    "var",
    [
        "PIP_INDEX_URL",
        "PIP_EXTRA_INDEX_URL",
        "PIP_FIND_LINKS",
        "PIP_NO_INDEX",
        "PIP_CERT",
        "PIP_CONFIG_FILE",
        "PIP_Index_Url",
    ],
)
def test_a_pip_variable_for_an_index_setting_makes_kvprobe_ask_pip(tmp_path, bare, monkeypatch, var):
    monkeypatch.setenv(var, str(tmp_path / "x"))
    with pytest.raises(ObserveError, match="cannot start"):
        installer.pip_config(tmp_path / "no-env", system=bare[1])


def test_pip_itself_reads_nothing_from_the_other_variables(venv, bare, tmp_path, monkeypatch):
    """Real pip, its files switched off (PIP_CONFIG_FILE=/dev/null, which makes kvprobe ask):
    the variables the fast path disregards give no setting uv is handed."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "pip-cache"))
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "60")
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    assert installer.pip_config(venv, system=bare[1]) == installer.IndexConfig()


@pytest.mark.parametrize("which", range(5))
def test_any_configuration_file_makes_kvprobe_ask_pip(tmp_path, bare, which):
    home, system = bare
    no_python = tmp_path / "no-env"
    write_conf(installer.pip_config_files(no_python, home, system)[which], timeout="5")
    with pytest.raises(ObserveError, match="cannot start"):
        installer.pip_config(no_python, system=system)


def test_a_pip_variable_makes_kvprobe_ask_pip(venv, bare, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "file:///srv/mirror/simple")
    assert installer.pip_config(venv, system=bare[1]).index_url == "file:///srv/mirror/simple"


def test_pip_reads_the_user_and_env_files_and_leaves_the_env_unchanged(venv, bare):
    home, system = bare
    write_conf(
        home / ".config" / "pip" / "pip.conf",
        **{"extra-index-url": "file:///a/simple file:///b/simple", "find-links": "/srv/wheels"},
    )
    write_conf(venv / "pip.conf", **{"index-url": "file:///env/simple"})
    try:
        config = installer.pip_config(venv, system=system)
    finally:
        (venv / "pip.conf").unlink()
    assert config == installer.IndexConfig(
        index_url="file:///env/simple",
        extra_index_urls=("file:///a/simple", "file:///b/simple"),
        find_links=("/srv/wheels",),
        cert=config.cert,  # this machine's /etc/pip.conf may set one
    )
    assert not list((venv / "lib").glob("python3*/site-packages/pip/**/*.pyc"))


def test_the_install_section_overrides_global_and_variables_override_both(venv, bare, monkeypatch):
    """What `pip install` uses: [install] over [global] whatever the order the keys are listed
    in (`pip config list` sorts them), PIP_* over both, another command's section ignored."""
    home, _ = bare
    conf = home / ".config" / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text(
        "[download]\nindex-url = https://download.invalid/simple\n"
        "[global]\nindex-url = https://global.invalid/simple\nfind-links = https://links.invalid/\n"
        "[install]\nindex-url = https://install.invalid/simple\n"
    )
    found = installer.pip_config(venv)
    assert found.index_url == "https://install.invalid/simple"
    assert found.find_links == ("https://links.invalid/",)
    monkeypatch.setenv("PIP_INDEX_URL", "https://env.invalid/simple")
    assert installer.pip_config(venv).index_url == "https://env.invalid/simple"

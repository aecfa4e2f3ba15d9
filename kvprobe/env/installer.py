"""Which installer fills a new env from a hash-pinned lock: uv when present, else pip.

uv installs the same lock with the same guarantees (``--require-hashes --no-deps``,
wheels only) several times faster, and its download cache under the kvprobe cache root
is shared by every profile's lock. uv does not read pip's configuration, so the indexes
pip is configured with (``pip config list``: index-url, extra-index-url, find-links,
cert) are handed to it explicitly, with ``unsafe-best-match`` (pip's rule: any index may
serve a version; the pinned hashes, not the index order, decide which file is trusted).
Asking pip costs a python start and pip's import (about half a second), so it is skipped
when pip has nothing to say: none of its configuration files, and no ``PIP_*`` variable
for those settings.

uv takes all files of one version from the first index that has it (astral-sh/uv#14000),
so a lock file can be unsatisfiable through uv where pip, which pools the files of all
indexes, succeeds. For local (``file://``) indexes kvprobe therefore names the file whose
sha256 the lock pins directly; anything uv still cannot install falls back to pip.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

from kvprobe import proc

INSTALLER_VAR = "KVPROBE_INSTALLER"  # "pip" forces pip; "uv" or unset: uv when found
_SETTINGS = ("index-url", "extra-index-url", "find-links", "no-index", "cert")  # the ones uv is handed
# What `pip install` reads, weakest first: [global], then [install], then PIP_* variables.
_SCOPE_RANK = {"global": 0, "install": 1, ":env:": 2}
_HREF = re.compile(r'href="([^"]+)"', re.IGNORECASE)


@dataclass(frozen=True)
class Requirement:
    """One lock entry: ``name==version`` and the sha256 digests it allows."""

    name: str
    version: str
    hashes: tuple[str, ...]

    @property
    def normalized(self) -> str:
        return re.sub(r"[-_.]+", "-", self.name).lower()


@dataclass(frozen=True)
class IndexConfig:
    """The package sources pip is configured with, in pip's terms."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    cert: str | None = None


def find_uv() -> str | None:
    """The uv binary to use, or None for pip (absent, or KVPROBE_INSTALLER=pip)."""
    if os.environ.get(INSTALLER_VAR, "").strip().lower() == "pip":
        return None
    beside = Path(sys.executable).parent / "uv"  # installed with kvprobe (dependency `uv`)
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("uv")


def parse_lock(text: str) -> list[Requirement]:
    """``name==version`` entries with their ``--hash=sha256:`` lines (pip's lock format)."""
    joined = re.sub(r"\\\s*\n", " ", text)
    reqs = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        spec, *opts = line.split()
        name, sep, version = spec.partition("==")
        hashes = tuple(o.split(":", 1)[1] for o in opts if o.startswith("--hash=sha256:"))
        if sep and hashes:
            reqs.append(Requirement(name.strip(), version.strip(), hashes))
    return reqs


def pip_config_files(prefix: Path, home: Path, system: Path = Path("/etc")) -> list[Path]:
    """The files pip reads its configuration from on Linux, for an env at ``prefix``.

    Global (XDG's default and /etc), the env's own, the user's (legacy and XDG): the list
    ``pip config debug`` shows when no XDG_* variable is set, and kvprobe passes pip none.
    """
    return [
        system / "xdg" / "pip" / "pip.conf",
        system / "pip.conf",
        prefix / "pip.conf",
        home / ".pip" / "pip.conf",
        home / ".config" / "pip" / "pip.conf",
    ]


def pip_config(env_dir: Path, *, system: Path = Path("/etc")) -> IndexConfig:
    """pip's index settings as ``pip install`` reads them from ``pip config list``: ``[install]``
    over ``[global]``, ``PIP_*`` variables over both (another command's section is not read).

    pip is not asked when it has nothing to say (Linux, none of :func:`pip_config_files`,
    no ``PIP_*`` variable for a setting read here or for a config file): the answer would
    be no setting, which means PyPI. pip runs without writing bytecode: asking leaves the
    new env as it was.
    """
    env = proc.clean_env({"PYTHONDONTWRITEBYTECODE": "1"}, network=True, passthrough_prefixes=("PIP_",))
    if not _pip_configured(env_dir, env, system):
        return IndexConfig()
    result = proc.capture([str(env_dir / "bin" / "python"), "-m", "pip", "config", "list"], timeout_s=60, env=env)
    found: dict[str, tuple[int, str]] = {}
    for line in result.stdout.splitlines() if result.ok else []:
        key, sep, value = line.partition("=")
        scope, _, name = key.rpartition(".")
        rank = _SCOPE_RANK.get(scope)
        if sep and rank is not None and rank >= found.get(name, (-1, ""))[0]:
            found[name] = (rank, value.strip().strip("'\""))
    return _index_config({name: value for name, (_, value) in found.items()})


def _index_config(found: dict[str, str]) -> IndexConfig:
    """pip's settings by name, as the installer's record."""
    return IndexConfig(
        index_url=found.get("index-url"),
        extra_index_urls=tuple(found.get("extra-index-url", "").split()),
        find_links=tuple(found.get("find-links", "").split()),
        no_index=found.get("no-index", "").lower() in ("1", "true", "yes", "on"),
        cert=found.get("cert"),
    )


def _pip_configured(env_dir: Path, env: dict[str, str], system: Path) -> bool:
    """Whether pip might have settings: anywhere but Linux, pip's own rules are not spelled out here.

    A variable is named as pip names it (``PIP_`` dropped, lower case, ``_`` as ``-``).
    """
    named = {key[4:].lower().replace("_", "-") for key in env if key.startswith("PIP_")}
    if sys.platform != "linux" or named & {*_SETTINGS, "config-file"}:
        return True
    return any(path.exists() for path in pip_config_files(env_dir, Path(env["HOME"]), system))


def local_files(reqs: list[Requirement], config: IndexConfig) -> dict[str, str]:
    """Lock name -> ``file://`` URL of the pinned file, from local simple indexes' pages."""
    indexes = [u for u in (config.index_url, *config.extra_index_urls) if u and u.startswith("file://")]
    chosen: dict[str, str] = {}
    for req in reqs:
        for index in indexes:
            url = _pinned_href(index, req)
            if url:
                chosen[req.name] = url
                break
    return chosen


def _pinned_href(index: str, req: Requirement) -> str | None:
    page_url = index.rstrip("/") + f"/{req.normalized}/"
    page = Path(unquote(urlparse(page_url).path)) / "index.html"
    try:
        text = page.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for href in _HREF.findall(text):
        href = html.unescape(href)
        target, _, fragment = href.partition("#")
        if fragment.startswith("sha256=") and fragment[7:] in req.hashes and target.endswith(".whl"):
            url = urljoin(page_url, target)
            if url.startswith("file://") and Path(unquote(urlparse(url).path)).is_file():
                return url
    return None


def uv_requirements(reqs: list[Requirement], direct: dict[str, str]) -> str:
    """The lock for uv: pinned local files named directly, the rest as ``name==version``."""
    lines = []
    for req in reqs:
        spec = f"{req.name} @ {direct[req.name]}" if req.name in direct else f"{req.name}=={req.version}"
        lines.append(" ".join([spec, *(f"--hash=sha256:{h}" for h in req.hashes)]))
    return "\n".join(lines) + "\n"


def uv_index_args(config: IndexConfig) -> list[str]:
    """uv flags for pip's sources (uv's own UV_* settings still apply on top)."""
    args = ["--index-strategy", "unsafe-best-match"]
    if config.no_index:
        args.append("--no-index")
    if config.index_url:
        args += ["--index-url", config.index_url]
    for url in config.extra_index_urls:
        args += ["--extra-index-url", url]
    for link in config.find_links:
        args += ["--find-links", link]
    return args


def uv_env(config: IndexConfig) -> dict[str, str]:
    """uv's environment: network settings, UV_* settings, and pip's CA bundle if it has one."""
    env = proc.clean_env(network=True, passthrough_prefixes=("UV_",))
    if config.cert and "SSL_CERT_FILE" not in env:
        env["SSL_CERT_FILE"] = config.cert
    return env


def uv_version(uv: str) -> str:
    result = proc.capture([uv, "--version"], timeout_s=30, env=proc.clean_env())
    return result.stdout.strip() if result.ok else "uv (version unknown)"

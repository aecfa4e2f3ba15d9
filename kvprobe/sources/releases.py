"""Releases on the package index: which versions a --releases SPEC names, which a profile
serves, and each one's wheel pin (file name and sha256, as the index states them).

A new release needs no code change: versions and digests come from the index through pip,
and the wheel itself is then fetched (once per digest) and checked by sources/wheel.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from kvprobe.errors import FetchError, UsageError
from kvprobe.model.records import WheelPin
from kvprobe.proc import read_tail
from kvprobe.sources.wheel import run_pip

_OPERATOR = re.compile(r"^\s*(===|==|!=|~=|<=|>=|<|>)")


def _version(text: str, spec: str, option: str) -> Version:
    try:
        return Version(text.strip())
    except InvalidVersion:
        raise UsageError(f"{option} {spec!r}: {text.strip()!r} is not a version") from None


def select(
    spec: str, available: list[str], *, option: str = "--releases", among: str = "a release on the index"
) -> list[str]:
    """The versions of ``available`` that ``spec`` names, ascending.

    A SPEC is comma-separated items: ``A..B`` (every release from A through B), a version
    (``0.5.19``), or a specifier (``>=0.5.20``). Ranges and versions add up; specifiers
    together form one set that also adds its matches (``>=0.5.20,<0.5.23`` is one set).
    UsageError (naming ``option``) for a malformed item or a named version ``available``
    does not hold (not ``among``)."""
    items = [item.strip() for item in spec.split(",") if item.strip()]
    if not items:
        raise UsageError(f"{option} is empty: give versions, ranges (A..B) or specifiers (>=X)")
    versions = {_version(v, spec, option): v for v in available}
    chosen: set[Version] = set()
    specifiers = [item for item in items if _OPERATOR.match(item)]
    for item in items:
        if item in specifiers:
            continue
        if ".." in item:
            low, high = (_version(part, spec, option) for part in item.split("..", 1))
            if low > high:
                low_text, high_text = (part.strip() for part in item.split("..", 1))
                raise UsageError(
                    f"{option}: {item} is a reversed range (from {low_text} down to {high_text}); "
                    f"write it lowest first: {high_text}..{low_text}"
                )
            chosen |= {v for v in versions if low <= v <= high}
        else:
            wanted = _version(item, spec, option)
            if wanted not in versions:
                raise UsageError(f"{option}: {item} is not {among}")
            chosen.add(wanted)
    if specifiers:
        chosen |= {v for v in versions if v in specifier_set(",".join(specifiers), option)}
    return [versions[v] for v in sorted(chosen)]


def specifier_set(text: str, where: str) -> SpecifierSet:
    try:
        return SpecifierSet(text)
    except InvalidSpecifier as exc:
        raise UsageError(f"{where}: {text!r} is not a version specifier: {exc}") from None


def serves(serves_spec: str | None, version: str) -> bool:
    """A profile's ``serves`` (a specifier set; absent: every release) admits ``version``."""
    if serves_spec is None:
        return True
    return specifier_set(serves_spec, "profile serves").contains(version, prereleases=True)


def ascending(versions: list[str]) -> list[str]:
    return sorted(versions, key=Version)


def index_versions(package: str, flags: list[str], scratch: Path, *, timeout_s: float = 120.0) -> list[str]:
    """Every (final or post) release of ``package`` the index has a wheel of for ``flags``."""
    run_pip(
        ["index", "versions", package, *flags],
        scratch,
        timeout_s=timeout_s,
        failure=f"could not list {package} releases",
    )
    text = (scratch / "pip.out").read_text(encoding="utf-8", errors="replace")
    match = re.search(r"^Available versions:\s*(.*)$", text, re.MULTILINE)
    if match is None:
        raise FetchError(f"pip index versions {package}: no 'Available versions' line in its output")
    return ascending([v.strip() for v in match.group(1).split(",") if v.strip()])


def resolve(package: str, version: str, flags: list[str], scratch: Path, *, timeout_s: float = 300.0) -> WheelPin:
    """The wheel the index serves for ``package==version``, pinned by the sha256 the index
    publishes for it (pip's dry-run report: no wheel is downloaded here). The bytes are checked
    against that digest when they are fetched (WheelSource.fetch): the index's digest and the
    bytes received must agree. UsageError when the index has no such release; FetchError when
    the index cannot be asked or names no single wheel with a digest."""
    report = scratch / "report.json"
    try:
        run_pip(
            [
                "install",
                "--dry-run",
                "--no-deps",
                "--ignore-installed",
                "--quiet",
                "--target",
                str(scratch / "target"),
                "--report",
                str(report),
                *flags,
                f"{package}=={version}",
            ],
            scratch,
            timeout_s=timeout_s,
            failure=f"could not resolve {package}=={version} on the index",
        )
    except FetchError:
        offered = versions_offered(read_tail(scratch / "pip.err", 64 * 1024))
        if offered:
            raise UsageError(f"{package} {version}: no such release on the index (it has {offered})") from None
        raise
    try:
        (item,) = json.loads(report.read_text(encoding="utf-8"))["install"]
        info = item["download_info"]
        url, digest = info["url"], info["archive_info"]["hashes"]["sha256"]
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise FetchError(f"pip's report for {package}=={version} names no single wheel with a sha256: {exc}") from exc
    filename = url.rsplit("/", 1)[-1].split("#", 1)[0]
    if not filename.endswith(".whl"):
        raise FetchError(f"{package}=={version}: the index offers {filename}, not a wheel")
    return WheelPin(package, version, filename, digest)


def versions_offered(pip_stderr: str) -> str | None:
    """The versions pip says the index has, when it refused a version for not being one of
    them; None when it saw none (index unreachable or package unknown: not the user's input)."""
    match = re.search(r"\(from versions: ([^)]*)\)", pip_stderr)
    if match is None or match[1].strip() in ("", "none"):
        return None
    versions = [v.strip() for v in match[1].split(",")]
    return ", ".join(versions) if len(versions) <= 6 else f"{versions[0]} .. {versions[-1]}"

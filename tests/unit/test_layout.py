"""The unit tests mirror the package: a newcomer finds the tests of kvprobe/<sub>/ in tests/unit/<sub>/.

The rule, by the code a test file is about:
- a module of a sub-package, kvprobe/<sub>/<module>.py: tests/unit/<sub>/test_<...>.py;
- a top-level module, kvprobe/<module>.py: tests/unit/core/test_<...>.py;
- the repository as a whole (import layers, this layout, docs links, commit messages): tests/unit/, named
  in REPOSITORY_WIDE below.
"""

from __future__ import annotations

from pathlib import Path

UNIT = Path(__file__).resolve().parent
PACKAGE = UNIT.parents[1] / "kvprobe"
CORE = "core"  # tests of kvprobe's top-level modules (kvprobe/text.py, kvprobe/proc.py, ...)
REPOSITORY_WIDE = {"test_architecture.py", "test_layout.py", "test_docs_links.py"}


def sub_packages(package: Path) -> set[str]:
    """The folders of ``package`` that hold Python modules (kvprobe/probe_api/ has no __init__)."""
    return {p.name for p in package.iterdir() if p.is_dir() and any(p.glob("*.py"))}


def misplaced(unit: Path, package: Path) -> list[str]:
    """Test files under ``unit`` that sit where the rule above does not put them."""
    allowed = sub_packages(package) | {CORE}
    found = []
    for path in sorted(unit.rglob("test_*.py")):
        parts = path.relative_to(unit).parts
        if len(parts) == 1 and parts[0] in REPOSITORY_WIDE:
            continue
        if len(parts) != 2 or parts[0] not in allowed:
            found.append("/".join(parts))
    return found


def test_every_unit_test_file_sits_in_the_folder_of_a_sub_package():
    assert misplaced(UNIT, PACKAGE) == [], (
        "tests/unit/<sub>/ for kvprobe/<sub>/, tests/unit/core/ for kvprobe's top-level modules "
        f"(folders allowed: {sorted(sub_packages(PACKAGE) | {CORE})})"
    )


def test_a_flat_file_and_a_folder_the_package_lacks_are_named(tmp_path):
    package, unit = tmp_path / "kvprobe", tmp_path / "unit"
    for name in ("kvprobe/verify/steps.py", "kvprobe/probe_api/kvprobe_probe.py", "kvprobe/text.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    (package / "assets").mkdir()  # data only: no sub-package
    for name in (
        "verify/test_steps.py",
        "probe_api/test_probe.py",
        "core/test_text.py",
        "test_layout.py",
        "test_flat.py",
        "sweep/test_sweep.py",
        "assets/test_assets.py",
        "verify/deep/test_deeper.py",
    ):
        (unit / name).parent.mkdir(parents=True, exist_ok=True)
        (unit / name).write_text("")
    assert sub_packages(package) == {"verify", "probe_api"}
    assert misplaced(unit, package) == [
        "assets/test_assets.py",
        "sweep/test_sweep.py",
        "test_flat.py",
        "verify/deep/test_deeper.py",
    ]

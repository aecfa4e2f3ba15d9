"""A probe whose import fails on a release is data per case, not a crashed probe process.

Each test builds a small package of its own (one "release" of it), a probe beside it, and
runs the probe through the real harness (``checks.probes.run_probe``: a subprocess of the
probe API's runner) with that package first on PYTHONPATH.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvprobe.checks.probes import ProbeRun, run_probe

DOOR_OLD = "def add(req):\n    return [req]\n"
DOOR_NEW = DOOR_OLD + "\ndef retire(req):\n    return []\n"

PROBE = '''"""Does the door retire a rejected request?"""
import kvprobe_probe as kp

probe = kp.Probe("doors", mocks={"nothing": "the fake door needs no mock"})
{imports}

DECISION = "fakedoor.door.retire"


@probe.case("door.retire", "a rejected request at the door", decision=DECISION)
def _(obs):
    with obs.decision():
        obs.record("retired", retire("rejected") == [])


@probe.case("door.add", description="control: a valid request", decision="fakedoor.door.add")
def _(obs):
    with obs.decision():
        obs.record("queued", add("valid") == ["valid"])


if __name__ == "__main__":
    probe.main()
'''


def run(
    tmp_path: Path,
    package: dict[str, str],
    imports: str,
    helpers: dict[str, str] | None = None,
    probe_text: str | None = None,
) -> ProbeRun:
    tree, probe_dir, scratch = tmp_path / "tree", tmp_path / "probe", tmp_path / "scratch"
    for rel, code in {"fakedoor/__init__.py": "", **package}.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(code)
    for folder in (probe_dir, scratch, tmp_path / "logs"):
        folder.mkdir(exist_ok=True)
    for name, code in (helpers or {}).items():
        (probe_dir / name).write_text(code)
    (probe_dir / "doors.py").write_text(probe_text or PROBE.replace("{imports}", imports))
    return run_probe(
        python=sys.executable,
        probe_file=probe_dir / "doors.py",
        python_path=[tree],
        out_json=tmp_path / "doors.json",
        log_dir=tmp_path / "logs",
        side_config={"side": "base"},
        env_extra={},
        scratch=scratch,
        timeout_s=60,
    )


def cases(result: ProbeRun) -> dict[str, dict]:
    assert result.ok, result.problem  # a schema-valid document, the process exited 0
    assert result.output is not None
    return {c["name"]: c for c in result.output["cases"]}


def test_the_release_with_the_symbol_is_observed(tmp_path):
    found = cases(run(tmp_path, {"fakedoor/door.py": DOOR_NEW}, "from fakedoor.door import add, retire"))
    assert {n: (c["observation"], c["observations"]) for n, c in found.items()} == {
        "door.retire": ("observed", {"retired": True}),
        "door.add": ("observed", {"queued": True}),
    }


@pytest.mark.parametrize(
    ("package", "imports", "missing"),
    [
        ({"fakedoor/door.py": DOOR_OLD}, "from fakedoor.door import add, retire", "fakedoor.door.retire"),
        ({}, "from fakedoor.door import add, retire", "fakedoor.door"),
        (
            {"fakedoor/door.py": DOOR_NEW},
            "import fakedoor.door\nfrom fakedoor.prefill import Queue",
            "fakedoor.prefill",
        ),
        (
            {"fakedoor/door.py": "raise ImportError('door needs the PD kernel of a later release')\n"},
            "from fakedoor.door import add, retire",
            "fakedoor.door",
        ),
    ],
    ids=["symbol-missing", "module-missing", "second-module-missing", "module-raises-importerror"],
)
def test_a_failed_module_level_import_is_not_present_in_every_case(tmp_path, package, imports, missing):
    found = cases(run(tmp_path, package, imports))
    assert list(found) == ["door.retire", "door.add"]  # declared order, both, though none registered
    for case in found.values():
        assert (case["observation"], case["status"], case["missing"]) == ("not-present", "raised", [missing])
        assert case["error"]["type"] == "kvprobe_probe.NotPresent"
        assert case["error"]["root_type"] in ("ImportError", "ModuleNotFoundError")
    assert found["door.retire"]["decision_point"] == "fakedoor.door.retire"  # a module-level constant
    assert found["door.add"]["description"] == "control: a valid request"
    if "raise ImportError" in package.get("fakedoor/door.py", ""):
        assert "PD kernel" in found["door.add"]["error"]["root_message"]


def test_a_dependency_outside_the_package_is_unobserved_not_absent(tmp_path):
    door = "import kvprobe_no_such_kernel\n" + DOOR_NEW
    found = cases(run(tmp_path, {"fakedoor/door.py": door}, "from fakedoor.door import add, retire"))
    for case in found.values():
        assert (case["observation"], case["missing"]) == ("unobserved", [])
        assert "kvprobe_no_such_kernel" in case["reason"]


def test_an_import_in_a_helper_beside_the_probe_names_what_the_helper_lacks(tmp_path):
    helper = "from fakedoor.door import add, retire  # the release's door\n"
    found = cases(
        run(tmp_path, {"fakedoor/door.py": DOOR_OLD}, "from doorworld import add, retire", {"doorworld.py": helper})
    )
    assert {c["missing"][0] for c in found.values()} == {"fakedoor.door.retire"}


def test_an_import_inside_a_case_before_its_decision_point_is_not_present(tmp_path):
    imports = "from fakedoor.door import add\n\n\ndef retire(req):\n    return []"
    in_case = PROBE.replace("{imports}", imports).replace(
        '    with obs.decision():\n        obs.record("retired"',
        '    from fakedoor.door import retire\n\n    with obs.decision():\n        obs.record("retired"',
    )
    assert in_case != PROBE.replace("{imports}", imports)
    found = cases(run(tmp_path, {"fakedoor/door.py": DOOR_OLD}, imports, probe_text=in_case))
    assert found["door.add"]["observation"] == "observed"
    assert (found["door.retire"]["observation"], found["door.retire"]["missing"]) == (
        "not-present",
        ["fakedoor.door.retire"],
    )


def test_an_import_before_any_probe_is_declared_is_still_a_crash(tmp_path):
    crash = "from fakedoor.door import retire\nimport kvprobe_probe\n"
    result = run(tmp_path, {"fakedoor/door.py": DOOR_OLD}, "", probe_text=crash)
    assert not result.ok and result.exit_code != 0
    assert "cannot import name 'retire'" in (tmp_path / "logs" / "doors.stderr").read_text()


def test_an_absent_name_is_unobserved_where_the_release_does_not_import_in_this_env(tmp_path):
    """The helper's import of ``retire`` fails (absent) before the probe reaches its import of
    ``fakedoor.sched``, which this env cannot import (a kernel it lacks): nothing of the release
    is observable here, so neither case may claim the code path absent (measured on SGLang
    0.5.2-0.5.11, whose probe world lacks a set-up name and whose scheduler needs sgl_kernel)."""
    helper = "from fakedoor.door import add, retire\nimport fakedoor.sched\n"
    package = {"fakedoor/door.py": DOOR_OLD, "fakedoor/sched.py": "import kvprobe_no_such_kernel\n"}
    found = cases(run(tmp_path, package, "from doorworld import add, retire", {"doorworld.py": helper}))
    for case in found.values():
        assert (case["observation"], case["missing"]) == ("unobserved", []), case
        assert "kvprobe_no_such_kernel" in case["reason"] and "fakedoor.door.retire" in case["reason"]
        assert "says nothing of the code path" in case["reason"]
    # the same release with a scheduler this env imports: the name is absent, as before
    package["fakedoor/sched.py"] = "X = 1\n"
    found = cases(run(tmp_path / "importable", package, "from doorworld import add, retire", {"doorworld.py": helper}))
    assert {(c["observation"], c["missing"][0]) for c in found.values()} == {("not-present", "fakedoor.door.retire")}


def test_a_release_module_that_raises_at_import_is_unobserved_per_case_not_a_dead_probe(tmp_path):
    """SGLang 0.5.1 and 0.5.5.post1-0.5.10.post1 raise ValueError in transformers 5.12.1 while the
    probe imports them: each declared case says so, where the probe used to die without output."""
    package = {"fakedoor/door.py": "raise ValueError('Image processor class must inherit from BaseImageProcessor')\n"}
    found = cases(run(tmp_path, package, "from fakedoor.door import add, retire"))
    assert list(found) == ["door.retire", "door.add"]
    for case in found.values():
        assert (case["observation"], case["missing"]) == ("unobserved", []), case
        assert case["reason"].startswith("importing fakedoor.door raised ValueError in fakedoor.door: Image processor")
        assert case["reason"].endswith("this env cannot import the release")

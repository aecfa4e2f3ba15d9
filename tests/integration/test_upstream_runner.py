"""Real pytest runs of small upstream-like trees, in real virtualenvs (pytest 9.2.0, pytest 8)
and in the system python's pytest when its version differs."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from kvprobe import proc
from kvprobe.checks.upstream import Overlay, TestFileRun, load_report, overlay_test_file, run_test_file
from kvprobe.errors import CheckRunError, UsageError
from kvprobe.model.records import FailureKind, Outcome, Transition
from kvprobe.rules.pytest_results import results_from_report, transitions

pytestmark = [pytest.mark.slow, pytest.mark.network]

TARGETS = {"pytest-9.2.0": "pytest==9.2.0", "pytest-8": "pytest>=8.2,<9", "system": None}


def _build_venv(root: Path, requirement: str) -> Path:
    """A venv with ``requirement`` installed; pytest.fail with pip's last line if it fails."""
    logs = root.parent / f"{root.name}-logs"
    steps = (
        [sys.executable, "-m", "venv", str(root)],
        [str(root / "bin" / "python"), "-m", "pip", "install", "-q", requirement],
    )
    for argv in steps:
        result = proc.run(
            argv,
            timeout_s=600,
            cwd=root.parent,
            env=proc.clean_env(network=True, passthrough_prefixes=("PIP_",)),
            stdout_path=logs / "stdout",
            stderr_path=logs / "stderr",
        )
        if not result.ok:
            pytest.fail(f"cannot build {root.name}: {result.summary()}")
    return root / "bin" / "python"


@pytest.fixture(scope="session", params=list(TARGETS))
def target_python(request, tmp_path_factory) -> Path:
    """The interpreter the upstream tests run in; one venv per target per session."""
    if TARGETS[request.param] is None:
        if pytest.__version__ == "9.2.0":
            pytest.skip("the system pytest is 9.2.0, already covered")
        return Path(sys.executable)
    return _build_venv(tmp_path_factory.mktemp("venvs") / request.param, TARGETS[request.param])


PKG_BASE = "def answer():\n    return 41\n"
PKG_HEAD = "def answer():\n    return 42\n\ndef helper():\n    return 'fixed'\n"

MIXED = '''
import os
import unittest
import pytest
import pkg

class CustomTestCase(unittest.TestCase):
    """Like SGLang's: re-raise a plain Exception from inside except."""
    def _retry(self, fn):
        try:
            fn()
        except Exception:
            raise Exception("retry() exceed maximum number of retries.")

class TestMixed(CustomTestCase):
    def test_retry_attribute(self):
        self._retry(lambda: pkg.helper())

    def test_retry_assertion(self):
        self._retry(lambda: self.assertEqual(pkg.answer(), 42))

    def test_subtests(self):
        for i in range(3):
            with self.subTest("case", i=i):
                self.assertFalse(i == 1 and pkg.answer() == 41)

def test_attribute():
    assert pkg.helper() == "fixed"

def test_assertion():
    assert pkg.answer() == 42

def test_ok():
    assert pkg.answer() in (41, 42)

def test_env():
    assert os.environ["SGLANG_TEST_MAX_RETRY"] == "0"
    assert os.environ["SGLANG_IS_IN_CI"] == "false"
    assert os.environ["KVPROBE_SIDE"] == "x"
    assert os.environ["HOME"] != os.path.expanduser("~root")
    assert "GITHUB_TOKEN" not in os.environ

@pytest.fixture
def broken():
    return pkg.helper()

def test_setup_error(broken):
    pass
'''


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def run(
    python: Path, tree: Path, test_rel: str, source: str, tmp: Path, *, timeout_s: float = 120, hint: str | None = None
) -> TestFileRun:
    result = run_test_file(
        python=python,
        tree=tree,
        rootdir_hint=hint,
        test_rel=test_rel,
        head_test_bytes=textwrap.dedent(source).encode(),
        python_path=[tree],
        out_dir=tmp / "raw",
        log_dir=tmp / "logs",
        timeout_s=timeout_s,
        env_extra={"KVPROBE_SIDE": "x"},
    )
    # the bundle verifier's path: the raw report alone gives the same results
    assert results_from_report(load_report(result.report_path)) == list(result.results)
    return result


def by_name(run_: TestFileRun) -> dict[str, object]:
    return {r.key.split("::", 1)[1] if "::" in r.key else r.key: r for r in run_.results}


def pytest_major(run_: TestFileRun) -> int:
    return int(load_report(run_.report_path)["pytest_version"].split(".")[0])


def test_failure_kinds_walk_the_exception_chain(target_python, tmp_path):
    tree = make_tree(tmp_path / "base", {"pkg/__init__.py": PKG_BASE})
    result = run(target_python, tree, "tests/test_mixed.py", MIXED, tmp_path)
    got = by_name(result)
    assert result.exit_code == 1 and not result.timed_out
    assert result.overlay == Overlay.ADDED
    assert (got["test_attribute"].kind, got["test_attribute"].exc_type) == (FailureKind.EXCEPTION, "AttributeError")
    assert (got["test_assertion"].kind, got["test_assertion"].exc_type) == (FailureKind.ASSERTION, "AssertionError")
    retry = got["TestMixed::test_retry_attribute"]
    assert (retry.outcome, retry.kind, retry.exc_type) == (Outcome.FAILED, FailureKind.EXCEPTION, "AttributeError")
    assert "helper" in retry.message
    assert got["TestMixed::test_retry_assertion"].kind is FailureKind.ASSERTION
    setup = got["test_setup_error"]
    assert (setup.outcome, setup.kind, setup.exc_type) == (Outcome.ERROR, FailureKind.EXCEPTION, "AttributeError")
    assert got["test_env"].outcome is Outcome.PASSED
    assert result.env_pinned["SGLANG_TEST_MAX_RETRY"] == "0"
    raw = load_report(result.report_path)
    chains = [
        t["exception"]["chain"] for t in raw["tests"] if t["nodeid"].endswith("test_retry_attribute") and t["exception"]
    ]
    assert chains == [["Exception", "AttributeError"]]
    assert result.junit_path is not None and result.junit_path.exists()
    assert result.stdout_path.read_text().strip()


def test_unittest_subtests_are_counted_apart(target_python, tmp_path):
    tree = make_tree(tmp_path / "base", {"pkg/__init__.py": PKG_BASE})
    result = run(target_python, tree, "tests/test_mixed.py", MIXED, tmp_path)
    got = by_name(result)
    if pytest_major(result) >= 9:
        # pytest 9: one SubtestReport per subTest; pytest passes the parent, but a test with a
        # failed subtest has not passed: FAILED, with no kind of its own (the subtest carries it)
        failed = got["TestMixed::test_subtests [case, i=1]"]
        assert (failed.outcome, failed.kind, failed.subtest) == (Outcome.FAILED, FailureKind.ASSERTION, "case, i=1")
        assert got["TestMixed::test_subtests [case, i=0]"].outcome is Outcome.PASSED
        assert (result.counts["subtests_passed"], result.counts["subtests_failed"]) == (2, 1)
        assert result.failure_kinds() == {"assertion": 3, "AttributeError": 3}
        parent = got["TestMixed::test_subtests"]
        assert (parent.outcome, parent.kind) == (Outcome.FAILED, None)
        assert result.counts["tests_failed"] == 5
    else:
        # pytest 8 without pytest-subtests: the first failing subTest fails the test
        assert got["TestMixed::test_subtests"].kind is FailureKind.ASSERTION
        assert result.counts["subtests_failed"] == 0
        assert result.failure_kinds() == {"assertion": 3, "AttributeError": 3}
        assert result.counts["tests_failed"] == 5
    assert result.counts["tests_error"] == 1


def test_base_to_head_transitions(target_python, tmp_path):
    base = make_tree(tmp_path / "base", {"pkg/__init__.py": PKG_BASE, "tests/test_mixed.py": "def test_old(): pass\n"})
    head = make_tree(tmp_path / "head", {"pkg/__init__.py": PKG_HEAD, "tests/test_mixed.py": MIXED})
    base_run = run(target_python, base, "tests/test_mixed.py", MIXED, tmp_path / "b")
    head_run = run(target_python, head, "tests/test_mixed.py", MIXED, tmp_path / "h")
    assert (base_run.overlay, head_run.overlay) == (Overlay.REPLACED, Overlay.IDENTICAL)
    assert head_run.exit_code == 0, head_run.stdout_path.read_text()
    moved = {k.split("::", 1)[1]: v for k, v in transitions(base_run.results, head_run.results).items()}
    assert moved["test_attribute"] is Transition.FAIL_TO_PASS
    assert moved["TestMixed::test_retry_attribute"] is Transition.FAIL_TO_PASS
    assert moved["test_setup_error"] is Transition.FAIL_TO_PASS
    assert moved["test_ok"] is Transition.PASS_TO_PASS
    if pytest_major(head_run) >= 9:
        assert moved["TestMixed::test_subtests [case, i=1]"] is Transition.FAIL_TO_PASS
        assert moved["TestMixed::test_subtests [case, i=0]"] is Transition.PASS_TO_PASS


def test_a_base_that_cannot_import_is_a_collection_result(target_python, tmp_path):
    source = "from pkg import helper\n\ndef test_helper():\n    assert helper() == 'fixed'\n"
    base = make_tree(tmp_path / "base", {"pkg/__init__.py": PKG_BASE})
    head = make_tree(tmp_path / "head", {"pkg/__init__.py": PKG_HEAD})
    base_run = run(target_python, base, "tests/test_new.py", source, tmp_path / "b")
    head_run = run(target_python, head, "tests/test_new.py", source, tmp_path / "h")
    [error] = base_run.results
    assert base_run.exit_code == 2
    assert (error.nodeid, error.outcome, error.kind, error.exc_type) == (
        "tests/test_new.py",
        Outcome.ERROR,
        FailureKind.COLLECTION,
        "ImportError",
    )
    assert base_run.failure_kinds() == {"assertion": 0, "collection": 1}
    assert transitions(base_run.results, head_run.results) == {
        "tests/test_new.py": Transition.ERROR,
        "tests/test_new.py::test_helper": Transition.NOT_RUN,
    }


def test_no_tests_collected_is_an_error(target_python, tmp_path):
    tree = make_tree(tmp_path / "t", {"pkg/__init__.py": PKG_BASE})
    result = run(target_python, tree, "tests/test_empty.py", "import pkg\n", tmp_path)
    [error] = result.results
    assert result.exit_code == 5 and result.pytest_exit == 5
    assert (error.outcome, error.kind) == (Outcome.ERROR, FailureKind.COLLECTION)
    assert result.counts["tests_passed"] == 0
    assert transitions(result.results, result.results) == {"tests/test_empty.py": Transition.ERROR}


def test_timeout_kills_the_run_and_keeps_finished_tests(target_python, tmp_path):
    source = """
        import time

        def test_fast():
            pass

        def test_sleeps():
            time.sleep(600)
    """
    tree = make_tree(tmp_path / "t", {"pkg/__init__.py": PKG_BASE})
    result = run(target_python, tree, "tests/test_slow.py", source, tmp_path, timeout_s=6)
    got = by_name(result)
    assert result.timed_out and result.duration_s < 30
    assert got["test_fast"].outcome is Outcome.PASSED
    assert (got["test_sleeps"].outcome, got["test_sleeps"].kind) == (Outcome.ERROR, FailureKind.TIMEOUT)
    assert load_report(result.report_path)["runner"]["report_source"] == "journal"
    assert result.failure_kinds() == {"assertion": 0, "timeout": 1}


def test_upstream_pytest_ini_in_a_subdirectory_sets_the_rootdir(target_python, tmp_path):
    tree = make_tree(
        tmp_path / "t",
        {
            "pkg/__init__.py": PKG_BASE,
            "pyproject.toml": "[project]\nname = 'upstream'\n",
            # only applies if test/ is the rootdir: checks are named check_*
            "test/pytest.ini": "[pytest]\npython_functions = check_*\nasyncio_mode = auto\n",
        },
    )
    source = """
        import pkg

        def check_answer():
            assert pkg.answer() == 41

        def test_ignored():
            assert False
    """
    result = run(target_python, tree, "test/registered/unit/sched/test_x.py", source, tmp_path)
    assert result.rootdir == tree / "test" and result.inifile == tree / "test" / "pytest.ini"
    [passed] = result.results
    assert (passed.nodeid, passed.outcome) == ("registered/unit/sched/test_x.py::check_answer", Outcome.PASSED)
    assert 'classname="registered.unit.sched.test_x"' in result.junit_path.read_text()
    hinted = run(target_python, tree, "test/registered/unit/sched/test_x.py", source, tmp_path / "hint", hint=".")
    assert hinted.rootdir == tree and hinted.inifile is None
    assert {r.nodeid.split("::")[1] for r in hinted.results} == {"test_ignored"}


def test_no_config_in_the_tree_ignores_configs_above_it(target_python, tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\npython_functions = nothing_*\n")
    tree = make_tree(tmp_path / "t", {"pkg/__init__.py": PKG_BASE})
    result = run(target_python, tree, "tests/test_a.py", "def test_a():\n    pass\n", tmp_path)
    assert result.rootdir == tree and result.inifile is None
    assert [(r.nodeid, r.outcome) for r in result.results] == [("tests/test_a.py::test_a", Outcome.PASSED)]


# ------------------------------------------------------------------ overlay (no pytest run)


def test_overlay_states(tmp_path):
    tree = make_tree(tmp_path / "t", {"tests/test_a.py": "old\n"})
    assert overlay_test_file(tree, "tests/test_a.py", b"old\n")[1] is Overlay.IDENTICAL
    assert overlay_test_file(tree, "tests/test_a.py", b"new\n")[1] is Overlay.REPLACED
    assert (tree / "tests/test_a.py").read_bytes() == b"new\n"
    assert overlay_test_file(tree, "new/dir/test_b.py", b"b\n")[1] is Overlay.ADDED


@pytest.mark.parametrize("bad", ["../test_x.py", "/abs/test_x.py", "tests/test_x.txt", "a\\test.py"])
def test_overlay_refuses_paths_leaving_the_tree(tmp_path, bad):
    with pytest.raises(UsageError):
        overlay_test_file(tmp_path, bad, b"")


def test_overlay_never_writes_through_a_symlink(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    tree = tmp_path / "t"
    tree.mkdir()
    (tree / "tests").symlink_to(outside)
    with pytest.raises(CheckRunError):
        overlay_test_file(tree, "tests/test_a.py", b"x")
    assert not any(outside.iterdir())
    (tree / "test_b.py").symlink_to(outside / "victim.py")
    (outside / "victim.py").write_text("keep\n")
    assert overlay_test_file(tree, "test_b.py", b"keep\n")[1] is Overlay.IDENTICAL
    assert not (tree / "test_b.py").is_symlink()
    assert (outside / "victim.py").read_text() == "keep\n"
    assert os.listdir(outside) == ["victim.py"]


def test_pytest_usage_error_is_infrastructure(target_python, tmp_path):
    tree = make_tree(tmp_path / "t", {"test/pytest.ini": "[pytest]\naddopts = --no-such-option\n"})
    result = run(target_python, tree, "test/test_a.py", "def test_a():\n    pass\n", tmp_path)
    [error] = result.results
    assert result.exit_code == 4
    assert (error.nodeid, error.outcome, error.kind) == ("test_a.py", Outcome.ERROR, FailureKind.INFRASTRUCTURE)


def test_fixture_subtests_parent_is_a_rollup(target_python, tmp_path):
    source = """
        def test_rows(subtests):
            for i in range(3):
                with subtests.test(msg="row", i=i):
                    assert i != 2
    """
    tree = make_tree(tmp_path / "t", {"pkg/__init__.py": PKG_BASE})
    result = run(target_python, tree, "tests/test_rows.py", source, tmp_path)
    if pytest_major(result) < 9:
        pytest.skip("the subtests fixture is built in from pytest 9")
    got = by_name(result)
    assert (got["test_rows"].outcome, got["test_rows"].kind) == (Outcome.FAILED, None)
    assert got["test_rows [row, i=2]"].kind is FailureKind.ASSERTION
    assert result.failure_kinds() == {"assertion": 1}
    assert (result.counts["subtests_passed"], result.counts["subtests_failed"]) == (2, 1)


def test_env_extra_may_not_override_what_the_runner_owns(tmp_path):
    with pytest.raises(UsageError, match="PYTHONPATH"):
        run_test_file(
            python=Path(sys.executable),
            tree=tmp_path,
            rootdir_hint=None,
            test_rel="test_a.py",
            head_test_bytes=b"",
            python_path=[],
            out_dir=tmp_path / "o",
            log_dir=tmp_path / "l",
            timeout_s=5,
            env_extra={"PYTHONPATH": "/elsewhere"},
        )
    assert not (tmp_path / "test_a.py").exists()

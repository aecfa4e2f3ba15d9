"""Rewriting [expect] tables (tomlkit) keeps every other byte; TOML values read back exactly;
test sets come from a run's rows."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from kvprobe.errors import UsageError
from kvprobe.experiments import tomltext
from kvprobe.experiments.expectations import Recording, observed_test_sets, rewrite
from tests.typed import run_receipt

PROBES = Path(__file__).resolve().parents[3] / "probes"
F = "tests/test_x.py"


def _recording(values, tests=None) -> Recording:
    return Recording("x", Path("experiment.toml"), "0" * 64, "run-1", values, tests=tests or {})


@pytest.mark.parametrize("name", ["experiment-a", "experiment-b", "experiment-c"])
def test_replacing_keeps_the_rest_of_a_real_experiment(name):
    text = (PROBES / name / "experiment.toml").read_text()
    values = {"base": {"p/c.one": {"x": 1}}, "head": {"p/c.one": {"x": 2}}}
    new = rewrite(text, _recording(values))
    old_data, new_data = tomllib.loads(text), tomllib.loads(new)
    assert new_data.pop("expect") == values
    old_data.pop("expect")
    assert new_data == old_data
    first = text.index("[expect.")
    assert new.startswith(text[:first].rstrip("\n"))  # the comment above the first [expect] table stays
    assert new.count("[expect.") == 2
    assert "# recorded by `kvprobe run x --record-expectations` from run run-1" in new


def test_interleaved_tables_and_comments_outside_are_kept():
    text = (
        '# header\nid = "x"  # keep\n\n[expect.base."p/a"]\nv = 1\n\n[scope]  # about scope\nshows = "s"  # why\n'
        '# inside scope\n[expect.head."p/a"]\nv = 2\n# trailing, inside [expect]: goes with the old values\n'
    )
    new = rewrite(text, _recording({"base": {"p/b": {"w": True}}}))
    assert tomllib.loads(new) == {"id": "x", "scope": {"shows": "s"}, "expect": {"base": {"p/b": {"w": True}}}}
    assert new.startswith('# header\nid = "x"  # keep\n')
    assert '[scope]  # about scope\nshows = "s"  # why\n# inside scope\n' in new
    assert "trailing" not in new


def test_appended_when_there_are_none():
    new = rewrite('id = "x"\n', _recording({"base": {"p/a": {"v": 1}}}))
    assert new.startswith('id = "x"\n') and tomllib.loads(new)["expect"] == {"base": {"p/a": {"v": 1}}}


def test_test_sets_are_written_and_other_files_keep_theirs():
    text = (
        'id = "x"\n[expect.base."p/a"]\nv = 1\n'
        '[expect.tests."other.py"]\nFAIL_TO_PASS = ["o::t"]\nPASS_TO_PASS = []\n'
        '[expect.tests."tests/test_x.py"]\nFAIL_TO_PASS = ["old"]\nPASS_TO_PASS = []\n'
    )
    sets = {F: {"FAIL_TO_PASS": ["a", "b [i=1]"], "PASS_TO_PASS": ["c"], "base_failure_kind": {"a": "ValueError"}}}
    new = rewrite(text, _recording({}, sets))
    assert tomllib.loads(new)["expect"] == {
        "base": {"p/a": {"v": 1}},  # this run observed no probe case: the probe expectations stay
        "tests": {"other.py": {"FAIL_TO_PASS": ["o::t"], "PASS_TO_PASS": []}, **sets},
    }


def row(test, transition, head="passed", kind=None, exc=None, file=F):
    return {"file": file, "test": test, "transition": transition, "head": head, "base_kind": kind, "base_exc_type": exc}


def test_sets_from_a_run_name_error_to_pass_as_fail_to_pass_with_its_kind():
    rows = [
        row("a", "FAIL_TO_PASS", kind="exception", exc="AttributeError"),
        row("b", "FAIL_TO_PASS", kind="assertion", exc="AssertionError"),
        row("c", "ERROR_TO_PASS", kind="collection", exc="ImportError"),
        row("d", "FAIL_TO_PASS"),  # failed only through its subtests: no kind of its own
        row("e", "PASS_TO_PASS"),
        row("f", "NOT_RUN", head="skipped"),
    ]
    assert observed_test_sets(rows) == {
        F: {
            "FAIL_TO_PASS": ["a", "b", "c", "d"],
            "PASS_TO_PASS": ["e"],
            "base_failure_kind": {"a": "AttributeError", "b": "assertion", "c": "collection:ImportError"},
        }
    }


def test_sets_are_refused_when_head_fails_or_nothing_went_to_pass():
    with pytest.raises(UsageError, match="head does not pass b"):
        observed_test_sets([row("a", "FAIL_TO_PASS"), row("b", "PASS_TO_FAIL", head="failed")])
    with pytest.raises(UsageError, match="no test went from fail"):
        observed_test_sets([row("a", "PASS_TO_PASS")])


@pytest.mark.parametrize(
    "value",
    [
        'quote " back \\ tab \t nl \n del \x7f é 😀',
        True,
        False,
        0,
        -(1 << 63),
        1.5,
        1e-300,
        [1, "a", [True]],
        {"k.e y": [1.0, {}]},
        [],
    ],
)
def test_values_read_back_exactly(value):
    text = f"{tomltext.key('a.b')} = {tomltext.value(value)}\n"
    got = tomllib.loads(text)["a.b"]
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("value", [None, float("nan"), float("inf"), 1 << 63, [1, None], object()])
def test_values_toml_cannot_hold_are_refused(value):
    with pytest.raises(ValueError):
        tomltext.value(value)


def _case(name: str, observation: str, **fields) -> dict:
    raised = observation != "observed"
    return {
        "name": name,
        "status": "raised" if raised else "ok",
        "observations": {} if raised else {"enqueued": True},
        "error": {"type": "X", "root_type": "X"} if raised else None,
        "observation": observation,
        "decision_point": "Q.add",
        "reason": fields.get("reason"),
        "missing": fields.get("missing", []),
    }


def test_recording_skips_unobserved_cases_says_why_and_records_absence():
    from kvprobe.experiments.expectations import plan
    from kvprobe.experiments.experiment import load_file
    from kvprobe.rules.compare import compare

    exp = load_file(PROBES / "experiment-a" / "experiment.toml")
    base = {"cases": [_case("seen", "observed"), _case("drift", "unobserved", reason="stub lacks max_input_len")]}
    head = {"cases": [_case("seen", "observed"), _case("drift", "not-present", reason="gone", missing=["Q.add"])]}
    comparison = compare(
        expect={}, probe_docs={"base": {"p": base}, "head": {"p": head}}, probe_problems={}, test_runs={}
    )
    receipt = run_receipt(comparison, mocks={}, run_id="r")
    rec = plan(exp, receipt)
    assert rec.cases == ["p/drift", "p/seen"]
    assert rec.values["base"]["p/seen"] == {"enqueued": True, "raised": False}
    # A release without the code path: its absence is the expectation (compare's not_present).
    assert rec.values["head"]["p/drift"] == {"not_present": ["Q.add"]}
    assert "p/drift" not in rec.values["base"]
    assert rec.skipped == ("base: p/drift: unobserved (stub lacks max_input_len): not recorded",)


def test_recording_skips_a_case_that_differed_between_repeats():
    from kvprobe.experiments.expectations import plan
    from kvprobe.experiments.experiment import load_file
    from kvprobe.rules.compare import compare

    exp = load_file(PROBES / "experiment-a" / "experiment.toml")
    doc = {"cases": [_case("seen", "observed")]}
    other = {"cases": [dict(_case("seen", "observed"), observations={"enqueued": False})]}
    comparison = compare(
        expect={},
        probe_docs={"base": {"p": doc}, "head": {"p": doc}},
        probe_problems={},
        test_runs={},
        repeats={"base": {"p": [doc]}, "head": {"p": [other]}},
    )
    receipt = run_receipt(comparison, mocks={}, run_id="r")
    rec = plan(exp, receipt)
    assert rec.values == {"base": {"p/seen": {"enqueued": True, "raised": False}}}
    assert rec.skipped == (
        "head: p/seen: unstable across repeats: observation 'enqueued' was True in run 1, False in run 2: not recorded",
    )


def test_the_templates_placeholder_case_is_never_recorded():
    """Declared mocks replaced but the template case kept: recorded, its observations (the same
    on both sides whatever the code does) would make a run 'reproduced' that tests nothing."""
    from kvprobe.experiments.expectations import plan
    from kvprobe.experiments.experiment import load_file
    from kvprobe.experiments.scaffold import TEMPLATE_CASE
    from kvprobe.rules.compare import compare

    exp = load_file(PROBES / "experiment-a" / "experiment.toml")
    doc = {"cases": [_case(TEMPLATE_CASE, "observed"), _case("door.rejected", "observed")]}
    docs = {"base": {"p": doc}, "head": {"p": doc}}
    comparison = compare(expect={}, probe_docs=docs, probe_problems={}, test_runs={})
    receipt = run_receipt(comparison, mocks={"p": {"transport": "a fake sender"}}, run_id="r")
    with pytest.raises(UsageError, match=rf"p/{TEMPLATE_CASE} is the template's placeholder case"):
        plan(exp, receipt)

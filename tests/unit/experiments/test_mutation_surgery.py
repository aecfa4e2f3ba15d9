"""The mutation harness's code surgery (tests/mutations.py), on small made-up modules."""

from __future__ import annotations

import textwrap

import pytest

from kvprobe.experiments import experiment as experiments
from kvprobe.model.records import SourceKind
from tests.mutations import (
    Define,
    Edit,
    Hunks,
    ImportName,
    MutantRepo,
    MutationSpec,
    SpecError,
    apply,
    experiment_copy,
    judge,
    statements,
)

BASE = textwrap.dedent(
    '''
    from pkg.utils import helper_a

    DEFAULT = False


    class Queue:
        limit = 1

        def add(self, req):
            """Admit a request."""
            if self.full():
                return
            self.items.append(req)

        def full(self):
            return len(self.items) >= self.limit


    def tail():
        return 1
    '''
).lstrip()

HEAD = textwrap.dedent(
    '''
    from pkg.utils import helper_a, is_reject

    # on by default since 2.0
    DEFAULT = True


    class Queue:
        limit = 1

        def add(self, req):
            """Admit a request."""
            # a rejected request is retired at the door
            if is_reject(req):
                self.retire(req)
                return
            if req.rebooted:
                req.rebooted = False
            if self.full():
                return
            self.items.append(req)
            self.count += 1

        def full(self):
            return len(self.items) >= self.limit

        def retire(self, req):
            req.done = True


    def tail():
        return 1
    '''
).lstrip()

F = "pkg/queue.py"


def _method(source: str, name: str) -> str:
    start = source.index(f"    def {name}(")
    return source[start : source.index("\n    def ", start + 1)]


def both(*changes):
    base, head = {F: BASE}, {F: HEAD}
    return apply(changes, "head", base, head).get(F), apply(changes, "base", base, head).get(F)


def test_define_swaps_a_module_assignment_with_its_comment_both_ways():
    reverted, backported = both(Define(F, "DEFAULT"))
    assert "DEFAULT = False" in reverted and "on by default" not in reverted
    assert "# on by default since 2.0\nDEFAULT = True" in backported


def test_define_inserts_a_method_after_its_head_neighbour_and_keeps_scaffolding_on_revert():
    change = Define(F, "Queue.retire", revert=False)
    assert apply([change], "head", {F: BASE}, {F: HEAD}) == {}  # head keeps its helper
    backported = apply([change], "base", {F: BASE}, {F: HEAD})[F]
    lines = backported.splitlines()
    assert lines.index("    def retire(self, req):") > lines.index("    def full(self):")
    assert lines.index("    def retire(self, req):") < lines.index("def tail():")
    compile(backported, F, "exec")


def test_define_removes_a_definition_the_donor_lacks():
    reverted = apply([Define(F, "Queue.retire")], "head", {F: BASE}, {F: HEAD})[F]
    assert "def retire" not in reverted and "def full" in reverted and "def tail" in reverted


def test_hunks_move_only_the_statement_that_mentions_the_fix():
    change = Hunks(F, "Queue.add", select=("is_reject",))
    reverted, backported = both(change)
    # the guard (with its comment) goes; the same release's other new lines stay
    add = _method(reverted, "add")
    assert "is_reject" not in add and "a rejected request" not in add
    assert "if req.rebooted:" in add and "self.count += 1" in add
    # the guard arrives in base, alone, where head has it: before the full() check
    assert "if req.rebooted" not in backported and "self.count" not in backported
    body = _method(backported, "add")
    assert body.index("if is_reject(req):") < body.index("if self.full():")
    assert "# a rejected request is retired at the door\n        if is_reject(req):" in body


def test_hunks_exclude_keeps_a_matching_hunk_out():
    change = Hunks(F, "Queue.add", select=("req",), exclude=("rebooted",))
    add = _method(both(change)[0], "add")
    assert "if req.rebooted:" in add and "is_reject" not in add


def test_statements_split_whole_statements_with_their_comments_and_refuse_fragments():
    lines = ["# why\n", "if a:\n", "    b()\n", "x = (\n", "    1\n", ")\n", "\n", "y = 2\n"]
    assert statements(lines) == [["# why\n", "if a:\n", "    b()\n"], ["x = (\n", "    1\n", ")\n", "\n"], ["y = 2\n"]]
    fragment = ["    b()\n", "if c:\n"]  # a body line and an unfinished statement
    assert statements(fragment) == [fragment]


def test_edit_rewrites_one_side_reindented_and_import_name_backports_an_import():
    edit = Edit(
        F, "Queue.add", on="base", find="if self.full():\n    return", replace="if self.full() or req.bad:\n    return"
    )
    imp = ImportName(F, "pkg.utils", "is_reject")
    base, head = {F: BASE}, {F: HEAD}
    assert apply([edit, imp], "head", base, head) == {}  # both are backport-only here
    backported = apply([edit, imp], "base", base, head)[F]
    assert "        if self.full() or req.bad:\n            return\n" in backported
    assert backported.splitlines()[1] == "from pkg.utils import is_reject"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (Hunks(F, "Queue.add", select=("no_such_call",)), "no hunk"),
        (Define(F, "Queue.missing"), "neither tree"),
        (Define(F, "Nope.add"), "'Nope' is defined 0 times"),
        (Edit(F, "Queue.add", on="base", find="return 42", replace="pass"), "found 0 times"),
        (ImportName(F, "pkg.utils", "helper_a"), "already imported"),
        (Define("pkg/other.py", "x"), "no such file"),
    ],
)
def test_a_change_that_matches_nothing_is_a_spec_error(change, message):
    with pytest.raises(SpecError, match=message):
        apply([change], "base", {F: BASE}, {F: HEAD})


def test_a_change_that_breaks_the_syntax_is_a_spec_error():
    edit = Edit(F, "Queue.add", on="base", find="return", replace="return (")
    with pytest.raises(SpecError, match="no longer parses"):
        apply([edit], "base", {F: BASE}, {F: HEAD})


def _row(case, name, base, head, exp_base, exp_head, *, declared=(True, True)):
    return {
        "case": case,
        "observation": name,
        "base": base,
        "head": head,
        "base_recorded": True,
        "head_recorded": True,
        "expected_base": exp_base,
        "expected_head": exp_head,
        "expected_base_declared": declared[0],
        "expected_head_declared": declared[1],
    }


def _receipt(rows, *, head_case="observed"):
    return {
        "comparison": {
            "cases": {"base": {"p/c": {"observation": "observed"}}, "head": {"p/c": {"observation": head_case}}},
            "observations": rows,
        }
    }


def test_judge_reads_flips_controls_and_unobserved_cases_per_side():
    rows = [
        _row("p/c", "enqueued", True, False, True, False),  # discriminating, both sides flipped
        _row("p/c", "retired", False, False, False, True),  # discriminating, head did not flip
        _row("p/c", "sent", 1, 1, 1, 1),  # control, holds
        _row("p/c", "kept", True, 0, True, True),  # control, head broke it (0 is not True)
    ]
    base = judge(_receipt(rows), slot="base", wants="base")
    assert base.ok and len(base.flipped) == 2 and not base.controls_broken
    head = judge(_receipt(rows, head_case="could-not-observe"), slot="head", wants="head")
    assert not head.ok
    assert head.unobserved == ("p/c",)
    assert [x.split(" =")[0] for x in head.not_flipped] == ["p/c: retired"]
    assert [x.split(" =")[0] for x in head.controls_broken] == ["p/c: kept"]


def test_judge_without_a_discriminating_observation_is_not_ok():
    rows = [_row("p/c", "sent", 1, 1, 1, 1)]  # a probe whose expectations never differ
    assert not judge(_receipt(rows), slot="base", wants="base").ok


@pytest.mark.parametrize("exp_id", ["experiment-a", "experiment-b"])
def test_experiment_copy_is_the_experiment_plus_a_git_pin_set_of_the_mutants(tmp_path, exp_id):
    spec = MutationSpec(exp_id, prs=(1,), changes=(), releases=("0", "1"))
    repo = MutantRepo(tmp_path / "repo", "a" * 40, "b" * 40, "c" * 40, "d" * 40)
    new_id = experiment_copy(spec, repo, tmp_path / "probes")
    original = experiments.load(exp_id)
    copy = experiments.load_file(tmp_path / "probes" / new_id / experiments.FILENAME)
    assert copy.id == f"{exp_id}-mutants"
    pins = copy.pin_sets["mutants"]
    assert pins.kind is SourceKind.GIT and pins.python_path == (".",)
    assert (pins.base.commit, pins.head.commit) == ("c" * 40, "d" * 40)  # head reverted -> base backported
    # everything else is the experiment's: probes byte for byte, pins, expectations
    assert copy.expectations == original.expectations and copy.probes == original.probes
    assert set(copy.pin_sets) == {*original.pin_sets, "mutants"}
    for path in experiments.bundled_files(original.directory)[1:]:
        assert (tmp_path / "probes" / new_id / path.name).read_bytes() == path.read_bytes()


def test_a_one_way_spec_runs_its_mutant_beside_the_other_release(tmp_path):
    repo = MutantRepo(tmp_path, "a" * 40, "b" * 40, "c" * 40, "d" * 40)
    both = MutationSpec("x", prs=(1,), changes=(), releases=("0", "1"))
    assert repo.pair(both) == ("c" * 40, "d" * 40)
    assert repo.slots(both) == {"revert": ("base", "base"), "backport": ("head", "head")}
    revert_only = MutationSpec("x", prs=(1,), changes=(), releases=("0", "1"), directions=("revert",))
    assert repo.pair(revert_only) == ("a" * 40, "c" * 40)
    assert repo.slots(revert_only) == {"revert": ("head", "base")}
    backport_only = MutationSpec("x", prs=(1,), changes=(), releases=("0", "1"), directions=("backport",))
    assert repo.pair(backport_only) == ("d" * 40, "b" * 40)


def test_judge_of_a_reverted_feature_counts_what_only_the_fixed_release_declares():
    # a feature the base lacks: only head declares; the reverted head runs in the head slot
    rows = [
        _row("p/c", "aborted", True, False, None, True, declared=(False, True)),  # moved: flipped
        _row("p/c", "kept", True, True, None, True, declared=(False, True)),  # same: maybe a control
    ]
    # the base's reserved not_present expectation is about code, not behaviour: not judged
    rows.append(_row("p/c", "not_present", None, None, ["pkg.checksum"], None, declared=(True, False)))
    verdict = judge(_receipt(rows), slot="head", wants="base")
    assert verdict.ok and [x.split(" =")[0] for x in verdict.flipped] == ["p/c: aborted"]
    rows[0]["head"] = True  # the probe reads "fixed" whatever the code
    assert not judge(_receipt(rows), slot="head", wants="base").ok

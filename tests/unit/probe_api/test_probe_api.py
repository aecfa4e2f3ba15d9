"""The probe-side API (kvprobe_probe): decision points, preconditions, presence,
configuration and mock absorption, and the documents it writes against the schema."""

from __future__ import annotations

import contextlib
import copy
import json
import sys
import types
from pathlib import Path

import pytest

from kvprobe import schema
from kvprobe.errors import SchemaError

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "kvprobe" / "probe_api"))

import kvprobe_probe as kp  # noqa: E402

VERSION = "kvprobe.probe-output/1"


class Door:
    """Stands in for a class under test."""

    def __init__(self, capacity: int, backend: str = "fake") -> None:
        self.capacity = capacity
        self.backend = backend
        self.queue: list[str] = []

    def add(self, req: str) -> None:
        if req == "boom":
            raise AssertionError("the door's own guard")
        self.queue.append(req)


def probe() -> kp.Probe:
    return kp.Probe("door_probe", mocks={"sender": "autospec of the sender", "streamer": "a sink"})


def only_case(document: dict) -> dict:
    schema.validate(document, VERSION, source="test")
    (case,) = document["cases"]
    return case


def run_one(func, decision: str | None = "Door.add", p: kp.Probe | None = None) -> dict:
    p = p or probe()
    p.case("c", "a case", decision=decision)(func)
    return p.run()


def test_exception_before_the_decision_point_is_unobserved_setup_drift():
    def case(obs):
        door = Door(4)
        door.max_input_len  # noqa: B018 - a field this release does not set
        with obs.decision():
            door.add("r")

    case_doc = only_case(run_one(case))
    assert case_doc["observation"] == "unobserved"
    assert case_doc["status"] == "raised" and case_doc["error"]["type"] == "AttributeError"
    assert case_doc["reason"].startswith("set-up raised AttributeError before the decision point Door.add")
    assert "max_input_len" in case_doc["reason"]


def test_exception_at_the_decision_point_is_behaviour():
    def case(obs):
        door = Door(4)
        obs.record("queued_before", len(door.queue))
        with obs.decision():
            door.add("boom")

    case_doc = only_case(run_one(case))
    assert case_doc["observation"] == "observed" and case_doc["reason"] is None
    assert case_doc["status"] == "raised" and case_doc["error"]["type"] == "AssertionError"
    assert case_doc["observations"] == {"queued_before": 0}
    assert case_doc["decision_point"] == "Door.add"


def test_a_mock_refusing_at_the_decision_point_is_drift_not_behaviour():
    p = probe()

    def case(obs):
        sender = p.mock("sender", Door)
        with obs.decision():
            sender.prefill_info_table.get("peer")  # an instance field the spec does not carry

    case_doc = only_case(run_one(case, p=p))
    assert case_doc["observation"] == "unobserved" and case_doc["error"]["type"] == "AttributeError"
    assert case_doc["reason"].startswith("a mock could not stand in (AttributeError: ")
    assert "prefill_info_table" in case_doc["reason"]


def test_a_strict_fake_rejecting_at_the_decision_point_is_behaviour():
    def case(obs):
        with obs.decision():
            raise kp.RejectedCall("a real sender refuses send() before init()")

    case_doc = only_case(run_one(case))
    assert case_doc["observation"] == "observed"
    assert case_doc["error"]["type"] == "kvprobe_probe.RejectedCall"


def test_a_case_that_never_reaches_its_decision_point_is_unobserved():
    def case(obs):
        obs.record("built", True)

    case_doc = only_case(run_one(case))
    assert case_doc["observation"] == "unobserved" and case_doc["status"] == "ok"
    assert case_doc["reason"] == "the case ended without reaching its decision point Door.add"


def test_a_missing_symbol_is_not_present_with_the_symbol_as_evidence():
    def case(obs):
        retire = kp.require(Door, "retire_unadmitted_request")
        with obs.decision():
            retire()

    case_doc = only_case(run_one(case))
    assert case_doc["observation"] == "not-present"
    assert case_doc["missing"] == [f"{__name__}.Door.retire_unadmitted_request"]
    assert case_doc["error"]["type"] == "kvprobe_probe.NotPresent"


def test_a_missing_keyword_is_not_present():
    kp.require_param(Door.add, "req")
    with pytest.raises(kp.NotPresent) as caught:
        kp.require_param(Door.add, "is_rebootstrap")
    assert caught.value.missing == [f"{__name__}.Door.add(is_rebootstrap=)"]


def test_require_module_tells_an_absent_module_from_a_broken_one(tmp_path, monkeypatch):
    (tmp_path / "broken_door.py").write_text("import kvprobe_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(kp.NotPresent) as caught:
        kp.require_module("json.kvprobe_no_such_submodule")
    assert caught.value.missing == ["json.kvprobe_no_such_submodule"]
    with pytest.raises(ModuleNotFoundError):
        kp.require_module("broken_door")
    assert kp.require_module("json") is json


def test_build_runs_the_real_constructor_with_the_arguments_it_declares():
    door = kp.build(Door, capacity=8, backend="mooncake", tp_rank=0)
    assert (door.capacity, door.backend) == (8, "mooncake")
    assert kp.build(Door, capacity=2).backend == "fake"


def test_build_names_a_required_parameter_the_probe_does_not_know():
    def case(obs):
        kp.build(Door, backend="mooncake")
        with obs.decision():
            pass

    case_doc = only_case(run_one(case))
    assert case_doc["observation"] == "unobserved"
    assert case_doc["reason"] == f"{__name__}.Door.__init__ needs capacity: unknown to this probe"


def test_a_precondition_that_does_not_hold_makes_the_case_unobserved():
    def case(obs):
        obs.precondition("row_held", True)
        obs.precondition("metadata_buffer_held", False, "alloc returned None")
        with obs.decision():
            pass

    case_doc = only_case(run_one(case))
    assert case_doc["observation"] == "unobserved"
    assert case_doc["preconditions"] == {"row_held": True, "metadata_buffer_held": False}
    assert case_doc["reason"] == "precondition metadata_buffer_held does not hold: alloc returned None"


def test_preconditions_belong_before_the_decision_point():
    def case(obs):
        with obs.decision():
            pass
        obs.precondition("late", True)

    case_doc = only_case(run_one(case))
    assert case_doc["observation"] == "observed"
    assert case_doc["error"]["type"] == "kvprobe_probe.ObservationError"


def test_a_case_without_a_decision_point_is_observed_from_its_first_line():
    def case(obs):
        obs.record("x", 1)
        raise ValueError("model said no")

    case_doc = only_case(run_one(case, decision=None))
    assert case_doc["observation"] == "observed" and case_doc["status"] == "raised"
    assert case_doc["decision_point"] is None
    with pytest.raises(kp.ObservationError):
        kp.Observations().decision().__enter__()


def test_configuration_records_non_default_settings_per_probe_and_per_case():
    p = probe()
    p.configure("disaggregation_mode", "prefill", default="null", why="the door exists only in PD mode")

    def case(obs):
        p.configure("enable_hicache_storage", True, default=False, why="HiCache releases become visible")
        with obs.decision():
            pass

    document = run_one(case, p=p)
    only_case(document)
    assert document["configuration"] == [
        {
            "name": "disaggregation_mode",
            "value": "prefill",
            "default": "null",
            "why": "the door exists only in PD mode",
            "case": None,
        },
        {
            "name": "enable_hicache_storage",
            "value": True,
            "default": False,
            "why": "HiCache releases become visible",
            "case": "c",
        },
    ]
    with pytest.raises(ValueError, match="is the default"):
        p.configure("page_size", 1, default=1, why="no")


def test_mocks_are_strict_and_what_they_absorbed_is_recorded_per_case():
    p = probe()

    def case(obs):
        sender = p.mock("sender", Door, absorbs=("add",))
        with pytest.raises(AttributeError):
            sender.send_kv_chunk  # noqa: B018 - not an attribute of the real class
        with pytest.raises(TypeError):
            sender.add("r", "unexpected")
        with obs.decision():
            sender.add("r")
            sender.add("s")

    document = run_one(case, p=p)
    assert only_case(document)["observation"] == "observed"
    # the rejected call with a wrong signature is not absorbed: only accepted calls count
    assert document["absorbed"] == [{"case": "c", "mock": "sender", "call": "add", "count": 2}]
    with pytest.raises(ValueError, match="not declared"):
        p.track("transport", object())


def test_a_call_no_mock_declares_it_absorbs_makes_the_case_unobserved():
    p = probe()

    def case(obs):
        sender_cls = p.mock("sender", Door, instance=False, absorbs=("()",))
        streamer = p.mock("streamer", Door, absorbs=("add",))
        with obs.decision():
            sender = sender_cls(4)
            if sender.add("r"):  # a MagicMock answer steers the code under test
                streamer.add("r")

    document = run_one(case, p=p)
    case_doc = only_case(document)
    assert case_doc["observation"] == "unobserved" and case_doc["status"] == "ok"
    # the truth test of the absorbed answer is recorded too: that is where it steered
    assert case_doc["reason"] == (
        "a mock absorbed calls the probe does not model: sender: ().add; sender: ().add().__bool__"
    )
    assert [(a["mock"], a["call"]) for a in document["absorbed"]] == [
        ("sender", "()"),
        ("sender", "().add"),
        ("sender", "().add().__bool__"),
        ("streamer", "add"),
    ]


def test_old_documents_stay_valid_and_the_new_fields_are_checked():
    def case(obs):
        with obs.decision():
            pass

    document = run_one(case)
    old = copy.deepcopy(document)
    for key in ("configuration", "absorbed"):
        del old[key]
    for key in ("observation", "decision_point", "reason", "missing", "preconditions"):
        del old["cases"][0][key]
    schema.validate(old, VERSION, source="a document written before the extension")

    bad = copy.deepcopy(document)
    bad["cases"][0].update(
        observation="not-present",
        reason="gone",
        status="raised",
        error=kp.describe_exception(kp.NotPresent("x")),
        missing=[],
    )
    with pytest.raises(SchemaError):
        schema.validate(bad, VERSION, source="not-present without evidence")
    bad["cases"][0].update(observation="unobserved", reason=None, missing=[])
    with pytest.raises(SchemaError):
        schema.validate(bad, VERSION, source="unobserved without a reason")
    partial = copy.deepcopy(document)
    del partial["cases"][0]["reason"]
    with pytest.raises(SchemaError):
        schema.validate(partial, VERSION, source="observation without its reason field")


def test_main_writes_one_valid_document(tmp_path):
    p = probe()

    @p.case("c", "a case", decision="Door.add")
    def _(obs):
        with obs.decision():
            Door(1).add("r")

    p.main(["--out", str(tmp_path / "out.json")])
    case_doc = only_case(json.loads((tmp_path / "out.json").read_text()))
    assert case_doc["observation"] == "observed" and case_doc["status"] == "ok"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_a_case_set_up_gives_its_value_and_what_it_raises_is_drift():
    entered: list[str] = []

    @contextlib.contextmanager
    def door_world():
        entered.append("in")
        yield Door(4)
        entered.append("out")

    @contextlib.contextmanager
    def broken_world():
        raise AttributeError("'Door' object has no attribute 'max_input_len'")
        yield

    p = probe()

    @p.case("ok", "a door from the set-up", decision="Door.add", using=door_world)
    def _(obs, door):
        with obs.decision():
            door.add("r")
        obs.record("queued", door.queue)

    @p.case("drift", "a set-up that breaks", decision="Door.add", using=broken_world)
    def _(obs, door):
        with obs.decision():
            door.add("r")

    ok, drift = p.run()["cases"]
    assert (ok["observation"], ok["observations"], entered) == ("observed", {"queued": ["r"]}, ["in", "out"])
    assert drift["observation"] == "unobserved" and "max_input_len" in drift["reason"]


def test_optional_is_the_symbol_or_none_where_the_release_lacks_it():
    assert kp.optional("json") is json and kp.optional("json", "dumps") is json.dumps
    assert kp.optional("json.kvprobe_no_such_submodule") is None
    assert kp.optional("json", "kvprobe_no_such_name") is None


def test_stand_in_unset_patches_only_globals_still_none():
    module = types.SimpleNamespace(_GROUP=None, _RANK=3)
    with kp.stand_in_unset(module, {"_GROUP": lambda: "one-process", "_RANK": lambda: 0}):
        assert (module._GROUP, module._RANK) == ("one-process", 3)
    assert (module._GROUP, module._RANK) == (None, 3)


def test_declared_cases_are_read_from_source_with_module_constants():
    source = """
import kvprobe_probe as kp
probe = kp.Probe("p", mocks={"m": "n/a"})
import missing_package
DOOR = "Door.add"

@probe.case("a.one", "first " "case", decision=DOOR, using=world)
def _(obs, w):
    pass

@other.case("not.mine")
def _(obs):
    pass

@probe.case("a.two", description="second")
def _(obs):
    pass
"""
    assert kp.declared_cases(source, "probe") == [("a.one", "first case", "Door.add"), ("a.two", "second", None)]


def test_import_failure_tells_an_absent_name_from_a_missing_dependency():
    symbol = kp.import_failure(ImportError("cannot import name 'retire' from 'door.prefill' (x.py)"), ["door.prefill"])
    assert isinstance(symbol, kp.NotPresent) and symbol.missing == ["door.prefill.retire"]
    module = kp.import_failure(ModuleNotFoundError("no door.decode", name="door.decode"), ["door.decode"])
    assert isinstance(module, kp.NotPresent) and module.missing == ["door.decode"]
    dependency = kp.import_failure(ModuleNotFoundError("no sgl_kernel", name="sgl_kernel"), ["door.decode"])
    assert isinstance(dependency, kp.CannotObserve) and "sgl_kernel" in str(dependency)


def test_an_absent_name_stays_absent_only_where_the_rest_of_the_release_imports(tmp_path, monkeypatch):
    """unless_unimportable: the probe's other imports of the package decide whether an absence
    is evidence (they import) or the env cannot import the release at all (could not observe)."""
    package = tmp_path / "fakerel"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "door.py").write_text("def add(req):\n    return [req]\n")
    (package / "sched.py").write_text("import kvprobe_no_such_kernel\n")
    (package / "broken.py").write_text("raise ValueError('image processor classes changed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.split(".")[0] == "fakerel"]:
        monkeypatch.delitem(sys.modules, name)
    absent = kp.NotPresent("fakerel.door.retire")
    assert kp.unless_unimportable(absent, ["fakerel.door", "fakerel.door.add", "fakerel.gone"]) is absent
    env = kp.unless_unimportable(absent, ["fakerel.door", "fakerel.sched"])
    assert isinstance(env, kp.CannotObserve) and "kvprobe_no_such_kernel" in str(env)
    assert "fakerel.door.retire" in str(env) and env.__cause__ is absent
    raising = kp.unless_unimportable(absent, ["fakerel.broken"])
    assert isinstance(raising, kp.CannotObserve) and "ValueError: image processor classes changed" in str(raising)

"""``kvprobe_autospec.lazy_autospec`` (``kp.lazy_autospec`` to probes) against
``unittest.mock.create_autospec``: the same script of reads, calls, sets and deletes on both
must be accepted or refused alike and leave equal ``mock_calls``. Stdlib only (no pytest
import), so the same checks run on any CPython: ``python
tests/unit/probe_api/test_lazy_autospec.py`` runs them with that interpreter."""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
import sys
import traceback
from pathlib import Path
from typing import ClassVar
from unittest import mock

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "kvprobe" / "probe_api"))

import kvprobe_autospec as ka  # noqa: E402
import kvprobe_probe as kp  # noqa: E402


class Mixin:
    tag = "mixin"

    def mixed(self, a, *, flag=False):
        return a

    async def fetch(self, key):
        return key


class Queue:
    """A class attribute holding an instance: autospecced as that instance."""

    depth = 0

    def push(self, item):
        return item


class Store(dict):
    """Builtin methods (method descriptors) beside Python ones."""

    def put(self, key, value):
        self[key] = value


class Base(Mixin):
    limit = 3
    items: ClassVar[list[int]] = [1, 2]
    nothing = None
    queue = Queue()

    def __init__(self, size, name="x"):
        self.size_ = size

    def add(self, req):
        return req

    @staticmethod
    def helper(x, y=1):
        return x + y

    @classmethod
    def make(cls, n):
        return cls(n)

    @property
    def size(self):
        return self.size_

    def assert_ready(self):
        return True

    partial_add = functools.partialmethod(add, "fixed")

    class Nested:
        kind = "nested"

        def __init__(self, v):
            self.v = v

        def inner(self, a):
            return a

        async def ainner(self):
            return 1


class Child(Base):
    def add(self, req, extra=None):
        return req

    async def drain(self, *, timeout):
        return timeout


class Called(Child):
    def __call__(self, x):
        return x


SPECS = [Base, Child, Called, Store, Queue, Base.Nested, Queue()]

_IDS = re.compile(r"id='\d+'|0x[0-9a-f]+")


def _text(value: object) -> str:
    return _IDS.sub("ID", str(value))


def _describe(value: object) -> str:
    """What a probe can see of a value read off a mock (ids aside)."""
    try:
        signature = str(inspect.signature(value)) if callable(value) else "-"
    except (TypeError, ValueError) as exc:
        signature = f"no signature: {type(exc).__name__}"
    return (
        f"{type(value).__name__} async={isinstance(value, mock.AsyncMock)} callable={callable(value)} "
        f"sig={signature} repr={_text(repr(value))}"
    )


def _attempt(step):
    try:
        result = step()
    except Exception as exc:  # the outcome under comparison: accepted or refused, and how
        return f"raised {type(exc).__name__}: {_text(exc)}"
    return "ok " + _describe(result)


def _reads(made, spec):
    """Read every attribute of the spec (and some it lacks), in an order, then again."""
    names = sorted(n for n in dir(spec) if not (n.startswith("__") and n.endswith("__")))
    names += ["missing", "assert_missing", "assret_ready", "__missing__", "__len__"]
    return [(f"read {n}", functools.partial(getattr, made, n)) for n in names + names[::2]]


def _await(made, name, *args, **kwargs):
    return asyncio.run(getattr(made, name)(*args, **kwargs))


def _calls(made):
    """Calls right and wrong for each kind of attribute, on the mock and on what calls return."""
    steps = {
        "mock()": lambda: made(),
        "mock(1)": lambda: made(1),
        "mock(1, name=y)": lambda: made(1, name="y"),
        "mock(1).add(r)": lambda: made(1).add("r"),
        "mock(1).add()": lambda: made(1).add(),
        "return_value.make(1)": lambda: made.return_value.make(1),
        "add(r)": lambda: made.add("r"),
        "add()": lambda: made.add(),
        "add(r, x)": lambda: made.add("r", "x"),
        "add(req=r)": lambda: made.add(req="r"),
        "add(r).send(1)": lambda: made.add("r").send(1),
        "bool(add(r))": lambda: bool(made.add("r")),
        "add.return_value": lambda: made.add.return_value,
        "helper(1)": lambda: made.helper(1),
        "helper()": lambda: made.helper(),
        "make(2)": lambda: made.make(2),
        "make()": lambda: made.make(),
        "mixed(1, flag=True)": lambda: made.mixed(1, flag=True),
        "mixed(1, 2)": lambda: made.mixed(1, 2),
        "await fetch(k)": lambda: _await(made, "fetch", "k"),
        "await fetch()": lambda: _await(made, "fetch"),
        "fetch(k) unawaited": lambda: made.fetch("k").close(),
        "await drain(timeout=1)": lambda: _await(made, "drain", timeout=1),
        "await drain(1)": lambda: _await(made, "drain", 1),
        "partial_add()": lambda: made.partial_add(),
        "assert_ready()": lambda: made.assert_ready(),
        "Nested(1)": lambda: made.Nested(1),
        "Nested()": lambda: made.Nested(),
        "Nested(1).inner(2)": lambda: made.Nested(1).inner(2),
        "Nested.inner(1)": lambda: made.Nested.inner(1),
        "Nested.inner(1, 2)": lambda: made.Nested.inner(1, 2),
        "await Nested(1).ainner()": lambda: _await(made.Nested(1), "ainner"),
        "Nested.kind.upper()": lambda: made.Nested.kind.upper(),
        "queue.push(1)": lambda: made.queue.push(1),
        "queue.push()": lambda: made.queue.push(),
        "queue.depth + 1": lambda: made.queue.depth + 1,
        "items.append(1)": lambda: made.items.append(1),
        "items.nope": lambda: made.items.nope,
        "limit.bit_length()": lambda: made.limit.bit_length(),
        "size": lambda: made.size,
        "size.fget(1)": lambda: made.size.fget(1),
        "nothing": lambda: made.nothing,
        "tag.upper()": lambda: made.tag.upper(),
        "put(k, v)": lambda: made.put("k", "v"),
        "get(k)": lambda: made.get("k"),
        "keys(1)": lambda: made.keys(1),
        "push(1)": lambda: made.push(1),
        "inner(1)": lambda: made.inner(1),
        "len(mock)": lambda: len(made),
        "mock == mock": lambda: made == made,
    }
    return list(steps.items())


def _sets(made):
    """Attributes the probe sets: they stick, a set mock records into the parent, a delete holds."""

    def set_attr(name, value):
        setattr(made, name, value)
        return getattr(made, name)

    def delete(name):
        delattr(made, name)
        return getattr(made, name)

    sub = mock.MagicMock()
    return [
        ("set limit=7", lambda: set_attr("limit", 7)),
        ("set custom=5", lambda: set_attr("custom", 5)),
        ("set sub mock", lambda: set_attr("sub", sub)),
        ("sub.go(1)", lambda: made.sub.go(1)),
        ("set add=fn", lambda: set_attr("add", len)),
        ("add(abc)", lambda: made.add("abc")),
        ("del helper", lambda: delete("helper")),
        ("helper(1) deleted", lambda: made.helper(1)),
        ("del fetch unread", lambda: delete("fetch")),
        ("del make", lambda: delete("make")),
        ("del make again", lambda: delete("make")),
        ("set queue mock", lambda: set_attr("queue", mock.MagicMock(name="q"))),
        ("queue.push(2)", lambda: made.queue.push(2)),
    ]


def _asserts(made):
    """unittest.mock's assertions: they match calls through the signatures of the children."""
    return [
        ("add.assert_any_call(req=r)", lambda: made.add.assert_any_call(req="r")),
        ("add.assert_called_with(r, x)", lambda: made.add.assert_called_with("r", "x")),
        ("make.assert_called_with(n=2)", lambda: made.make.assert_called_with(n=2)),
        ("helper.assert_any_call(x=1)", lambda: made.helper.assert_any_call(x=1)),
        ("assert_has_calls add(req=r)", lambda: made.assert_has_calls([mock.call.add(req="r")])),
        ("assert_has_calls mixed(a=9)", lambda: made.assert_has_calls([mock.call.mixed(a=9)])),
        ("assert_has_calls mixed(1, 2)", lambda: made.assert_has_calls([mock.call.mixed(1, 2)])),
        ("assert_any_call push(item=1)", lambda: made.assert_any_call.push(item=1)),
        ("assert_has_calls push(item=1)", lambda: made.assert_has_calls([mock.call.queue.push(item=1)])),
        ("assert_has_calls Nested().inner(a=2)", lambda: made.assert_has_calls([mock.call.Nested().inner(a=2)])),
    ]


def _script(made, spec, reads_first):
    """Reads of every attribute first, or calls and assertions on children never read before."""
    calls = _asserts(made) + _calls(made) + _asserts(made)
    steps = _reads(made, spec) + calls if reads_first else calls + _reads(made, spec)
    return steps + _sets(made) + [("dir", lambda: sorted(dir(made)))] + _calls(made)[:12]


def _recorded(made):
    """The calls recorded, as text (an argument can be the mock itself: ids aside)."""
    return {
        key: [_text(tuple(c)) for c in getattr(made, key)] for key in ("mock_calls", "method_calls", "call_args_list")
    }


def _run(make, spec, instance):
    """Each step's outcome and the calls recorded: in both orders, after ``reset_mock`` and ``seal``."""
    outcomes, recorded = [], {}
    for reads_first in (True, False):
        made = make(spec, instance=instance, name="m")
        outcomes += [(label, _attempt(step)) for label, step in _script(made, spec, reads_first)]
        outcomes.append(("dir after", sorted(dir(made))))
        recorded.update({f"{key} reads first={reads_first}": value for key, value in _recorded(made).items()})
    made.reset_mock()
    outcomes += [(label, _attempt(step)) for label, step in _calls(made)[:8]]
    recorded.update({f"{key} after reset": value for key, value in _recorded(made).items()})
    sealed = make(spec, instance=instance, name="m")
    mock.seal(sealed)
    outcomes += [(f"sealed {label}", _attempt(step)) for label, step in _calls(sealed)]
    recorded.update({f"{key} sealed": value for key, value in _recorded(sealed).items()})
    return outcomes, recorded


@functools.cache
def _eager(spec, instance):
    """create_autospec's outcomes, once per spec (the sample and the broken variants share them)."""
    return _run(mock.create_autospec, spec, instance)


def _differences(spec, instance):
    """Where the lazy autospec differs from create_autospec, and the outcomes both agreed on."""
    eager = _eager(spec, instance)
    lazy = _run(ka.lazy_autospec, spec, instance)
    steps = [f"{label}: eager {a!r} lazy {b!r}" for (label, a), (_, b) in zip(eager[0], lazy[0], strict=True) if a != b]
    recorded = [
        f"{key}: eager {eager[1][key]} lazy {lazy[1][key]}" for key in eager[1] if eager[1][key] != lazy[1][key]
    ]
    return steps + recorded, [str(outcome) for _, outcome in eager[0]]


# The unit tier compares a sample: Called (a callable subclass of Child, Base and Mixin: every
# kind of member) as an instance, and the cheap specs both ways, about a fifth of the whole
# comparison's time. The whole comparison runs as a script, on each CPython the machine has,
# in tests/integration/test_lazy_autospec_versions.py.
SAMPLE = [(Called, True)] + [(spec, instance) for spec in SPECS[3:] for instance in (True, False)]
WHOLE = [(spec, instance) for spec in SPECS for instance in (True, False)]


def _compare(pairs):
    """Each pair compared: no step's outcome and no recorded call differs."""
    for spec, instance in pairs:
        differences, _ = _differences(spec, instance)
        assert differences == [], (spec, instance)


def test_lazy_autospec_accepts_refuses_and_records_what_create_autospec_does():
    _compare(SAMPLE)


def _unsigned_child(pending):
    """A method child made as _method_child makes it, less the signature check."""
    original, parent, name = pending.spec, pending.parent, pending.name
    klass = mock.AsyncMock if mock.iscoroutinefunction(original) else mock.MagicMock
    child = klass(
        parent=parent, name=name, _new_name=name, _new_parent=parent, spec=original, _eat_self=pending.skipfirst
    )
    if ka._PRESETS_METHOD_RETURNS:
        child.return_value = klass()
    return child


def _orphan_child(pending):
    """A method child made with its signature check but no parent: its calls reach no mock_calls."""
    original, name = pending.spec, pending.name
    klass = mock.AsyncMock if mock.iscoroutinefunction(original) else mock.MagicMock
    child = klass(name=name, spec=original, _eat_self=pending.skipfirst)
    if ka._PRESETS_METHOD_RETURNS:
        child.return_value = klass()
    mock._check_signature(original, child, skipfirst=pending.skipfirst)
    return child


def _self_eating_child(pending, made=ka._method_child):
    """A method child whose ``self`` is skipped where it is not, and kept where it is skipped."""
    pending.skipfirst = not pending.skipfirst
    return made(pending)


# Broken lazy autospecs, each with a step of Queue's script that must then differ (Queue as an
# instance: the cheapest spec with a method, in the sample, so create_autospec's side is cached).
BROKEN = {
    "no signature check": (("_method_child", _unsigned_child), "assert_has_calls push(item=1): eager "),
    "children without a parent": (("_method_child", _orphan_child), "mock_calls reads first=True: eager "),
    "self skipped wrongly": (("_method_child", _self_eating_child), "push(1): eager "),
    "return value preset wrongly": (
        ("_PRESETS_METHOD_RETURNS", not ka._PRESETS_METHOD_RETURNS),
        "sealed push(1): eager ",
    ),
}


def test_the_comparison_tells_a_broken_lazy_autospec_apart():
    """The comparison can fail: each way of making the lazy children wrong shows as a difference,
    at the step that exercises it (a script that stopped calling with wrong arguments, reading
    mock_calls or sealing would let one through)."""
    missed = {}
    for broken, ((attribute, replacement), step) in BROKEN.items():
        with mock.patch.object(ka, attribute, replacement):
            differences, _ = _differences(Queue, True)
        if not [d for d in differences if d.startswith(step)]:
            missed[broken] = differences[:5]
    assert missed == {}


def test_the_script_sees_refusals_and_records_calls():
    """The comparison is not vacuous: the script meets refusals, async mocks and recorded calls."""
    outcomes, recorded = _run(ka.lazy_autospec, Child, False)
    seen: dict[str, object] = {}
    for label, outcome in outcomes:
        seen.setdefault(label, outcome)  # the first time: the script repeats some steps later
    assert seen["read missing"].startswith("raised AttributeError")
    assert seen["add()"].startswith("raised TypeError: missing a required argument: 'req'")
    assert seen["mock()"].startswith("raised TypeError")
    assert "async=True" in seen["read drain"]
    assert seen["set custom=5"] == "ok " + _describe(5)
    assert seen["helper(1) deleted"].startswith("raised AttributeError")
    assert "('().add', ('r',), {})" in recorded["mock_calls reads first=True"]
    assert "('sub.go', (1,), {})" in recorded["mock_calls reads first=True"]


def test_children_are_made_when_first_read():
    made = ka.lazy_autospec(Child, instance=True, name="m")
    pending = [n for n, c in made._mock_children.items() if not isinstance(c, mock.NonCallableMock)]
    assert "add" in pending and "fetch" in pending and "Nested" in pending
    made.add("r")
    child = made._mock_children["add"]
    assert isinstance(child, mock.MagicMock) and child is made.add
    assert not isinstance(made._mock_children["fetch"], mock.NonCallableMock)


def test_a_refused_read_raises_from_unittest_mock_alone():
    """As from create_autospec: the probe's classifier reads the innermost frame, and outputs quote tracebacks."""
    made = ka.lazy_autospec(Child, instance=True, name="m")
    try:
        made.send_kv_chunk  # noqa: B018 - not an attribute of the class
    except AttributeError as exc:
        files = [frame.f_code.co_filename for frame, _ in traceback.walk_tb(exc.__traceback__)]
    assert files[-1] == mock.__file__ and kp.__file__ not in files and ka.__file__ not in files


def test_probe_mock_is_the_lazy_autospec():
    probe = kp.Probe("p", mocks={"sender": "autospec of Child"})
    assert kp.lazy_autospec is ka.lazy_autospec
    made = probe.mock("sender", Child, limit=9)
    assert not isinstance(made._mock_children["add"], mock.NonCallableMock)
    assert made.limit == 9


if __name__ == "__main__":
    for test in [value for key, value in sorted(globals().items()) if key.startswith("test_")]:
        test()
    _compare([pair for pair in WHOLE if pair not in SAMPLE])
    print(f"{sys.version.split()[0]}: the lazy autospec matched create_autospec")

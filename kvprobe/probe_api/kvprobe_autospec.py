"""Autospec, made lazily: what ``create_autospec`` makes, each method child when first read.

Probe-side, imported INSIDE the target environment (stdlib only, never kvprobe): the probe
API's ``Probe.mock`` makes its mocks with :func:`lazy_autospec`, which ``kvprobe_probe``
re-exports (``kp.lazy_autospec``). It travels as ``kvprobe_probe.py`` does: this folder
(kvprobe/probe_api/) is on the probe process's ``sys.path``, in the fork server's and the
kept server's too, and in the wheel.

``kvprobe_probe`` imports it on its last lines, after everything else: tracebacks in probe
outputs (committed bundles among them) cite lines of kvprobe_probe.py, and a line added above
them would move every one. Keep that import at the end of kvprobe_probe.py, and add to this
file, not to that one, what the autospec needs.
"""

from __future__ import annotations

import inspect
from typing import Any
from unittest import mock as _mock


def _presets_method_returns() -> bool:
    """Whether this interpreter's create_autospec gives each method child a return value at once.

    3.12 and later do (``new.return_value = child_klass()``); 3.10 and 3.11 make it on first
    read. Asked of create_autospec itself, so a patch release that changes it is followed.
    """

    class Probe:
        def method(self) -> None:
            """A method create_autospec makes a child for."""

    child = _mock.create_autospec(Probe, instance=True).method
    return child.__dict__["_mock_return_value"] is not _mock.DEFAULT


_PRESETS_METHOD_RETURNS = _presets_method_returns()


class _PendingMethod(_mock._SpecState):
    """A method child not made yet: what create_autospec's loop would have made for it.

    A ``_SpecState`` so that ``reset_mock`` passes over it as it passes over create_autospec's
    own pending (non-method) children; :class:`_Children` makes it when it is looked up.
    """

    def __init__(self, original: Any, parent: Any, name: str, skipfirst: bool) -> None:
        super().__init__(original, False, parent, name)
        self.skipfirst = skipfirst


class _Children(dict):
    """A lazy autospec's children: a pending method child is made the first time it is looked up.

    unittest.mock looks a child up with ``get`` wherever it reads one: an attribute read
    (after its checks for unknown and magic names), ``del``, ``seal`` and the assertion
    helpers' signature walk. So every reader meets the child create_autospec would have made,
    and a refused read raises from unittest.mock's own frame, with no frame of this file.
    """

    def get(self, name: str, default: Any = None) -> Any:
        with _mock.NonCallableMock._lock:  # an RLock: NonCallableMock.__getattr__ holds it here
            found = dict.get(self, name, default)
            if isinstance(found, _PendingMethod):
                found = self[name] = _method_child(found)
            return found


def _method_child(pending: _PendingMethod) -> Any:
    """The method child create_autospec's loop makes, with its signature check."""
    original, parent, name = pending.spec, pending.parent, pending.name
    klass = _mock.AsyncMock if _mock.iscoroutinefunction(original) else _mock.MagicMock
    child = klass(parent=parent, name=name, _new_name=name, _new_parent=parent,
                  spec=original, _eat_self=pending.skipfirst)
    if _PRESETS_METHOD_RETURNS:
        child.return_value = klass()
    _mock._check_signature(original, child, skipfirst=pending.skipfirst)
    return child


def _lazy_eligible(spec: Any) -> bool:
    """A spec ``lazy_autospec`` makes itself; the others go to create_autospec as they are.

    The others (a function, a list, a mock, a data descriptor such as a property, None, an
    object with ``__code__``) take branches of create_autospec this file does not copy.
    """
    return not (spec is None or isinstance(spec, _mock.FunctionTypes) or _mock._is_list(spec)
                or _mock._is_instance_mock(spec) or inspect.isdatadescriptor(spec)
                or getattr(spec, "__code__", None))


def lazy_autospec(spec: Any, *, instance: bool = False, name: str | None = None, parent: Any = None) -> Any:
    """``create_autospec(spec, instance=instance, name=name)``, each method child made when first read.

    create_autospec makes a MagicMock (with its own class, spec and signature) for every
    method in ``dir(spec)`` at once: thousands for SGLang's Scheduler, of which a probe reads
    a handful. Here the walk over ``dir(spec)`` still happens at once (every attribute is
    fetched when create_autospec would fetch it, and a class changed later changes nothing),
    but a method it finds is kept as a pending child, made when first looked up by the steps
    create_autospec takes for it. Other attributes are pending in create_autospec already,
    and it makes them when they are read.

    It copies create_autospec of CPython 3.10-3.13 for spec_set False and no extra keywords,
    and so uses unittest.mock's internals: ``_SpecState`` (a pending child, as create_autospec
    keeps non-method attributes, given the same positional arguments: ``instance`` lands in
    ``ids`` there too), ``_check_signature`` (the signature check a mock gets), ``_must_skip``
    (whether a method eats ``self``), ``_is_magic``, ``_callable``, ``_instance_callable``,
    ``_is_list``, ``_is_instance_mock``, ``FunctionTypes`` and ``iscoroutinefunction`` (the
    tests create_autospec makes), the ``_mock_children`` dict every reader looks a child up
    in with ``get`` (see :class:`_Children`) and ``NonCallableMock._lock`` (the RLock guarding
    it). tests/unit/probe_api/test_lazy_autospec.py holds it against create_autospec on each version.
    """
    if not _lazy_eligible(spec):
        return _mock.create_autospec(spec, instance=instance, _parent=parent, _name=name)
    is_type = isinstance(spec, type)
    klass: type = _mock.MagicMock
    if not _mock._callable(spec) or (is_type and instance and not _mock._instance_callable(spec)):
        klass = _mock.NonCallableMagicMock
    kwargs: dict[str, Any] = {"spec": spec, "_spec_as_instance": True} if instance else {"spec": spec}
    made = klass(parent=parent, _new_parent=parent, _new_name=name if parent is not None else "",
                 name=name, **kwargs)
    made.__dict__["_mock_children"] = _Children()
    _mock._check_signature(spec, made, is_type, instance)
    if is_type and not instance:
        made.return_value = lazy_autospec(spec, instance=True, name="()", parent=made)
    for entry in dir(spec):
        if _mock._is_magic(entry):
            continue
        try:
            original = getattr(spec, entry)
        except AttributeError:
            continue
        if isinstance(original, _mock.FunctionTypes):
            pending = _PendingMethod(original, made, entry, _mock._must_skip(spec, entry, is_type))
        else:
            pending = _mock._SpecState(original, False, made, entry, instance)
        made._mock_children[entry] = pending
    return made

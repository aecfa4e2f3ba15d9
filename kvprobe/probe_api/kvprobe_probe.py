"""Probe-side API, imported INSIDE the target environment (stdlib only).

A probe file declares what it mocks, registers cases, and calls ``probe.main()``.
Each case receives an ``Observations`` object and records named, JSON-valued
observations. An exception inside a case is data: it is recorded with its type,
message and root cause, the observations made before it are kept, and the
remaining cases still run. The runner reads the one JSON document ``main``
writes; nothing is parsed from logs.

A case names its decision point: the real call under test whose behaviour the
experiment is about. The case says when it gets there (``obs.decision()``), and
that is what tells "the door enqueued the request" apart from "our set-up broke":

* observed: the decision point was reached. An exception from then on is
  behaviour of the code under test and is kept as the case's error.
* unobserved: the case raised before the decision point (set-up drift: a stub
  lacking a field, a changed constructor), a mock refused a call anywhere or
  absorbed one the probe does not model (a mock is never the code under test),
  a precondition did not hold, or the case never got there. ``reason`` says
  why; never read as behaviour.
* not-present: the code path itself is missing in this release (``require``
  failed, or an import statement of the probe's own code did); ``missing``
  names the absent module or symbol as evidence.

kvprobe runs a probe through this file (``python kvprobe_probe.py PROBE --out
FILE``, :func:`run_file`), so an import the probe's module cannot make on a
release (an older one without the module or the name) is reported per declared
case, not as a crashed process: not-present when what is missing belongs to the
package the probe imports, unobserved when it is a dependency outside it.

The probe also records every non-default configuration it sets
(``probe.configure``) and what each tracked mock absorbed: every call a mock
accepted in place of the real collaborator (``probe.mock`` / ``probe.track``).

    import kvprobe_probe as kp
    probe = kp.Probe("admission", mocks={"sender": "autospec of the KV sender class"})

    @probe.case("prefill.rejected_new", "an over-long prompt rejected before admission",
                decision="PrefillBootstrapQueue.add")
    def _(obs):
        add = kp.require(queue_cls, "add")
        with obs.decision():
            add(queue, req)
        obs.record("enqueued", req in queue.queue)

    if __name__ == "__main__":
        probe.main()

A case's set-up can be a context manager factory (``using=``) whose value is the
case's second argument; what lives beside the probe file (helpers it imports) is
the probe's own code too, and is copied into every bundle with it.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import inspect
import json
import math
import os
import platform
import re
import sys
import tempfile
import time
import traceback
import types
from collections import Counter
from typing import Any, Callable, Iterator
from unittest import mock as _mock

OUTPUT_SCHEMA = "kvprobe.probe-output/1"
_MAX_TRACEBACK_CHARS = 8000


SIDE_CONFIG_ENV = "KVPROBE_SIDE_CONFIG"

OBSERVED, UNOBSERVED, NOT_PRESENT = "observed", "unobserved", "not-present"


def side_config() -> dict[str, Any]:
    """The side's configuration the runner passed (synthetic experiments' switches).

    Diff probes on real code get ``{"side": "base"|"head", ...}``; they must not
    branch on it to change what they observe.
    """
    raw = os.environ.get(SIDE_CONFIG_ENV)
    return json.loads(raw) if raw else {}


class ObservationError(ValueError):
    """An observation that cannot be recorded faithfully (bad name, value or duplicate)."""


class NotPresent(Exception):
    """The code path a case is about does not exist in this release."""

    def __init__(self, *missing: str) -> None:
        super().__init__("not present in this release: " + ", ".join(missing))
        self.missing = list(missing)


class CannotObserve(Exception):
    """The case cannot reach its decision point faithfully; the message says why."""


class RejectedCall(Exception):
    """A strict fake refused a call that its real counterpart would refuse."""


def _qualified(owner: Any) -> str:
    if inspect.ismodule(owner):
        return owner.__name__
    module = getattr(owner, "__module__", None)
    name = getattr(owner, "__qualname__", None) or type(owner).__qualname__
    return f"{module}.{name}" if module else name


def require(owner: Any, name: str) -> Any:
    """``owner.name``, or NotPresent naming the missing symbol."""
    try:
        return getattr(owner, name)
    except AttributeError:
        raise NotPresent(f"{_qualified(owner)}.{name}") from None


def require_module(name: str) -> Any:
    """The imported module, or NotPresent if this release has no such module.

    Only a missing module itself counts: a module that exists but fails to import
    (a missing dependency) raises as usual, so the case is unobserved, not absent.
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise NotPresent(name) from None
        raise


def optional(module: str, name: str | None = None) -> Any:
    """The module (or its attribute ``name``), or None where this release has no such thing."""
    try:
        found = require_module(module)
        return found if name is None else require(found, name)
    except NotPresent:
        return None


@contextlib.contextmanager
def stand_in_unset(module: Any, values: dict[str, Callable[[], Any]]) -> Iterator[None]:
    """Patch each global of ``module`` named in ``values`` that is still None, for the block.

    For state an initializer the probe does not run would have set (a process's
    groups, its rank); ``values`` maps a name to a factory of its stand-in.
    """
    with contextlib.ExitStack() as stack:
        for name, make in values.items():
            if getattr(module, name, 0) is None:
                stack.enter_context(_mock.patch.object(module, name, make()))
        yield


# --- imports that fail: evidence of absence, or an environment that cannot observe ------
_CANNOT_IMPORT = re.compile(r"cannot import name '([\w.]+)' from '([\w.]+)'")


def _top(name: str) -> str:
    return name.split(".")[0]


def import_failure(exc: ImportError, requested: list[str]) -> Exception:
    """What a failed import of ``requested`` (the modules an import statement names) means.

    NotPresent when what is missing belongs to the package asked for (a module, a
    name, or a module of that package that raised ImportError), naming it; else
    CannotObserve: a dependency outside that package is what this environment lacks.
    """
    tops = {_top(r) for r in requested}
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        failing, missing = exc.name, exc.name
    elif (match := _CANNOT_IMPORT.search(str(exc))) is not None:
        failing, missing = match.group(2), f"{match.group(2)}.{match.group(1)}"
    else:
        failing, missing = _raising_module(exc), (requested or ["?"])[0]
    if failing is not None and _top(failing) in tops:
        error: Exception = NotPresent(missing)
    else:
        error = CannotObserve(f"importing {', '.join(requested)} failed on {failing or 'an unknown module'} "
                              f"outside that package: {_qualname(type(exc))}: {str(exc)[:500]}")
    error.__cause__ = exc
    return error


def _raising_module(exc: BaseException) -> str | None:
    """The module whose code raised ``exc`` (its innermost frame), outside the import machinery."""
    name = None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        module = frame.f_globals.get("__name__")
        if module and not module.startswith(("importlib", "_frozen_importlib")):
            name = module
    return name


def _import_statement(exc: BaseException, directory: str) -> list[str] | None:
    """The modules named by the probe's own import statement that raised ``exc``, if one did.

    The probe's own code is every file in its directory (the probe file and helpers beside it).
    """
    found = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        filename = os.path.abspath(frame.f_code.co_filename)
        if os.path.dirname(filename) == directory:
            found = (filename, lineno)
    if found is None:
        return None
    for node in ast.walk(_parsed(found[0])):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and node.lineno <= found[1] <= (node.end_lineno or 0):
            if isinstance(node, ast.ImportFrom):
                return [node.module or ""] if node.level == 0 else None
            return [alias.name for alias in node.names]
    return None


def _parsed(filename: str) -> ast.Module:
    with open(filename, encoding="utf-8") as handle:
        return ast.parse(handle.read(), filename)


def require_param(func: Callable, name: str) -> None:
    """NotPresent unless ``func`` declares a parameter ``name`` (a keyword the release lacks)."""
    if name not in inspect.signature(func).parameters:
        raise NotPresent(f"{_qualified(func)}({name}=)")


def build(cls: type, **known: Any) -> Any:
    """Run the real constructor with the arguments it declares, taken from ``known``.

    Constructor signatures drift between releases; a required parameter the
    probe does not know raises CannotObserve naming it, instead of a TypeError
    that would read like behaviour.
    """
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    kwargs, unknown = {}, []
    for param in params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.name in known:
            kwargs[param.name] = known[param.name]
        elif param.default is param.empty:
            unknown.append(param.name)
    if unknown:
        raise CannotObserve(f"{_qualified(cls)}.__init__ needs {', '.join(unknown)}: unknown to this probe")
    return cls(**kwargs)


def _check_json_value(name: str, value: Any) -> None:
    """Reject values that JSON cannot carry exactly (NaN, sets, objects...)."""
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ObservationError(f"observation {name!r}: NaN/Infinity is not valid JSON")
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_json_value(name, item)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ObservationError(f"observation {name!r}: dict keys must be str")
            _check_json_value(name, item)
        return
    raise ObservationError(
        f"observation {name!r}: {type(value).__name__} is not a JSON value"
    )


def _check_name(name: Any, what: str) -> None:
    if not isinstance(name, str) or not name or not name.replace("_", "a").replace(".", "a").isalnum():
        raise ObservationError(f"{what} name {name!r} must be [A-Za-z0-9_.]+")


class Observations:
    """What one case saw: ordered name -> JSON value, each name recorded once."""

    def __init__(self, decision_point: str | None = None) -> None:
        self.values: dict[str, Any] = {}
        self.notes: list[str] = []
        self.preconditions: dict[str, bool] = {}
        self.decision_point = decision_point
        # A case without a declared decision point is observed from its first line.
        self.reached = decision_point is None

    def record(self, name: str, value: Any) -> Any:
        """Record ``value`` under ``name``; returns it so calls can be inlined."""
        _check_name(name, "observation")
        if name in self.values:
            raise ObservationError(f"observation {name!r} recorded twice")
        _check_json_value(name, value)
        self.values[name] = list(value) if isinstance(value, tuple) else value
        return value

    def note(self, text: str) -> None:
        """A free-text remark for humans; never compared."""
        self.notes.append(str(text))

    def precondition(self, name: str, holds: bool, detail: str = "") -> None:
        """Record a state the set-up must have built; CannotObserve if it did not."""
        _check_name(name, "precondition")
        if name in self.preconditions:
            raise ObservationError(f"precondition {name!r} checked twice")
        if self.reached:
            raise ObservationError(f"precondition {name!r} checked after the decision point")
        self.preconditions[name] = bool(holds)
        if not holds:
            raise CannotObserve(f"precondition {name} does not hold" + (f": {detail}" if detail else ""))

    @contextlib.contextmanager
    def decision(self) -> Iterator[None]:
        """Wrap the real call under test: from here on an exception is behaviour."""
        if self.decision_point is None:
            raise ObservationError("this case declared no decision point")
        if self.reached:
            raise ObservationError(f"decision point {self.decision_point!r} entered twice")
        self.reached = True
        yield


def _qualname(exc_type: type) -> str:
    module = exc_type.__module__
    return exc_type.__qualname__ if module == "builtins" else f"{module}.{exc_type.__qualname__}"


def _root_cause(exc: BaseException) -> BaseException:
    """Walk __cause__/__context__ to the innermost exception (retry wrappers hide it)."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        nxt = exc.__cause__ or exc.__context__
        if nxt is None:
            break
        exc = nxt
    return exc


def describe_exception(exc: BaseException) -> dict[str, Any]:
    """Type, message, root cause and a bounded traceback of ``exc``."""
    root = _root_cause(exc)
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {
        "type": _qualname(type(exc)),
        "message": str(exc)[:2000],
        "root_type": _qualname(type(root)),
        "root_message": str(root)[:2000],
        "traceback": tb[-_MAX_TRACEBACK_CHARS:],
    }


_MOCK_FILE = os.path.normcase(os.path.abspath(_mock.__file__))


def _raised_by_mock(exc: BaseException) -> bool:
    """True if the innermost frame is unittest.mock: a mock, not the code under test, refused."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.normcase(os.path.abspath(tb.tb_frame.f_code.co_filename)) == _MOCK_FILE


def _classify(obs: Observations, exc: Exception | None) -> tuple[str, str | None, list[str]]:
    """(observation, reason, missing) of a finished case."""
    if isinstance(exc, NotPresent) and not obs.reached:
        return NOT_PRESENT, str(exc), exc.missing
    if exc is not None and _raised_by_mock(exc):
        # Even at the decision point: a mock lacking a field is the probe's drift.
        return UNOBSERVED, f"a mock could not stand in ({_qualname(type(exc))}: {str(exc)[:500]})", []
    if obs.reached:
        return OBSERVED, None, []
    if exc is None:
        return UNOBSERVED, f"the case ended without reaching its decision point {obs.decision_point}", []
    if isinstance(exc, CannotObserve):
        return UNOBSERVED, str(exc), []
    return UNOBSERVED, (f"set-up raised {_qualname(type(exc))} before the decision point "
                        f"{obs.decision_point}: {str(exc)[:500]}"), []


class Probe:
    """A named set of cases plus the declaration of what the probe mocks."""

    def __init__(self, name: str, *, mocks: dict[str, str], description: str = "") -> None:
        if not mocks:
            raise ValueError("a probe must declare what it mocks (mocks={} is not allowed)")
        self.name = name
        self.mocks = dict(mocks)
        self.description = description
        self._cases: list[tuple[str, str, str | None, Callable[[Observations], None]]] = []
        self.facts: dict[str, Any] = {}
        self.configuration: list[dict[str, Any]] = []
        self.absorbed: list[dict[str, Any]] = []
        self._case: str | None = None
        self._tracked: list[tuple[str, Any]] = []
        # The probe's own code: its file and the helpers beside it (an import there is the probe's).
        caller = sys._getframe(1).f_globals.get("__file__")
        self.directory = os.path.dirname(os.path.abspath(caller)) if caller else None

    def case(self, name: str, description: str = "", *, decision: str | None = None,
             using: Callable[[], contextlib.AbstractContextManager] | None = None) -> Callable:
        """Decorator registering one case; names are unique within the probe.

        ``decision`` names the real call under test; the case enters it with
        ``obs.decision()``. Without one, the case is observed from its first line.
        ``using`` is the case's set-up: a factory of a context manager whose value is
        the case's second argument (``def _(obs, world)``); it runs inside the case,
        so what it raises is set-up drift and the mocks it makes are the case's.
        """
        if any(existing[0] == name for existing in self._cases):
            raise ValueError(f"case {name!r} registered twice")

        def register(func: Callable) -> Callable:
            body = func if using is None else _with_setup(func, using)
            self._cases.append((name, description or (func.__doc__ or "").strip(), decision, body))
            return func

        return register

    def fact(self, name: str, value: Any) -> None:
        """Context about the code under test (e.g. which file a class came from)."""
        _check_json_value(name, value)
        self.facts[name] = value

    def configure(self, name: str, value: Any, *, default: Any, why: str) -> Any:
        """Record a non-default setting the probe applies (in a case: for that case only)."""
        _check_json_value(name, value)
        _check_json_value(name, default)
        if value == default:
            raise ValueError(f"configuration {name!r}: {value!r} is the default, nothing to record")
        entry = {"name": name, "value": value, "default": default, "why": why, "case": self._case}
        if entry not in self.configuration:
            self.configuration.append(entry)
        return value

    def track(self, name: str, mock_obj: Any, *, absorbs: tuple[str, ...] = ()) -> Any:
        """Record every call ``mock_obj`` accepts in this case under the declared mock ``name``.

        ``absorbs`` lists the calls the probe models ("()" is calling the mock
        itself, "().send" a method of what it returned). A call outside it was
        absorbed without the probe knowing what the real collaborator would have
        done, so the case is unobserved.
        """
        if name not in self.mocks:
            raise ValueError(f"mock {name!r} is not declared in the probe's mocks")
        self._tracked.append((name, mock_obj, frozenset(absorbs)))
        return mock_obj

    def mock(self, name: str, spec: Any, *, instance: bool = True, absorbs: tuple[str, ...] = (),
             **attrs: Any) -> Any:
        """A tracked autospec of ``spec`` (:func:`lazy_autospec`): unknown attributes and wrong signatures raise."""
        made = lazy_autospec(spec, instance=instance, name=name)
        for key, value in attrs.items():
            setattr(made, key, value)
        return self.track(name, made, absorbs=absorbs)

    def _collect_absorbed(self, case: str) -> list[str]:
        """Record the tracked mocks' calls; returns the unmodelled ones."""
        counts: Counter[tuple[str, str]] = Counter()
        unmodelled: list[str] = []
        for name, mock_obj, absorbs in self._tracked:
            for call in mock_obj.mock_calls:
                call_name = call[0] or "()"
                counts[(name, call_name)] += 1
                label = f"{name}: {call_name}"
                if call_name not in absorbs and label not in unmodelled:
                    unmodelled.append(label)
        for (name, call), count in sorted(counts.items()):
            self.absorbed.append({"case": case, "mock": name, "call": call, "count": count})
        self._tracked = []
        return unmodelled

    def run_case(self, name: str, description: str, decision: str | None, func: Callable) -> dict[str, Any]:
        obs = Observations(decision)
        self._case, self._tracked = name, []
        started = time.perf_counter()
        exc: Exception | None = None
        try:
            func(obs)
        except ImportError as caught:
            exc = caught if obs.reached else self._failed_import(caught)
        except Exception as caught:  # outcomes are data: record, keep going
            exc = caught
        finally:
            self._case = None
            unmodelled = self._collect_absorbed(name)
        observation, reason, missing = _classify(obs, exc)
        if unmodelled and observation == OBSERVED:
            # What an unmodelled call returned may have steered the code under test.
            observation = UNOBSERVED
            reason = "a mock absorbed calls the probe does not model: " + "; ".join(unmodelled)
        return {
            "name": name,
            "description": description,
            "status": "ok" if exc is None else "raised",
            "observation": observation,
            "decision_point": decision,
            "reason": reason,
            "missing": missing,
            "preconditions": obs.preconditions,
            "observations": obs.values,
            "notes": obs.notes,
            "error": None if exc is None else describe_exception(exc),
            "duration_s": round(time.perf_counter() - started, 6),
        }

    def run(self, only: list[str] | None = None) -> dict[str, Any]:
        if not self._cases:
            raise RuntimeError(f"probe {self.name!r} registered no cases")
        selected = [c for c in self._cases if not only or c[0] in only]
        unknown = sorted(set(only or []) - {c[0] for c in self._cases})
        if unknown:
            raise RuntimeError(f"unknown case(s): {', '.join(unknown)}")
        results = [self.run_case(*c) for c in selected]
        return {
            "schema": OUTPUT_SCHEMA,
            "probe": self.name,
            "description": self.description,
            "mocks": self.mocks,
            "facts": self.facts,
            "configuration": self.configuration,
            "absorbed": self.absorbed,
            "python": platform.python_version(),
            "cases": results,
        }

    def _failed_import(self, exc: ImportError) -> Exception:
        """An import statement of the probe's own code that failed: absent or unobservable.

        An ImportError from anywhere else (SGLang importing lazily) stays as it is.
        """
        requested = _import_statement(exc, self.directory) if self.directory else None
        return exc if requested is None else import_failure(exc, requested)

    def run_unimportable(self, exc: ImportError, declared: list[tuple[str, str, str | None]],
                         only: list[str] | None = None) -> dict[str, Any]:
        """The document of a probe whose module failed to import: every declared case says why."""
        failure = self._failed_import(exc)
        if failure is exc:
            failure = CannotObserve(f"the probe's module raised {_qualname(type(exc))}: {str(exc)[:500]}")
            failure.__cause__ = exc

        def fail(_obs: Observations) -> None:
            raise failure

        self._cases = [(name, description, decision, fail) for name, description, decision in declared]
        return self.run(only)

    def main(self, argv: list[str] | None = None) -> None:
        """CLI entry used by kvprobe: ``python probe.py --out FILE [--case NAME]...``."""
        args = _arguments(self, argv)
        _write(self, args.out, self.run(args.case))


def _with_setup(func: Callable, using: Callable[[], contextlib.AbstractContextManager]) -> Callable:
    def case(obs: Observations) -> None:
        with using() as made:
            func(obs, made)

    return case


def _arguments(probe: Probe, argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=probe.description or probe.name)
    parser.add_argument("--out", required=True, help="where to write the JSON output")
    parser.add_argument("--case", action="append", help="run only these cases")
    return parser.parse_args(argv)


def _write(probe: Probe, out: str, document: dict[str, Any]) -> None:
    """Write the document atomically (the runner reads only this file)."""
    data = json.dumps(document, indent=2, sort_keys=True, allow_nan=False) + "\n"
    directory = os.path.dirname(os.path.abspath(out))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".probe-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(data)
    os.replace(tmp, out)
    sys.stdout.write(f"{probe.name}: {len(document['cases'])} case(s) written to {out}\n")


# --- the harness's entry: run a probe file, and report an import it cannot make per case -----
def run_file(path: str, argv: list[str]) -> None:
    """Run the probe file as ``__main__`` (as ``python FILE`` does) with ``argv``.

    When its module body raises ImportError before ``main``, the probe's declared
    cases (read from its source) are each reported not-present (the missing module
    or symbol as evidence) or unobserved (a dependency outside the package), so
    one absent module is data per case, never a crashed probe process.
    """
    path = os.path.abspath(path)
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    module = types.ModuleType("__main__")
    module.__file__ = path
    sys.modules["__main__"] = module
    sys.argv = [path, *argv]
    sys.path[0] = os.path.dirname(path)
    try:
        exec(compile(source, path, "exec"), module.__dict__)
    except ImportError as exc:
        named = [(key, value) for key, value in vars(module).items() if isinstance(value, Probe)]
        if len(named) != 1:
            raise  # no probe declared before the import: nothing to report per case
        variable, probe = named[0]
        args = _arguments(probe, argv)
        _write(probe, args.out, probe.run_unimportable(exc, declared_cases(source, variable), args.case))


def declared_cases(source: str, variable: str) -> list[tuple[str, str, str | None]]:
    """(name, description, decision) of every ``@<variable>.case(...)`` in the source.

    Arguments must be literals or module-level constants (``DECISION = "..."``): the
    module could not run, so nothing else can be evaluated.
    """
    tree = ast.parse(source)
    constants = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            with contextlib.suppress(ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                constants[node.targets[0].id] = ast.literal_eval(node.value)

    def value(node: ast.expr) -> Any:
        if isinstance(node, ast.Name) and node.id in constants:
            return constants[node.id]
        return ast.literal_eval(node)

    declared = []
    for node in ast.walk(tree):
        for decorator in getattr(node, "decorator_list", []):
            if (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
                    and decorator.func.attr == "case" and isinstance(decorator.func.value, ast.Name)
                    and decorator.func.value.id == variable):
                args = [value(a) for a in decorator.args]
                keywords = {k.arg: k.value for k in decorator.keywords}
                description = args[1] if len(args) > 1 else value(keywords.get("description", ast.Constant("")))
                decision = value(keywords.get("decision", ast.Constant(None)))
                declared.append((args[0], description, decision))
    return declared


# --- autospec, made lazily: in kvprobe_autospec.py beside this file --------------------------
# Imported here, at the end, so that the lines of everything above, which tracebacks in probe
# outputs cite, stay those of the file before it: anything new goes below them too.
from kvprobe_autospec import lazy_autospec  # noqa: E402 - at the end on purpose (above)


# --- an absent name says nothing where the release does not import here ----------------------
def _package_imports(directory: str, top: str) -> list[str]:
    """The modules of package ``top`` that the probe's own code (every file in ``directory``)
    imports at module level, in file order; for ``from M import N`` also ``M.N`` (N may be a
    submodule; one that is not is skipped as absent)."""
    found: list[str] = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".py"):
            continue
        try:
            tree = _parsed(os.path.join(directory, name))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*")]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            found += [n for n in names if _top(n) == top and n not in found]
    return found


def unless_unimportable(missing: NotPresent, modules: list[str]) -> Exception:
    """``missing``, unless one of ``modules`` (what the probe's own code imports of the release)
    fails to import here for a reason outside the package (a dependency this env lacks, or one
    whose API the release no longer fits): then CannotObserve naming both, since nothing of the
    release is observable in this env and the absence of a set-up name is no evidence that the
    code path is absent. A module that is itself absent is skipped."""
    for module in modules:
        try:
            importlib.import_module(module)
            continue
        except ImportError as exc:
            failure = import_failure(exc, [module])
            if isinstance(failure, NotPresent):
                continue
            reason = str(failure)
        except Exception as exc:  # a release module raising on import is what this env says of it
            reason = f"importing {module} raised {_qualname(type(exc))}: {str(exc)[:500]}"
        error = CannotObserve(
            f"{reason}; this env cannot import the release, so that it lacks {', '.join(missing.missing)} "
            "(which the probe's own code imports) says nothing of the code path"
        )
        error.__cause__ = missing
        return error
    return missing


def _failed_import_here(self: Probe, exc: ImportError) -> Exception:
    """:meth:`Probe._failed_import`, then :func:`unless_unimportable` over the probe's imports."""
    failure = _failed_import_of_the_probe(self, exc)
    if isinstance(failure, NotPresent) and self.directory:
        failure = unless_unimportable(failure, _package_imports(self.directory, _top(failure.missing[0])))
    return failure


# Set here, not in the class above, for the rule of this section's heading (lines stay put).
_failed_import_of_the_probe = Probe._failed_import
Probe._failed_import = _failed_import_here  # type: ignore[method-assign]


def run_file_reporting(path: str, argv: list[str]) -> None:
    """:func:`run_file`, and where an import statement of the probe's own code raised something
    other than ImportError (a release module that does not fit this env's dependencies, e.g.
    transformers refusing its image processor classes), each declared case says so
    (could not observe, naming the module that raised) instead of a probe that died without
    output. Anything else still propagates: it is no statement about the release."""
    try:
        run_file(path, argv)
    except Exception as exc:
        probes = [v for v in vars(sys.modules.get("__main__", types.ModuleType("_"))).values() if isinstance(v, Probe)]
        directory = os.path.dirname(os.path.abspath(path))
        requested = _import_statement(exc, directory)
        if isinstance(exc, ImportError) or len(probes) != 1 or requested is None:
            raise
        failing = _raising_module(exc) or "an unknown module"
        failure = CannotObserve(
            f"importing {', '.join(requested)} raised {_qualname(type(exc))} in {failing}: {str(exc)[:500]}; "
            "this env cannot import the release"
        )
        failure.__cause__ = exc
        with open(path, encoding="utf-8") as handle:
            source = handle.read()
        variable = next(k for k, v in vars(sys.modules["__main__"]).items() if v is probes[0])
        probe = probes[0]
        args = _arguments(probe, argv)

        def fail(_obs: Observations) -> None:
            raise failure

        declared = declared_cases(source, variable)
        probe._cases = [(name, description, decision, fail) for name, description, decision in declared]
        _write(probe, args.out, probe.run(args.case))


if __name__ == "__main__":
    # ``python kvprobe_probe.py PROBE_FILE --out OUT``: the probe imports this file as
    # ``kvprobe_probe``; run through that one module, not this ``__main__`` copy.
    import kvprobe_probe

    kvprobe_probe.run_file_reporting(sys.argv[1], sys.argv[2:])

"""pytest plugin, loaded INSIDE the target environment with ``-p kvprobe_pytest_report``.

Stdlib + pytest only; never imports kvprobe. It records pytest's own report objects
(not log text) into one JSON document, schema ``kvprobe.pytest-report/1``, written
atomically to the path in ``$KVPROBE_PYTEST_REPORT`` at session finish. While the
session runs it appends one JSON line per event to ``<path>.journal`` so that a run
killed by a timeout still leaves the results it reached and the test it was in.

For every failure it walks the exception chain (``__cause__``, else ``__context__``)
to the root: SGLang's ``CustomTestCase`` re-raises a plain ``Exception`` from inside
``except``, so the top type hides the real AttributeError / AssertionError.
Subtests (pytest >= 9 ``SubtestReport``, or pytest-subtests) are recorded with
their ``msg``/``kwargs`` apart from the parent test.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from typing import Any

import pytest

SCHEMA = "kvprobe.pytest-report/1"
REPORT_ENV = "KVPROBE_PYTEST_REPORT"
_ATTR = "kvprobe_exception"
_MAX_MESSAGE = 2000
_MAX_LONGREPR = 4000
_MAX_CHAIN = 32


def exception_info(exc: BaseException | None) -> dict[str, Any] | None:
    """Top type, root type/module/message and the type-name chain, top first."""
    if exc is None:
        return None
    chain: list[BaseException] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(chain) < _MAX_CHAIN:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or current.__context__
    root = chain[-1]
    return {
        "top_type": type(exc).__qualname__,
        "root_type": type(root).__qualname__,
        "root_module": type(root).__module__,
        "root_message": _bounded(_safe_str(root), _MAX_MESSAGE),
        "chain": [type(e).__qualname__ for e in chain],
        # pytest.fail() and AssertionError subclasses are the test's own verdict
        "assertion": isinstance(root, (AssertionError, pytest.fail.Exception)),
    }


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # a broken __str__ must not lose the report
        return f"<unprintable {type(exc).__qualname__}>"


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 15] + "...[truncated]"


def _longrepr(report: Any) -> str:
    try:
        text = str(report.longrepr) if report.longrepr is not None else ""
    except Exception:
        text = "<unprintable longrepr>"
    return _bounded(text, _MAX_LONGREPR)


def _subtest(report: Any) -> dict[str, Any] | None:
    """msg/kwargs of a subtest report (pytest 9 SubtestReport, pytest-subtests SubTestReport)."""
    context = getattr(report, "context", None)
    if context is None or not hasattr(context, "kwargs"):
        return None
    kwargs = {str(k): v if isinstance(v, str) else repr(v) for k, v in dict(context.kwargs).items()}
    msg = getattr(context, "msg", None)
    return {"msg": None if msg is None else str(msg), "kwargs": kwargs,
            "report_type": type(report).__name__}


def test_entry(report: Any) -> dict[str, Any]:
    """One pytest TestReport (setup/call/teardown, or a subtest) as JSON data."""
    failed = report.outcome == "failed"
    return {
        "nodeid": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "wasxfail": getattr(report, "wasxfail", None),
        "xfail": _xfail(report),
        "duration": round(float(getattr(report, "duration", 0.0) or 0.0), 6),
        "subtest": _subtest(report),
        "exception": getattr(report, _ATTR, None) if failed else None,
        "longrepr": _longrepr(report) if failed else "",
    }


def _xfail(report: Any) -> str | None:
    if not hasattr(report, "wasxfail"):
        return None
    return "xfailed" if report.outcome == "skipped" else "xpassed"


class _Recorder:
    """Collects entries; flushes a journal line per event and the document at the end."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.journal_path = path + ".journal"
        self.doc: dict[str, Any] = {
            "schema": SCHEMA, "complete": False, "pytest_version": pytest.__version__,
            "python_version": platform.python_version(), "started_at": time.time(),
            "rootdir": None, "inifile": None, "args": [], "collected": None,
            "exitstatus": None, "collection_errors": [], "tests": [], "running": None,
        }
        self._collect_exc: dict[str, dict[str, Any]] = {}
        self._journal = open(self.journal_path, "w", encoding="utf-8")  # noqa: SIM115

    def _log(self, event: str, data: Any) -> None:
        self._journal.write(json.dumps({"event": event, "data": data}, default=repr) + "\n")
        self._journal.flush()

    def pytest_configure(self, config: pytest.Config) -> None:
        self.doc["rootdir"] = str(config.rootpath)
        self.doc["inifile"] = str(config.inipath) if config.inipath else None
        self.doc["args"] = [str(a) for a in config.invocation_params.args]
        self._log("meta", {k: self.doc[k] for k in ("schema", "pytest_version",
                                                     "python_version", "rootdir", "inifile")})

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: Any, call: Any) -> Any:
        report = yield
        if call.excinfo is not None:
            setattr(report, _ATTR, exception_info(call.excinfo.value))
        return report

    def pytest_exception_interact(self, node: Any, call: Any, report: Any) -> None:
        if isinstance(node, pytest.Collector) and call.excinfo is not None:
            self._collect_exc[node.nodeid] = exception_info(call.excinfo.value)

    def pytest_collectreport(self, report: Any) -> None:
        if not report.failed:
            return
        entry = {"nodeid": report.nodeid, "exception": self._collect_exc.get(report.nodeid),
                 "longrepr": _longrepr(report)}
        self.doc["collection_errors"].append(entry)
        self._log("collection_error", entry)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.doc["collected"] = len(session.items)
        self._log("collected", self.doc["collected"])

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self.doc["running"] = nodeid
        self._log("start", nodeid)

    @pytest.hookimpl(trylast=True)  # after the terminal reporter settles outcomes
    def pytest_runtest_logreport(self, report: Any) -> None:
        entry = test_entry(report)
        self.doc["tests"].append(entry)
        self._log("test", entry)

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        self.doc["running"] = None
        self._log("finish", nodeid)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: Any) -> None:
        self.doc["exitstatus"] = int(exitstatus)
        self.doc["complete"] = True
        self.doc["finished_at"] = time.time()
        self._journal.close()
        write_json_atomic(self.path, self.doc)


def write_json_atomic(path: str, doc: Any) -> None:
    """Write ``doc`` to a temp file beside ``path``, then rename over it."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".kvprobe-report-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(doc, handle, indent=1, sort_keys=True, default=repr)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def pytest_configure(config: pytest.Config) -> None:
    path = os.environ.get(REPORT_ENV)
    if path and not config.pluginmanager.has_plugin("kvprobe-report-recorder"):
        recorder = _Recorder(path)
        # pytest_configure is historic: the recorder's own hook is called on register.
        config.pluginmanager.register(recorder, "kvprobe-report-recorder")

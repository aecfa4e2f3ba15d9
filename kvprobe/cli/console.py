"""rich rendering: results on stdout, progress and diagnostics on stderr, data escaped.

Every string kvprobe did not write (a bundle, a log, an experiment file) reaches rich as
``data(...)``: control characters shown as escapes (kvprobe.text.for_terminal) and rich
markup escaped, so no such string can move the cursor, reorder text or open a link.

When a stream is not a terminal it gets plain lines: no wrapping, no boxes, no spinner; a
table row is one line, so an identifier or a digest is never split (``| grep`` finds it).
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvprobe.model.records import Experiment, GateStatus, Verdict
from kvprobe.progress import Reporter
from kvprobe.text import for_terminal

if TYPE_CHECKING:
    from rich.status import Status  # Console.status() imports it: a spinner on a terminal only

    from kvprobe.model.gates_receipt import GatesReceipt
    from kvprobe.model.receipt import Receipt
    from kvprobe.model.sweep_receipt import SweepReceipt

_VERDICT_STYLE = {
    Verdict.REPRODUCED: "bold green",
    Verdict.NOT_REPRODUCED: "bold red",
    Verdict.NO_EXPECTATIONS: "bold yellow",
    Verdict.COULD_NOT_OBSERVE: "bold magenta",
    Verdict.ERROR: "bold magenta",
}
_PLAIN_WIDTH = 1_000_000  # a line on a pipe is as long as its record
HEARTBEAT_S = 15.0  # a long step on a pipe says it is alive this often


def data(value: Any) -> str:
    """Untrusted text as rich markup that shows it literally, on one line."""
    return escape(for_terminal(value))


_DIGEST = re.compile(r"\b([0-9a-f]{12})[0-9a-f]{52}\b")


def cell(console: Console, text: str) -> str:
    """A table cell: on a terminal a sha256 in it is shown by its first 12 hex digits (the
    whole digest is on its own line below the table, where it is never split); a pipe gets
    it whole, as it gets everything."""
    return _DIGEST.sub(r"\1…", text) if console.is_terminal else text


def whole_line(console: Console, text: str) -> None:
    """A line holding an id or a digest: never broken by rich (the terminal may wrap it on
    screen, but a copy of it is one line)."""
    console.print(text, soft_wrap=True)


def make_console(file: IO[str]) -> Console:
    """A terminal gets rich's normal output; anything else plain unwrapped lines."""
    if file.isatty():
        return Console(file=file, highlight=False, soft_wrap=False)
    return Console(file=file, highlight=False, soft_wrap=True, width=_PLAIN_WIDTH, no_color=True)


def stderr_console() -> Console:
    return make_console(sys.stderr)


def stdout_console() -> Console:
    return make_console(sys.stdout)


def emit(console: Console, renderable: Any) -> None:
    """Print a table (or text): boxed on a terminal; on a pipe, one unpadded line per row."""
    if console.is_terminal:
        console.print(renderable)
        return
    if isinstance(renderable, Table):
        renderable.box = None
        renderable.pad_edge = False
    with console.capture() as captured:
        console.print(renderable)
    for line in captured.get().splitlines():
        console.file.write(line.rstrip() + "\n")


class Output:
    """A command's two streams and its verbosity (-q/-v: 0 is the default): the one path
    every command writes through (kvprobe.cli.base.streams_for makes it; --json documents
    go through base.emit_json).

    Results go to ``out`` (stdout) unless ``--json`` owns stdout or -qq silenced them
    (``results``; ``result`` and ``document`` check it); progress (``reporter()``) goes to
    ``err`` (stderr) and -q silences it; diagnostics (``diagnostic``) go to ``err`` and -qq
    silences them; warnings (``warn``) are always shown.
    """

    def __init__(self, verbosity: int = 0, as_json: bool = False) -> None:
        self.verbosity = verbosity
        self.err = stderr_console()
        self.results = not as_json and verbosity > -2
        self.out = stdout_console()

    def reporter(self) -> Reporter:
        quiet = self.verbosity < 0
        if self.err.is_terminal:
            return RichReporter(self.err, quiet=quiet)
        return PlainReporter(self.err, quiet=quiet)

    def warn(self, text: str) -> None:
        """A warning (already escaped markup) on stderr; shown even with -qq."""
        self.err.print(f"[bold yellow]warning[/]: {text}")

    def error(self, text: str) -> None:
        """An error line (plain text, untrusted parts already through for_terminal) on stderr:
        one of several experiments that ended without a bundle; always shown."""
        self.err.print(f"kvprobe: error: {text}", markup=False, highlight=False, soft_wrap=True)

    def diagnostic(self, text: str) -> None:
        """A diagnostic or a hint (already escaped markup) on stderr; not with -qq."""
        if self.verbosity > -2:
            self.err.print(text)

    def result(self, text: str) -> None:
        """A result line (plain text, untrusted parts already through for_terminal) on stdout,
        never wrapped (a path or a digest stays whole); not under --json or -qq."""
        if self.results:
            self.out.print(text, markup=False, highlight=False, soft_wrap=True)

    def document(self, text: str) -> None:
        """A document that is the command's result (an export, a signed envelope), on stdout
        byte for byte; not with -qq."""
        if self.results:
            self.out.file.write(text)
            self.out.file.flush()


class RichReporter(Reporter):
    """One spinner listing every step in progress (base and head run in parallel threads);
    each thread's updates go to its own step; finished steps stay in the scrollback."""

    def __init__(self, console: Console | None = None, quiet: bool = False) -> None:
        self.console = console or stderr_console()
        self.quiet = quiet
        self._lock = threading.Lock()
        self._active: dict[int, list[str]] = {}  # thread id -> [title, detail]
        self._status: Status | None = None

    @contextmanager
    def step(self, title: str) -> Iterator[None]:
        if self.quiet:
            yield
            return
        started = time.monotonic()
        self._begin(title)
        try:
            yield
        finally:
            self._end()
        self.console.print(f"[green]✓[/] {data(title)} [dim]({time.monotonic() - started:.1f}s)[/]")

    def _begin(self, title: str) -> None:
        with self._lock:
            self._active[threading.get_ident()] = [title, ""]
            if self._status is None:
                self._status = self.console.status(self._text())
                self._status.start()
            else:
                self._status.update(self._text())

    def _end(self) -> None:
        with self._lock:
            self._active.pop(threading.get_ident(), None)
            if not self._active and self._status is not None:
                self._status.stop()
                self._status = None
            elif self._status is not None:
                self._status.update(self._text())

    def _text(self) -> str:
        return "\n".join(
            f"{data(title)} [dim]— {data(detail)}[/]" if detail else data(title)
            for title, detail in self._active.values()
        )

    def update(self, text: str) -> None:
        with self._lock:
            entry = self._active.get(threading.get_ident())
            if entry is not None and self._status is not None:
                entry[1] = text
                self._status.update(self._text())

    def note(self, text: str) -> None:
        if not self.quiet:
            self.console.print(f"[dim]·[/] {data(text)}")


class PlainReporter(Reporter):
    """Progress for a log (CI, a pipe): a line when a step starts, a heartbeat with the
    elapsed time every ``heartbeat_s`` while it runs, and a line when it ends."""

    def __init__(self, console: Console, quiet: bool = False, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.console = console
        self.quiet = quiet
        self.heartbeat_s = heartbeat_s
        self._lock = threading.Lock()
        self._detail: dict[int, str] = {}

    def _line(self, text: str) -> None:
        with self._lock:
            self.console.print(text, markup=False)

    @contextmanager
    def step(self, title: str) -> Iterator[None]:
        if self.quiet:
            yield
            return
        started, stop, ident = time.monotonic(), threading.Event(), threading.get_ident()
        self._line(f"… {for_terminal(title)}")
        beat = threading.Thread(target=self._beat, args=(title, started, stop, ident), daemon=True)
        beat.start()
        ok = False
        try:
            yield
            ok = True
        finally:
            stop.set()
            beat.join()
            self._detail.pop(ident, None)
            mark = "✓" if ok else "✗"
            self._line(f"{mark} {for_terminal(title)} ({time.monotonic() - started:.1f}s)")

    def _beat(self, title: str, started: float, stop: threading.Event, ident: int) -> None:
        while not stop.wait(self.heartbeat_s):
            detail = self._detail.get(ident)
            extra = f" — {for_terminal(detail)}" if detail else ""
            self._line(f"  {for_terminal(title)}: still running, {time.monotonic() - started:.0f}s{extra}")

    def update(self, text: str) -> None:
        self._detail[threading.get_ident()] = text

    def note(self, text: str) -> None:
        if not self.quiet:
            self._line(f"· {for_terminal(text)}")


def experiments_table(experiments: list[Experiment]) -> Table:
    table = Table(title="experiments", title_justify="left")
    for col in ("id", "layer", "fix", "pin sets", "source", "title"):
        table.add_column(col)
    for exp in experiments:
        prs = ", ".join(f"#{n}" for n in exp.fix.prs) or "-"
        sets = ", ".join(f"{n}*" if n == exp.default_pin_set else n for n in exp.pin_sets)
        table.add_row(data(exp.id), exp.layer.value, prs, data(sets), data(exp.source or "-"), data(exp.title))
    return table


def print_experiment(console: Console, exp: Experiment) -> None:
    console.print(f"[bold]{data(exp.id)}[/]: {data(exp.title)}")
    console.print(f"source: {data(exp.source or '-')} ({data(exp.directory)})")
    console.print(f"layer: {exp.layer.value}   profile: {data(exp.profile)}   upstream: {data(exp.upstream or '-')}")
    console.print(
        f"fix: {', '.join(f'#{n}' for n in exp.fix.prs) or '-'} (release {data(exp.fix.release or '-')}): "
        f"{data(exp.fix.summary)}"
    )
    pins = Table(title="pin sets (* = default)", title_justify="left")
    for col in ("name", "kind", "base", "head"):
        pins.add_column(col, overflow="fold")
    for name, ps in exp.pin_sets.items():
        label = f"{name}*" if name == exp.default_pin_set else name
        pins.add_row(data(label), ps.kind.value, _pin_text(ps.base.identity()), _pin_text(ps.head.identity()))
    emit(console, pins)
    for test in exp.tests:
        console.print(f"upstream test: {data(test.path)} (pins: {data(', '.join(test.pin_sets or ['all']))})")
    for probe in exp.probes:
        console.print(f"probe: {data(probe.path)}")
    exp_table = Table(title="expectations", title_justify="left")
    for col in ("case", "observation", "base", "head"):
        exp_table.add_column(col, overflow="fold")
    keys = sorted(set(exp.expectations.get("base", {})) | set(exp.expectations.get("head", {})))
    for key in keys:
        names = sorted(
            set(exp.expectations.get("base", {}).get(key, {})) | set(exp.expectations.get("head", {}).get(key, {}))
        )
        for name in names:
            exp_table.add_row(
                data(key),
                data(name),
                _val(exp.expectations.get("base", {}).get(key, {}), name),
                _val(exp.expectations.get("head", {}).get(key, {}), name),
            )
    if keys:
        emit(console, exp_table)
    else:
        console.print("expectations: none declared")
    console.print(f"shows: {data(exp.scope.shows)}")
    for item in exp.scope.does_not_show:
        console.print(f"does not show: {data(item)}")


def _val(values: Mapping[str, Any], name: str) -> str:
    return data(repr(values[name])) if name in values else "-"


def _pin_text(identity: dict[str, Any]) -> str:
    if identity["kind"] == "git":
        return data(identity["commit"])
    if identity["kind"] == "wheel":
        return data(f"{identity['filename']} sha256:{identity['sha256']}")
    return data(", ".join(f"{k}={v}" for k, v in identity["switches"].items()))


def observation_headline(c: Mapping[str, Any]) -> str:
    """What was checked, kind by kind: the fix's flips apart from the controls that must hold
    (compare/5 counts them apart; an older receipt has only the totals)."""
    if "flips_expected" not in c:
        return (
            f"observations: {c['observations_matched']}/{c['observations_expected']} expected matched, "
            f"{c['observations_changed']} changed from base to head"
        )
    parts = [
        f"{c['flips_held']}/{c['flips_expected']} changed as expected",
        f"{c['controls_held']}/{c['controls_expected']} controls held",
    ]
    if c["one_sided_expected"]:
        parts.append(f"{c['one_sided_held']}/{c['one_sided_expected']} expected on one side only")
    if c["unchecked"]:
        parts.append(f"{c['unchecked']} recorded unchecked")
    return "observations: " + ", ".join(parts)


def print_run_summary(console: Console, receipt: Receipt, bundle: str, digest: str, verbosity: int) -> None:
    """The verdict, its reasons, the bundle and its digest. The observation rows that matter
    (did not match, or changed unchecked), every row with -v. On a pipe one table, one line a
    row; on a terminal one table per case under its id, so that no id is folded."""
    comp = receipt.comparison
    full = verbosity > 0
    rows: list[tuple[str, str, str, str, str, str]] = []
    for row in comp.observations:
        checked = row["expected_base_declared"] or row["expected_head_declared"]
        if not (checked or row["changed"]):
            continue
        good = row["base_ok"] and row["head_ok"]
        if not full and good and checked:
            continue
        expected = f"{_exp(row, 'base')} → {_exp(row, 'head')}"
        mark = ("✓" if good else "✗") if checked else "unchecked"
        if row.get("unstable"):  # run --repeat: it differed between runs, neither match nor mismatch
            mark = "unstable"
        rows.append((data(row["case"]), data(row["observation"]), _obs(row, "base"), _obs(row, "head"), expected, mark))
    if rows and not console.is_terminal:
        table = Table(title="observations (base vs head)", title_justify="left")
        for col in ("case", "observation", "base", "head", "expected", "ok"):
            table.add_column(col, overflow="fold")
        for cells in rows:
            table.add_row(*cells)
        emit(console, table)
    elif rows:
        console.print("[italic]observations (base vs head)[/]")
        for case in dict.fromkeys(r[0] for r in rows):
            table = Table(title=case, title_justify="left", title_style="bold")
            table.add_column("observation", no_wrap=True)
            for col in ("base", "head", "expected", "ok"):
                table.add_column(col, overflow="fold")
            for cells in rows:
                if cells[0] == case:
                    table.add_row(*cells[1:])
            emit(console, table)
    console.print(observation_headline(comp.counts))
    for path, summary in comp.test_summary.items():
        console.print(
            f"upstream {data(path)}: {data(summary['transitions'])}; "
            f"base failure kinds {data(summary['base']['failure_kinds'])}"
        )
    style = _VERDICT_STYLE.get(receipt.verdict, "bold")
    console.print(f"verdict: [{style}]{data(receipt.verdict)}[/]")
    limit = None if verbosity > 0 else 20
    for reason in comp.reasons[:limit]:
        console.print(f"  - {data(reason)}")
    whole_line(console, f"bundle: {data(bundle)}")
    whole_line(console, f"manifest sha256: {digest}")


def print_sweep_summary(console: Console, receipt: SweepReceipt, bundle: str, digest: str) -> None:
    """One line per selected release in version order (its class, and why when it is not
    affected or fixed; a release the profile does not serve as ``not-served`` with the reason
    the listing records), the bundle and its digest: `kvprobe sweep`'s results on stdout."""
    from kvprobe.rules.sweep_classification import NOT_SERVED
    from kvprobe.rules.sweep_listing import ascending

    by_version = {r.version: r for r in receipt.releases}
    not_run = {e.version: e.not_run for e in receipt.listing.selected if e.not_run is not None}
    for version in ascending([*by_version, *(v for v in receipt.unserved if v not in by_version)]):
        if version not in by_version:
            why = not_run.get(version) or "not run: the profile does not serve it"
            console.print(f"{data(version)}  {NOT_SERVED}  {data(why)}", highlight=False)
            continue
        cls = by_version[version].classification
        why = f"  {data('; '.join(cls.reasons[:2]))}" if cls.reasons else ""
        reused = by_version[version].reused
        why += f"  (reused from {data(reused.observed_utc)})" if reused else ""
        console.print(f"{data(version)}  {data(cls.overall)}{why}", highlight=False)
    console.print(f"bundle: {data(bundle)}", highlight=False)
    console.print(f"manifest sha256: {digest}", highlight=False)


def print_run_diagnostics(console: Console, receipt: Receipt) -> None:
    """On stderr: every upstream test file a side could not collect, and why."""
    for summary in receipt.comparison.test_summary.values():
        for side in ("base", "head"):
            for error in summary[side].get("collection_errors", []):
                console.print(
                    f"  {side} could not collect {data(error['nodeid'])}: "
                    f"{data(error['exc_type'] or 'error')}: {data(error['message'])}"
                )


def _obs(row: dict[str, Any], side: str) -> str:
    return data(repr(row[side])) if row[f"{side}_recorded"] else "—"


def _exp(row: dict[str, Any], side: str) -> str:
    return data(repr(row[f"expected_{side}"])) if row[f"expected_{side}_declared"] else "·"


_STEP_STYLE = {
    "pass": "green",
    "fail": "bold red",
    "skipped": "dim",
    "self-consistent": "yellow",
    "could-not-run": "bold magenta",
}
_OUTCOME_STYLE = {
    "verified": "bold green",
    "self-consistent": "bold yellow",
    "failed": "bold red",
    "could-not-rerun": "bold magenta",
}


def print_verify_report(console: Console, report: Any) -> None:
    """The result on stdout: the step table, the manifest digest and the outcome."""
    table = Table(title=f"verify {data(report.bundle)}", title_justify="left")
    for col in ("#", "step", "result", "detail"):
        table.add_column(col, overflow="fold")
    for step in report.steps:
        count = f" ({len(step.defects)} defect{'s' if len(step.defects) != 1 else ''})" if step.defects else ""
        style = _STEP_STYLE.get(step.status, "bold")
        detail = cell(console, step.summary + count)
        table.add_row(str(step.number), data(step.name), f"[{style}]{data(step.status)}[/]", data(detail))
    emit(console, table)
    whole_line(console, f"manifest sha256: {report.manifest_sha256 or '-'}")
    whole_line(console, f"result: [{_OUTCOME_STYLE.get(report.outcome, 'bold')}]{data(report.outcome)}[/]")
    if report.outcome == "verified":
        for anchor in report.anchored_by:
            whole_line(console, f"anchored by: {data(anchor.kind)} — {data(anchor.detail)}")
    elif report.outcome == "self-consistent":
        whole_line(
            console,
            "anchored by: nothing — it agrees with itself (and with kvprobe's copy of a shipped experiment); "
            "--expect-manifest-sha256, --attestation or --rerun anchors it",
        )


def print_verify_diagnostics(console: Console, report: Any, max_defects: int | None = 200) -> None:
    """On stderr, one line each: the notes, every step that did not pass, and every defect
    (up to ``max_defects``; -v or --json: all)."""
    shown = 0
    for step in report.steps:
        for note in step.notes:
            whole_line(console, f"[dim]·[/] {data(note)}")
        if step.status != "pass":
            style = _STEP_STYLE.get(step.status, "bold")
            whole_line(
                console, f"step {step.number} {data(step.name)}: [{style}]{data(step.status)}[/] — {data(step.summary)}"
            )
        for defect in step.defects:
            if max_defects is None or shown < max_defects:
                whole_line(console, f"  [red]✗[/] [{step.number}] {data(defect.message)}")
            shown += 1
    if max_defects is not None and shown > max_defects:
        console.print(f"  … {shown - max_defects} more defects (use -v or --json for all)")


_GATE_STYLE = {
    GateStatus.PASS: "bold green",
    GateStatus.FAIL: "bold red",
    GateStatus.UNKNOWN: "bold magenta",
    GateStatus.INFO: "dim",
}


def print_gates(console: Console, receipt: GatesReceipt, bundle: str, digest: str) -> None:
    """One table per gate: status, detail and the evidence that decided each check."""
    for gate in receipt.gates:
        style = _GATE_STYLE[gate.status]
        table = Table(
            title=f"gate {gate.number}: [{style}]{gate.status}[/] — {data(gate.title)}",
            title_justify="left",
        )
        for col in ("check", "status", "detail", "evidence"):
            table.add_column(col, overflow="fold")
        for check in gate.checks:
            status = check.status if check.decides else f"{check.status} (info)"
            table.add_row(
                data(check.name),
                f"[{_GATE_STYLE[check.status]}]{status}[/]",
                data(check.detail),
                data(check.evidence),
            )
        emit(console, table)
    console.print(f"overall: [{_GATE_STYLE[receipt.overall]}]{receipt.overall}[/]")
    console.print(f"bundle: {data(bundle)}")
    console.print(f"manifest sha256: {digest}")


def print_gate_diagnostics(console: Console, receipt: GatesReceipt) -> None:
    """On stderr, per gate that did not pass: one line with the gate's status, then one line per
    deciding check that did not pass with that check's own status (a gate that fails can hold
    an unknown check: it is not printed under the gate's "fail")."""
    for gate in receipt.gates:
        if gate.status is GateStatus.PASS:
            continue
        style = _GATE_STYLE[gate.status]
        console.print(f"gate {gate.number}: [{style}]{gate.status}[/] — {data(gate.title)}")
        for check in (c for c in gate.checks if c.decides and c.status is not GateStatus.PASS):
            own = _GATE_STYLE[check.status]
            console.print(f"gate {gate.number}, {data(check.name)}: [{own}]{check.status}[/] — {data(check.detail)}")


def _age(seconds: float) -> str:
    if seconds < 3600:
        return f"{max(0, int(seconds // 60))} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.0f} days ago"


def print_cache(console: Console, root: str, entries: list[Any], now: float) -> None:
    """`kvprobe cache ls`: one row per entry, newest use last, and the total. A terminal
    shows keys shortened; a pipe gets them whole."""
    from kvprobe.env.cache import human_size

    table = Table(title=f"cache {data(root)}", title_justify="left")
    for col in ("kind", "key", "size", "last used"):
        table.add_column(col, overflow="fold", justify="right" if col == "size" else "left")
    short = console.is_terminal
    for entry in entries:
        key = data(entry.key[:24] + "…" if short and len(entry.key) > 24 else entry.key)
        key += f" [dim]{data(entry.label)}[/]" if entry.label else ""
        key += "" if entry.complete else " [yellow](incomplete)[/]"
        table.add_row(data(entry.kind), key, human_size(entry.size), _age(now - entry.last_used))
    emit(console, table)
    console.print(f"total: {human_size(sum(e.size for e in entries))} in {len(entries)} entries")
    units = [e for e in entries if e.kind == "unit" and e.complete]
    if units:
        console.print(
            f"sweep units: {len(units)} ({human_size(sum(e.size for e in units))}), reused by `kvprobe sweep` "
            "(`kvprobe cache prune --kind unit --all` removes them)"
        )
    linked = sum(e.linked for e in entries)
    if linked:
        console.print(
            f"each file is counted once: {human_size(linked)} more are hard links to files counted "
            "already, under the first entry listed (uv's cache links the envs it built)"
        )


def print_prune(console: Console, outcomes: list[Any], dry_run: bool) -> None:
    """`kvprobe cache prune`: what went (or would go), what stayed and why, bytes freed."""
    from kvprobe.env.cache import human_size

    for o in outcomes:
        mark = {"deleted": "[green]deleted[/]", "would-delete": "[yellow]would delete[/]"}.get(
            o.action, "[magenta]skipped[/]"
        )
        why = f": {data(o.reason)}" if o.reason else ""
        label = f" {data(o.entry.label)}" if o.entry.label else ""
        console.print(
            f"{mark} {data(o.entry.kind)} {data(o.entry.key)}{label} ({human_size(o.entry.size)}){why}", soft_wrap=True
        )
    freed = sum(o.entry.size for o in outcomes if o.action in ("deleted", "would-delete"))
    verb = "would free" if dry_run else "freed"
    console.print(f"{verb} {human_size(freed)}; {sum(o.action == 'skipped' for o in outcomes)} skipped")


def print_recording(console: Console, recording: Any) -> None:
    """What ``--record-expectations`` is about to write: observations base vs head per case,
    then per upstream test file its FAIL_TO_PASS / PASS_TO_PASS sets."""
    if recording.cases:
        table = Table(title=f"expectations to record into {data(recording.path)}", title_justify="left")
        for col in ("case", "observation", "base", "head", ""):
            table.add_column(col, overflow="fold")
        for case in recording.cases:
            base = recording.values.get("base", {}).get(case, {})
            head = recording.values.get("head", {}).get(case, {})
            for name in sorted(set(base) | set(head)):
                changed = (name in base) != (name in head) or repr(base.get(name)) != repr(head.get(name))
                table.add_row(data(case), data(name), _val(base, name), _val(head, name), "≠" if changed else "")
        emit(console, table)
    for file, sets in recording.tests.items():
        kinds = sets.get("base_failure_kind", {})
        tally = ", ".join(f"{n} {k}" for k, n in sorted(Counter(kinds.values()).items())) or "no failure kind"
        console.print(
            f"{data(file)}: FAIL_TO_PASS {len(sets['FAIL_TO_PASS'])} (on base: {data(tally)}), "
            f"PASS_TO_PASS {len(sets['PASS_TO_PASS'])}",
            soft_wrap=True,
        )
        for test in sets["FAIL_TO_PASS"]:
            console.print(f"  FAIL_TO_PASS {data(test)}  ({data(kinds.get(test, 'no failure kind'))})", soft_wrap=True)
    for item in recording.skipped:
        console.print(f"[yellow]not recorded[/]: {data(item)}")
    if recording.cases and not recording.differs:
        console.print(
            "[bold yellow]warning[/]: no recorded observation differs between base and head; "
            "these expectations cannot tell the fix apart"
        )

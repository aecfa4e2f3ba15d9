"""rich on stderr: the Reporter the core is handed, and the tables humans read."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.status import Status
from rich.table import Table

from kvprobe.model.records import Experiment
from kvprobe.progress import Reporter

_VERDICT_STYLE = {
    "reproduced": "bold green",
    "not-reproduced": "bold red",
    "no-expectations": "bold yellow",
    "error": "bold magenta",
}


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=False)


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
        self.console.print(f"[green]✓[/] {title} [dim]({time.monotonic() - started:.1f}s)[/]")

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
        return "\n".join(f"{title} [dim]— {detail}[/]" if detail else title for title, detail in self._active.values())

    def update(self, text: str) -> None:
        with self._lock:
            entry = self._active.get(threading.get_ident())
            if entry is not None and self._status is not None:
                entry[1] = text
                self._status.update(self._text())

    def note(self, text: str) -> None:
        if not self.quiet:
            self.console.print(f"[dim]·[/] {text}")


def experiments_table(experiments: list[Experiment]) -> Table:
    table = Table(title="experiments", title_justify="left")
    for col in ("id", "layer", "fix", "pin sets", "title"):
        table.add_column(col)
    for exp in experiments:
        prs = ", ".join(f"#{n}" for n in exp.fix.prs) or "-"
        sets = ", ".join(f"{n}*" if n == exp.default_pin_set else n for n in exp.pin_sets)
        table.add_row(exp.id, exp.layer.value, prs, sets, exp.title)
    return table


def print_experiment(console: Console, exp: Experiment) -> None:
    console.print(f"[bold]{exp.id}[/]: {exp.title}")
    console.print(f"layer: {exp.layer.value}   profile: {exp.profile}   upstream: {exp.upstream or '-'}")
    console.print(
        f"fix: {', '.join(f'#{n}' for n in exp.fix.prs) or '-'} (release {exp.fix.release or '-'}): {exp.fix.summary}"
    )
    pins = Table(title="pin sets (* = default)", title_justify="left")
    for col in ("name", "kind", "base", "head"):
        pins.add_column(col, overflow="fold")
    for name, ps in exp.pin_sets.items():
        label = f"{name}*" if name == exp.default_pin_set else name
        pins.add_row(label, ps.kind.value, _pin_text(ps.base.identity()), _pin_text(ps.head.identity()))
    console.print(pins)
    for test in exp.tests:
        console.print(f"upstream test: {test.path} (pins: {', '.join(test.pin_sets or ['all'])})")
    for probe in exp.probes:
        console.print(f"probe: {probe.path}")
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
                key,
                name,
                _val(exp.expectations.get("base", {}).get(key, {}), name),
                _val(exp.expectations.get("head", {}).get(key, {}), name),
            )
    console.print(exp_table if keys else "expectations: none declared")
    console.print(f"shows: {exp.scope.shows}")
    for item in exp.scope.does_not_show:
        console.print(f"does not show: {item}")


def _val(values: Mapping[str, Any], name: str) -> str:
    return repr(values[name]) if name in values else "-"


def _pin_text(identity: dict[str, Any]) -> str:
    if identity["kind"] == "git":
        return identity["commit"]
    if identity["kind"] == "wheel":
        return f"{identity['filename']}\nsha256:{identity['sha256']}"
    return ", ".join(f"{k}={v}" for k, v in identity["switches"].items())


def print_run_summary(console: Console, receipt: dict[str, Any], bundle: str, digest: str) -> None:
    comp = receipt["comparison"]
    table = Table(title="observations (base vs head)", title_justify="left")
    for col in ("case", "observation", "base", "head", "expected", "ok"):
        table.add_column(col, overflow="fold")
    for row in comp["observations"]:
        if not (row["expected_base_declared"] or row["expected_head_declared"] or row["changed"]):
            continue
        expected = f"{_exp(row, 'base')} → {_exp(row, 'head')}"
        ok = "✓" if row["base_ok"] and row["head_ok"] else "✗"
        table.add_row(row["case"], row["observation"], _obs(row, "base"), _obs(row, "head"), expected, ok)
    if table.row_count:
        console.print(table)
    for path, summary in comp["test_summary"].items():
        console.print(
            f"upstream {path}: {summary['transitions']}; base failure kinds {summary['base']['failure_kinds']}"
        )
        for side in ("base", "head"):
            for error in summary[side].get("collection_errors", []):
                console.print(
                    f"  {side} could not collect {error['nodeid']}: {error['exc_type'] or 'error'}: {error['message']}",
                    markup=False,
                )
    style = _VERDICT_STYLE.get(receipt["verdict"], "bold")
    console.print(f"verdict: [{style}]{receipt['verdict']}[/]")
    for reason in comp["reasons"][:20]:
        console.print(f"  - {reason}")
    console.print(f"bundle: {bundle}")
    console.print(f"manifest sha256: {digest}")


def _obs(row: dict[str, Any], side: str) -> str:
    return repr(row[side]) if row[f"{side}_recorded"] else "—"


def _exp(row: dict[str, Any], side: str) -> str:
    return repr(row[f"expected_{side}"]) if row[f"expected_{side}_declared"] else "·"


_STEP_STYLE = {
    "pass": "green",
    "fail": "bold red",
    "skipped": "dim",
    "self-consistent": "yellow",
    "could-not-run": "bold magenta",
}
_OUTCOME_STYLE = {"verified": "bold green", "failed": "bold red", "could-not-rerun": "bold magenta"}


def print_verify_report(console: Console, report: Any, max_defects: int = 200) -> None:
    """The step table, then every defect (up to ``max_defects``; --json has them all)."""
    from rich.markup import escape

    table = Table(title=f"verify {escape(report.bundle)}", title_justify="left")
    for col in ("#", "step", "result", "detail"):
        table.add_column(col, overflow="fold")
    for step in report.steps:
        count = f" ({len(step.defects)} defect{'s' if len(step.defects) != 1 else ''})" if step.defects else ""
        style = _STEP_STYLE.get(step.status, "bold")
        table.add_row(str(step.number), step.name, f"[{style}]{step.status}[/]", escape(step.summary + count))
    console.print(table)
    shown = 0
    for step in report.steps:
        for note in step.notes:
            console.print(f"[dim]·[/] {escape(note)}")
        for defect in step.defects:
            if shown < max_defects:
                console.print(f"  [red]✗[/] [{step.number}] {escape(defect.message)}")
            shown += 1
    if shown > max_defects:
        console.print(f"  … {shown - max_defects} more defects (use --json for all)")
    console.print(f"manifest sha256: {report.manifest_sha256 or '-'}")
    console.print(f"result: [{_OUTCOME_STYLE.get(report.outcome, 'bold')}]{report.outcome}[/]")


_GATE_STYLE = {"pass": "bold green", "fail": "bold red", "unknown": "bold magenta", "info": "dim"}


def print_gates(console: Console, receipt: dict[str, Any], bundle: str, digest: str) -> None:
    """One table per gate: status, detail and the evidence that decided each check."""
    for gate in receipt["gates"]:
        style = _GATE_STYLE[gate["status"]]
        table = Table(
            title=f"gate {gate['number']}: [{style}]{gate['status']}[/] — {gate['title']}", title_justify="left"
        )
        for col in ("check", "status", "detail", "evidence"):
            table.add_column(col, overflow="fold")
        for check in gate["checks"]:
            status = check["status"] if check["decides"] else f"{check['status']} (info)"
            table.add_row(
                check["name"], f"[{_GATE_STYLE[check['status']]}]{status}[/]", check["detail"], check["evidence"]
            )
        console.print(table)
    console.print(f"overall: [{_GATE_STYLE[receipt['overall']]}]{receipt['overall']}[/]")
    console.print(f"bundle: {bundle}")
    console.print(f"manifest sha256: {digest}")


def _age(seconds: float) -> str:
    if seconds < 3600:
        return f"{max(0, int(seconds // 60))} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.0f} days ago"


def print_cache(console: Console, root: str, entries: list[Any], now: float) -> None:
    """`kvprobe cache ls`: one row per entry, newest use last, and the total."""
    from rich.markup import escape

    from kvprobe.env.cache import human_size

    table = Table(title=f"cache {escape(root)}", title_justify="left")
    for col in ("kind", "key", "size", "last used"):
        table.add_column(col, overflow="fold", justify="right" if col == "size" else "left")
    for entry in entries:
        key = escape(entry.key[:24] + ("…" if len(entry.key) > 24 else ""))
        key += f" [dim]{escape(entry.label)}[/]" if entry.label else ""
        key += "" if entry.complete else " [yellow](incomplete)[/]"
        table.add_row(entry.kind, key, human_size(entry.size), _age(now - entry.last_used))
    console.print(table)
    console.print(f"total: {human_size(sum(e.size for e in entries))} in {len(entries)} entries")


def print_prune(console: Console, outcomes: list[Any], dry_run: bool) -> None:
    """`kvprobe cache prune`: what went (or would go), what stayed and why, bytes freed."""
    from rich.markup import escape

    from kvprobe.env.cache import human_size

    for o in outcomes:
        mark = {"deleted": "[green]deleted[/]", "would-delete": "[yellow]would delete[/]"}.get(
            o.action, "[magenta]skipped[/]"
        )
        why = f": {escape(o.reason)}" if o.reason else ""
        label = f" {escape(o.entry.label)}" if o.entry.label else ""
        console.print(
            f"{mark} {o.entry.kind} {escape(o.entry.key)}{label} ({human_size(o.entry.size)}){why}", soft_wrap=True
        )
    freed = sum(o.entry.size for o in outcomes if o.action in ("deleted", "would-delete"))
    verb = "would free" if dry_run else "freed"
    console.print(f"{verb} {human_size(freed)}; {sum(o.action == 'skipped' for o in outcomes)} skipped")


def print_recording(console: Console, recording: Any) -> None:
    """What ``--record-expectations`` is about to write: observations base vs head per case,
    then per upstream test file its FAIL_TO_PASS / PASS_TO_PASS sets."""
    from rich.markup import escape

    if recording.cases:
        table = Table(title=f"expectations to record into {recording.path}", title_justify="left")
        for col in ("case", "observation", "base", "head", ""):
            table.add_column(col, overflow="fold")
        for case in recording.cases:
            base = recording.values.get("base", {}).get(case, {})
            head = recording.values.get("head", {}).get(case, {})
            for name in sorted(set(base) | set(head)):
                changed = (name in base) != (name in head) or repr(base.get(name)) != repr(head.get(name))
                table.add_row(case, name, _val(base, name), _val(head, name), "≠" if changed else "")
        console.print(table)
    for file, sets in recording.tests.items():
        kinds = sets.get("base_failure_kind", {})
        tally = ", ".join(f"{n} {k}" for k, n in sorted(Counter(kinds.values()).items())) or "no failure kind"
        console.print(
            f"{escape(file)}: FAIL_TO_PASS {len(sets['FAIL_TO_PASS'])} (on base: {escape(tally)}), "
            f"PASS_TO_PASS {len(sets['PASS_TO_PASS'])}",
            soft_wrap=True,
        )
        for test in sets["FAIL_TO_PASS"]:
            console.print(
                f"  FAIL_TO_PASS {escape(test)}  ({escape(kinds.get(test, 'no failure kind'))})", soft_wrap=True
            )
    for item in recording.skipped:
        console.print(f"[yellow]not recorded[/]: {item}")
    if recording.cases and not recording.differs:
        console.print(
            "[bold yellow]warning[/]: no recorded observation differs between base and head; "
            "these expectations cannot tell the fix apart"
        )

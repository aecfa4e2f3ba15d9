"""Untrusted text is data, never markup or commands (issue #11).

Strings from a bundle, a log or a tar member name must reach the terminal, Markdown and
shell escaped for that destination. Terminal runs use a pseudo-terminal (as a person at a
terminal sees them: click and rich both behave differently on a pipe); the assertions look
for the bundle's own control sequences (an OSC window-title set, a clear-screen) and bidi
controls, not for kvprobe's colours.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import tarfile

import pytest

from tests import forge
from tests.attacks.gatelogs import CONTEXT, RAISED, startup_log
from tests.attacks.harness import (
    ANSI_PAYLOAD,
    BIDI_PAYLOAD,
    MODEL_BUNDLE,
    REPO,
    assert_no_raw_escapes,
    assert_outcome,
    copy_committed,
)

pytestmark = pytest.mark.attack

HOSTILE_TEXT = (
    "<details open><summary>verified by kvprobe</summary><img src=x onerror=alert(1)></details> "
    "[verify here](https://evil.example/x) ![t](https://evil.example/t.png)"
)
EXP_TOML = f"probes/{forge.EXP_ID}/experiment.toml"


def retitle(bundle, title: str, limit: str) -> None:
    """A self-consistent bundle whose title (experiment.toml and receipt) and one receipt
    limit carry ``title`` / ``limit`` (the limit through host.system, which the limits are
    derived from): it verifies."""
    path = bundle / EXP_TOML
    path.write_text(
        path.read_text().replace('title = "A forged but valid experiment"', f"title = {json.dumps(title)}", 1)
    )

    def change(receipt):
        receipt["experiment"]["title"] = title
        receipt["experiment"]["sha256"] = forge.sha(path.read_bytes())
        receipt["host"]["system"] = "Linux " + limit

    forge.edit_receipt(bundle, change)
    forge.recite(bundle, EXP_TOML)


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "terminal"])
def test_escape_sequences_in_tar_member_names(sandbox, forged, tty):
    """Attack: a .tar.gz member whose name carries an OSC title set, a clear-screen and bidi
    controls; verify names the member in its defect list."""
    name = "b/logs/" + ANSI_PAYLOAD + BIDI_PAYLOAD
    archive = forge.tar_of(
        forged, sandbox.inputs / "h.tar.gz", [forge.member(name, tarfile.SYMTYPE, None, "/etc/passwd")]
    )
    result = sandbox.run("verify", archive, tty=tty)
    assert_outcome(sandbox, result, 1, "archive-link-member")
    assert_no_raw_escapes(result.err + result.out)
    if not tty:
        assert b"\x1b" not in result.stderr, "an escape byte from the archive reached a pipe"


def test_escape_sequences_in_a_sha256sums_line(sandbox, forged):
    """Attack (own): SHA256SUMS is plain text, not schema-checked: a line naming a path with
    control sequences is echoed in the defect list."""
    sums = forged / "SHA256SUMS"
    sums.write_text(sums.read_text() + "0" * 64 + "  logs/" + ANSI_PAYLOAD + BIDI_PAYLOAD + "\n")
    result = sandbox.run("verify", forged, tty=True)
    assert_outcome(sandbox, result, 1, "SHA256SUMS")
    assert_no_raw_escapes(result.err)


@pytest.mark.parametrize("fmt", ["markdown", "openvex", "intoto"])
def test_receipt_text_printed_to_a_terminal(sandbox, forged, fmt):
    """Attack: control sequences and bidi controls in the title and a limit of a bundle that
    verifies; `report` writes its output to the terminal."""
    retitle(forged, "A forged title" + ANSI_PAYLOAD + BIDI_PAYLOAD, "a limit" + ANSI_PAYLOAD + BIDI_PAYLOAD)
    assert sandbox.run("verify", forged).code == 0
    # an unshipped experiment's advisory record is refused unless asked for (test_attack_report)
    author = ("--author", "x", "--allow-unanchored") if fmt == "openvex" else ()
    result = sandbox.run("report", forged, "--format", fmt, *author, tty=True)
    assert_outcome(sandbox, result, 0)
    assert_no_raw_escapes(result.err)


def test_markdown_report_passes_no_html_or_links_through(sandbox, forged):
    """Attack: HTML, <details>, links and images in the title, a limit and host.system."""
    retitle(forged, "A forged title " + HOSTILE_TEXT, HOSTILE_TEXT)
    forge.edit_receipt(forged, lambda r: r["host"].update(system="Linux " + HOSTILE_TEXT))
    assert sandbox.run("verify", forged).code == 0
    result = sandbox.run("report", forged, "--format", "markdown", "-o", sandbox.out, allow=(sandbox.out,))
    assert_outcome(sandbox, result, 0)
    text = sandbox.out.read_text()
    for raw in ("<details", "<summary", "<img", "](https://evil.example"):
        assert raw not in text, f"{raw!r} from the receipt reaches the Markdown:\n" + "\n".join(
            line for line in text.splitlines() if raw in line
        )


def test_suggested_verify_command_quotes_the_bundle_path(sandbox, forged):
    """Attack: a bundle directory named `$(touch pwned)...`; the report's `sh` block is pasted."""
    evil = forged.with_name("$(touch pwned)`touch pwned2`;touch pwned3")
    forged.rename(evil)
    result = sandbox.run("report", evil, "--format", "markdown")
    assert_outcome(sandbox, result, 0)
    block = re.search(r"```sh\n(.*?)\n```", result.out, re.DOTALL)
    assert block, result.out
    paste = sandbox.root / "paste"  # where the reviewer pastes it: a stub kvprobe records its argv
    (paste / "bin").mkdir(parents=True)
    stub = paste / "bin" / "kvprobe"
    stub.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > "$KV_ARGS"\n')
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    subprocess.run(
        ["sh", "-c", block.group(1)],
        cwd=paste,
        timeout=10,
        check=False,
        env={"PATH": f"{paste / 'bin'}:{os.environ['PATH']}", "KV_ARGS": str(paste / "argv")},
    )
    made = sorted(p.name for p in paste.iterdir() if p.name.startswith("pwned"))
    assert made == [], f"pasting the suggested command ran commands from the bundle name: {made}"
    argv = (paste / "argv").read_text().splitlines()
    assert argv[0] == "verify" and argv[1].endswith(evil.name), argv


def test_markdown_table_cells_hold_hostile_observed_values(sandbox, forged):
    """Regression guard: an observed value with HTML and a pipe, in a bundle that verifies
    (raw outputs and comparison edited together), stays code inside its own table cell."""
    value = "<script>alert(1)</script>|x"
    for side in ("base", "head"):
        rel = f"raw/{side}/probes/doors.json"
        raw = forge.load(forged, rel)
        raw["cases"][0]["observations"]["placeholder_len"] = value + side
        (forged / rel).write_bytes(forge.dumps(raw))

    def change(receipt):
        comparison = receipt["comparison"]
        row = next(r for r in comparison["observations"] if r["observation"] == "placeholder_len")
        row.update(base=value + "base", head=value + "head", changed=True)
        comparison["counts"]["observations_changed"] += 1
        for side in ("base", "head"):
            comparison["cases"][side]["doors/reject"]["observations"]["placeholder_len"] = value + side

    forge.edit_receipt(forged, change)
    for side in ("base", "head"):
        forge.recite(forged, f"raw/{side}/probes/doors.json")
    assert sandbox.run("verify", forged).code == 0
    result = sandbox.run("report", forged, "--format", "markdown")
    assert_outcome(sandbox, result, 0)
    rows = [line for line in result.out.splitlines() if "alert(1)" in line]
    assert rows, result.out
    for row in rows:
        assert "<script>" not in re.sub(r"`[^`]*`", "", row), row  # only inside code spans
        assert len(re.split(r"(?<!\\)\|", row)) == 8, f"a value added or split a cell: {row}"


# --- gates: log lines ----------------------------------------------------------------------


def _two_workers(sandbox, hostile_line_text: str):
    """Prefill and decode startup logs that pass gate 1 and show the canary (so the expected
    overall result is 3, undecided without --sglang), the prefill scheduler line prefixed."""
    paths = []
    for role in ("prefill", "decode"):
        text = startup_log(role, RAISED, CONTEXT, canary=True)
        if role == "prefill":
            text = text.replace("max_total_num_tokens=", hostile_line_text + " max_total_num_tokens=", 1)
        path = sandbox.inputs / f"{role}.log"
        path.write_text(text)
        paths += ["--log", str(path)]
    return paths


def test_rich_markup_in_a_log_line(sandbox):
    """Attack: `[/]` and `[link=...]` in a worker's log line; today `gates` crashes on it."""
    logs = _two_workers(sandbox, "[/] [link=https://evil.example]click[/link]")
    result = sandbox.run("gates", *logs, "--out", sandbox.out, allow=(sandbox.out,), tty=True)
    assert_outcome(sandbox, result, 3)
    assert "\x1b]8;" not in result.err, "log text became a terminal hyperlink"


def test_escape_sequences_in_a_log_line(sandbox):
    """Attack: control sequences and bidi controls in a deciding log line: terminal and README."""
    logs = _two_workers(sandbox, ANSI_PAYLOAD + BIDI_PAYLOAD)
    result = sandbox.run("gates", *logs, "--out", sandbox.out, allow=(sandbox.out,), tty=True)
    assert_outcome(sandbox, result, 3)
    assert_no_raw_escapes(result.err)
    assert_no_raw_escapes((sandbox.out / "README.md").read_bytes())


# --- rerun notes and a hostile project folder ----------------------------------------------


def test_rerun_note_echoes_receipt_text(sandbox):
    """Attack (own): host.system in a model bundle's receipt (unchecked free text) is echoed
    raw in the rerun's notes."""
    bundle = copy_committed(MODEL_BUNDLE, sandbox)
    forge.edit_receipt(bundle, lambda r: r["host"].update(system="Linux" + ANSI_PAYLOAD + BIDI_PAYLOAD))
    result = sandbox.run("verify", bundle, "--rerun", tty=True)
    assert_outcome(sandbox, result, 0)
    assert_no_raw_escapes(result.err)


@pytest.mark.parametrize("command", [("list",), ("show", "model")])
def test_markup_in_an_experiment_title_from_the_project_folder(sandbox, command):
    """Attack (own): ./probes of the current directory (a cloned project) shadows the built-in
    experiments; a title with `[/]` crashes `list` and `show`."""
    target = sandbox.cwd / "probes" / "model"
    target.mkdir(parents=True)
    source = REPO / "probes" / "model"
    for path in source.iterdir():
        if path.is_file():
            (target / path.name).write_bytes(path.read_bytes())
    toml = target / "experiment.toml"
    toml.write_text(toml.read_text().replace('title = "Synthetic model', 'title = "[/] Synthetic model', 1))
    result = sandbox.run(*command)
    assert_outcome(sandbox, result, 0)
    assert "[/] Synthetic model" in result.out + result.err


def test_osv_summary_and_details_are_inert_markdown(sandbox):
    """Attack (#22 "Text"): the experiment's title carries raw HTML, a `javascript:` link and bidi
    controls; OSV viewers render `summary`/`details` as Markdown. Today they reach the record raw.
    They must pass the one neutraliser the Markdown export uses (kvprobe.text.for_markdown)."""
    from tests.relabel import relabelled_sweep

    title = f"{HOSTILE_TEXT} [run me](javascript:alert(1)) {BIDI_PAYLOAD}"
    bundle = relabelled_sweep(sandbox.inputs / "text", title=title)
    result = sandbox.run("report", bundle, "--format", "osv", "--allow-unanchored")
    assert_outcome(sandbox, result, 0)
    record = json.loads(result.out)
    for field in ("summary", "details"):
        # kvprobe's own links: the fix PRs, built from the receipt's GitHub upstream
        text = re.sub(r"\[#\d+\]\(https://github\.com/sgl-project/sglang/pull/\d+\)", "", record[field])
        assert "<" not in text and "](" not in text, (field, text)
        assert_no_raw_escapes(text)
    assert "javascript:alert(1)" in record["summary"]  # shown as text, never as a link target

"""kvprobe.text: untrusted text made safe for a terminal, Markdown, a shell and JSON."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from kvprobe.text import for_json, for_markdown, for_shell, for_terminal

CONTROL_CLASSES = {
    "csi": "\x1b[2J",
    "osc-title": "\x1b]0;pwned\x07",
    "c1-csi": "\x9b31m",
    "nul-del": "\x00\x7f",
    "line-breaks": "a\nb\rc\td",
    "bidi-override": "\u202eexe.txt",
    "bidi-isolate": "\u2066hidden\u2069",
    "marks": "\u200e\u200f\u061c",
    "zero-width": "\u200bx\u2060\ufeff",
}
_RAW = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")


@pytest.mark.parametrize("payload", CONTROL_CLASSES.values(), ids=CONTROL_CLASSES.keys())
def test_terminal_shows_every_control_class_as_text(payload):
    shown = for_terminal("x" + payload)
    assert not _RAW.search(shown), repr(shown)
    assert shown.startswith("x") and "\\" in shown
    assert for_terminal(shown) == shown  # idempotent


def test_terminal_keeps_ordinary_text_and_unicode():
    text = "experiment-a: PR #38935 → fixed [/] <b> café 漢字 'q' \"d\""
    assert for_terminal(text) == text


def test_terminal_names_the_character():
    assert for_terminal("\x1b[31m") == "\\x1b[31m"
    assert for_terminal("\u202e") == "\\u202e"


@pytest.mark.parametrize("payload", CONTROL_CLASSES.values(), ids=CONTROL_CLASSES.keys())
def test_markdown_has_no_control_characters_and_is_idempotent(payload):
    shown = for_markdown("title " + payload)
    assert not _RAW.search(shown), repr(shown)
    assert for_markdown(shown) == shown


@pytest.mark.parametrize(
    "hostile, forbidden",
    [
        ("<details open><summary>x</summary></details>", "<"),
        ("<img src=x onerror=alert(1)>", "<"),
        ("[verify here](https://evil.example/x)", "]("),
        ("![t](https://evil.example/t.png)", "]("),
        ("**verified**", "**"),
        ("`code` span", "`"),
        ("a | b", "|"),
        ("~~struck~~", "~~"),
        ("_emphasis_", "_"),
    ],
)
def test_markdown_neutralises_markup(hostile, forbidden):
    shown = for_markdown(hostile)
    assert forbidden not in shown, shown
    assert for_markdown(shown) == shown


def test_markdown_heading_only_at_the_start_and_names_kept_readable():
    assert for_markdown("# title").startswith("&#35;")
    assert for_markdown("PR #38935 fixed max_total_num_tokens") == "PR #38935 fixed max_total_num_tokens"
    assert for_markdown("a &amp; b") == "a &amp; b"  # an entity stays: it renders as text
    assert for_markdown("a & b") == "a &#38; b"


def test_markdown_table_cell_keeps_the_row_shape():
    """A value in a GFM table cell cannot add a cell: no unescaped pipe, no line break."""
    value = for_markdown("x|y\n| z | w |\\|")
    row = f"| {value} | next |"
    assert len(re.split(r"(?<!\\)\|", row)) == 4, row
    assert "\n" not in value


@pytest.mark.parametrize(
    "name",
    ["plain", "with space", "$(touch pwned)`touch pwned2`;touch pwned3", "it's", "-rf", "", "a\nb", "\u202eexe"],
)
def test_shell_word_round_trips(name):
    assert shlex.split(f"kvprobe verify {for_shell(name)} --x") == ["kvprobe", "verify", name, "--x"]


def test_json_escapes_bidi_and_c1_but_keeps_the_document():
    doc = {"title": "t\u202eexe\u2066x\u2069\x85", "arrow": "→"}
    text = for_json(json.dumps(doc, indent=2, ensure_ascii=False))
    assert not _RAW.search(text.replace("\n", ""))
    assert json.loads(text) == doc
    assert "→" in text
    assert for_json(text) == text

"""The docs a newcomer follows lead somewhere: every relative link in README.md and docs/, and
every ``docs/<page>.md`` a source file names, is a file of the checkout (pages move: the fork
server's narrative went from docs/architecture.md to docs/design/)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
_DOCS_PATH = re.compile(r"\bdocs/[\w./-]+\.md\b")


def broken_links(page: Path) -> list[str]:
    """Relative links of a Markdown page that name no file or folder beside it."""
    return [
        target
        for target in _LINK.findall(page.read_text(encoding="utf-8"))
        if "://" not in target and not target.startswith("mailto:") and not (page.parent / target).exists()
    ]


def missing_docs(text: str, root: Path) -> list[str]:
    """The Markdown paths under docs/ a text names that are not files under ``root``."""
    return sorted({p for p in _DOCS_PATH.findall(text) if not (root / p).is_file()})


def test_every_relative_link_of_the_readme_and_the_docs_resolves():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    assert {str(p.relative_to(ROOT)): broken_links(p) for p in pages if broken_links(p)} == {}


def test_every_docs_page_a_source_names_exists():
    sources = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    for folder in ("kvprobe", "tests", "bench"):
        sources += (ROOT / folder).rglob("*.py")
    named = {str(p.relative_to(ROOT)): missing_docs(p.read_text(encoding="utf-8"), ROOT) for p in sources}
    assert {k: v for k, v in named.items() if v} == {}


def test_a_moved_page_is_found(tmp_path):
    (tmp_path / "docs" / "design").mkdir(parents=True)
    (tmp_path / "docs" / "design" / "two-cores.md").write_text("# two cores\n")
    page = tmp_path / "docs" / "architecture.md"
    page.write_text("[ok](design/two-cores.md#why) [gone](design/kept-server.md) [web](https://example.org/x.md)\n")
    assert broken_links(page) == ["design/kept-server.md"]
    text = "see docs/design/two-cores.md and docs/architecture.md, not docs/design/kept-server.md."
    assert missing_docs(text, tmp_path) == ["docs/design/kept-server.md"]

"""kvprobe's own source, parsed once per process: the architecture, layout, typed-read and
output-path checks each walk every module, and parsing dominates their cost."""

from __future__ import annotations

import ast
import functools
from pathlib import Path


def parse(path: Path) -> ast.Module:
    """The module at ``path`` as it is on disk now (a planted file is read afresh: the text,
    not the path, is what is kept). Callers only read the tree."""
    return _parsed(path.read_text(encoding="utf-8"), str(path))


@functools.lru_cache(maxsize=1024)
def _parsed(text: str, filename: str) -> ast.Module:
    return ast.parse(text, filename)


@functools.lru_cache(maxsize=1024)
def nodes(tree: ast.AST) -> tuple[ast.AST, ...]:
    """Every node of ``tree`` (``ast.walk``'s order), listed once per tree: each check walks
    every module again, and walking costs more than the checks themselves."""
    return tuple(ast.walk(tree))

"""Renderings of a bundle for review: Markdown, OpenVEX, in-toto."""

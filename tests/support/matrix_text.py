"""Edits of matrix.yaml's text, as a user makes them."""

from __future__ import annotations

import re


def remove_block(text: str, key: str) -> str:
    """matrix.yaml without one torch release's block (and its own comment lines above it)."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(f'  "{key}":'))
    end = next((i for i in range(start + 1, len(lines)) if re.match(r'^  ("|#)|^\S', lines[i])), len(lines))
    while start > 0 and lines[start - 1].startswith("  #"):
        start -= 1
    return "".join(lines[:start] + lines[end:])

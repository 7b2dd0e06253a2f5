"""The plain-text tables the commands print (``tether runs``, ``submissions``, ``journal``, ``usage``, ``prices``):
columns as wide as their widest cell, two spaces apart, no trailing blanks."""

from __future__ import annotations

from collections.abc import Sequence


def columns(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The header and each row as one line, every column padded to its widest cell."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]

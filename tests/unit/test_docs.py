"""docs/protocol.md stays true to ``protocol``: every frame and every write has a row naming its fields."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

from protocol import FRAME_TYPES, WRITE_TYPES

PROTOCOL_DOC = Path(__file__).parents[2] / "docs" / "protocol.md"
ENVELOPE_FIELDS = {"call_id"}
"""Documented once for every request and reply, not in each row."""


def _rows() -> dict[str, list[str]]:
    """Every table row of the protocol reference, by the wire tag in its first cell."""
    rows: dict[str, list[str]] = {}
    for match in re.finditer(r"^\| `([a-z_]+)` \|.*$", PROTOCOL_DOC.read_text(encoding="utf-8"), re.MULTILINE):
        rows.setdefault(match.group(1), []).append(match.group(0))
    return rows


WIRE_TAGS = [(cls.TYPE, cls) for cls in FRAME_TYPES] + [(cls.OP, cls) for cls in WRITE_TYPES]


@pytest.mark.parametrize(("tag", "cls"), WIRE_TAGS, ids=[tag for tag, _ in WIRE_TAGS])
def test_every_frame_and_write_has_a_row_naming_its_fields(tag: str, cls: type) -> None:
    rows = _rows().get(tag)
    assert rows, f"docs/protocol.md has no table row for `{tag}` ({cls.__name__})"
    fields = [field.name for field in attrs.fields(cls) if field.name not in ENVELOPE_FIELDS]
    assert any(all(f"`{name}" in row for name in fields) for row in rows), (
        f"no row for `{tag}` in docs/protocol.md names all of {cls.__name__}'s fields {fields}"
    )

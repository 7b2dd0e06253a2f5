"""Keyset paging: every record of a read the owner answers a page at a time."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

from protocol import ProtocolError

_T = TypeVar("_T")
_C = TypeVar("_C", str, int)


async def read_pages(
    read_page: Callable[[_C | None], Awaitable[tuple[Sequence[_T], _C | None]]], what: str
) -> list[_T]:
    """Every record of a keyset-paged read, joined: ``read_page(after)`` answers one page and the cursor after it
    (``None``: that was the last page), starting from ``None``. The owner's cursors only move forward (the pages
    are in key order); one that does not is the owner's error, raised as :class:`ProtocolError` rather than read
    again forever. A checkpoint (each page is a call)."""
    return [record async for page in pages(read_page, what) for record in page]


async def pages(
    read_page: Callable[[_C | None], Awaitable[tuple[Sequence[_T], _C | None]]], what: str
) -> AsyncIterator[Sequence[_T]]:
    """The pages of :func:`read_pages`, one at a time, each read when the previous one was taken."""
    after: _C | None = None
    while True:
        page, next_after = await read_page(after)
        yield page
        if next_after is None:
            return
        if after is not None and next_after <= after:
            raise ProtocolError(f"{what} after {after!r} answered a page ending at {next_after!r}")
        after = next_after

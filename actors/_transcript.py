"""The worker's transcript cache: what the run loop reads instead of a conversation's whole transcript each turn.

A transcript's entries are immutable and only ever appended (positions 0, 1, 2, ... within their conversation; the
store never rewrites nor deletes one), so a prefix read once stays true: a read asks the owner only for the entries
after the last cached position. The cache needs no lease epoch to stay valid (the epoch grows with every grant, so
keying on it would empty the cache at every phase): what could make a cached prefix untrue is only another database
behind the same connection (a restored backup, another owner), and each read checks for that by reading the last
cached entry again and comparing its id; a mismatch or a gap drops the conversation's cache and reads it whole.

Bounded (docs/operations.md): at most :data:`MAX_CONVERSATIONS` conversations and :data:`MAX_ENTRIES` entries in
all per client, least recently read dropped first; a transcript longer than :data:`MAX_ENTRIES` is read whole each
time and not cached. Beside each cached transcript, a memo (:meth:`TranscriptCache.memo`) keeps what the run loop
derived from it (the messages folded so far), dropped with the transcript and whenever it is read whole.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Final

from protocol import EntryRecord

if TYPE_CHECKING:
    from ._client import Client

MAX_CONVERSATIONS: Final = 256
"""Conversations cached per client (a worker runs at most this many conversations' runs before one is re-read)."""
MAX_ENTRIES: Final = 200_000
"""Entries cached per client, over all its conversations."""


class TranscriptCache:
    """The cached transcripts of one client's conversations (see the module's docstring)."""

    def __init__(self, *, max_conversations: int = MAX_CONVERSATIONS, max_entries: int = MAX_ENTRIES) -> None:
        if max_conversations < 1 or max_entries < 1:
            raise ValueError("a transcript cache holds at least one conversation and one entry")
        self.max_conversations = max_conversations
        self.max_entries = max_entries
        self._cached: OrderedDict[str, list[EntryRecord]] = OrderedDict()
        self._memos: dict[str, dict[str, Any]] = {}
        self._size = 0
        self.entries_read = 0
        """Entries the owner sent for reads through this cache (the overlap entry included): what it saves shows
        here."""

    @property
    def size(self) -> int:
        """Entries cached now, over all conversations."""
        return self._size

    def cached(self, conversation_id: str) -> int | None:
        """How many entries of ``conversation_id`` are cached, ``None`` if none."""
        entries = self._cached.get(conversation_id)
        return None if entries is None else len(entries)

    async def entries(self, client: Client, conversation_id: str) -> list[EntryRecord]:
        """Every entry of the conversation, oldest first, as :meth:`Client.entries` returns them: the cached prefix
        plus what the owner holds after it. The returned list is a copy: the caller may keep or change it."""
        cached = self._drop(conversation_id)
        fresh: list[EntryRecord] | None = None
        if cached:
            last = cached[-1]
            # Read from the last cached entry on (the cursor is exclusive): it must come back unchanged.
            tail = await self._read(client, conversation_id, last.position - 1 if last.position else None)
            if tail and tail[0].entry_id == last.entry_id and _contiguous(tail, last.position):
                cached.extend(tail[1:])
                fresh = cached
        if fresh is None:
            self._memos.pop(conversation_id, None)  # derived from a prefix that is not (or no longer) known true
            fresh = await self._read(client, conversation_id, None)
            if not _contiguous(fresh, 0):
                return fresh  # not a transcript as the store writes them: never cache it
        self._keep(conversation_id, fresh)
        return list(fresh)

    def memo(self, conversation_id: str) -> dict[str, Any]:
        """What a reader derived from the conversation's cached transcript, kept as long as the transcript is cached
        and never read whole since (then empty again); a throwaway dict for a conversation not cached."""
        if conversation_id not in self._cached:
            return {}
        return self._memos.setdefault(conversation_id, {})

    def forget(self, conversation_id: str) -> None:
        self._drop(conversation_id)
        self._memos.pop(conversation_id, None)

    async def _read(self, client: Client, conversation_id: str, cursor: int | None) -> list[EntryRecord]:
        result: list[EntryRecord] = []
        while True:
            page = await client.read_entries(conversation_id, order="asc", cursor=cursor)
            result.extend(page.entries)
            self.entries_read += len(page.entries)
            if page.next_cursor is None:
                return result
            cursor = page.next_cursor

    def _drop(self, conversation_id: str) -> list[EntryRecord] | None:
        entries = self._cached.pop(conversation_id, None)
        if entries is not None:
            self._size -= len(entries)
        return entries

    def _keep(self, conversation_id: str, entries: list[EntryRecord]) -> None:
        if len(entries) > self.max_entries:
            self._memos.pop(conversation_id, None)
            return
        self._cached[conversation_id] = entries
        self._size += len(entries)
        while len(self._cached) > self.max_conversations or self._size > self.max_entries:
            evicted, dropped = self._cached.popitem(last=False)
            self._size -= len(dropped)
            self._memos.pop(evicted, None)


def _contiguous(entries: list[EntryRecord], first: int) -> bool:
    return all(entry.position == first + index for index, entry in enumerate(entries))


_CACHES: weakref.WeakKeyDictionary[Client, TranscriptCache] = weakref.WeakKeyDictionary()


def transcript_cache(client: Client) -> TranscriptCache:
    """The cache of ``client`` (made on first use; it goes with the client)."""
    cache = _CACHES.get(client)
    if cache is None:
        cache = _CACHES[client] = TranscriptCache()
    return cache


async def transcript(client: Client, conversation_id: str) -> list[EntryRecord]:
    """Every entry of ``conversation_id``, oldest first, through ``client``'s cache."""
    return await transcript_cache(client).entries(client, conversation_id)

"""The worker's transcript cache: what the run loop reads instead of a conversation's whole transcript each turn.

A transcript's entries are immutable and only ever appended (positions 0, 1, 2, ... within their conversation; the
store never rewrites nor deletes one), so a prefix read once stays true: a read asks the owner only for the entries
after the last cached position. The cache needs no lease epoch to stay valid (the epoch grows with every grant, so
keying on it would empty the cache at every phase): what could make a cached prefix untrue is only another database
behind the same connection (a restored backup, another owner), and each read checks for that by reading the last
cached entry again and comparing its id; a mismatch or a gap drops the conversation's cache and reads it whole.

Bounded (docs/operations.md): at most :data:`MAX_CONVERSATIONS` conversations, :data:`MAX_ENTRIES` entries and
:data:`MAX_BYTES` bytes in all per client (entries counted as msgpack-encoded, as the owner sends them, plus what the
memos are charged), least recently read dropped first; a transcript past a bound alone is read whole each time and
not cached. Beside each cached transcript, a memo (:meth:`TranscriptCache.memo`) keeps what the run loop derived
from it (the messages folded so far), charged to the bound by its reader (:meth:`TranscriptCache.charge`), dropped
with the transcript and whenever it is read whole.

A read returns a :class:`Transcript`: a read-only view of the cached list as it was, never a copy (a turn would
copy the whole transcript each time); the list is only ever appended to, so the view does not change.
"""

from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, overload

import msgpack

from protocol import EntryRecord, converter

if TYPE_CHECKING:
    from .._client._client import Client

MAX_CONVERSATIONS: Final = 4096
"""Conversations cached per client (a worker runs at most this many conversations' runs before one is re-read; the
entries and bytes below bound the memory: 256 made a worker serving more concurrent runs than that read every
turn's transcript whole, which ``bench/capacity.py`` reaches)."""
MAX_ENTRIES: Final = 200_000
"""Entries cached per client, over all its conversations."""
MAX_BYTES: Final = 64 << 20
"""Bytes cached per client, over all its conversations: their entries msgpack-encoded and their memos' charges."""


def encoded_size(entry: EntryRecord) -> int:
    """``entry``'s size msgpack-encoded (as a read's reply carries it): what it counts against :data:`MAX_BYTES`."""
    return len(msgpack.packb(converter.unstructure(entry), use_bin_type=True))


class Transcript(Sequence[EntryRecord]):
    """A read-only view of the first ``length`` entries of a cached list that is only ever appended to: what a
    read returned, unchanged by later reads, without copying the list. Compares equal to a sequence of the same
    entries."""

    __slots__ = ("_entries", "_length")

    def __init__(self, entries: list[EntryRecord], length: int | None = None) -> None:
        self._entries = entries
        self._length = len(entries) if length is None else length

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> EntryRecord: ...
    @overload
    def __getitem__(self, index: slice) -> list[EntryRecord]: ...
    def __getitem__(self, index: int | slice) -> EntryRecord | list[EntryRecord]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._length)
            return self._entries[start:stop:step]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("transcript index out of range")
        return self._entries[index]

    def __iter__(self) -> Iterator[EntryRecord]:
        return itertools.islice(self._entries, self._length)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(other) == self._length and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Transcript({list(self)!r})"


class TranscriptCache:
    """The cached transcripts of one client's conversations (see the module's docstring)."""

    def __init__(
        self, *, max_conversations: int = MAX_CONVERSATIONS, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES
    ) -> None:
        if max_conversations < 1 or max_entries < 1 or max_bytes < 1:
            raise ValueError("a transcript cache holds at least one conversation, one entry and one byte")
        self.max_conversations = max_conversations
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._cached: OrderedDict[str, list[EntryRecord]] = OrderedDict()
        self._entry_bytes: dict[str, int] = {}
        """Each cached transcript's entries' encoded bytes."""
        self._memos: dict[str, dict[str, Any]] = {}
        self._memo_bytes: dict[str, int] = {}
        """What each memo was charged (:meth:`charge`); counted in :attr:`bytes` while its transcript is cached."""
        self._size = 0
        self._bytes = 0
        self.entries_read = 0
        """Entries the owner sent for reads through this cache (the overlap entry included): what it saves shows
        here."""

    @property
    def size(self) -> int:
        """Entries cached now, over all conversations."""
        return self._size

    @property
    def bytes(self) -> int:
        """Bytes cached now, over all conversations: entries encoded, plus what their memos were charged."""
        return self._bytes

    def cached(self, conversation_id: str) -> int | None:
        """How many entries of ``conversation_id`` are cached, ``None`` if none."""
        entries = self._cached.get(conversation_id)
        return None if entries is None else len(entries)

    async def entries(self, client: Client, conversation_id: str) -> Transcript:
        """Every entry of the conversation, oldest first, as :meth:`Client.entries` returns them: the cached prefix
        plus what the owner holds after it, as a read-only :class:`Transcript` (not a copy: later reads do not
        change it)."""
        try:
            return await self._entries(client, conversation_id)
        except BaseException:
            self._forget_memo(conversation_id)  # its transcript was dropped for the read: nothing to derive from
            raise

    async def _entries(self, client: Client, conversation_id: str) -> Transcript:
        cached, cached_bytes = self._drop(conversation_id)
        fresh: list[EntryRecord] | None = None
        if cached:
            last = cached[-1]
            # Read from the last cached entry on (the cursor is exclusive): it must come back unchanged.
            tail = await self._read(client, conversation_id, last.position - 1 if last.position else None)
            if tail and tail[0].entry_id == last.entry_id and _contiguous(tail, last.position):
                cached.extend(tail[1:])  # only appended to: the views returned before keep their length
                cached_bytes += sum(encoded_size(entry) for entry in tail[1:])
                fresh = cached
        if fresh is None:
            self._forget_memo(conversation_id)  # derived from a prefix that is not (or no longer) known true
            fresh = await self._read(client, conversation_id, None)
            if not _contiguous(fresh, 0):
                return Transcript(fresh)  # not a transcript as the store writes them: never cache it
            cached_bytes = sum(encoded_size(entry) for entry in fresh)
        self._keep(conversation_id, fresh, cached_bytes)
        return Transcript(fresh)

    def memo(self, conversation_id: str) -> dict[str, Any]:
        """What a reader derived from the conversation's cached transcript, kept as long as the transcript is cached
        and never read whole since (then empty again); a throwaway dict for a conversation not cached. Its reader
        says what it holds with :meth:`charge`."""
        if conversation_id not in self._cached:
            return {}
        return self._memos.setdefault(conversation_id, {})

    def charge(self, conversation_id: str, nbytes: int) -> None:
        """Count ``nbytes`` (what the memo holds now, in place of its last charge) against :attr:`max_bytes`; past
        it, the least recently read transcripts are dropped, this one too if it is past the bound alone."""
        if conversation_id not in self._cached:
            return
        self._bytes += nbytes - self._memo_bytes.get(conversation_id, 0)
        self._memo_bytes[conversation_id] = nbytes
        self._evict()

    def forget(self, conversation_id: str) -> None:
        self._drop(conversation_id)
        self._forget_memo(conversation_id)

    async def _read(self, client: Client, conversation_id: str, cursor: int | None) -> list[EntryRecord]:
        result: list[EntryRecord] = []
        while True:
            page = await client.read_entries(conversation_id, order="asc", cursor=cursor)
            result.extend(page.entries)
            self.entries_read += len(page.entries)
            if page.next_cursor is None:
                return result
            cursor = page.next_cursor

    def _drop(self, conversation_id: str) -> tuple[list[EntryRecord] | None, int]:
        """Take the transcript out of the cache (its memo stays, uncounted): the entries and their bytes."""
        entries = self._cached.pop(conversation_id, None)
        if entries is None:
            return None, 0
        nbytes = self._entry_bytes.pop(conversation_id)
        self._size -= len(entries)
        self._bytes -= nbytes + self._memo_bytes.get(conversation_id, 0)
        return entries, nbytes

    def _forget_memo(self, conversation_id: str) -> None:
        self._memos.pop(conversation_id, None)
        charged = self._memo_bytes.pop(conversation_id, 0)
        if conversation_id in self._cached:
            self._bytes -= charged

    def _keep(self, conversation_id: str, entries: list[EntryRecord], nbytes: int) -> None:
        if len(entries) > self.max_entries or nbytes > self.max_bytes:
            self._forget_memo(conversation_id)
            return
        self._cached[conversation_id] = entries
        self._entry_bytes[conversation_id] = nbytes
        self._size += len(entries)
        self._bytes += nbytes + self._memo_bytes.get(conversation_id, 0)
        self._evict()

    def _evict(self) -> None:
        while self._cached and (
            len(self._cached) > self.max_conversations or self._size > self.max_entries or self._bytes > self.max_bytes
        ):
            evicted = next(iter(self._cached))
            self._drop(evicted)
            self._forget_memo(evicted)


def _contiguous(entries: list[EntryRecord], first: int) -> bool:
    return all(entry.position == first + index for index, entry in enumerate(entries))


_CACHES: weakref.WeakKeyDictionary[Client, TranscriptCache] = weakref.WeakKeyDictionary()


def transcript_cache(client: Client) -> TranscriptCache:
    """The cache of ``client`` (made on first use; it goes with the client)."""
    cache = _CACHES.get(client)
    if cache is None:
        cache = _CACHES[client] = TranscriptCache()
    return cache


async def transcript(client: Client, conversation_id: str) -> Transcript:
    """Every entry of ``conversation_id``, oldest first, through ``client``'s cache."""
    return await transcript_cache(client).entries(client, conversation_id)

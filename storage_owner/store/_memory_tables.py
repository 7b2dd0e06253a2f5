"""The memory store's tables and rows, and the journaled writes its rooms make (:class:`Journaled`): what
:class:`~storage_owner.store.MemoryStore` and its rooms share, as the SQLite store's rooms share its connection.
Sans-IO."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any, Final, TypeVar

import attrs

from protocol import (
    Budget,
    ConversationRecord,
    ModelPrice,
    RunRecord,
    RunUsage,
    StorageError,
    SubmissionRecord,
    TaskRecord,
)
from storage_owner.core import PartialHead

K = TypeVar("K")
V = TypeVar("V")
Undo = Callable[[], None]

_MISSING: Final[Any] = object()
_BEYOND: Final = 1 << 62
"""Past every position and seq (the SQLite store's bound for an open end)."""


@attrs.frozen
class _Entry:
    entry_id: str
    seq: int
    kind: str
    data: bytes
    created_at_ms: int
    model: bytes | None = None
    head: str | None = None


@attrs.frozen
class _Run:
    record: RunRecord
    input: bytes
    created_seq: int


@attrs.frozen
class _Operation:
    run_id: str
    ordinal: int
    task_id: str
    status: str
    record: bytes


@attrs.frozen
class _Interaction:
    operation_id: str
    run_id: str
    status: str
    record: bytes


@attrs.frozen
class _Task:
    record: TaskRecord
    """Its outcomes (``held``, ``outcome``) as stored: copied in and out, since their results are values."""
    input: bytes
    checkpoint: bytes


@attrs.frozen
class _Partial:
    order: int
    """Its place in its run's partial output (the SQLite row's rowid): kept when a later attempt replaces it."""
    head: PartialHead


class _Tables:
    """Every table of one memory database: what stays when a store over it is closed and :meth:`reopened
    <MemoryStore.reopen>`. A row is replaced, never changed in place, so that an undo can put the old one back."""

    def __init__(self) -> None:
        self.log: dict[int, tuple[str | None, int, bytes]] = {}
        """Commits by seq: the one conversation it touched (``None``: none or several), its time, its records."""
        self.seqs: list[int] = []
        """The log's seqs, in order."""
        self.meta: dict[str, int] = {}
        self.conversations: dict[str, ConversationRecord] = {}
        """As inserted, but for ``entry_count``, which is counted when read."""
        self.entries: dict[str, dict[int, _Entry]] = {}
        """Each conversation's entries by position."""
        self.positions: dict[str, list[int]] = {}
        """Each conversation's entry positions, in order."""
        self.entry_ids: dict[str, str] = {}
        """The conversation of every entry id (unique across conversations)."""
        self.documents: dict[tuple[str, str], tuple[int, bytes, int, int]] = {}
        """By ``(scope, name)``: version, value, seq, updated_at_ms."""
        self.submissions: dict[str, tuple[SubmissionRecord, bytes]] = {}
        """By submission id: the record (its payload aside) and its payload."""
        self.requests: dict[tuple[str, str], str] = {}
        """The submission id of each ``(conversation_id, request_id)``."""
        self.runs: dict[str, _Run] = {}
        self.operations: dict[str, _Operation] = {}
        self.journals: dict[str, list[str]] = {}
        """Each run's operation ids, by ordinal (the index in the list)."""
        self.interactions: dict[str, _Interaction] = {}
        self.asked: dict[str, str] = {}
        """The approval of each operation that asked one (its questions are found by their ids)."""
        self.usage: dict[tuple[str, str], RunUsage] = {}
        self.prices: dict[str, ModelPrice] = {}
        self.budgets: dict[tuple[str, str], Budget] = {}
        self.tasks: dict[str, _Task] = {}
        self.partials: dict[str, _Partial] = {}
        self.pieces: dict[str, dict[int, str]] = {}
        """Each operation's pieces of partial output, by character offset."""
        self.counters: dict[str, int] = {"partial_order": 0}


class _Closed(_Tables):
    """A closed store's tables: every use raises (every method reads its tables first, so none needs a check)."""

    def __init__(self) -> None:
        pass

    def __getattribute__(self, name: str) -> Any:
        raise StorageError("the memory store is closed")


class Journaled:
    """The base of every room of the memory store: the tables in use, the open transaction's journal, and the writes
    that journal how to undo themselves (the module docstring of ``_memory``, rule 1)."""

    _t: _Tables  # both set by MemoryStore.__init__, which says what they are
    _undo: list[Undo] | None

    def _put(self, table: dict[K, V], key: K, value: V) -> None:
        undo = self._undo
        if undo is not None:
            old = table.get(key, _MISSING)
            undo.append(lambda: _restore(table, key, old))
        table[key] = value

    def _delete(self, table: dict[K, V], key: K) -> None:
        old = table.pop(key, _MISSING)
        if old is not _MISSING and self._undo is not None:
            self._undo.append(lambda: _restore(table, key, old))

    def _insert_sorted(self, values: list[int], value: int) -> None:
        if values and value > values[-1]:
            values.append(value)
        else:
            bisect.insort(values, value)
        if self._undo is not None:
            self._undo.append(lambda: values.remove(value))

    def _append(self, values: list[V], value: V) -> None:
        values.append(value)
        if self._undo is not None:
            self._undo.append(lambda: values.remove(value))


def _restore(table: dict[K, V], key: K, old: V) -> None:
    if old is _MISSING:
        del table[key]
    else:
        table[key] = old

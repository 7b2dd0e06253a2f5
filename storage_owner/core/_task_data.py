"""The input and checkpoint of the tasks written lately, kept so that granting a lease reads nothing, sans-IO.

A task's input and checkpoint live in the store beside its record, and a lease carries both: without this, every
grant reads them back, though most grants follow the commit that wrote them by one batch (a task created, or
advanced to its next checkpoint, is leased in the settle of the same batch). :class:`TaskData` keeps what was last
written of each task's input and checkpoint, as the values the commit carried, and answers the
:class:`~._ports.TaskReads` port from them, the store otherwise.

1. Filled by the two writes that store them: a task's creation (its input, no checkpoint) and a new state that
   carries a checkpoint (only a task whose input it holds; a write of one past :data:`MAX_CACHED_VALUE_BYTES`
   drops the task's entry instead, since what it holds would no longer be what is stored).
2. Bounded: at most :data:`MAX_CACHED_TASKS` entries and :data:`MAX_CACHED_BYTES` of their stored (msgpack) size;
   the least recently written go first. A task that ended stays until it is pushed out (its input may still be
   read once, by the settle that follows its end).
3. A refused request puts back the entries it changed (journaled like every other in-memory state), so what is
   kept is what is stored once the request is undone; an entry pushed out is only read from the store again.
4. The values are shared with the frames they came from and go to (a lease's input is the object the create
   carried): nothing in the owner mutates a decoded payload.
5. A checkpoint saved in this batch is stored at its end (:meth:`~._task_records.TaskRecords.write_saved`, which
   keeps it here then): until then it is read from the saved records, whatever is kept or stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ._ports import NO_CHANGE, TaskReads
from ._unit import Journal

MAX_CACHED_TASKS: Final = 1024
"""Tasks whose input and checkpoint the owner keeps at most (docs/operations.md, bounds)."""
MAX_CACHED_BYTES: Final = 8 << 20
"""The stored size of the inputs and checkpoints kept, at most (8 MiB)."""
MAX_CACHED_VALUE_BYTES: Final = 64 << 10
"""A task whose input and checkpoint store larger than this (64 KiB together) is not kept: read when leased."""

_Entry = tuple[Any, Any, int, int]
"""(input, checkpoint, the input's stored size, the checkpoint's)."""


class TaskData:
    """See the module docstring. Answers :class:`~._ports.TaskReads` for every room of the owner."""

    __slots__ = ("_bytes", "_entries", "_journal", "_store", "_unwritten")

    def __init__(self, store: TaskReads, journal: Journal, unwritten: Mapping[str, tuple[object, object]]) -> None:
        self._store = store
        self._journal = journal
        self._unwritten = unwritten
        """The task engine's records saved in this batch and not stored yet, with their checkpoints (rule 5)."""
        self._entries: dict[str, _Entry] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, task_id: str) -> bool:
        return task_id in self._entries

    @property
    def size_bytes(self) -> int:
        """The stored size of what is kept."""
        return self._bytes

    def task_data(self, task_id: str) -> tuple[Any, Any]:
        """A stored task's ``(input, checkpoint)``: kept, or read from the store."""
        entry = self._entries.get(task_id)
        if entry is None:
            input_value, checkpoint = self._store.task_data(task_id)
        else:
            input_value, checkpoint = entry[0], entry[1]
        unwritten = self._unwritten.get(task_id)
        if unwritten is not None and unwritten[1] is not NO_CHANGE:  # rule 5
            checkpoint = unwritten[1]
        return input_value, checkpoint

    def created(self, task_id: str, input_value: object, input_bytes: int) -> None:
        """A task was stored with ``input_value`` (of ``input_bytes`` stored) and no checkpoint (rule 1)."""
        self._write(task_id, (input_value, None, input_bytes, 0))

    def advanced(self, task_id: str, checkpoint: object, checkpoint_bytes: int) -> None:
        """A task's new ``checkpoint`` (of ``checkpoint_bytes`` stored) was stored (rule 1)."""
        entry = self._entries.get(task_id)
        if entry is not None:
            self._write(task_id, (entry[0], checkpoint, entry[2], checkpoint_bytes))

    def _write(self, task_id: str, entry: _Entry) -> None:
        entries = self._entries
        previous = entries.pop(task_id, None)
        if previous is not None:
            self._bytes -= previous[2] + previous[3]
        if self._journal.open:
            self._journal.undo(lambda: self._put_back(task_id, previous))
        size = entry[2] + entry[3]
        if size > MAX_CACHED_VALUE_BYTES:
            return
        entries[task_id] = entry
        self._bytes += size
        while len(entries) > MAX_CACHED_TASKS or self._bytes > MAX_CACHED_BYTES:  # rule 2: the oldest go first
            oldest = next(iter(entries))
            dropped = entries.pop(oldest)
            self._bytes -= dropped[2] + dropped[3]

    def _put_back(self, task_id: str, previous: _Entry | None) -> None:
        """Rule 3: the entry ``task_id`` had before the refused request (none: it is dropped)."""
        current = self._entries.pop(task_id, None)
        if current is not None:
            self._bytes -= current[2] + current[3]
        if previous is not None:
            self._entries[task_id] = previous
            self._bytes += previous[2] + previous[3]

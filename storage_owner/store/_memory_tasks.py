"""The memory store's tasks (the :class:`~storage_owner.core.TaskStore` port) over its tables: a mixin of
:class:`~storage_owner.store.MemoryStore`, the twin of ``_tasks``'s SQL."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from protocol import TaskOutcome, TaskRecord
from storage_owner.core import NO_CHANGE, StoreConflict, TaskRow

from ._blobs import pack, structure_outcome, unpack, unstructure_outcome
from ._memory_tables import Journaled, _Task


class TasksMemory(Journaled):
    """Tasks (and the conversations their live tasks own)."""

    def insert_task(self, record: TaskRecord, input: object, checkpoint: object) -> int:
        t = self._t
        if record.task_id in t.tasks:
            raise StoreConflict("task", record.task_id)
        packed = pack(input)
        self._put(t.tasks, record.task_id, _Task(_task_copy(record), packed, pack(checkpoint)))
        return len(packed)

    def update_task(self, record: TaskRecord, *, checkpoint: object = NO_CHANGE) -> int:
        t = self._t
        stored = t.tasks.get(record.task_id)
        if stored is None:
            return 0
        kept = stored.checkpoint if checkpoint is NO_CHANGE else pack(checkpoint)
        self._put(t.tasks, record.task_id, _Task(_task_copy(record), stored.input, kept))
        return 0 if checkpoint is NO_CHANGE else len(kept)

    def task(self, task_id: str) -> TaskRecord | None:
        stored = self._t.tasks.get(task_id)
        return None if stored is None else _task_copy(stored.record)

    def task_data(self, task_id: str) -> tuple[Any, Any]:
        stored = self._t.tasks.get(task_id)
        assert stored is not None, f"task {task_id} is not stored"
        return unpack(stored.input), unpack(stored.checkpoint)

    def live_tasks(self, *, unsettled_only: bool = False) -> Iterator[TaskRecord]:
        for task_id in sorted(self._t.tasks):
            record = self._t.tasks[task_id].record
            if record.status != "terminal" and not (
                unsettled_only and record.status == "pending" and record.abort is None
            ):
                yield _task_copy(record)

    def live_task_rows(self) -> Iterator[TaskRow]:
        tasks = self._t.tasks
        for task_id in sorted(tasks):
            record = tasks[task_id].record
            if record.status != "terminal":
                yield (
                    task_id,
                    record.kind,
                    record.conversation_id,
                    record.owner_task_id,
                    record.status,
                    record.abort,
                    record.abandon_on_restart,
                )

    def task_count(self) -> int:
        return len(self._t.tasks)

    def task_owned_conversations(self) -> list[tuple[str, str]]:
        t = self._t
        owned = []
        for conversation_id in sorted(t.conversations):
            owner = t.conversations[conversation_id].owner_task_id
            if owner is not None:
                task = t.tasks.get(owner)
                if task is not None and task.record.status != "terminal":
                    owned.append((conversation_id, owner))
        return owned


def _outcome_copy(outcome: TaskOutcome | None) -> TaskOutcome | None:
    if outcome is None:
        return None
    return structure_outcome(unpack(pack(unstructure_outcome(outcome))), TaskOutcome)  # type: ignore[no-any-return]


def _task_copy(record: TaskRecord) -> TaskRecord:
    """``record`` detached: its outcomes' results are values (a record without outcomes holds none)."""
    if record.held is None and record.outcome is None:
        return record
    return attrs.evolve(record, held=_outcome_copy(record.held), outcome=_outcome_copy(record.outcome))

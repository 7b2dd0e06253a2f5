"""The SQL of tasks (the :class:`~storage_owner.core.TaskStore` port of ``storage_owner.core._tasks``): a mixin of
:class:`~storage_owner.store.SqliteStore`, with the task row codecs generated from the task columns at import."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Final

import apsw
import attrs

from protocol import TaskOutcome, TaskRecord
from storage_owner.core import NO_CHANGE, TASK_ROW_FIELDS, StoreConflict, TaskRow

from ._blobs import pack, structure_outcome, unpack, unstructure_outcome

# A task's columns in one place: they are TaskRecord's fields, in its order, named as its fields but for
# _TASK_COLUMN_OF; _TASK_TO_COLUMN and _TASK_FROM_COLUMN say how a field that is not stored as it is converts (an
# expression over "{0}"). The row <-> record functions are generated from these once, at import (as attrs generates
# __init__), so reading and writing a task costs what hand-written functions would.
_TASK_FIELDS: Final = tuple(field.name for field in attrs.fields(TaskRecord))
_TASK_COLUMN_OF: Final = {"on": "on_ids"}
_TASK_TO_COLUMN: Final = {
    "on": "pack(list({0})) if {0} else None",
    "restart_limit": "0 if {0} is None else {0}",  # no limit: 0, which no capability announces (its limit is 1 or more)
    "held": "None if {0} is None else pack(unstructure_outcome({0}))",
    "outcome": "None if {0} is None else pack(unstructure_outcome({0}))",
}
_TASK_FROM_COLUMN: Final = {
    "background": "{0} == 1",
    "abandon_on_restart": "{0} == 1",
    "on": "_NO_IDS if {0} is None else tuple(unpack({0}))",
    "restart_limit": "{0} or None",
    "held": "None if {0} is None else structure_outcome(unpack({0}), TaskOutcome)",
    "outcome": "None if {0} is None else structure_outcome(unpack({0}), TaskOutcome)",
}
_TASK_COLUMNS: Final = ", ".join(_TASK_COLUMN_OF.get(name, name) for name in _TASK_FIELDS)
_LIVE_TASK_ROW_COLUMNS: Final = ", ".join(_TASK_COLUMN_OF.get(name, name) for name in TASK_ROW_FIELDS)
_INSERT_TASK: Final = (
    f"INSERT INTO tasks ({_TASK_COLUMNS}, input, checkpoint) VALUES ({', '.join('?' * (len(_TASK_FIELDS) + 2))})"
)
_UPDATE_TASK_SET: Final = ", ".join(f"{_TASK_COLUMN_OF.get(name, name)} = ?" for name in _TASK_FIELDS[1:])
_UPDATE_TASK: Final = f"UPDATE tasks SET {_UPDATE_TASK_SET} WHERE task_id = ?"
_UPDATE_TASK_CHECKPOINT: Final = f"UPDATE tasks SET {_UPDATE_TASK_SET}, checkpoint = ? WHERE task_id = ?"


def _task_codecs() -> tuple[Callable[[TaskRecord], tuple[object, ...]], Callable[[Any], TaskRecord]]:
    """``(_task_row, _task_record)``: a record as the values of :data:`_TASK_COLUMNS`, and back."""
    to_row = ", ".join(_TASK_TO_COLUMN.get(name, "{0}").format(f"record.{name}") for name in _TASK_FIELDS)
    to_record = ", ".join(
        f"{name}=" + _TASK_FROM_COLUMN.get(name, "{0}").format(f"row[{index}]")
        for index, name in enumerate(_TASK_FIELDS)
    )
    source = (
        f"def _task_row(record):\n    return ({to_row},)\n\n"
        f"def _task_record(row):\n    return TaskRecord({to_record})\n"
    )
    namespace: dict[str, Any] = {
        "TaskRecord": TaskRecord,
        "TaskOutcome": TaskOutcome,
        "_NO_IDS": _NO_IDS,
        "pack": pack,
        "unpack": unpack,
        "structure_outcome": structure_outcome,
        "unstructure_outcome": unstructure_outcome,
    }
    exec(compile(source, "<task codecs>", "exec"), namespace)
    return namespace["_task_row"], namespace["_task_record"]


_NO_IDS: Final[tuple[str, ...]] = ()
_task_row, _task_record = _task_codecs()


class TasksSql:
    """The ``tasks`` table (and the conversations its live tasks own)."""

    _db: apsw.Connection

    def insert_task(self, record: TaskRecord, input: object, checkpoint: object) -> int:
        packed = pack(input)
        try:
            self._db.execute(_INSERT_TASK, (*_task_row(record), packed, pack(checkpoint)))
        except apsw.ConstraintError as exc:
            raise StoreConflict("task", record.task_id) from exc
        return len(packed)

    def update_task(self, record: TaskRecord, *, checkpoint: object = NO_CHANGE) -> int:
        """Store ``record`` (every column but the input); the checkpoint too when one is given."""
        row = _task_row(record)
        if checkpoint is NO_CHANGE:
            self._db.execute(_UPDATE_TASK, (*row[1:], row[0]))
            return 0
        packed = pack(checkpoint)
        self._db.execute(_UPDATE_TASK_CHECKPOINT, (*row[1:], packed, row[0]))
        return len(packed)

    def task(self, task_id: str) -> TaskRecord | None:
        row = self._db.execute(f"SELECT {_TASK_COLUMNS} FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        return None if row is None else _task_record(row)

    def task_data(self, task_id: str) -> tuple[Any, Any]:
        """A stored task's ``(input, checkpoint)``."""
        row = self._db.execute("SELECT input, checkpoint FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        assert row is not None, f"task {task_id} is not stored"
        return unpack(row[0]), unpack(row[1])

    def live_tasks(self, *, unsettled_only: bool = False) -> Iterator[TaskRecord]:
        """Every task that is not terminal, oldest first; with ``unsettled_only`` not the plain pending ones."""
        unsettled = " AND (status != 'pending' OR abort IS NOT NULL)" if unsettled_only else ""
        rows = self._db.execute(
            f"SELECT {_TASK_COLUMNS} FROM tasks WHERE status != 'terminal'{unsettled} ORDER BY task_id"
        )
        return (_task_record(row) for row in rows)

    def live_task_rows(self) -> Iterator[TaskRow]:
        """The facts of every task that is not terminal (a :data:`~storage_owner.core.TaskRow`), oldest first."""
        return self._db.execute(
            f"SELECT {_LIVE_TASK_ROW_COLUMNS} FROM tasks WHERE status != 'terminal' ORDER BY task_id"
        )

    def task_count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM tasks").fetchone()[0])  # type: ignore[index]

    def task_owned_conversations(self) -> list[tuple[str, str]]:
        """``(conversation_id, owner_task_id)`` of every conversation owned by a task that is not terminal."""
        rows = self._db.execute(
            "SELECT c.conversation_id, c.owner_task_id FROM conversations AS c JOIN tasks AS t "
            "ON t.task_id = c.owner_task_id WHERE c.owner_task_id IS NOT NULL AND t.status != 'terminal'"
        )
        return [(conversation_id, owner) for conversation_id, owner in rows]

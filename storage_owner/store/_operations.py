"""The SQL of the operation journal and interactions (the :class:`~storage_owner.core.OperationStore` port of
``storage_owner.core._operations``): a mixin of :class:`~storage_owner.store.SqliteStore`, with the operation records
it keeps as last written (which every rollback of the store drops)."""

from __future__ import annotations

from typing import Final

import apsw

from protocol import TOOL_TASK_PREFIX, InteractionRecord, OperationRecord
from storage_owner.core import StoreConflict

from ._blobs import pack_interaction, pack_operation, structure_interaction, unpack, unpack_operation

MAX_KEPT_OPERATIONS: Final = 256
"""Operation records the store keeps as last written (:meth:`SqliteStore.operation` answers from them; an intent is
read back by its result's commit, a batch or so later)."""
MAX_KEPT_OPERATION_BYTES: Final = 4 << 20
"""Their stored size at most (4 MiB); one record past 64 KiB is not kept."""
MAX_KEPT_OPERATION_RECORD_BYTES: Final = 64 << 10


class OperationsSql:
    """The ``operations`` and ``interactions`` tables. :class:`~storage_owner.store.SqliteStore` starts the kept
    records empty, and drops them on every rollback (:meth:`_forget_operations`)."""

    _db: apsw.Connection
    _operations: dict[str, bytes]
    """The operation records written lately, as stored (so what they read back is detached from the caller's
    objects, as a read of the table), least recent first: dropped whole by any rollback, so they are always what
    the open transaction holds."""
    _operation_bytes: int

    def insert_operation(self, record: OperationRecord) -> None:
        """Journal a new operation, after the run's others."""
        packed = pack_operation(record)
        try:
            self._db.execute(
                "INSERT INTO operations (operation_id, run_id, ordinal, task_id, status, record) VALUES "
                "(?1, ?2, (SELECT COALESCE(MAX(ordinal) + 1, 0) FROM operations WHERE run_id = ?2), ?3, ?4, ?5)",
                (record.operation_id, record.run_id, record.task_id, record.status, packed),
            )
        except apsw.ConstraintError as exc:
            raise StoreConflict("operation", record.operation_id) from exc
        self._keep_operation(record.operation_id, packed)

    def update_operation(self, record: OperationRecord) -> None:
        packed = pack_operation(record)
        self._db.execute(
            "UPDATE operations SET task_id = ?, status = ?, record = ? WHERE operation_id = ?",
            (record.task_id, record.status, packed, record.operation_id),
        )
        self._keep_operation(record.operation_id, packed)

    def operation(self, operation_id: str) -> OperationRecord | None:
        kept = self._operations.get(operation_id)
        if kept is not None:
            return unpack_operation(kept)
        row = self._db.execute("SELECT record FROM operations WHERE operation_id = ?", (operation_id,)).fetchone()
        return None if row is None else unpack_operation(row[0])

    def _keep_operation(self, operation_id: str, packed: bytes) -> None:
        """Keep an operation's record as just stored, within :data:`MAX_KEPT_OPERATIONS` and
        :data:`MAX_KEPT_OPERATION_BYTES` (the least recently written dropped first; one past
        :data:`MAX_KEPT_OPERATION_RECORD_BYTES` not kept)."""
        kept = self._operations
        previous = kept.pop(operation_id, None)
        if previous is not None:
            self._operation_bytes -= len(previous)
        if len(packed) > MAX_KEPT_OPERATION_RECORD_BYTES:
            return
        kept[operation_id] = packed
        self._operation_bytes += len(packed)
        while len(kept) > MAX_KEPT_OPERATIONS or self._operation_bytes > MAX_KEPT_OPERATION_BYTES:
            self._operation_bytes -= len(kept.pop(next(iter(kept))))

    def _forget_operations(self) -> None:
        self._operations.clear()
        self._operation_bytes = 0

    @property
    def kept_operations(self) -> tuple[int, int]:
        """How many operation records are kept, and their stored size (the bound's test reads it)."""
        return len(self._operations), self._operation_bytes

    def open_operations(self, task_id: str) -> list[OperationRecord]:
        """The operations a task's lease started that have no result yet."""
        rows = self._db.execute(
            "SELECT record FROM operations WHERE task_id = ? AND status = 'started' ORDER BY ordinal", (task_id,)
        )
        return [unpack_operation(row[0]) for row in rows]

    def operation_page(self, run_id: str, cursor: int, limit: int) -> tuple[list[OperationRecord], bool]:
        """A run's operations from the ``cursor``-th (oldest first), at most ``limit``, and whether more follow."""
        rows = self._db.execute(
            "SELECT record FROM operations WHERE run_id = ? AND ordinal >= ? ORDER BY ordinal LIMIT ?",
            (run_id, cursor, limit + 1),
        ).fetchall()
        return [unpack_operation(row[0]) for row in rows[:limit]], len(rows) > limit  # type: ignore[arg-type]

    def insert_interaction(self, record: InteractionRecord) -> None:
        try:
            self._db.execute(
                "INSERT INTO interactions (interaction_id, operation_id, kind, run_id, status, record) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    record.interaction_id,
                    record.operation_id,
                    record.kind,
                    record.run_id,
                    record.status,
                    pack_interaction(record),
                ),
            )
        except apsw.ConstraintError as exc:
            raise StoreConflict("interaction", record.interaction_id) from exc

    def update_interaction(self, record: InteractionRecord) -> None:
        self._db.execute(
            "UPDATE interactions SET status = ?, record = ? WHERE interaction_id = ?",
            (record.status, pack_interaction(record), record.interaction_id),
        )

    def _interaction(self, blob: bytes) -> InteractionRecord:
        raw = unpack(blob)
        if "tool" not in raw:  # stored by an engine before schema 6: its tool task (the approval's owner) names it
            row = self._db.execute(
                "SELECT tool.kind FROM tasks AS approval JOIN tasks AS tool ON tool.task_id = approval.owner_task_id "
                "WHERE approval.task_id = ?",
                (raw["task_id"],),
            ).fetchone()
            raw["tool"] = "" if row is None else str(row[0]).removeprefix(TOOL_TASK_PREFIX)
        return structure_interaction(raw, InteractionRecord)  # type: ignore[no-any-return]

    def interaction(self, interaction_id: str) -> InteractionRecord | None:
        row = self._db.execute("SELECT record FROM interactions WHERE interaction_id = ?", (interaction_id,)).fetchone()
        return None if row is None else self._interaction(row[0])

    def operation_interaction(self, operation_id: str) -> InteractionRecord | None:
        row = self._db.execute(
            "SELECT record FROM interactions WHERE operation_id = ? AND kind = 'approval'", (operation_id,)
        ).fetchone()
        return None if row is None else self._interaction(row[0])

    def interaction_page(
        self, status: str | None, run_id: str | None, after_interaction_id: str | None, limit: int
    ) -> tuple[list[InteractionRecord], bool]:
        """Up to ``limit`` interactions in id order after ``after_interaction_id``, filtered; whether more follow."""
        rows = self._db.execute(
            "SELECT record FROM interactions WHERE interaction_id > ?1 AND (?2 IS NULL OR status = ?2) "
            "AND (?3 IS NULL OR run_id = ?3) ORDER BY interaction_id LIMIT ?4",
            (after_interaction_id or "", status, run_id, limit + 1),
        ).fetchall()
        page = [self._interaction(row[0]) for row in rows[:limit]]  # type: ignore[arg-type]
        return page, len(rows) > limit

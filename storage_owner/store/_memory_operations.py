"""The memory store's operation journal and interactions (the :class:`~storage_owner.core.OperationStore` port) over its
tables: a mixin of :class:`~storage_owner.store.MemoryStore`, the twin of ``_operations``'s SQL."""

from __future__ import annotations

from protocol import InteractionRecord, OperationRecord
from storage_owner.core import StoreConflict

from ._blobs import pack_interaction, pack_operation, structure_interaction, unpack, unpack_operation
from ._memory_tables import Journaled, _Interaction, _Operation


class OperationsMemory(Journaled):
    """The operation journal (each run's by ordinal) and interactions."""

    def insert_operation(self, record: OperationRecord) -> None:
        t = self._t
        if record.operation_id in t.operations:
            raise StoreConflict("operation", record.operation_id)
        journal = t.journals.get(record.run_id)
        if journal is None:
            self._put(t.journals, record.run_id, [])
            journal = t.journals[record.run_id]
        stored = _Operation(record.run_id, len(journal), record.task_id, record.status, pack_operation(record))
        self._put(t.operations, record.operation_id, stored)
        self._append(journal, record.operation_id)

    def update_operation(self, record: OperationRecord) -> None:
        t = self._t
        stored = t.operations.get(record.operation_id)
        if stored is not None:
            updated = _Operation(stored.run_id, stored.ordinal, record.task_id, record.status, pack_operation(record))
            self._put(t.operations, record.operation_id, updated)

    def operation(self, operation_id: str) -> OperationRecord | None:
        stored = self._t.operations.get(operation_id)
        return None if stored is None else unpack_operation(stored.record)

    def open_operations(self, task_id: str) -> list[OperationRecord]:
        found = [op for op in self._t.operations.values() if op.task_id == task_id and op.status == "started"]
        found.sort(key=lambda op: op.ordinal)
        return [unpack_operation(op.record) for op in found]

    def operation_page(self, run_id: str, cursor: int, limit: int) -> tuple[list[OperationRecord], bool]:
        t = self._t
        ids = t.journals.get(run_id, [])[max(cursor, 0) :]
        return [unpack_operation(t.operations[op_id].record) for op_id in ids[:limit]], len(ids) > limit

    def insert_interaction(self, record: InteractionRecord) -> None:
        t = self._t
        approval = record.kind == "approval"
        if record.interaction_id in t.interactions or (approval and record.operation_id in t.asked):
            raise StoreConflict("interaction", record.interaction_id)
        stored = _Interaction(record.operation_id, record.run_id, record.status, pack_interaction(record))
        self._put(t.interactions, record.interaction_id, stored)
        if approval:
            self._put(t.asked, record.operation_id, record.interaction_id)

    def update_interaction(self, record: InteractionRecord) -> None:
        t = self._t
        stored = t.interactions.get(record.interaction_id)
        if stored is not None:
            updated = _Interaction(stored.operation_id, stored.run_id, record.status, pack_interaction(record))
            self._put(t.interactions, record.interaction_id, updated)

    def interaction(self, interaction_id: str) -> InteractionRecord | None:
        stored = self._t.interactions.get(interaction_id)
        return None if stored is None else _unpack_interaction(stored.record)

    def operation_interaction(self, operation_id: str) -> InteractionRecord | None:
        interaction_id = self._t.asked.get(operation_id)
        return None if interaction_id is None else self.interaction(interaction_id)

    def interaction_page(
        self, status: str | None, run_id: str | None, after_interaction_id: str | None, limit: int
    ) -> tuple[list[InteractionRecord], bool]:
        interactions = self._t.interactions
        found = [
            interactions[interaction_id].record
            for interaction_id in sorted(interactions)
            if interaction_id > (after_interaction_id or "")
            and (status is None or interactions[interaction_id].status == status)
            and (run_id is None or interactions[interaction_id].run_id == run_id)
        ]
        return [_unpack_interaction(blob) for blob in found[:limit]], len(found) > limit


def _unpack_interaction(blob: bytes) -> InteractionRecord:
    return structure_interaction(unpack(blob), InteractionRecord)  # type: ignore[no-any-return]

"""The memory store's partial output (the :class:`~storage_owner.core.PartialStore` port) over its tables: a mixin of
:class:`~storage_owner.store.MemoryStore`, the twin of ``_partials``'s SQL."""

from __future__ import annotations

import attrs

from protocol import StorageError
from storage_owner.core import PartialHead

from ._memory_tables import Journaled, _Partial


class PartialsMemory(Journaled):
    """Partial output: one head per operation, in the order each first streamed, and its pieces."""

    def partial(self, operation_id: str) -> PartialHead | None:
        stored = self._t.partials.get(operation_id)
        return None if stored is None else stored.head

    def held_partials(self) -> list[PartialHead]:
        return [
            stored.head
            for stored in self._ordered_partials()
            if stored.head.pieces > 0 or stored.head.status == "streaming"
        ]

    def put_partial(self, head: PartialHead) -> None:
        t = self._t
        stored = t.partials.get(head.operation_id)
        if stored is None:
            order = t.counters["partial_order"] + 1
            self._put(t.counters, "partial_order", order)
            self._put(t.partials, head.operation_id, _Partial(order, head))
        else:  # the run and conversation stay as first stored (the SQLite store's upsert leaves them)
            kept = attrs.evolve(head, run_id=stored.head.run_id, conversation_id=stored.head.conversation_id)
            self._put(t.partials, head.operation_id, _Partial(stored.order, kept))

    def insert_partial_piece(self, operation_id: str, offset: int, text: str) -> None:
        t = self._t
        pieces = t.pieces.get(operation_id)
        if pieces is None:
            self._put(t.pieces, operation_id, {})
            pieces = t.pieces[operation_id]
        if offset in pieces:
            raise StorageError(f"storage failed: operation {operation_id} has a piece at offset {offset} already")
        self._put(pieces, offset, text)

    def delete_partial_pieces(self, operation_id: str) -> None:
        self._delete(self._t.pieces, operation_id)

    def partial_text(self, operation_id: str) -> str:
        pieces = self._t.pieces.get(operation_id, {})
        return "".join(pieces[offset] for offset in sorted(pieces))

    def run_partials_from(self, run_id: str, from_operation_id: str | None, limit: int) -> list[PartialHead]:
        first = 0
        if from_operation_id is not None:
            start = self._t.partials.get(from_operation_id)
            if start is None:
                return []
            first = start.order
        ordered = (stored.head for stored in self._ordered_partials() if stored.order >= first)
        return [head for head in ordered if head.run_id == run_id][:limit]

    def _ordered_partials(self) -> list[_Partial]:
        return sorted(self._t.partials.values(), key=lambda stored: stored.order)

    def partial_piece_count(self) -> int:
        """Pieces stored in all (for tests of the bounds)."""
        return sum(len(pieces) for pieces in self._t.pieces.values())

"""The stored shape of partial output and what the core needs of the store for it (``_partials`` uses them,
``_ports.Store`` includes them); apart from ``_partials`` so that ``_ports`` imports nothing of the run logic."""

from __future__ import annotations

from typing import Protocol

import attrs

from protocol import PartialStatus


@attrs.frozen(kw_only=True)
class PartialHead:
    """The stored state of one operation's partial output: its current attempt, where that attempt's intent was
    committed (``intent_seq``, which tells a new attempt from the same one after ``retry_run`` restarts the
    numbering), its status, its size so far and how many pieces are stored."""

    operation_id: str
    run_id: str
    conversation_id: str
    attempt: int
    intent_seq: int
    status: PartialStatus
    chars: int
    size_bytes: int
    pieces: int
    seq: int
    created_at_ms: int
    updated_at_ms: int


class PartialStore(Protocol):
    """What the partial output needs of the store (``storage_owner.store._partials`` implements it)."""

    def partial(self, operation_id: str) -> PartialHead | None: ...

    def held_partials(self) -> list[PartialHead]:
        """Heads whose pieces are stored or that still stream (read once, at start)."""
        ...

    def put_partial(self, head: PartialHead) -> None:
        """Insert or update a head (an update keeps its place in :meth:`run_partials`)."""
        ...

    def insert_partial_piece(self, operation_id: str, offset: int, text: str) -> None: ...

    def delete_partial_pieces(self, operation_id: str) -> None: ...

    def partial_text(self, operation_id: str) -> str:
        """The stored pieces joined, in offset order."""
        ...

    def run_partials(self, run_id: str) -> list[PartialHead]:
        """A run's heads, in the order their operations first streamed."""
        ...

    def run_partials_from(self, run_id: str, from_operation_id: str | None, limit: int) -> list[PartialHead]:
        """Up to ``limit`` of :meth:`run_partials`, from ``from_operation_id`` (included; ``None``: the first)."""
        ...

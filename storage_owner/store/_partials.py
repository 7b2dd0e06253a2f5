"""The SQL of partial output (the :class:`~storage_owner.core.PartialStore` port of ``storage_owner.core._partials``): a
mixin of :class:`~storage_owner.store.SqliteStore`."""

from __future__ import annotations

from typing import Any, Final

import apsw

from storage_owner.core import PartialHead

_COLUMNS: Final = (
    "operation_id, run_id, conversation_id, attempt, intent_seq, status, chars, size_bytes, pieces, seq, "
    "created_at_ms, updated_at_ms"
)


def _head(row: Any) -> PartialHead:
    return PartialHead(
        operation_id=row[0],
        run_id=row[1],
        conversation_id=row[2],
        attempt=row[3],
        intent_seq=row[4],
        status=row[5],
        chars=row[6],
        size_bytes=row[7],
        pieces=row[8],
        seq=row[9],
        created_at_ms=row[10],
        updated_at_ms=row[11],
    )


class PartialsSql:
    """Partial output's tables: ``partials`` (one row per operation) and ``partial_pieces``."""

    _db: apsw.Connection

    def partial(self, operation_id: str) -> PartialHead | None:
        row = self._db.execute(f"SELECT {_COLUMNS} FROM partials WHERE operation_id = ?", (operation_id,)).fetchone()
        return None if row is None else _head(row)

    def held_partials(self) -> list[PartialHead]:
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM partials WHERE pieces > 0 OR status = 'streaming'")
        return [_head(row) for row in rows]

    def put_partial(self, head: PartialHead) -> None:
        # An upsert keeps the row (and its rowid, the order of a run's partials) when a later attempt replaces it.
        self._db.execute(
            f"INSERT INTO partials ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (operation_id) DO UPDATE SET attempt = excluded.attempt, intent_seq = excluded.intent_seq, "
            "status = excluded.status, chars = excluded.chars, size_bytes = excluded.size_bytes, "
            "pieces = excluded.pieces, seq = excluded.seq, created_at_ms = excluded.created_at_ms, "
            "updated_at_ms = excluded.updated_at_ms",
            (
                head.operation_id,
                head.run_id,
                head.conversation_id,
                head.attempt,
                head.intent_seq,
                head.status,
                head.chars,
                head.size_bytes,
                head.pieces,
                head.seq,
                head.created_at_ms,
                head.updated_at_ms,
            ),
        )

    def insert_partial_piece(self, operation_id: str, offset: int, text: str) -> None:
        self._db.execute(
            "INSERT INTO partial_pieces (operation_id, char_offset, text) VALUES (?, ?, ?)",
            (operation_id, offset, text),
        )

    def delete_partial_pieces(self, operation_id: str) -> None:
        self._db.execute("DELETE FROM partial_pieces WHERE operation_id = ?", (operation_id,))

    def partial_text(self, operation_id: str) -> str:
        rows = self._db.execute(
            "SELECT text FROM partial_pieces WHERE operation_id = ? ORDER BY char_offset", (operation_id,)
        )
        return "".join(row[0] for row in rows)

    def run_partials_from(self, run_id: str, from_operation_id: str | None, limit: int) -> list[PartialHead]:
        if from_operation_id is None:
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM partials WHERE run_id = ? ORDER BY rowid LIMIT ?", (run_id, limit)
            )
        else:
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM partials WHERE run_id = ? AND rowid >= "
                "(SELECT rowid FROM partials WHERE operation_id = ?) ORDER BY rowid LIMIT ?",
                (run_id, from_operation_id, limit),
            )
        return [_head(row) for row in rows]

    def partial_piece_count(self) -> int:
        """Pieces stored in all (for tests of the bounds)."""
        return int(self._db.execute("SELECT COUNT(*) FROM partial_pieces").fetchone()[0])  # type: ignore[index]

"""The SQL of the commit log and the owner's settings (the :class:`~storage_owner.core.LogStore` port of
``storage_owner.core._unit``, ``_watches`` and ``_owner``): a mixin of :class:`~storage_owner.store.SqliteStore`. The
port's savepoints are the store's own, with its transaction (they drop what every rollback drops)."""

from __future__ import annotations

import apsw

from storage_owner.core import LoggedCommit

from ._blobs import RECORDS, pack, structure_records, unpack, unstructure_records


class LogSql:
    """The ``commits`` and ``meta`` tables."""

    _db: apsw.Connection

    # ----------------------------------------------------------------------------------------- commit log

    def head_seq(self) -> int:
        row = self._db.execute("SELECT MAX(seq) FROM commits").fetchone()
        return 0 if row is None or row[0] is None else int(row[0])

    def log_commit(self, commit: LoggedCommit, conversation_ids: frozenset[str]) -> bytes:
        blob = pack(unstructure_records(commit.records))
        only = next(iter(conversation_ids)) if len(conversation_ids) == 1 else None
        self._db.execute(
            "INSERT INTO commits (seq, conversation_id, committed_at_ms, records) VALUES (?, ?, ?, ?)",
            (commit.seq, only, commit.committed_at_ms, blob),
        )
        return blob

    def read_log(
        self, after_seq: int, conversation_id: str | None, limit: int, *, until_seq: int | None = None
    ) -> list[LoggedCommit]:
        """Commits with ``after_seq < seq <= until_seq`` (no upper bound when ``None``), oldest first, at most
        ``limit``. With ``conversation_id``, only commits that may touch it: its own, and those that touched
        several conversations (their records still need filtering)."""
        until = (1 << 62) if until_seq is None else until_seq
        if conversation_id is None:
            rows = self._db.execute(
                "SELECT seq, committed_at_ms, records FROM commits WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
                (after_seq, until, limit),
            )
        else:
            rows = self._db.execute(
                "SELECT seq, committed_at_ms, records FROM commits WHERE seq > ? AND seq <= ? "
                "AND (conversation_id = ? OR conversation_id IS NULL) ORDER BY seq LIMIT ?",
                (after_seq, until, conversation_id, limit),
            )
        return [
            LoggedCommit(seq=seq, committed_at_ms=at_ms, records=structure_records(unpack(blob), RECORDS))
            for seq, at_ms, blob in rows
        ]

    # ----------------------------------------------------------------------------------------------- meta

    def get_meta(self, key: str) -> int | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else int(row[0])

    def set_meta(self, key: str, value: int) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

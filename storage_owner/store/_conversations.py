"""The SQL of conversations, their entries and documents, and submissions (the
:class:`~storage_owner.core.ConversationStore` port of ``storage_owner.core._conversations``): a mixin of
:class:`~storage_owner.store.SqliteStore`."""

from __future__ import annotations

from typing import Any, Final

import apsw
import attrs

from protocol import (
    RESET_ENTRY,
    ConversationRecord,
    DocumentRecord,
    EntryRecord,
    JsonValue,
    Order,
    RunAnswer,
    SubmissionRecord,
)
from storage_owner.core import StoreConflict

from ._blobs import pack, unpack
from ._schema import GLOBAL_SCOPE

# A submission's columns: SubmissionRecord's fields in its order; payload and answer are msgpack.
_SUBMISSION_FIELDS: Final = tuple(field.name for field in attrs.fields(SubmissionRecord))
_SUBMISSION_COLUMNS: Final = ", ".join(_SUBMISSION_FIELDS)


def _submission_row(record: SubmissionRecord) -> tuple[object, ...]:
    values: list[object] = []
    for name in _SUBMISSION_FIELDS:
        value = getattr(record, name)
        if name in ("payload", "entry"):
            value = None if name == "entry" and value is None else pack(value)
        elif name == "answer":
            value = None if value is None else pack(attrs.asdict(value))
        values.append(value)
    return tuple(values)


def _submission_record(row: Any) -> SubmissionRecord:
    values = dict(zip(_SUBMISSION_FIELDS, row, strict=True))
    values["payload"] = unpack(values["payload"])
    values["entry"] = None if values["entry"] is None else unpack(values["entry"])
    answer = values["answer"]
    values["answer"] = None if answer is None else RunAnswer(**unpack(answer))
    return SubmissionRecord(**values)


class ConversationsSql:
    """The ``conversations``, ``entries``, ``documents`` and ``submissions`` tables."""

    _db: apsw.Connection

    # -------------------------------------------------------------------------------------- conversations

    def insert_conversation(self, record: ConversationRecord) -> None:
        try:
            self._db.execute(
                "INSERT INTO conversations (conversation_id, created_at_ms, seq, owner_task_id, agent) "
                "VALUES (?, ?, ?, ?, ?)",
                (record.conversation_id, record.created_at_ms, record.seq, record.owner_task_id, record.agent),
            )
        except apsw.ConstraintError as exc:
            raise StoreConflict("conversation", record.conversation_id) from exc

    def conversation(self, conversation_id: str) -> ConversationRecord | None:
        row = self._db.execute(
            "SELECT created_at_ms, seq, (SELECT COALESCE(MAX(position) + 1, 0) FROM entries "
            "WHERE conversation_id = ?1), owner_task_id, agent FROM conversations WHERE conversation_id = ?1",
            (conversation_id,),
        ).fetchone()
        if row is None:
            return None
        created_at_ms, seq, entry_count, owner_task_id, agent = row
        return ConversationRecord(
            conversation_id=conversation_id,
            created_at_ms=created_at_ms,
            seq=seq,
            entry_count=entry_count,
            owner_task_id=owner_task_id,
            agent=agent,
        )

    def conversation_count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM conversations").fetchone()[0])  # type: ignore[index]

    # -------------------------------------------------------------------------------------------- entries

    def next_entry_position(self, conversation_id: str) -> int | None:
        row = self._db.execute(
            "SELECT (SELECT COALESCE(MAX(position) + 1, 0) FROM entries WHERE conversation_id = ?1) "
            "FROM conversations WHERE conversation_id = ?1",
            (conversation_id,),
        ).fetchone()
        return None if row is None else int(row[0])

    def insert_entry(self, record: EntryRecord) -> None:
        try:
            self._db.execute(
                "INSERT INTO entries "
                "(conversation_id, position, entry_id, seq, kind, data, created_at_ms, model, head) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.conversation_id,
                    record.position,
                    record.entry_id,
                    record.seq,
                    record.kind,
                    pack(record.data),
                    record.created_at_ms,
                    None if record.model is None else pack(record.model),
                    record.head,
                ),
            )
        except apsw.ConstraintError as exc:
            raise StoreConflict("entry", record.entry_id) from exc

    def entries(self, conversation_id: str, order: Order, cursor: int | None, limit: int) -> list[EntryRecord]:
        return self.entry_page(conversation_id, order, cursor, limit)[0]

    def entry_page(
        self, conversation_id: str, order: Order, cursor: int | None, limit: int, *, max_data_bytes: int | None = None
    ) -> tuple[list[EntryRecord], bool]:
        """Up to ``limit`` entries after (``asc``) or before (``desc``) the exclusive ``cursor``, and whether more
        follow. With ``max_data_bytes`` the page also ends before the entry that would take the stored data past
        that many bytes (it always holds at least one entry)."""
        columns = "position, entry_id, seq, kind, data, created_at_ms, model, head"
        if order == "asc":
            rows = self._db.execute(
                f"SELECT {columns} FROM entries WHERE conversation_id = ? AND position > ? ORDER BY position LIMIT ?",
                (conversation_id, -1 if cursor is None else cursor, limit + 1),
            )
        else:
            rows = self._db.execute(
                f"SELECT {columns} FROM entries WHERE conversation_id = ? AND position < ? "
                "ORDER BY position DESC LIMIT ?",
                (conversation_id, (1 << 62) if cursor is None else cursor, limit + 1),
            )
        page: list[EntryRecord] = []
        total_bytes = 0
        for position, entry_id, seq, kind, data, created_at_ms, model, head in rows:
            total_bytes += len(data) + (0 if model is None else len(model))
            if len(page) == limit or (page and max_data_bytes is not None and total_bytes > max_data_bytes):
                return page, True
            page.append(
                EntryRecord(
                    entry_id=entry_id,
                    conversation_id=conversation_id,
                    position=position,
                    seq=seq,
                    kind=kind,
                    data=unpack(data),
                    created_at_ms=created_at_ms,
                    model=JsonValue(None if model is None else unpack(model)),
                    head=head,
                )
            )
        return page, False

    def entry_position(self, conversation_id: str, entry_id: str) -> int | None:
        row = self._db.execute(
            "SELECT position FROM entries WHERE entry_id = ? AND conversation_id = ?", (entry_id, conversation_id)
        ).fetchone()
        return None if row is None else int(row[0])

    def context_start(self, conversation_id: str) -> int:
        """Where the model's context of the conversation starts: after its last reset entry, or at the head its last
        entry naming one named, whichever is later (0: at its first entry)."""
        row = self._db.execute(
            "SELECT MAX(start) FROM ("
            f"SELECT position + 1 AS start FROM entries WHERE conversation_id = ?1 AND kind = '{RESET_ENTRY}' "
            "UNION ALL SELECT h.position FROM entries AS e JOIN entries AS h ON h.entry_id = e.head "
            "WHERE e.conversation_id = ?1 AND e.head IS NOT NULL)",
            (conversation_id,),
        ).fetchone()
        return 0 if row is None or row[0] is None else int(row[0])

    def entry_count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM entries").fetchone()[0])  # type: ignore[index]

    # ------------------------------------------------------------------------------------------ documents

    def document(self, conversation_id: str | None, name: str) -> DocumentRecord | None:
        scope = GLOBAL_SCOPE if conversation_id is None else conversation_id
        row = self._db.execute(
            "SELECT version, value, seq, updated_at_ms FROM documents WHERE scope = ? AND name = ?",
            (scope, name),
        ).fetchone()
        if row is None:
            return None
        version, value, seq, updated_at_ms = row
        return DocumentRecord(
            conversation_id=conversation_id,
            name=name,
            version=version,
            value=unpack(value),
            seq=seq,
            updated_at_ms=updated_at_ms,
        )

    def put_document(self, record: DocumentRecord) -> None:
        scope = GLOBAL_SCOPE if record.conversation_id is None else record.conversation_id
        self._db.execute(
            "INSERT OR REPLACE INTO documents (scope, name, version, value, seq, updated_at_ms) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (scope, record.name, record.version, pack(record.value), record.seq, record.updated_at_ms),
        )

    # ---------------------------------------------------------------------------------------- submissions

    def submission(self, conversation_id: str, request_id: str) -> SubmissionRecord | None:
        row = self._db.execute(
            f"SELECT {_SUBMISSION_COLUMNS} FROM submissions WHERE conversation_id = ? AND request_id = ?",
            (conversation_id, request_id),
        ).fetchone()
        return None if row is None else _submission_record(row)

    def submission_by_id(self, submission_id: str) -> SubmissionRecord | None:
        row = self._db.execute(
            f"SELECT {_SUBMISSION_COLUMNS} FROM submissions WHERE submission_id = ?", (submission_id,)
        ).fetchone()
        return None if row is None else _submission_record(row)

    def open_submissions(self) -> list[SubmissionRecord]:
        rows = self._db.execute(
            f"SELECT {_SUBMISSION_COLUMNS} FROM submissions WHERE status IN ('queued', 'placed') "
            "ORDER BY created_seq, submission_id"
        ).fetchall()
        return [_submission_record(row) for row in rows]

    def unanswered_of_run(self, conversation_id: str, run_id: str) -> list[SubmissionRecord]:
        rows = self._db.execute(
            f"SELECT {_SUBMISSION_COLUMNS} FROM submissions WHERE conversation_id = ? AND run_id = ? "
            "AND status = 'unanswered' ORDER BY created_seq, submission_id",
            (conversation_id, run_id),
        ).fetchall()
        return [_submission_record(row) for row in rows]

    def submission_page(
        self, conversation_id: str, after_submission_id: str | None, limit: int
    ) -> tuple[list[SubmissionRecord], bool]:
        after = (-1, "")
        if after_submission_id is not None:
            row = self._db.execute(
                "SELECT created_seq, submission_id FROM submissions WHERE submission_id = ? AND conversation_id = ?",
                (after_submission_id, conversation_id),
            ).fetchone()
            if row is not None:
                after = (row[0], row[1])
        rows = self._db.execute(
            f"SELECT {_SUBMISSION_COLUMNS} FROM submissions WHERE conversation_id = ? "
            "AND (created_seq, submission_id) > (?, ?) ORDER BY created_seq, submission_id LIMIT ?",
            (conversation_id, *after, limit + 1),
        ).fetchall()
        return [_submission_record(row) for row in rows[:limit]], len(rows) > limit

    def insert_submission(self, record: SubmissionRecord) -> None:
        try:
            self._db.execute(
                f"INSERT INTO submissions ({_SUBMISSION_COLUMNS}, created_seq) "
                f"VALUES ({', '.join('?' * (len(_SUBMISSION_FIELDS) + 1))})",
                (*_submission_row(record), record.seq),
            )
        except apsw.ConstraintError as exc:
            raise StoreConflict("submission", record.submission_id) from exc

    def update_submission(self, record: SubmissionRecord) -> None:
        self._db.execute(
            "UPDATE submissions SET status = ?, seq = ?, run_id = ?, reason = ?, answer = ? WHERE submission_id = ?",
            (
                record.status,
                record.seq,
                record.run_id,
                record.reason,
                None if record.answer is None else pack(attrs.asdict(record.answer)),
                record.submission_id,
            ),
        )

"""The memory store's conversations, entries, documents and submissions (the
:class:`~storage_owner.core.ConversationStore` port) over its tables: a mixin of
:class:`~storage_owner.store.MemoryStore`, the twin of ``_conversations``'s SQL."""

from __future__ import annotations

import bisect

import attrs

from protocol import RESET_ENTRY, ConversationRecord, DocumentRecord, EntryRecord, JsonValue, Order, SubmissionRecord
from storage_owner.core import StoreConflict

from ._blobs import pack, unpack
from ._memory_tables import _BEYOND, Journaled, _Entry
from ._schema import GLOBAL_SCOPE


class ConversationsMemory(Journaled):
    """Conversations, their entries and documents, and submissions."""

    # -------------------------------------------------------------------------------------- conversations

    def insert_conversation(self, record: ConversationRecord) -> None:
        t = self._t
        if record.conversation_id in t.conversations:
            raise StoreConflict("conversation", record.conversation_id)
        self._put(t.conversations, record.conversation_id, attrs.evolve(record, entry_count=0))

    def conversation(self, conversation_id: str) -> ConversationRecord | None:
        record = self._t.conversations.get(conversation_id)
        if record is None:
            return None
        return attrs.evolve(record, entry_count=self._next_position(conversation_id))

    def _next_position(self, conversation_id: str) -> int:
        positions = self._t.positions.get(conversation_id)
        return positions[-1] + 1 if positions else 0

    def conversation_count(self) -> int:
        return len(self._t.conversations)

    # -------------------------------------------------------------------------------------------- entries

    def next_entry_position(self, conversation_id: str) -> int | None:
        if conversation_id not in self._t.conversations:
            return None
        return self._next_position(conversation_id)

    def insert_entry(self, record: EntryRecord) -> None:
        t = self._t
        entries = t.entries.get(record.conversation_id)
        if record.entry_id in t.entry_ids or (entries is not None and record.position in entries):
            raise StoreConflict("entry", record.entry_id)
        if entries is None:
            self._put(t.entries, record.conversation_id, {})
            self._put(t.positions, record.conversation_id, [])
            entries = t.entries[record.conversation_id]
        model = None if record.model is None else pack(record.model)
        entry = _Entry(
            record.entry_id, record.seq, record.kind, pack(record.data), record.created_at_ms, model, record.head
        )
        self._put(entries, record.position, entry)
        self._insert_sorted(t.positions[record.conversation_id], record.position)
        self._put(t.entry_ids, record.entry_id, record.conversation_id)

    def entry_page(
        self, conversation_id: str, order: Order, cursor: int | None, limit: int, *, max_data_bytes: int | None = None
    ) -> tuple[list[EntryRecord], bool]:
        t = self._t
        positions = t.positions.get(conversation_id, [])
        entries = t.entries.get(conversation_id, {})
        if order == "asc":
            chosen = range(bisect.bisect_right(positions, -1 if cursor is None else cursor), len(positions))
        else:
            chosen = range(bisect.bisect_left(positions, _BEYOND if cursor is None else cursor) - 1, -1, -1)
        page: list[EntryRecord] = []
        total_bytes = 0
        for index in chosen:  # no copy of the transcript's positions
            position = positions[index]
            entry = entries[position]
            total_bytes += len(entry.data) + (0 if entry.model is None else len(entry.model))
            if len(page) == limit or (page and max_data_bytes is not None and total_bytes > max_data_bytes):
                return page, True
            page.append(
                EntryRecord(
                    entry_id=entry.entry_id,
                    conversation_id=conversation_id,
                    position=position,
                    seq=entry.seq,
                    kind=entry.kind,
                    data=unpack(entry.data),
                    created_at_ms=entry.created_at_ms,
                    model=JsonValue(None if entry.model is None else unpack(entry.model)),
                    head=entry.head,
                )
            )
        return page, False

    def entry_position(self, conversation_id: str, entry_id: str) -> int | None:
        if self._t.entry_ids.get(entry_id) != conversation_id:
            return None
        for position, entry in self._t.entries[conversation_id].items():
            if entry.entry_id == entry_id:
                return position
        return None

    def context_start(self, conversation_id: str) -> int:
        start = 0
        for position, entry in self._t.entries.get(conversation_id, {}).items():
            if entry.kind == RESET_ENTRY:
                start = max(start, position + 1)
            elif entry.head is not None:
                start = max(start, self.entry_position(conversation_id, entry.head) or 0)
        return start

    def entry_count(self) -> int:
        return len(self._t.entry_ids)

    # ------------------------------------------------------------------------------------------ documents

    def document(self, conversation_id: str | None, name: str) -> DocumentRecord | None:
        scope = GLOBAL_SCOPE if conversation_id is None else conversation_id
        stored = self._t.documents.get((scope, name))
        if stored is None:
            return None
        version, value, seq, updated_at_ms = stored
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
        stored = (record.version, pack(record.value), record.seq, record.updated_at_ms)
        self._put(self._t.documents, (scope, record.name), stored)

    # ---------------------------------------------------------------------------------------- submissions

    def submission(self, conversation_id: str, request_id: str) -> SubmissionRecord | None:
        submission_id = self._t.requests.get((conversation_id, request_id))
        return None if submission_id is None else self.submission_by_id(submission_id)

    def submission_by_id(self, submission_id: str) -> SubmissionRecord | None:
        stored = self._t.submissions.get(submission_id)
        if stored is None:
            return None
        record, payload = stored
        return attrs.evolve(record, payload=unpack(payload))

    def open_submissions(self) -> list[SubmissionRecord]:
        # Insertion order is creation order: a dict keeps it, and an update replaces a value in place.
        return [
            attrs.evolve(record, payload=unpack(payload))
            for record, payload in self._t.submissions.values()
            if record.status in ("queued", "placed")
        ]

    def unanswered_of_run(self, conversation_id: str, run_id: str) -> list[SubmissionRecord]:
        return [
            attrs.evolve(record, payload=unpack(payload))
            for record, payload in self._t.submissions.values()
            if record.conversation_id == conversation_id and record.run_id == run_id and record.status == "unanswered"
        ]

    def submission_page(
        self, conversation_id: str, after_submission_id: str | None, limit: int
    ) -> tuple[list[SubmissionRecord], bool]:
        found = [
            attrs.evolve(record, payload=unpack(payload))
            for record, payload in self._t.submissions.values()
            if record.conversation_id == conversation_id
        ]
        ids = [record.submission_id for record in found]
        if after_submission_id in ids:
            found = found[ids.index(after_submission_id) + 1 :]
        return found[:limit], len(found) > limit

    def insert_submission(self, record: SubmissionRecord) -> None:
        t = self._t
        key = (record.conversation_id, record.request_id)
        if record.submission_id in t.submissions or key in t.requests:
            raise StoreConflict("submission", record.submission_id)
        self._put(t.submissions, record.submission_id, (record, pack(record.payload)))
        self._put(t.requests, key, record.submission_id)

    def update_submission(self, record: SubmissionRecord) -> None:
        t = self._t
        stored = t.submissions.get(record.submission_id)
        assert stored is not None, f"submission {record.submission_id} is not stored"
        self._put(t.submissions, record.submission_id, (record, stored[1]))

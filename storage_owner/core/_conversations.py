"""Conversations, sans-IO: conversations, their transcripts (entries) and documents, and the submissions handed to
them (docs/runs.md, "Conversations and submissions").

1. A conversation is created by a commit, owned by nobody or by a live task that may still own new work (a
   subagent's transcript: it starts with the configuration of its owner's conversation, ``_config`` rule 4); its id
   is unique, and its agent binding never changes.
2. An entry takes its conversation's next position in the commit that appends it; an entry id is unique. Kinds
   under ``tether.`` are the runtime's: only a run's own tasks write them (``_runs``).
3. A document (per conversation, or global) is versioned: each put is the next version; a put naming another
   expected version than the stored one is a ``conflict``.
4. A submission's ``(conversation, request_id)`` is looked up before any other check or write: the same kind and
   payload return the original, anything else is a ``conflict``. An ``input`` to a conversation bound to an agent
   admits a queued run in the same commit (``_runs``); its one fallible write is its first, the submission's insert.

What becomes of a submission after rule 4 (queued, placed, done, unanswered; steers, writes, withdrawal) is the
inbox's (``_inbox``), whose :data:`~._inbox.SUBMISSION_TRANSITIONS` ``docs/runs.md`` prints.
"""

from __future__ import annotations

import uuid
from typing import Final

import attrs

from protocol import (
    AGENT_TASK_PREFIX,
    RESERVED_ENTRY_PREFIX,
    AbortConversation,
    AbortTask,
    AppendEntry,
    Configure,
    ConversationAborted,
    ConversationRecord,
    ConversationReply,
    CreateConversation,
    DocumentRecord,
    DocumentReply,
    EntriesReply,
    EntryRecord,
    ErrorCode,
    Frame,
    JsonValue,
    LeaseRef,
    PutDocument,
    ReadConversation,
    ReadDocument,
    ReadEntries,
    ReadSubmission,
    ReadSubmissions,
    SubmissionRecord,
    SubmissionReply,
    SubmissionsReply,
    Submit,
    Submitted,
    SubmitWrite,
    Withdraw,
    Withdrawn,
)

from ._checks import (
    MAX_CURSOR,
    Refusal,
    check_id,
    check_limit,
    check_name,
    missing_conversation,
    no_conversation,
    same_json,
)
from ._inbox import CONTINUE_KIND, INPUT_KIND, RESET_KIND, VISIBLE_KEYS, WRITE_KIND, EntrySpec, Inbox, write_entry
from ._output import READ_BUDGET_BYTES, PeerId, fit_page
from ._ports import ConversationStore, StoreConflict
from ._runs import Runs
from ._tasks import TaskEngine
from ._unit import Journal, UnitOfWork

MAX_CACHED_POSITIONS: Final = 100_000
"""Conversations whose next entry position the core remembers (the cache is dropped whole past this)."""
MAX_REQUEST_ID_CHARS: Final = 200
SUBMISSION_QUEUED: Final = "queued"
SUBMISSION_DONE: Final = "done"
MAX_HANDOFF_BYTES: Final = 1 << 20
MAX_MODEL_MESSAGES: Final = 64
MAX_MODEL_TEXT_BYTES: Final = 1 << 20
WRITE_KEYS: Final = frozenset({"kind", "data", *VISIBLE_KEYS})
ENTRY_KEYS: Final = frozenset({"kind", "data"})
_WRITE_IDS: Final = uuid.UUID("6a2e9f4c-1b7d-4e0a-9c3f-5d8b2e1a7f60")


def _check_reset(request: Submit) -> None:
    """A reset's payload: nothing, or ``{"handoff": TEXT}`` (the first user message of the new context)."""
    payload = request.payload
    if payload is None:
        return
    handoff = payload.get("handoff") if isinstance(payload, dict) and set(payload) <= {"handoff"} else False
    if handoff is not None and (not isinstance(handoff, str) or not 1 <= len(handoff.encode()) <= MAX_HANDOFF_BYTES):
        message = (
            f'a reset\'s payload is null or {{"handoff": TEXT}}, TEXT 1 byte to {MAX_HANDOFF_BYTES} bytes; nothing '
            "was written"
        )
        raise Refusal(ErrorCode.INVALID, message)


def _check_entry(value: JsonValue, where: str, keys: frozenset[str]) -> dict[str, JsonValue]:
    """An entry the application asks for (a write's payload, an input's ``entry``): an object of ``keys`` with a
    ``kind`` of the application's; refused (nothing written) otherwise."""
    if not isinstance(value, dict) or set(value) - keys or not isinstance(value.get("kind"), str):
        shape = ", ".join(sorted(keys - {"kind"}))
        message = (
            f'{where} is {{"kind": KIND, ...}} with at most {shape} besides, not '
            f"{type(value).__name__ if not isinstance(value, dict) else sorted(value)}; nothing was written"
        )
        raise Refusal(ErrorCode.INVALID, message)
    kind = value["kind"]
    check_name(kind, f"{where}.kind")
    if kind.startswith(RESERVED_ENTRY_PREFIX):
        message = (
            f"{where}.kind {kind!r}: entry kinds under {RESERVED_ENTRY_PREFIX!r} are the runtime's; give the entry a "
            "kind of your own (such as 'app.note'); nothing was written"
        )
        raise Refusal(ErrorCode.INVALID, message)
    return value


def _check_model(value: JsonValue, where: str) -> None:
    """What a model sees of an entry: 1 to :data:`MAX_MODEL_MESSAGES` messages ``{"role": "user" | "assistant",
    "text": TEXT}``, each text 1 byte to :data:`MAX_MODEL_TEXT_BYTES`."""
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_MODEL_MESSAGES:
        raise Refusal(
            ErrorCode.INVALID, f"{where} is a list of 1 to {MAX_MODEL_MESSAGES} messages; nothing was written"
        )
    for index, message in enumerate(value):
        text = message.get("text") if isinstance(message, dict) else None
        if (
            not isinstance(message, dict)
            or set(message) != {"role", "text"}
            or message["role"] not in ("user", "assistant")
            or not isinstance(text, str)
            or not 1 <= len(text.encode()) <= MAX_MODEL_TEXT_BYTES
        ):
            message_text = (
                f'{where}[{index}] is {{"role": "user" | "assistant", "text": TEXT}}, TEXT 1 byte to '
                f"{MAX_MODEL_TEXT_BYTES} bytes; nothing was written"
            )
            raise Refusal(ErrorCode.INVALID, message_text)


class Entries:
    """Where each conversation's next entry goes: the position, cached per conversation (a read saved per append).
    A refused request drops the cache whole (``_unit``): it is filled again from the store."""

    def __init__(self, store: ConversationStore, journal: Journal) -> None:
        self._store = store
        self.next: dict[str, int] = {}
        """The next position per conversation, advanced by every append (read in place on the hot path)."""
        journal.cache(self.next.clear)

    def stored_position(self, conversation_id: str) -> int | None:
        """The conversation's next position as stored (``None``: no such conversation), cached from now on."""
        position = self._store.next_entry_position(conversation_id)
        if position is not None and len(self.next) >= MAX_CACHED_POSITIONS:
            self.next.clear()
        return position

    def place(self, conversation_id: str, entry_id: str, spec: EntrySpec, seq: int, now_ms: int) -> EntryRecord:
        """Append an entry the owner writes itself (a submission's: an input's, a reset's, a write's) at the next
        position."""
        position = self.next.get(conversation_id)
        if position is None:
            position = self.stored_position(conversation_id)
            assert position is not None, f"conversation {conversation_id} is not stored"
        entry = EntryRecord(
            entry_id=entry_id,
            conversation_id=conversation_id,
            position=position,
            seq=seq,
            kind=spec.kind,
            data=spec.data,
            created_at_ms=now_ms,
            model=spec.model,
            head=spec.head,
        )
        self._store.insert_entry(entry)
        self.next[conversation_id] = position + 1
        return entry


class Conversations:
    """The conversations of one store: their writes, reads and submissions. See the module docstring."""

    def __init__(self, store: ConversationStore, entries: Entries, tasks: TaskEngine, runs: Runs, inbox: Inbox) -> None:
        self._store = store
        self._inbox = inbox
        self._entries = entries
        self._next = entries.next
        self._tasks = tasks
        self._runs = runs

    # ---------------------------------------------------------------------------------------- commit writes

    def apply_create(self, unit: UnitOfWork, write: CreateConversation, where: str, lease: LeaseRef | None) -> int:
        """Rule 1."""
        check_id(write.conversation_id, f"{where}.conversation_id")
        if write.agent is not None:
            check_name(write.agent, f"{where}.agent")
        if write.owner_task_id is not None:
            self._tasks.check_conversation_owner(write.owner_task_id, where)
        conversation = ConversationRecord(
            conversation_id=write.conversation_id,
            created_at_ms=unit.now_ms,
            seq=unit.seq,
            entry_count=0,
            owner_task_id=write.owner_task_id,
            agent=write.agent,
        )
        try:
            self._store.insert_conversation(conversation)
        except StoreConflict as exc:
            raise Refusal(ErrorCode.DUPLICATE, f"{where}: conversation {exc.key} already exists") from exc
        unit.records.append(conversation)
        if write.owner_task_id is not None:
            self._tasks.conversation_created(write.conversation_id, write.owner_task_id)
            owner = self._tasks.record(write.owner_task_id)
            assert owner is not None, "check_conversation_owner() found it live"
            source = self._store.conversation(owner.conversation_id) if owner.conversation_id else None
            same_agent = source is not None and source.agent == write.agent
            self._inbox.config.inherit(unit, write.conversation_id, owner.conversation_id, same_agent)
        return 0

    def apply_append(self, unit: UnitOfWork, write: AppendEntry, where: str, lease: LeaseRef | None) -> int:
        """Rule 2; the result is the entry's position. The hot path: a commit of one entry."""
        conversation_id = write.conversation_id
        check_id(conversation_id, f"{where}.conversation_id")
        check_id(write.entry_id, f"{where}.entry_id")
        check_name(write.kind, f"{where}.kind")
        if write.kind.startswith(RESERVED_ENTRY_PREFIX):
            self._runs.check_run_entry(conversation_id, write.kind, lease, where)
        position = self._next.get(conversation_id)
        if position is None:
            position = self._entries.stored_position(conversation_id)
            if position is None:
                raise missing_conversation(conversation_id)
        entry = EntryRecord(
            entry_id=write.entry_id,
            conversation_id=conversation_id,
            position=position,
            seq=unit.seq,
            kind=write.kind,
            data=write.data,
            created_at_ms=unit.now_ms,
        )
        try:
            self._store.insert_entry(entry)
        except StoreConflict as exc:
            raise Refusal(ErrorCode.DUPLICATE, f"{where}: entry id {exc.key} already exists") from exc
        self._next[conversation_id] = position + 1
        unit.records.append(entry)
        return position

    def apply_put_document(self, unit: UnitOfWork, write: PutDocument, where: str, lease: LeaseRef | None) -> int:
        """Rule 3; the result is the document's new version. Names under ``tether.`` are the owner's (a
        conversation's configuration is written by ``configure``)."""
        check_name(write.name, f"{where}.name")
        if write.name.startswith(RESERVED_ENTRY_PREFIX):
            message = (
                f"{where}.name {write.name!r}: document names under {RESERVED_ENTRY_PREFIX!r} are the owner's (a "
                "conversation's configuration is changed with configure); nothing of the commit was written"
            )
            raise Refusal(ErrorCode.INVALID, message)
        if write.conversation_id is not None:
            check_id(write.conversation_id, f"{where}.conversation_id")
            if self._store.conversation(write.conversation_id) is None:
                raise missing_conversation(write.conversation_id)
        current = self._store.document(write.conversation_id, write.name)
        current_version = 0 if current is None else current.version
        if write.expected_version is not None and write.expected_version != current_version:
            raise Refusal(
                ErrorCode.CONFLICT,
                f"{where}: document {write.name!r} is at version {current_version}, "
                f"not the expected {write.expected_version}",
            )
        document = DocumentRecord(
            conversation_id=write.conversation_id,
            name=write.name,
            version=current_version + 1,
            value=write.value,
            seq=unit.seq,
            updated_at_ms=unit.now_ms,
        )
        self._store.put_document(document)
        unit.records.append(document)
        return document.version

    # ---------------------------------------------------------------------------------------------- submit

    def apply_submit(self, unit: UnitOfWork, write: SubmitWrite, where: str, lease: LeaseRef | None) -> int:
        """A ``submit`` inside a commit (``tx.submit``): the same rules as the request, atomically with the commit's
        other writes; 1 if it was admitted now, 0 for a repeated request id."""
        request = Submit(**attrs.asdict(write, recurse=False))  # the same fields as the request
        reply = self.on_submit(unit, request)
        assert isinstance(reply, Submitted)
        return int(reply.created)

    def on_submit(self, unit: UnitOfWork, request: Submit) -> Frame:
        """Rule 4, then what becomes of the submission (``_inbox``): an input starts a run, queues one, steers the
        live run or is refused; a continue starts a run with no input of its own; a reset is placed at once, or waits
        for the working run's boundary; a write is appended at once (or waits: behind a queued reset, and for the
        working run's boundary if the model sees it); another kind is stored, ``done``."""
        existing = self._store.submission(request.conversation_id, request.request_id)
        if existing is not None:
            same = same_json(existing.payload, request.payload) and same_json(existing.entry, request.entry)
            if not (existing.kind == request.kind and same):
                message = (
                    f"request id {request.request_id!r} was already used in this conversation for a different "
                    f"submission ({existing.submission_id}, kind {existing.kind!r}); nothing was written"
                )
                raise Refusal(ErrorCode.CONFLICT, message)
            return Submitted(submission=existing, created=False)
        store = self._store
        check_id(request.conversation_id, "conversation_id")
        check_id(request.submission_id, "submission_id")
        check_name(request.kind, "kind")
        if not 1 <= len(request.request_id) <= MAX_REQUEST_ID_CHARS:
            raise Refusal(ErrorCode.INVALID, f"request_id must hold 1 to {MAX_REQUEST_ID_CHARS} characters")
        conversation = store.conversation(request.conversation_id)
        if conversation is None:
            raise missing_conversation(request.conversation_id)
        if request.entry is not None:
            if request.kind != INPUT_KIND:
                message = f"entry is an input's own entry; a {request.kind!r} takes none; nothing was written"
                raise Refusal(ErrorCode.INVALID, message)
            _check_entry(request.entry, "entry", ENTRY_KEYS)
        run = None
        reason = None
        spec = None
        status, run_id, when_busy, joins, waits = SUBMISSION_QUEUED, None, "follow_up", False, False
        held = None
        if request.kind == INPUT_KIND:
            active = self._runs.check_input(request, conversation)
            held = self._runs.held(request.conversation_id)  # released below: this input queues behind
            steer = request.when_busy == "steer" and held is None
            tail = None
            if (  # the mode is read only when it decides something
                active is not None
                and not steer
                and self._inbox.config.mode(request.conversation_id, "follow_ups") == "all"
            ):
                tail = self._runs.queued_tail(request.conversation_id)
            if active is not None and steer:
                run_id, when_busy = active.run_id, "steer"  # queued here, placed in it at its next boundary
            elif tail is not None:
                run_id, joins = tail.run_id, True  # follow_ups="all": placed with that queued run's own input
            else:
                run = self._runs.new_run(request, conversation, unit.seq, unit.now_ms)
                run_id = run.run_id
        elif request.kind == CONTINUE_KIND:
            held = self._runs.held(request.conversation_id)
            if held is not None:
                self._runs.check_continue(request, conversation)
                run_id, joins = held.run_id, True  # the oldest held run answers it (``_inbox`` rule 6)
            else:
                run = self._runs.new_continue(request, conversation, unit.seq, unit.now_ms)
                run_id = run.run_id
        elif request.kind == RESET_KIND:
            _check_reset(request)
            active = self._runs.active_run(request.conversation_id)
            if active is not None and active.status != "queued":  # a run is working: it waits for its boundary
                run_id, waits = active.run_id, True
            else:
                status = SUBMISSION_DONE  # placed at once (a run still queued then runs in the new context)
        elif request.kind == WRITE_KIND:
            spec = self._check_write(request)
            active = self._runs.active_run(request.conversation_id)
            working = active is not None and active.status != "queued"
            if self._inbox.reset_queued(request.conversation_id):
                waits = True  # behind the queued reset, so that the reset does not hide it
            elif working and (spec.model is not None or spec.head is not None):
                assert active is not None
                run_id, waits = active.run_id, True  # the model sees it: at the working run's next boundary
            elif spec.head is not None and self._inbox.stale(request.conversation_id, spec.head):
                status, reason = "unanswered", "stale"  # its head left the model's context: nothing placed
            else:
                status = SUBMISSION_DONE
        else:
            status = SUBMISSION_DONE  # the application's own kind: stored for it, nothing of the runtime answers it
        submission = SubmissionRecord(
            submission_id=request.submission_id,
            conversation_id=request.conversation_id,
            request_id=request.request_id,
            kind=request.kind,
            payload=request.payload,
            status=status,
            seq=unit.seq,
            created_at_ms=unit.now_ms,
            run_id=run_id,
            when_busy=when_busy,
            reason=reason,
            entry=request.entry,
        )
        if when_busy == "steer" or joins or waits:
            self._inbox.check_room(request.conversation_id)
        try:
            store.insert_submission(submission)  # the first fallible write: no savepoint before it
        except StoreConflict as exc:
            raise Refusal(ErrorCode.DUPLICATE, f"submission id {exc.key} already exists") from exc
        unit.records.append(submission)
        if held is not None:
            unit.records += self._runs.release_held(request.conversation_id, unit.seq, unit.now_ms)
        if spec is not None and status == SUBMISSION_DONE:
            entry_id = str(uuid.uuid5(_WRITE_IDS, request.submission_id))
            unit.records.append(self._entries.place(request.conversation_id, entry_id, spec, unit.seq, unit.now_ms))
        if when_busy == "steer" or joins or waits:
            self._inbox.queue(submission)  # (room was checked before the insert)
        elif request.kind == RESET_KIND:
            self._inbox.place_reset(submission, unit.seq, unit.now_ms)
            self._inbox.flush(unit)
        if run is not None:
            # Cannot clash: a run is named after its submission, whose id the insert above found unused.
            self._runs.created(run, request.payload)
            unit.records.append(run)
        return Submitted(submission=submission, created=True)

    def _check_write(self, request: Submit) -> EntrySpec:
        """A write's entry, from its payload ``{"kind", "data", "model", "head"}`` (all but the kind optional): the
        kind is the application's, ``model`` what the model sees of it, ``head`` an entry of this conversation the
        model's context starts at from it on; refused (nothing written) otherwise."""
        payload = _check_entry(request.payload, "a write's payload", WRITE_KEYS)
        model = payload.get("model")
        if model is not None:
            _check_model(model, "payload.model")
        head = payload.get("head")
        if head is not None and (
            not isinstance(head, str) or self._store.entry_position(request.conversation_id, head) is None
        ):
            message = (
                f"payload.head {head!r} names no entry of conversation {request.conversation_id} (a head is "
                "the id of the entry the model's context starts at from this write on); nothing was written"
            )
            raise Refusal(ErrorCode.INVALID, message)
        return write_entry(payload)

    def on_abort_conversation(self, unit: UnitOfWork, request: AbortConversation) -> Frame:
        """Withdraw every queued input (steers, follow-ups and their queued runs), abort the active run; with
        ``background``, abort the live tasks the conversation owns outside its runs (each bottom-up, by the task
        engine). A queued reset is withdrawn too; the writes that waited behind it are kept, appended now."""
        check_id(request.conversation_id, "conversation_id")
        if self._store.conversation(request.conversation_id) is None:
            raise missing_conversation(request.conversation_id)
        withdrawn: list[str] = []
        for record in list(self._inbox.queued.get(request.conversation_id, [])):
            if record.kind == WRITE_KIND:  # kept: appended now (the reset it waited behind is withdrawn)
                self._inbox.apply_write(record, unit.seq, unit.now_ms)
            else:
                self._inbox.withdraw(record, unit.seq)
                withdrawn.append(record.submission_id)
        for run_id in self._runs.queued_run_ids(request.conversation_id):
            own = self._store.submission_by_id(run_id)
            if own is not None and own.status == SUBMISSION_QUEUED:
                self._inbox.withdraw(own, unit.seq)
                withdrawn.append(run_id)
        active = self._runs.abort_active(request.conversation_id, unit)
        tasks: list[str] = []
        if request.background:
            for task in self._tasks.live_roots(request.conversation_id):
                if task.kind.startswith(AGENT_TASK_PREFIX) or task.abort is not None:
                    continue
                marked, _ = self._tasks.abort_task(AbortTask(task_id=task.task_id), unit.seq, unit.now_ms, "abort")
                unit.records.append(marked)
                tasks.append(task.task_id)
        self._inbox.flush(unit)
        run = None if active is None else self._runs.live.get(active.run_id, active)
        return ConversationAborted(withdrawn=tuple(withdrawn), run=run, tasks=tuple(tasks))

    def on_withdraw(self, unit: UnitOfWork, request: Withdraw) -> Frame:
        """Take a queued submission back (``_inbox`` rule 5): a steer leaves the inbox; an input's queued run is
        cancelled with it. A placed or settled one is left as it is, and said so."""
        check_id(request.submission_id, "submission_id")
        record = self._store.submission_by_id(request.submission_id)
        if record is None:
            return Withdrawn(outcome="not_found", submission=None)
        if record.status == "placed":
            return Withdrawn(outcome="already_placed", submission=record)
        if record.status != SUBMISSION_QUEUED:
            return Withdrawn(outcome="settled", submission=record)
        withdrawn = self._inbox.withdraw(record, unit.seq)
        if record.run_id == record.submission_id:  # a queued run's own input: the run goes with it
            self._runs.cancel_queued(record.run_id, unit)
        self._inbox.flush(unit)
        return Withdrawn(outcome="withdrawn", submission=withdrawn)

    def on_configure(self, unit: UnitOfWork, request: Configure) -> Frame:
        """``_config`` rules 1 and 2; a changed model makes placement look again at the conversation's run (rule 4)."""
        config = self._inbox.config
        check_id(request.conversation_id, "conversation_id")
        before = config.model_of(request.conversation_id)  # (on_configure refuses an unknown conversation)
        reply = config.on_configure(unit, request)
        if config.model_of(request.conversation_id) != before:
            self._runs.requirement_changed(request.conversation_id)
        return reply

    # ----------------------------------------------------------------------------------------------- reads

    def on_read_conversation(self, peer: PeerId, call_id: int, request: ReadConversation, now_ms: int) -> Frame:
        conversation = self._store.conversation(request.conversation_id)
        if conversation is None:
            raise Refusal(ErrorCode.NOT_FOUND, no_conversation(request.conversation_id))
        return ConversationReply(conversation=conversation)

    def on_read_entries(self, peer: PeerId, call_id: int, request: ReadEntries, now_ms: int) -> Frame:
        check_limit(request.limit)
        if request.cursor is not None and not 0 <= request.cursor <= MAX_CURSOR:
            message = f"cursor must be a position (0 or more) or null, not {request.cursor}"
            raise Refusal(ErrorCode.INVALID, message)
        entries, more = self._store.entry_page(
            request.conversation_id, request.order, request.cursor, request.limit, max_data_bytes=READ_BUDGET_BYTES
        )
        # Entries are stored only in a conversation that exists, and none is ever removed: only an empty page asks.
        if not entries and self._store.conversation(request.conversation_id) is None:
            raise Refusal(ErrorCode.NOT_FOUND, no_conversation(request.conversation_id))
        next_cursor = entries[-1].position if more else None
        return EntriesReply(entries=tuple(entries), next_cursor=next_cursor)

    def on_read_document(self, peer: PeerId, call_id: int, request: ReadDocument, now_ms: int) -> Frame:
        conversation_id = request.conversation_id
        document = self._store.document(conversation_id, request.name)
        # Likewise a conversation's document: only when there is none is the conversation looked for.
        if document is None and conversation_id is not None and self._store.conversation(conversation_id) is None:
            raise Refusal(ErrorCode.NOT_FOUND, no_conversation(conversation_id))
        return DocumentReply(document=document)

    def on_read_submissions(self, peer: PeerId, call_id: int, request: ReadSubmissions, now_ms: int) -> Frame:
        check_limit(request.limit)
        if self._store.conversation(request.conversation_id) is None:
            raise Refusal(ErrorCode.NOT_FOUND, no_conversation(request.conversation_id))
        found, more = self._store.submission_page(request.conversation_id, request.after_submission_id, request.limit)
        found, more = fit_page(found, more, lambda one: SubmissionsReply(submissions=(one,)))
        return SubmissionsReply(
            submissions=tuple(found), next_after_submission_id=found[-1].submission_id if more else None
        )

    def on_read_submission(self, peer: PeerId, call_id: int, request: ReadSubmission, now_ms: int) -> Frame:
        if self._store.conversation(request.conversation_id) is None:
            raise Refusal(ErrorCode.NOT_FOUND, no_conversation(request.conversation_id))
        return SubmissionReply(submission=self._store.submission(request.conversation_id, request.request_id))

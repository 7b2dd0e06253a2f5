"""The inbox, sans-IO: what becomes of each submission to a conversation (docs/runs.md, "The inbox").

1. **Statuses.** A submission is created ``queued`` (an input, a reset or a write that must wait) or ``done`` (a
   write, or a reset of an idle conversation: appended at once). An input is ``placed`` once its user entry is in the
   transcript, in a run; it settles with that run: ``done`` with the run's answer, or ``unanswered`` with why the run
   ended without one. A queued submission may settle ``unanswered`` without being placed: withdrawn, or its queued
   run cancelled. A queued reset or write is ``done`` once placed. :data:`SUBMISSION_TRANSITIONS` holds every change,
   checked on each (:func:`~._checks.check_move`).
2. **Admission** (``Conversations.on_submit``): an input to a conversation with no live run starts one (run id =
   submission id), unless it asked ``when_idle="reject"``. While a run is live, ``follow_up`` queues a run of its own
   behind it (``_runs``; with ``follow_ups="all"`` it joins the conversation's queued run instead, and waits here),
   ``steer`` waits here naming the live run it will join, and ``reject`` refuses. A reset waits here while a run
   works; a write waits here while a reset does. At most :data:`MAX_QUEUED_PER_CONVERSATION` wait.
3. **Placement.** A run's own input is placed when the run is admitted (a ``continue`` has none), after what a run
   before it left waiting (older first) and before what named it while it was queued. At a boundary of the
   conversation's active run (a tool round ends: its task stops waiting on its tool calls; or it answers: its task
   completes naming a ``steer_checkpoint``), what waits is placed in admission order: the oldest steer (every one
   with ``steering="all"``), up to a reset, which is placed too unless a steer went first (with the writes behind
   it), and ends the group. A steer placed at the answer turns the completion into another turn at that checkpoint,
   so the same run answers it. What a run never reached (it failed or was cancelled first) keeps waiting, and the
   next run admitted in the conversation places it first. A write the model sees (it carries ``model`` messages or
   names a ``head``) waits, while a run works, for that run's next boundary, where every such write queued before
   the first reset is placed before the steers (writes, then user items; each in admission order). A write naming a
   head no longer in the model's context when it is placed (before the last reset, or before a later head's cut:
   ``context_start``) settles ``unanswered`` (``stale``) and places nothing.
4. **Settlement.** When a run ends, every input placed in it settles: ``done`` with the run's answer, or
   ``unanswered`` with the run's reason (``aborted`` for a cancelled run; an orphaned run's inputs carry why its task
   was orphaned: ``missing_task``, ``task_too_old`` or ``migration_failed``). A retried run's inputs (its own, and
   the steers placed in it) are ``placed`` again.
5. **Withdrawal.** A queued submission settles ``unanswered`` (``withdrawn``); an input's queued run is cancelled
   with it. A placed one is ``already_placed``, a settled one ``settled``: nothing changes. After a failed run, with
   ``after_failed_run="withdraw"``, the inputs queued behind it settle so too, with the reason ``run_failed``
   (``_runs`` rule 7).
6. **Continue.** A ``continue`` places no entry of its own: its run answers the context as it is. One submitted
   while runs wait held after a failed run joins the oldest of them (rule 3 places it with that run's input).

Entry ids are derived from the submission ids, and placement happens in the commit that takes an item out of the
queue, so a settle run again after a crash places nothing twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Final, Literal, Protocol

import attrs

from protocol import (
    RESET_ENTRY,
    USER_ENTRY,
    EntryRecord,
    ErrorCode,
    Frame,
    JsonValue,
    Record,
    RunAnswer,
    RunRecord,
    SubmissionRecord,
    SubmissionReply,
    WaitSubmission,
)

from ._checks import Refusal, check_move
from ._config import Configurations
from ._output import Outbox, PeerId
from ._peers import Waits
from ._ports import ConversationStore
from ._unit import Journal, UnitOfWork

SubmissionEvent = Literal["place", "apply", "answer", "unanswer", "withdraw", "retry", "stale"]
QUEUED: Final = "queued"
PLACED: Final = "placed"
SETTLED: Final = frozenset({"done", "unanswered"})
SUBMISSION_TRANSITIONS: Final[Mapping[tuple[str, str], frozenset[str]]] = {
    ("queued", "place"): frozenset({"placed"}),  # 3
    ("queued", "apply"): frozenset({"done"}),  # 3 (a reset, or a write behind it, placed at a boundary)
    ("queued", "withdraw"): frozenset({"unanswered"}),  # 5 (withdrawn, or its queued run cancelled)
    ("queued", "stale"): frozenset({"unanswered"}),  # 3 (a write whose head left the context)
    ("placed", "answer"): frozenset({"done"}),  # 4
    ("placed", "unanswer"): frozenset({"unanswered"}),  # 4
    ("unanswered", "retry"): frozenset({"placed"}),  # 4 (a retried run's own input)
}
"""The submission state machine: from a status, on an event, the statuses a submission may take; see the module
docstring for the rule each row follows. Nothing leaves ``done``."""
_ENTRY_IDS: Final = uuid.UUID("3d0f2b0e-7c55-4a3e-8f0e-6b1d2a9c4e71")
MAX_QUEUED_PER_CONVERSATION: Final = 1000
"""Submissions one conversation's inbox holds waiting (steers, follow-ups joining a queued run, resets, writes behind
a reset; kept in the owner's memory): one more is refused ``conflict`` (not ``overloaded``: a client would retry it
for a minute), nothing written."""
NEVER_PLACED: Final = frozenset({"withdrawn", "run_failed"})
"""The reasons of submissions that settled ``unanswered`` without being placed in their run."""
UNANSWERED_REASONS: Final = {
    "max_turns": "turn_limit",
    "model_retries_exhausted": "interrupted",
    "phase_error": "faulted",
    "no_progress": "faulted",
    "unknown_phase": "faulted",
}
"""A run's reason as its inputs' (the reference's names: the run keeps the precise one), where they differ."""


def steer_entry_id(submission_id: str) -> str:
    """The user entry a steer is placed as (an input that starts its own run is placed as its run's)."""
    return str(uuid.uuid5(_ENTRY_IDS, f"{submission_id}/user"))


INPUT_KIND: Final = "input"
"""The submission kind that starts a run in a conversation bound to an agent (or joins one)."""
CONTINUE_KIND: Final = "continue"
"""The submission kind that starts a run on the context as it is, with no new user message (never queued behind a
working run)."""
RESET_KIND: Final = "reset"
"""The submission kind that starts the model's context again (placed at once, or at the live run's boundary)."""
WRITE_KIND: Final = "write"
"""The submission kind that appends an entry at once and never starts a run: payload ``{"kind", "data"}``."""


@attrs.frozen
class EntrySpec:
    """An entry the owner places for a submission: its kind and data, what the model sees of it (``model``
    messages, for an entry of the application's kind), and the head the model's context starts at from it on."""

    kind: str
    data: JsonValue
    model: JsonValue = attrs.field(default=None, converter=JsonValue)
    head: str | None = None


class PlaceEntry(Protocol):
    """Append an entry at the conversation's next position, in the commit (``_conversations.Entries.place``)."""

    def __call__(self, conversation_id: str, entry_id: str, spec: EntrySpec, seq: int, now_ms: int) -> EntryRecord: ...


VISIBLE_KEYS: Final = frozenset({"model", "head"})
"""The keys of a write's payload that make the model see it."""


def entry_of(record: SubmissionRecord) -> EntrySpec:
    """The entry a reset or a write submission is placed as (the write's payload was checked at admission)."""
    payload = record.payload if isinstance(record.payload, dict) else {}
    if record.kind == RESET_KIND:
        data = JsonValue({"handoff": payload.get("handoff"), "submission_id": record.submission_id})
        return EntrySpec(RESET_ENTRY, data)
    return write_entry(payload)


def write_entry(payload: Mapping[str, JsonValue]) -> EntrySpec:
    """The entry a write's payload ``{"kind", "data", "model", "head"}`` asks for (checked at admission)."""
    head = payload.get("head")
    return EntrySpec(
        str(payload["kind"]),
        JsonValue(payload.get("data")),
        JsonValue(payload.get("model")),
        head if isinstance(head, str) else None,
    )


def input_entry(own_entry: JsonValue, text: JsonValue, run_id: str, submission_id: str) -> EntrySpec:
    """The entry an input is placed as: ``tether.user`` with its text, or the input's own entry (``{"kind",
    "data"}``, checked at admission) whose model message is its text, as the user's."""
    if isinstance(own_entry, dict):
        model = JsonValue([{"role": "user", "text": text}])
        return EntrySpec(str(own_entry["kind"]), JsonValue(own_entry.get("data")), model)
    return EntrySpec(USER_ENTRY, JsonValue({"text": text, "run_id": run_id, "submission_id": submission_id}))


def visible(record: SubmissionRecord) -> bool:
    """Whether a write changes what the model sees (``model`` messages, or a ``head``): it waits for a boundary."""
    return record.kind == WRITE_KIND and isinstance(record.payload, dict) and bool(set(record.payload) & VISIBLE_KEYS)


def unanswered_reason(run: RunRecord) -> str:
    """Why the inputs of ``run``, which ended without an answer, went unanswered."""
    if run.status == "cancelled":
        return "aborted"
    reason = run.reason or "faulted"
    return UNANSWERED_REASONS.get(reason, reason)


class Inbox:
    """Every conversation's queued steers and every live run's placed inputs. See the module docstring."""

    def __init__(
        self,
        store: ConversationStore,
        journal: Journal,
        place_entry: PlaceEntry,
        waits: Waits,
        outbox: Outbox,
        config: Configurations,
    ) -> None:
        self._store = store
        self.config = config
        self._journal = journal
        self._place_entry = place_entry
        self._waits = waits
        self._outbox = outbox
        self.queued: dict[str, list[SubmissionRecord]] = {}
        """What waits in each conversation's inbox, oldest first (rules 2 and 3)."""
        self._placed: dict[str, list[str]] = {}
        """The inputs placed in each live run, in placement order (rule 4)."""
        self._records: list[Record] = []
        """What placement and settlement changed since the last :meth:`flush` (user entries, submissions), in order:
        it goes into the commit, and the waits of the submissions it settled are answered once that is logged."""
        for record in store.open_submissions():
            if record.status == PLACED and record.run_id is not None:
                self._placed.setdefault(record.run_id, []).append(record.submission_id)
            elif record.status == QUEUED and record.run_id != record.submission_id:  # steers, joiners, resets, writes
                self.queued.setdefault(record.conversation_id, []).append(record)

    # ------------------------------------------------------------------------------------------- admission

    def queue(self, record: SubmissionRecord) -> None:
        """An input admitted to wait here (stored by the caller): a steer naming the live run it will join, or a
        follow-up naming the queued run it joins (``follow_ups="all"``)."""
        queue = self.queued.setdefault(record.conversation_id, [])
        queue.append(record)
        self._journal.undo(lambda: self._drop(record))

    def check_room(self, conversation_id: str) -> None:
        """Refuse (``conflict``, before anything is written) one more waiting submission past the bound."""
        if len(self.queued.get(conversation_id, ())) >= MAX_QUEUED_PER_CONVERSATION:
            message = (
                f"conversation {conversation_id} has {MAX_QUEUED_PER_CONVERSATION} submissions waiting in its inbox, "
                "its bound; nothing was written: wait for its run to place some, or withdraw some"
            )
            raise Refusal(ErrorCode.CONFLICT, message)

    # ------------------------------------------------------------------------------------------- placement

    def admitted(self, run: RunRecord, text: JsonValue, seq: int, now_ms: int, entry_id: str) -> list[Record]:
        """A run was admitted (rule 3): what a run before it left queued, its own input, then the steers that named it
        while it was queued, as user entries, each submission ``placed`` in it. Returns the records, in order (the
        caller puts them before the run's task)."""
        start = len(self._records)
        queue = self.queued.get(run.conversation_id, [])
        leftovers = [record for record in queue if record.run_id != run.run_id]
        steers = [record for record in queue if record.run_id == run.run_id]
        for record in leftovers:
            if not self._waiting(record):
                continue  # a write placed with the reset before it, a moment ago
            if record.kind == INPUT_KIND:
                self._place(record, run, seq, now_ms)
            elif record.kind == RESET_KIND:  # a reset (and the writes behind it) a run before left waiting
                self.place_reset(record, seq, now_ms)
            else:
                self._apply(record, seq, now_ms)
        own = self._store.submission_by_id(run.submission_id)
        if text is not None:  # (a continue has no input of its own)
            spec = input_entry(JsonValue(None) if own is None else own.entry, text, run.run_id, run.submission_id)
            self._records.append(self._place_entry(run.conversation_id, entry_id, spec, seq, now_ms))
        if own is not None and own.status == QUEUED:
            self._move(own, "place", seq, placed_in=run)
        for record in steers:
            self._place(record, run, seq, now_ms)
        placed = self._records[start:]
        del self._records[start:]
        return placed

    def boundary(self, run: RunRecord, seq: int, now_ms: int) -> bool:
        """A boundary of ``run``, its conversation's active run (rule 3): what waits for it, in admission order: its
        oldest queued steer (every one with ``steering="all"``), up to a queued reset, which is placed too (with the
        writes that waited behind it) and ends the group: what follows a reset waits for the new context's run.
        Returns whether a steer was placed (the run answers it)."""
        if not self.queued.get(run.conversation_id):
            return False  # the common case: nothing waits, and the configuration is not read
        first = self.config.mode(run.conversation_id, "steering") == "first"
        steered = False
        for record in list(self.queued.get(run.conversation_id, ())):  # writes the model sees first
            if record.kind == RESET_KIND:
                break
            if visible(record):
                self._apply(record, seq, now_ms)
        for record in list(self.queued.get(run.conversation_id, ())):
            if record.kind == RESET_KIND:
                if not steered:  # a steer before it is answered first; the reset waits for the next boundary
                    self.place_reset(record, seq, now_ms)
                break
            if record.kind != INPUT_KIND or record.when_busy != "steer" or (steered and first):
                continue  # a follow-up joining a queued run, or a second steer of a "first" boundary
            self._place(record, run, seq, now_ms)
            steered = True
        return steered

    def _waiting(self, record: SubmissionRecord) -> bool:
        """Whether ``record`` still waits in its conversation's inbox."""
        queue = self.queued.get(record.conversation_id, ())
        return any(one.submission_id == record.submission_id for one in queue)

    def reset_queued(self, conversation_id: str) -> bool:
        """Whether a reset waits in the conversation's inbox (a write then waits behind it)."""
        return any(record.kind == RESET_KIND for record in self.queued.get(conversation_id, ()))

    def place_reset(self, record: SubmissionRecord, seq: int, now_ms: int) -> None:
        """The reset entry (its handoff text in it), ``done``, then each write that waited behind it, ``done``."""
        queue = list(self.queued.get(record.conversation_id, ()))
        self._apply(record, seq, now_ms)
        behind = False
        for waiting in queue:
            if waiting.submission_id == record.submission_id:
                behind = True
            elif behind and waiting.kind == RESET_KIND:
                break  # the writes behind the next reset wait for it
            elif behind and waiting.kind == WRITE_KIND:
                self._apply(waiting, seq, now_ms)

    def apply_write(self, record: SubmissionRecord, seq: int, now_ms: int) -> None:
        """A queued write, appended now and ``done`` (``abort_conversation`` keeps writes)."""
        self._apply(record, seq, now_ms)

    def _apply(self, record: SubmissionRecord, seq: int, now_ms: int) -> None:
        """Place a reset's or a write's entry now, and settle it ``done`` (a write whose head left the model's
        context: ``unanswered``, ``stale``, nothing placed)."""
        if record.status == QUEUED:
            self._drop(record)
            self._journal.undo(lambda: self._restore(record))
        spec = entry_of(record)
        if spec.head is not None and self.stale(record.conversation_id, spec.head):
            self._move(record, "stale", seq, reason="stale")
            return
        self._note(self._place_entry(record.conversation_id, steer_entry_id(record.submission_id), spec, seq, now_ms))
        if record.status == QUEUED:
            self._move(record, "apply", seq)

    def stale(self, conversation_id: str, head: str) -> bool:
        """Whether the entry ``head`` is no longer in the model's context (before where it starts now)."""
        position = self._store.entry_position(conversation_id, head)
        return position is None or position < self._store.context_start(conversation_id)

    def _place(self, record: SubmissionRecord, run: RunRecord, seq: int, now_ms: int) -> None:
        self._drop(record)
        self._journal.undo(lambda: self._restore(record))
        if record.kind == CONTINUE_KIND:  # rule 6: nothing of its own to place
            self._move(record, "place", seq, placed_in=run)
            return
        spec = input_entry(record.entry, record.payload, run.run_id, record.submission_id)
        entry_id = steer_entry_id(record.submission_id)
        self._note(self._place_entry(run.conversation_id, entry_id, spec, seq, now_ms))
        self._move(record, "place", seq, placed_in=run)

    # ------------------------------------------------------------------------------------------ settlement

    def run_ended(self, run: RunRecord, seq: int, unanswered: str | None = None) -> None:
        """``run`` is terminal (rule 4): the inputs placed in it settle; its own input, still queued (a queued run
        cancelled), settles ``unanswered``. ``unanswered``: why they did, where that is not the run's reason (an
        orphaned run's: why its task was orphaned)."""
        reason = unanswered or unanswered_reason(run)
        placed = self._placed.pop(run.run_id, [])
        if placed:
            self._journal.undo(lambda: self._placed.__setitem__(run.run_id, placed))
        if not placed:
            own = self._store.submission_by_id(run.submission_id)
            if own is not None and own.status == QUEUED:
                self._move(own, "withdraw", seq, reason=reason)
            return
        for submission_id in placed:
            record = self._store.submission_by_id(submission_id)
            if record is None or record.status != PLACED:
                continue
            if run.status == "completed":
                self._move(record, "answer", seq, answer=run.answer)
            else:
                self._move(record, "unanswer", seq, reason=reason)

    def run_retried(self, run: RunRecord, seq: int) -> None:
        """A failed run is queued again: the inputs placed in it (its own, and steers it took) are ``placed`` in it
        again, the retry answers them (rule 4); what never reached it (withdrawn) stays settled."""
        for record in self._store.unanswered_of_run(run.conversation_id, run.run_id):
            if record.kind in (INPUT_KIND, CONTINUE_KIND) and record.reason not in NEVER_PLACED:
                self._move(record, "retry", seq, placed_in=run)

    # ------------------------------------------------------------------------------------------ withdrawal

    def withdraw(self, record: SubmissionRecord, seq: int, reason: str = "withdrawn") -> SubmissionRecord:
        """Rule 5 for a queued submission (``reason``: ``withdrawn``, or ``run_failed`` after a failed run)."""
        self._drop(record)
        self._journal.undo(lambda: self._restore(record))
        return self._move(record, "withdraw", seq, reason=reason)

    def withdraw_own(self, run: RunRecord, seq: int, reason: str) -> None:
        """Rule 5 for a queued run's own input, if it is still queued (the caller cancels the run)."""
        own = self._store.submission_by_id(run.submission_id)
        if own is not None and own.status == QUEUED:
            self.withdraw(own, seq, reason)

    # ------------------------------------------------------------------------------------------ the records

    def _move(
        self,
        record: SubmissionRecord,
        event: SubmissionEvent,
        seq: int,
        *,
        placed_in: RunRecord | None = None,
        reason: str | None = None,
        answer: RunAnswer | None = None,
    ) -> SubmissionRecord:
        """Store ``record``'s next state (checked against :data:`SUBMISSION_TRANSITIONS`) and note it changed."""
        status = {"place": PLACED, "retry": PLACED, "answer": "done", "apply": "done"}.get(event, "unanswered")
        new = attrs.evolve(
            record,
            status=status,
            seq=seq,
            run_id=record.run_id if placed_in is None else placed_in.run_id,
            reason=reason,
            answer=answer,
        )
        check_move(SUBMISSION_TRANSITIONS, "submission", record.submission_id, record.status, event, new.status)
        self._store.update_submission(new)
        if placed_in is not None:
            placed = self._placed.setdefault(placed_in.run_id, [])
            placed.append(new.submission_id)
            self._journal.undo(lambda: placed.remove(new.submission_id))
        self._note(new)
        return new

    def _note(self, record: Record) -> None:
        records = self._records
        records.append(record)
        self._journal.undo(lambda: records.remove(record) if record in records else None)

    def flush(self, unit: UnitOfWork) -> None:
        """What changed since the last flush: into ``unit``'s commit, the waits of the submissions it settled answered
        once it is logged."""
        if not self._records:
            return
        records, self._records = self._records, []
        unit.records += records
        settled = [r for r in records if isinstance(r, SubmissionRecord) and r.status in SETTLED]
        if settled:
            unit.then(lambda: self._answer(settled))

    def _answer(self, settled: list[SubmissionRecord]) -> None:
        for record in settled:
            for peer, call_id in self._waits.take("submission", record.submission_id):
                self._outbox.reply(peer, call_id, SubmissionReply(submission=record))

    def _drop(self, record: SubmissionRecord) -> None:
        queue = self.queued.get(record.conversation_id)
        if queue is None:
            return
        queue[:] = [one for one in queue if one.submission_id != record.submission_id]
        if not queue:
            del self.queued[record.conversation_id]

    def _restore(self, record: SubmissionRecord) -> None:
        """Undo of :meth:`_drop` inside a refused request: back in its place (creation order)."""
        queue = self.queued.setdefault(record.conversation_id, [])
        if all(one.submission_id != record.submission_id for one in queue):
            queue.append(record)
            queue.sort(key=lambda one: one.seq)  # a queued submission's seq is its creating commit's

    # -------------------------------------------------------------------------------------------- requests

    def require(self, submission_id: str) -> SubmissionRecord:
        record = self._store.submission_by_id(submission_id)
        if record is None:
            raise Refusal(ErrorCode.NOT_FOUND, f"submission {submission_id} does not exist")
        return record

    def on_wait_submission(self, peer: PeerId, call_id: int, request: WaitSubmission, now_ms: int) -> Frame | None:
        record = self.require(request.submission_id)
        if record.status in SETTLED:
            return SubmissionReply(submission=record)
        self._waits.add("submission", record.submission_id, peer, call_id)
        return None

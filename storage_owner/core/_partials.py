"""Partial output of model requests and tool calls, sans-IO: what the owner stores and pushes while a model streams
or a tool reports its progress (``call.output``; docs/runs.md, "Partial output").

A worker streaming a model request (or running a tool call) commits its text in pieces (``append_partial`` writes,
under the lease of the task that started the operation); each piece is stored and logged as a
:class:`~protocol.PartialRecord` in its commit, so a watch of the conversation sees it live, and a watch resumed from
a seq (or catching up from the log) replays it exactly. Rules:

1. **Keyed by (operation, attempt).** A piece is accepted only for the open attempt of an operation, under the
   lease that started it. The first piece of an attempt replaces whatever an earlier attempt of the operation
   stored (its pieces are deleted): a reader never gets text twice.
2. **Contiguous.** A piece may overlap what is stored (a piece resent after a lost reply; only the characters past
   it are new) but never leave a gap (``conflict``, naming where the stored text ends).
3. **Bounded.** At most :data:`~protocol.MAX_PARTIAL_BYTES` of text per attempt, at most
   :data:`~protocol.MAX_PARTIAL_PIECE_BYTES` per piece (``invalid`` past either; nothing is written).
4. **Ends.** The operation's result commits: a ``done`` record (no text: the answer is the assistant entry) in the
   same commit, and the stored pieces are deleted (the tables keep the final text in the result and the entry; the
   commit log keeps each piece's record, like every commit). The ``partials`` row stays: ``read_partials`` answers
   ``done`` from it. A failed attempt (the
   worker reports a failed stream), an interrupted one (the owner decides it: worker gone, lease lost, owner
   restarted) or the run ending while it streams: an ``aborted`` record. An aborted attempt's pieces stay until the
   next attempt replaces them, or are deleted once no attempt can follow (last attempt, run ended).
5. **An interrupted answer is kept.** What an interrupted attempt had stored is kept in the transcript as a
   ``tether.aborted_answer`` entry: by the worker, in the commit of the next attempt's intent (``actors``'
   ``_partials.aborted_answer``); or here, in the commit that ends the run when no attempt follows (its last attempt
   was interrupted, or the run was cancelled while it waited to retry), just before the pieces are deleted. Both
   decide by the same rule (the operation ``interrupted`` at the attempt whose pieces are stored) and derive the same
   entry id (:func:`~protocol.aborted_answer_entry_id`), so an attempt's text is kept once.

One row per operation in ``partials`` (the current attempt, its status and size) and its pieces as rows of
``partial_pieces``: appending a piece writes the piece alone, never the text so far again.

An operation's first piece creates its row ``streaming``; its status changes only as :data:`PARTIAL_TRANSITIONS`
allows, checked on every put of a row (an illegal transition raises :class:`~._checks.IllegalTransition`: a bug,
never bad input). ``docs/runs.md`` ("Partial output") prints the table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final, Literal

import attrs

from protocol import (
    ABORTED_ANSWER_ENTRY,
    MAX_PARTIAL_BYTES,
    MAX_PARTIAL_PIECE_BYTES,
    AppendPartial,
    EntryRecord,
    ErrorCode,
    Frame,
    LeaseRef,
    OperationRecord,
    PartialRecord,
    PartialsReply,
    PartialStatus,
    ReadPartials,
    Record,
    RunRecord,
    aborted_answer_entry_id,
    encode_frame,
    has_result,
    json_value,
    kept_answer,
)

from ._checks import Refusal, check_id, check_move
from ._inbox import EntrySpec, PlaceEntry
from ._output import READ_BUDGET_BYTES, PeerId
from ._ports import OperationReads, PartialHead, PartialStore, RunReads
from ._run_rules import TERMINAL
from ._unit import Head, Journal, UnitOfWork

STREAMING: Final = "streaming"
PAGE_BYTES: Final = 512 << 10
"""A ``read_partials`` page ends once its records pass this many bytes encoded (the owner's read budget), so a
reply stays under ``MAX_MESSAGE_BYTES`` although one operation's text may hold up to ``MAX_PARTIAL_BYTES``."""
PAGE_OPERATIONS: Final = 1000
"""Operations one ``read_partials`` page reads at most (a run has one per model request)."""
MIN_CUT_BYTES: Final = 4 << 10
"""A text is cut to fill the rest of a page only if that rest holds this much; otherwise the page ends before it."""
PartialEvent = Literal["append", "replace", "done", "abort", "drop"]

PARTIAL_TRANSITIONS: Final[Mapping[tuple[PartialStatus, PartialEvent], frozenset[PartialStatus]]] = {
    ("streaming", "append"): frozenset({"streaming"}),  # 2: a piece of the same attempt
    ("streaming", "replace"): frozenset({"streaming"}),  # 1: a new attempt's first piece
    ("aborted", "replace"): frozenset({"streaming"}),  # 1
    ("streaming", "done"): frozenset({"done"}),  # 4: the result committed
    ("aborted", "done"): frozenset({"done"}),  # 4: a later attempt completed without text
    ("streaming", "abort"): frozenset({"aborted"}),  # 4: failed, interrupted, or its run ended
    ("aborted", "drop"): frozenset({"aborted"}),  # 4: no attempt can follow, its pieces are deleted
}
"""The partial output state machine (of an operation's ``partials`` row): from a status, on an event, the statuses
it may take; see the module docstring for the rules each row follows. Nothing leaves ``done``."""


class Partials:
    """The partial output of one store's model requests; see the module docstring."""

    def __init__(
        self,
        store: PartialStore,
        journal: Journal,
        head: Head,
        *,
        stored_runs: RunReads,
        stored_operations: OperationReads,
        place_entry: PlaceEntry,
    ) -> None:
        self._store = store
        self._place_entry = place_entry
        """Appends an entry the owner writes itself (``_conversations.Entries.place``): rule 5's."""
        self._stored_runs = stored_runs
        self._stored_operations = stored_operations
        self._journal = journal
        self._head = head
        self._held: dict[str, PartialHead] = {head.operation_id: head for head in store.held_partials()}
        """Heads that stream or whose pieces are stored: at most one per live model request (and per run)."""

    # ---------------------------------------------------------------------------------------------- pieces

    def apply_append(self, unit: UnitOfWork, write: AppendPartial, where: str, lease: LeaseRef | None) -> int:
        """An ``append_partial`` write of a commit: its piece is logged (nothing when it held nothing new)."""
        op = self._stored_operations.operation(write.operation_id) if write.operation_id else None
        piece = self.append(write, op, lease, unit.seq, unit.now_ms, where)
        if piece is not None:
            unit.records.append(piece)
        return 0

    def append(
        self,
        write: AppendPartial,
        op: OperationRecord | None,
        lease: LeaseRef | None,
        seq: int,
        now_ms: int,
        where: str,
    ) -> PartialRecord | None:
        """Store a piece (rules 1 to 3); ``None`` when it holds nothing new (an overlap resent). Every check runs
        before the first write."""
        if lease is None:
            message = f"{where}: partial output is written only under the lease of the task that started its operation"
            raise Refusal(ErrorCode.NOT_ALLOWED, message)
        check_id(write.operation_id, f"{where}.operation_id")
        if write.attempt < 1 or write.offset < 0 or not write.text:
            message = f"{where}: attempt 1 or more, offset 0 or more and a non-empty text; nothing was written"
            raise Refusal(ErrorCode.INVALID, message)
        piece_bytes = len(write.text.encode("utf-8", "surrogatepass"))
        if piece_bytes > MAX_PARTIAL_PIECE_BYTES:
            message = (
                f"{where}: a piece carries at most {MAX_PARTIAL_PIECE_BYTES} bytes of text, not {piece_bytes}: "
                "split it; nothing was written"
            )
            raise Refusal(ErrorCode.INVALID, message)
        if op is None:
            raise Refusal(ErrorCode.NOT_FOUND, f"{where}: operation {write.operation_id} does not exist")
        what = f"{where}: operation {op.operation_id}"
        if op.task_id != lease.task_id:
            message = f"{what} was started under task {op.task_id}'s lease, not this one; nothing was written"
            raise Refusal(ErrorCode.NOT_ALLOWED, message)
        if op.status != "started" or op.attempt != write.attempt:
            message = (
                f"{what} has no open attempt {write.attempt} (it is {op.status} at attempt {op.attempt}): the piece "
                "is not stored"
            )
            raise Refusal(ErrorCode.CONFLICT, message)
        old = self._held.get(op.operation_id)
        same = old is not None and old.intent_seq == op.seq and old.attempt == op.attempt
        if same and old is not None and old.status != STREAMING:
            raise Refusal(ErrorCode.CONFLICT, f"{what}: attempt {op.attempt}'s partial output is {old.status} already")
        stored_chars = old.chars if same and old is not None else 0
        if write.offset > stored_chars:
            message = (
                f"{what}: the stored output of attempt {op.attempt} ends at character {stored_chars}; a piece at "
                f"{write.offset} would leave a gap; nothing was written"
            )
            raise Refusal(ErrorCode.CONFLICT, message)
        new = write.text[stored_chars - write.offset :]
        if not new:
            return None
        new_bytes = len(new.encode("utf-8", "surrogatepass"))
        stored_bytes = old.size_bytes if same and old is not None else 0
        if stored_bytes + new_bytes > MAX_PARTIAL_BYTES:
            message = (
                f"{what}: attempt {op.attempt}'s partial output would pass {MAX_PARTIAL_BYTES} bytes "
                f"({stored_bytes} stored, {new_bytes} more); it is kept up to there and the answer commits whole with "
                "the result"
            )
            raise Refusal(ErrorCode.INVALID, message)
        # Writes from here on.
        event: PartialEvent = "append"
        if same and old is not None:
            previous: PartialHead | None = old
            head = attrs.evolve(
                old,
                chars=old.chars + len(new),
                size_bytes=old.size_bytes + new_bytes,
                pieces=old.pieces + 1,
                seq=seq,
                updated_at_ms=now_ms,
            )
        else:
            event = "replace"
            previous = old if old is not None else self._store.partial(op.operation_id)
            if previous is not None and previous.pieces:
                self._store.delete_partial_pieces(op.operation_id)  # an earlier attempt's: replaced (rule 1)
            head = PartialHead(
                operation_id=op.operation_id,
                run_id=op.run_id,
                conversation_id=op.conversation_id,
                attempt=op.attempt,
                intent_seq=op.seq,
                status=STREAMING,
                chars=len(new),
                size_bytes=new_bytes,
                pieces=1,
                seq=seq,
                created_at_ms=now_ms,
                updated_at_ms=now_ms,
            )
        self._store.insert_partial_piece(op.operation_id, stored_chars, new)
        self._put(None if previous is None else previous.status, head, event)
        self._set(head)
        return _partial_record(head, offset=stored_chars, text=new, status=STREAMING, seq=seq, created_at_ms=now_ms)

    # ------------------------------------------------------------------------------------------------ ends

    def finished(self, op: OperationRecord, seq: int, now_ms: int) -> PartialRecord | None:
        """The operation's attempt got its result (``completed``: ``done``; ``failed``: ``aborted``), rule 4."""
        return self._end(op, "done" if op.status == "completed" else "aborted", has_result(op), seq, now_ms)

    def settled(self, records: Iterable[Record], seq: int, now_ms: int) -> list[Record]:
        """What a settling commit changed: operations the owner decided were interrupted, and runs that ended, abort
        their streaming output (rule 4); a run that ends keeps the text of its interrupted attempt (rule 5)."""
        out: list[Record] = []
        for record in records:
            if isinstance(record, OperationRecord) and record.status == "interrupted":
                ended = self._end(record, "aborted", has_result(record), seq, now_ms)
                if ended is not None:
                    out.append(ended)
            elif isinstance(record, RunRecord) and record.status in TERMINAL:
                out += self._run_ended(record.run_id, seq, now_ms)
        return out

    def _end(
        self, op: OperationRecord, status: PartialStatus, final: bool, seq: int, now_ms: int
    ) -> PartialRecord | None:
        head = self._held.get(op.operation_id)
        if head is None:
            return None
        # An interrupted operation has no open attempt, whatever its number says (a withdrawn one counts the attempt
        # before the stopped one): what still streams of it ended.
        streaming = head.status == STREAMING and (head.attempt == op.attempt or op.status == "interrupted")
        if not streaming and not final:
            return None
        was = head.status
        if not streaming and status == "done":
            # A later attempt completed without streaming text (tool calls only): its ``done`` record (no text)
            # tells readers to drop the earlier attempt's aborted output.
            head = attrs.evolve(head, attempt=op.attempt, chars=0, size_bytes=0, status=STREAMING)
            streaming = True
        return self._close(head, was, status if streaming else head.status, final, seq, now_ms, emit=streaming)

    def _run_ended(self, run_id: str, seq: int, now_ms: int) -> list[Record]:
        out: list[Record] = []
        for head in [head for head in self._held.values() if head.run_id == run_id]:
            kept = self._keep_answer(head, seq, now_ms)  # (before its pieces are deleted)
            if kept is not None:
                out.append(kept)
            status: PartialStatus = "aborted" if head.status == STREAMING else head.status
            record = self._close(head, head.status, status, True, seq, now_ms, emit=head.status == STREAMING)
            if record is not None:
                out.append(record)
        return out

    def _keep_answer(self, head: PartialHead, seq: int, now_ms: int) -> EntryRecord | None:
        """Rule 5: the ``tether.aborted_answer`` entry of an interrupted attempt no other follows (its run ends now),
        if it stored text; ``None`` otherwise (it streamed nothing, it failed: the worker kept it with its failure,
        or a later attempt started: the worker kept it with that attempt's intent)."""
        if not head.pieces or head.status != "aborted":  # (no read of the text for a run that ends answered)
            return None
        op = self._stored_operations.operation(head.operation_id)
        text = self._store.partial_text(head.operation_id)
        data = kept_answer(op, status=head.status, attempt=head.attempt, text=text)
        if op is None or data is None:
            return None
        entry_id = aborted_answer_entry_id(op.operation_id, op.attempt)
        return self._place_entry(
            op.conversation_id, entry_id, EntrySpec(ABORTED_ANSWER_ENTRY, json_value(data)), seq, now_ms
        )

    def _close(
        self,
        head: PartialHead,
        was: PartialStatus,
        status: PartialStatus,
        final: bool,
        seq: int,
        now_ms: int,
        *,
        emit: bool,
    ) -> PartialRecord | None:
        """End ``head`` (stored as ``was``) as ``status``; ``final``: no attempt can follow, so its pieces are
        deleted."""
        if final and head.pieces:
            self._store.delete_partial_pieces(head.operation_id)
        new = attrs.evolve(
            head,
            status=status,
            pieces=0 if final else head.pieces,
            seq=seq if emit else head.seq,
            updated_at_ms=now_ms,
        )
        event: PartialEvent = "done" if status == "done" else "abort" if was == STREAMING else "drop"
        self._put(was, new, event)
        if final:
            self._forget(head.operation_id)
        else:
            self._set(new)
        if not emit:
            return None
        return _partial_record(head, offset=head.chars, text="", status=status, seq=seq, created_at_ms=now_ms)

    # ------------------------------------------------------------------------------------------------ reads

    def on_read_partials(self, peer: PeerId, call_id: int, request: ReadPartials, now_ms: int) -> Frame:
        page = self.read(
            run_id=request.run_id,
            operation_id=request.operation_id,
            from_operation_id=request.from_operation_id,
            from_offset=request.from_offset,
            budget=READ_BUDGET_BYTES,
        )
        if not page.records:  # nothing streamed yet, or nothing by that id: say which
            if request.run_id is not None and self._stored_runs.run(request.run_id) is None:
                raise Refusal(ErrorCode.NOT_FOUND, f"run {request.run_id} does not exist")
            if request.operation_id is not None and self._stored_operations.operation(request.operation_id) is None:
                raise Refusal(ErrorCode.NOT_FOUND, f"operation {request.operation_id} does not exist")
        return PartialsReply(
            partials=tuple(page.records),
            seq=self._head.seq,
            next_operation_id=page.next_operation_id,
            next_offset=page.next_offset,
        )

    def read(
        self,
        *,
        run_id: str | None,
        operation_id: str | None,
        from_operation_id: str | None = None,
        from_offset: int = 0,
        budget: int = PAGE_BYTES,
    ) -> PartialsPage:
        """A page of each operation's stored partial output, one record per operation from offset 0 (``done``: no
        text, at its end), starting at ``from_operation_id``'s character ``from_offset``. The page ends once its
        records pass ``budget`` bytes encoded: a text that does not fit is cut (at a character) and the page says
        where to continue. Every check runs before anything is read."""
        if (run_id is None) == (operation_id is None):
            raise Refusal(ErrorCode.INVALID, "read_partials names exactly one of run_id and operation_id")
        if from_offset < 0 or (from_offset and from_operation_id is None):
            message = f"from_offset must be 0 or more, and comes with from_operation_id (not {from_offset})"
            raise Refusal(ErrorCode.INVALID, message)
        if operation_id is not None:
            check_id(operation_id, "operation_id")
            if from_operation_id not in (None, operation_id):
                message = f"from_operation_id must be the operation_id read ({operation_id}), not {from_operation_id}"
                raise Refusal(ErrorCode.INVALID, message)
            head = self._store.partial(operation_id)
            heads = [] if head is None else [head]
        else:
            assert run_id is not None
            check_id(run_id, "run_id")
            if from_operation_id is not None:
                check_id(from_operation_id, "from_operation_id")
                start = self._store.partial(from_operation_id)
                if start is None or start.run_id != run_id:
                    message = f"from_operation_id {from_operation_id} has no partial output in run {run_id}"
                    raise Refusal(ErrorCode.INVALID, message)
            heads = self._store.run_partials_from(run_id, from_operation_id, PAGE_OPERATIONS + 1)
        out: list[PartialRecord] = []
        used = 0
        for index, head in enumerate(heads[:PAGE_OPERATIONS]):
            record = self._record(head, from_offset if index == 0 and from_operation_id is not None else 0)
            size = _encoded_size(record)
            if used + size <= budget:
                out.append(record)
                used += size
                continue
            room = budget - used - (size - _utf8_size(record.text))
            if record.text and (not out or room >= MIN_CUT_BYTES):
                cut = _cut(record.text, room)
                out.append(attrs.evolve(record, text=record.text[:cut]))
                return PartialsPage(out, head.operation_id, record.offset + cut)
            if not out:  # a record without text is small: it always fits a page alone
                out.append(record)
                continue
            return PartialsPage(out, head.operation_id, 0)
        if len(heads) > PAGE_OPERATIONS:
            return PartialsPage(out, heads[PAGE_OPERATIONS].operation_id, 0)
        return PartialsPage(out, None, 0)

    def _record(self, head: PartialHead, offset: int) -> PartialRecord:
        """``head``'s output as one record from character ``offset`` (from 0 when its text is shorter: another
        attempt replaced the one a reader continues)."""
        text = self._store.partial_text(head.operation_id) if head.pieces else ""
        done = head.status == "done" or not head.pieces
        if done:
            offset, text = head.chars, ""
        elif offset >= len(text):
            offset = 0
        elif offset:
            text = text[offset:]
        return _partial_record(
            head, offset=offset, text=text, status=head.status, seq=head.seq, created_at_ms=head.created_at_ms
        )

    @property
    def held_count(self) -> int:
        """How many operations stream or keep pieces now (a bound: one per live model request)."""
        return len(self._held)

    # ------------------------------------------------------------------------------------------- in memory

    def _put(self, previous: PartialStatus | None, head: PartialHead, event: PartialEvent) -> None:
        """Store ``head``, which ``event`` made of a row stored as ``previous`` (``None``: the operation's first
        piece creates it): refused loudly if :data:`PARTIAL_TRANSITIONS` forbids it."""
        if previous is not None:
            check_move(
                PARTIAL_TRANSITIONS, "partial output of operation", head.operation_id, previous, event, head.status
            )
        self._store.put_partial(head)

    def _set(self, head: PartialHead) -> None:
        old = self._held.get(head.operation_id)
        self._held[head.operation_id] = head
        self._journal.undo(lambda: self._restore(head.operation_id, old))

    def _forget(self, operation_id: str) -> None:
        old = self._held.pop(operation_id, None)
        self._journal.undo(lambda: self._restore(operation_id, old))

    def _restore(self, operation_id: str, head: PartialHead | None) -> None:
        if head is None:
            self._held.pop(operation_id, None)
        else:
            self._held[operation_id] = head


@attrs.frozen
class PartialsPage:
    """One page of :meth:`Partials.read`: its records and where the next one starts (``None``: nothing more)."""

    records: list[PartialRecord]
    next_operation_id: str | None
    next_offset: int


def _partial_record(
    head: PartialHead, *, offset: int, text: str, status: PartialStatus, seq: int, created_at_ms: int
) -> PartialRecord:
    """A record of ``head``'s model request (its operation, run, conversation and attempt): ``text`` from character
    ``offset``, as of commit ``seq``."""
    return PartialRecord(
        operation_id=head.operation_id,
        run_id=head.run_id,
        conversation_id=head.conversation_id,
        attempt=head.attempt,
        offset=offset,
        text=text,
        status=status,
        seq=seq,
        created_at_ms=created_at_ms,
    )


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _encoded_size(record: PartialRecord) -> int:
    """What ``record`` adds to a ``partials`` reply (with the reply's envelope: an overestimate)."""
    return len(encode_frame(PartialsReply(partials=(record,), seq=record.seq), call_id=0))


def _cut(text: str, room: int) -> int:
    """How many characters of ``text``, from the first, fit ``room`` bytes of UTF-8 (one at least)."""
    encoded = text.encode("utf-8", "surrogatepass")
    end = max(0, min(room, len(encoded)))
    while 0 < end < len(encoded) and encoded[end] & 0xC0 == 0x80:  # not inside a character
        end -= 1
    return max(1, len(encoded[:end].decode("utf-8", "surrogatepass")))

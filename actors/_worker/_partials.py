"""Partial output on the worker's side: a model's text while it streams, sent to the owner in pieces. docs/agents.md
says it for users, docs/runs.md what the owner stores; a reader assembles the pieces again with
:class:`~actors.PartialText` (``actors/_client/_partials.py``).

The worker sends the first piece as soon as text arrives, then at most every ``partial_interval_ms``, each piece
carrying all the text that arrived since the last one (a piece in flight never holds the stream up: the next piece
takes everything that came meanwhile), and the rest in the commit of the result. Pieces are ``append_partial``
writes in commits of their own under the run task's lease, so they group into the owner's batches like any commit,
and a stale lease is refused whole. Sending is best effort and never fails the run: a refused piece stops the
pieces of that attempt; the answer commits whole with the result either way.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final

import trio

from protocol import (
    ABORTED_ANSWER_ENTRY,
    MAX_PARTIAL_BYTES,
    MAX_PARTIAL_PIECE_BYTES,
    AppendPartial,
    OperationRecord,
    PartialRecord,
    TetherError,
    aborted_answer_entry_id,
    kept_answer,
    raise_collapsed,
)

from ._phase import Phase, PhaseTransaction

FINAL_PIECE_BYTES: Final = 64 << 10
"""At most this much of the unsent text rides in the result's commit (which holds the answer twice already, in the
result and in the assistant entry): past it, the ``done`` record ends the partial output and the answer is the
entry."""


def aborted_answer(op: OperationRecord | None, partials: Sequence[PartialRecord]) -> dict[str, Any] | None:
    """The ``tether.aborted_answer`` entry's data for the attempt of a model request that was cut off (``op``, as the
    journal holds it when its next attempt is about to start; ``partials``, what the owner stores of its output),
    ``None`` when there is nothing to keep. Pure: a phase that runs again decides the same from the same records.

    Kept only for an attempt the owner decided ``interrupted`` (its worker killed or gone, its lease lost) that
    streamed text, whose aborted output is still that attempt's: not for one that streamed nothing; not for a request
    a close gave back (it is withdrawn at the attempt before the stopped one, and sent again as that attempt: a close
    is not a crash); not once a later attempt started (its entry, if any, was committed with that attempt's intent).
    A ``failed`` attempt keeps its entry in the commit of its failure (:meth:`AgentRun._model_failed`); an attempt no
    other follows, in the commit that ends its run (the owner's, ``storage_owner/core/_partials.py``)."""
    if op is None:
        return None
    found = [p for p in partials if p.operation_id == op.operation_id]
    if len(found) != 1 or found[0].offset != 0:  # (a read from the start holds the whole text)
        return None
    [partial] = found
    return kept_answer(op, status=partial.status, attempt=partial.attempt, text=partial.text)


def append_aborted_answer(tx: PhaseTransaction, conversation_id: str, data: Mapping[str, Any]) -> None:
    """Add the ``tether.aborted_answer`` entry of :func:`aborted_answer` to ``tx``; its id derives from the operation
    and the attempt (:func:`~protocol.aborted_answer_entry_id`), so no attempt's text is kept twice (the owner refuses
    an entry id twice, the whole commit)."""
    tx.append(
        conversation_id,
        kind=ABORTED_ANSWER_ENTRY,
        entry_id=aborted_answer_entry_id(data["operation_id"], data["attempt"]),
        data=dict(data),
    )


def _prefix(text: str, max_bytes: int) -> tuple[str, int]:
    """The longest prefix of ``text`` of at most ``max_bytes`` UTF-8 bytes, and its size."""
    raw = text.encode()
    if len(raw) <= max_bytes:
        return text, len(raw)
    cut = raw[:max_bytes].decode(errors="ignore")  # drops a character cut in half
    return cut, len(cut.encode())


class PartialSender:
    """Sends one model request attempt's streamed text in pieces while it streams (see the module docstring).

    :meth:`feed` never blocks and never fails: it only records the text. The pieces go out from a task of the
    nursery that :func:`partial_output` opens; :meth:`final_writes` gives the rest for the result's commit.
    """

    def __init__(self, rt: Phase, operation_id: str, attempt: int, interval_ms: int) -> None:
        self._rt = rt
        self._operation_id = operation_id
        self._attempt = attempt
        self._interval_s = interval_ms / 1000
        self._unsent: list[str] = []
        """Text that no piece has carried yet."""
        self._in_flight = ""
        """The text of the piece sent and not acknowledged yet (its outcome is unknown if it is cut short)."""
        self._stored_chars = 0
        self._stored_bytes = 0
        self._arrived = trio.Event()
        self.stopped: str | None = None
        """Why no more pieces are sent for this attempt (a refusal, a lost connection, the bound), if so."""
        self.pieces_sent = 0

    def feed(self, text: str) -> None:
        """Text the model streamed (a ``TextDelta``); it goes out with the next piece (dropped once sending
        stopped: nothing would carry it)."""
        if text and self.stopped is None:
            self._unsent.append(text)
            self._arrived.set()

    async def run(self) -> None:
        """Send pieces until cancelled: the first as soon as text arrives, then at most every interval."""
        while self.stopped is None:
            await self._arrived.wait()
            self._arrived = trio.Event()
            started_s = trio.current_time()
            await self._send_piece()
            await trio.sleep_until(started_s + self._interval_s)

    async def _send_piece(self) -> None:
        budget = min(MAX_PARTIAL_PIECE_BYTES, MAX_PARTIAL_BYTES - self._stored_bytes)
        unsent = "".join(self._unsent)
        text, size = _prefix(unsent, budget)
        rest = unsent[len(text) :]
        if not text:
            self._stop(f"the partial output reached its bound of {MAX_PARTIAL_BYTES} bytes")
            return
        self._unsent = [rest] if rest else []
        if rest:
            self._arrived.set()  # the rest goes with the next piece
        self._in_flight = text
        write = AppendPartial(
            operation_id=self._operation_id, attempt=self._attempt, offset=self._stored_chars, text=text
        )
        try:
            await self._rt.client.commit_writes((write,), lease=self._rt.lease)
        except TetherError as exc:  # refused (a stale lease, ...) or the connection lost: no more pieces
            self._stop(f"a piece was not stored: {type(exc).__name__}: {exc}")
            return
        self._in_flight = ""
        self._stored_chars += len(text)
        self._stored_bytes += size
        self.pieces_sent += 1

    def _stop(self, reason: str) -> None:
        self.stopped = reason
        self._unsent, self._in_flight = [], ""  # no piece will carry them: hold nothing more for this attempt

    def final_writes(self) -> list[AppendPartial]:
        """The text not acknowledged yet (a piece cut short in flight included: the owner skips what it has), as
        the last piece, for the commit of the result; none once sending stopped."""
        if self.stopped is not None:
            return []
        rest = self._in_flight + "".join(self._unsent)
        budget = min(FINAL_PIECE_BYTES, MAX_PARTIAL_PIECE_BYTES, MAX_PARTIAL_BYTES - self._stored_bytes)
        text, _ = _prefix(rest, budget)
        if not text:
            return []
        return [
            AppendPartial(operation_id=self._operation_id, attempt=self._attempt, offset=self._stored_chars, text=text)
        ]


@contextlib.asynccontextmanager
async def partial_output(rt: Phase, operation_id: str, attempt: int, interval_ms: int) -> AsyncIterator[PartialSender]:
    """A :class:`PartialSender` for one attempt; with ``interval_ms`` 0 nothing is sent before the end. On exit the
    piece in flight is cut short (its outcome does not matter: the last piece overlaps it)."""
    sender = PartialSender(rt, operation_id, attempt, interval_ms)
    if interval_ms <= 0:
        yield sender
        return
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender.run, name=f"partial output of {operation_id}")
            try:
                yield sender
            finally:
                nursery.cancel_scope.cancel(reason="the model stream ended")
    except BaseExceptionGroup as group:  # what the stream raised, as itself (the sender raises nothing)
        raise_collapsed(group)

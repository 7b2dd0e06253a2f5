"""The client's calls of runs: their records, the operation journal, partial output, interactions."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Final, Literal

import attrs
import trio

from protocol import (
    CancelRun,
    InteractionRecord,
    InteractionReply,
    InteractionsReply,
    OperationRecord,
    OperationReply,
    OperationsReply,
    PartialRecord,
    PartialsReply,
    ProtocolError,
    ReadInteractions,
    ReadOperation,
    ReadOperations,
    ReadPartials,
    ReadRun,
    ReadRuns,
    Resolve,
    Respond,
    RetryRun,
    RunRecord,
    RunReply,
    RunsReply,
    UsageError,
    WaitRun,
    json_value,
)

from ._base import BaseClient
from ._pages import pages, read_pages

RUNS_PAGE: Final = 1000
"""Runs, operations and interactions read per request (the owner's limit)."""

MAX_PARTIAL_REREADS: Final = 16
"""Times :meth:`Client.partials` reads a text again from its start because its attempt changed between two pages."""


class RunCalls(BaseClient):
    """Runs, their operation journal and partial output, and interactions (a part of :class:`~actors.Client`)."""

    async def run(self, run_id: str) -> RunRecord:
        """The run's record; :class:`~protocol.NotFound` if there is none."""
        reply = await self.connection.call(ReadRun(run_id=run_id), RunReply)
        return reply.run

    async def wait_for_run(self, run_id: str) -> RunRecord:
        """Return the run's record once it is ``completed``, ``failed``, ``cancelled`` or ``needs_attention``.

        Survives reconnections and owner restarts, like :meth:`wait_for_task`. Bound it with ``trio.fail_after``.
        """
        reply = await self._wait(WaitRun(run_id=run_id), RunReply)
        return reply.run

    async def runs(self, *, conversation_id: str | None = None, status: str | None = None) -> list[RunRecord]:
        """Every run (of one conversation and/or in one status when given), in the order they were created: by the
        commit that created each (a subagent's run, whose id is derived from its caller's, in its place; a retried
        run keeps its place), runs of one commit by id."""
        return [run async for run in self.iter_runs(conversation_id=conversation_id, status=status)]

    async def iter_runs(
        self, *, conversation_id: str | None = None, status: str | None = None
    ) -> AsyncIterator[RunRecord]:
        """The runs of :meth:`runs`, in the same order, read a page at a time as the loop asks for them: memory for
        one page however many runs there are (``tether usage --conversation`` counts the runs it does not show)."""

        async def page(after: str | None) -> tuple[Sequence[RunRecord], str | None]:
            request = ReadRuns(conversation_id=conversation_id, status=status, after_run_id=after, limit=RUNS_PAGE)
            reply = await self.connection.call(request, RunsReply)
            return reply.runs, reply.next_after_run_id

        async for records in pages(page, "read_runs"):
            for run in records:
                yield run

    async def operations(self, run_id: str) -> list[OperationRecord]:
        """The run's operation journal (model calls and tool calls, their intents and results), oldest first."""

        async def page(after: int | None) -> tuple[Sequence[OperationRecord], int | None]:
            request = ReadOperations(run_id=run_id, cursor=0 if after is None else after, limit=RUNS_PAGE)
            reply = await self.connection.call(request, OperationsReply)
            return reply.operations, reply.next_cursor

        return await read_pages(page, "read_operations")

    async def operation(self, operation_id: str) -> OperationRecord:
        """One operation of the journal as it stands (its intent, attempt, and result once committed);
        :class:`~protocol.NotFound` before its first intent. A checkpoint."""
        reply = await self.connection.call(ReadOperation(operation_id=operation_id), OperationReply)
        return reply.operation

    async def partials(self, *, run_id: str | None = None, operation_id: str | None = None) -> PartialsReply:
        """The stored partial output of one model request (``operation_id``) or of each of a run's (``run_id``):
        exactly one of the two. Each is one ``PartialRecord`` from offset 0 holding the text streamed so far
        (``done``: no text, the answer is the assistant entry; ``aborted``: never an answer). The reply's ``seq``
        is the head as of the read: ``watch(from_seq=reply.seq)`` continues exactly, and feeding both to an
        :class:`~actors.PartialText` shows each text once. A checkpoint.

        Read page by page (a page ends at the owner's read budget, a long text is cut and continued): the pages are
        joined here, one record per operation; ``seq`` is the first page's. A text whose attempt changed between
        two pages is read again from its start."""
        if (run_id is None) == (operation_id is None):
            await trio.lowlevel.checkpoint()
            raise UsageError("partials() takes exactly one of run_id= and operation_id=")
        held: dict[str, PartialRecord] = {}
        seq: int | None = None
        from_operation_id: str | None = None
        from_offset = 0
        rereads = 0
        while True:
            request = ReadPartials(
                run_id=run_id, operation_id=operation_id, from_operation_id=from_operation_id, from_offset=from_offset
            )
            reply = await self.connection.call(request, PartialsReply)
            seq = reply.seq if seq is None else seq
            reread = _join_partials(held, reply.partials)
            if reread is not None:
                rereads += 1
                if rereads > MAX_PARTIAL_REREADS:
                    raise ProtocolError(f"the partial output of {reread} changed attempt {rereads} times while read")
                from_operation_id, from_offset = reread, 0
                continue
            if reply.next_operation_id is None:
                return PartialsReply(partials=tuple(held.values()), seq=seq)
            if not reply.partials and (reply.next_operation_id, reply.next_offset) == (from_operation_id, from_offset):
                raise ProtocolError(f"read_partials made no progress at {from_operation_id} offset {from_offset}")
            from_operation_id, from_offset = reply.next_operation_id, reply.next_offset

    async def cancel_run(self, run_id: str) -> RunRecord:
        """Cancel a run once durable: a queued one ends ``cancelled`` at once; an active one has its task aborted
        and ends ``cancelled`` once that is terminal (wait with :meth:`wait_for_run`). Cancelling a cancelled run
        again is a no-op; a run that ended otherwise raises :class:`~protocol.Conflict`. Returns the run's record
        as the owner's batch that committed the cancel left it: ``cancelled`` when nothing had to run first,
        otherwise its status with reason ``cancelling`` (never ``waiting`` nor ``needs_attention``: its open
        interactions are ``cancelled``, nobody is asked anything any more)."""
        reply = await self.connection.call(CancelRun(run_id=run_id), RunReply)
        return reply.run

    async def retry(self, run_id: str) -> RunRecord:
        """Re-attempt a ``failed`` run (a new task, the same run). A run not ended (``needs_attention`` included) is
        left as is and its record returned: it resumes by itself once its cause is settled. A ``completed`` or
        ``cancelled`` run raises :class:`~protocol.Conflict`."""
        reply = await self.connection.call(RetryRun(run_id=run_id), RunReply)
        return reply.run

    async def resolve(self, operation_id: str, output: Any, *, resolved_by: str | None = None) -> OperationRecord:
        """Settle an interrupted manual tool call with ``output`` (the result the model sees), once durable."""
        request = Resolve(operation_id=operation_id, output=json_value(output, "output"), resolved_by=resolved_by)
        reply = await self.connection.call(request, OperationReply)
        return reply.operation

    async def respond(
        self,
        interaction_id: str,
        *,
        approve: bool | None = None,
        note: str | None = None,
        answer: Any = None,
        responded_by: str | None = None,
    ) -> InteractionRecord:
        """Answer an interaction, once durable: an approval with ``approve`` (and a ``note``), a question
        (``call.ask``) with ``answer``, a JSON value its schema accepts (not ``None``). It is answered once: the same
        answer again is a no-op, another raises :class:`~protocol.Conflict`; an answer of the wrong shape raises
        :class:`~protocol.InvalidRequest` saying what was expected, and changes nothing."""
        request = Respond(
            interaction_id=interaction_id,
            approve=approve,
            note=note,
            answer=json_value(answer, "answer"),
            responded_by=responded_by,
        )
        reply = await self.connection.call(request, InteractionReply)
        return reply.interaction

    async def interactions(
        self, *, status: Literal["open", "answered", "cancelled"] | None = "open", run_id: str | None = None
    ) -> list[InteractionRecord]:
        """The interactions in ``status`` (every status when ``None``), of one run when given, oldest first."""

        async def page(after: str | None) -> tuple[Sequence[InteractionRecord], str | None]:
            request = ReadInteractions(status=status, run_id=run_id, after_interaction_id=after, limit=RUNS_PAGE)
            reply = await self.connection.call(request, InteractionsReply)
            return reply.interactions, reply.next_after_interaction_id

        return await read_pages(page, "read_interactions")


def _join_partials(held: dict[str, PartialRecord], page: Sequence[PartialRecord]) -> str | None:
    """Add a ``read_partials`` page to ``held`` (one record per operation, in order): a record continuing the text
    held for its operation (same attempt, from where it ends) is joined to it; a record from offset 0, or one
    without text (an ended output), replaces it. Returns the operation whose text must be read again from its start
    (it continued another attempt's), having dropped what was held for it."""
    for record in page:
        before = held.get(record.operation_id)
        if before is None or record.offset == 0 or not record.text:
            held[record.operation_id] = record
        elif (
            before.attempt == record.attempt
            and before.created_at_ms == record.created_at_ms
            and before.offset + len(before.text) == record.offset
            and before.offset == 0
        ):
            held[record.operation_id] = attrs.evolve(
                record, offset=0, text=before.text + record.text, created_at_ms=before.created_at_ms
            )
        else:
            del held[record.operation_id]
            return record.operation_id
    return None

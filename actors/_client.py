"""The client: ``actors.connect(db=... | url=..., token=...)``, the typed API over one connection.

The connection (``_connection.py``) is shared by every task that uses the client: requests are coalesced, replies
matched by ``call_id``. If it drops, calls in flight raise :class:`~protocol.ConnectionLost` (their outcome is
unknown), the client reconnects with back-off (re-reading the runtime file when it was opened with ``db=``, since a
restarted owner listens on a new port), and watches (``_watch.py``) resume from the last ``seq`` they delivered,
with no gap and no duplicate. Calls made while disconnected wait for the reconnection, at most
``reconnect_timeout_s``.
"""

from __future__ import annotations

import contextlib
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, Final, Literal, TypeVar

import attrs
import trio

from protocol import (
    AbortTask,
    AdvanceClock,
    Announce,
    AppendEntry,
    Budget,
    BudgetReply,
    CancelRun,
    ClockReply,
    Commit,
    Committed,
    ConnectionLost,
    ConversationRecord,
    ConversationReply,
    CreateConversation,
    CreateTask,
    DocumentRecord,
    DocumentReply,
    EntriesReply,
    EntryRecord,
    InteractionRecord,
    InteractionReply,
    InteractionsReply,
    LeaseRef,
    ModelPrice,
    Ok,
    OperationRecord,
    OperationReply,
    OperationsReply,
    Order,
    OutcomesReply,
    PartialRecord,
    PartialsReply,
    PeerInfo,
    PeersReply,
    Ping,
    Pong,
    PricesReply,
    ProtocolError,
    PutDocument,
    ReadConversation,
    ReadDocument,
    ReadEntries,
    ReadInteractions,
    ReadOperation,
    ReadOperations,
    ReadOutcomes,
    ReadPartials,
    ReadPeers,
    ReadPrices,
    ReadRun,
    ReadRuns,
    ReadSubmission,
    ReadTask,
    ReadTaskGraph,
    ReadUsage,
    ReadUsageTotals,
    Release,
    Request,
    Resolve,
    Respond,
    RetryRun,
    RunRecord,
    RunReply,
    RunsReply,
    RunUsage,
    SetBudget,
    SetPrices,
    SubmissionRecord,
    SubmissionReply,
    Submit,
    Submitted,
    TaskGraphReply,
    TaskNode,
    TaskOutcome,
    TaskRecord,
    TaskReply,
    TetherError,
    UsageError,
    UsageReply,
    UsageTotal,
    UsageTotalsReply,
    WaitRun,
    WaitTask,
    Welcome,
    Write,
    json_value,
    new_id,
)

from ._connection import CONNECT_TIMEOUT_S as CONNECT_TIMEOUT_S  # re-exported: tests/faults/test_up_faults.py
from ._connection import RECONNECT_TIMEOUT_S, Connection, open_connection
from ._watch import WatchStream

ENTRY_PAGE: Final = 500
OUTCOMES_PAGE: Final = 1000
"""Outcomes read per request (the owner's limit)."""
RUNS_PAGE: Final = 1000
"""Runs, operations and interactions read per request (the owner's limit)."""

WhenBusy = Literal["follow_up", "reject"]
"""What an ``input`` submission does while its conversation has an active run: queue behind it, or be refused."""

_R = TypeVar("_R")
_T = TypeVar("_T")
_C = TypeVar("_C", str, int)


class Client:
    """A connection to one owner. Create it with :func:`connect`; every method is a trio checkpoint.

    The typed API over one :class:`~actors._connection.Connection` (which reconnects, matches replies and feeds
    watches); :attr:`connection` is that layer, which the worker and phases use too.
    """

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        """The connection layer under this client (see ``actors/_connection.py`` for its surface)."""

    @property
    def welcome(self) -> Welcome | None:
        """The owner's last ``Welcome`` (its instance, clock and head ``seq`` at connect time)."""
        return self.connection.welcome

    @property
    def reconnects(self) -> int:
        """How many times the connection was re-established."""
        return self.connection.reconnects

    # ------------------------------------------------------------------------------------------- public API

    async def create_conversation(
        self, conversation_id: str | None = None, *, agent: str | None = None, owner_task_id: str | None = None
    ) -> str:
        """Create a conversation (with a new UUIDv7 id unless one is given) and return its id once durable.

        With ``agent``, the conversation is bound to that agent: each ``input`` submitted to it starts a run. With
        ``owner_task_id``, a live task owns it (a subagent's transcript): aborting the task aborts its runs, and their
        usage counts toward that task's tree.
        """
        async with self.commit() as tx:
            conversation_id = tx.create_conversation(conversation_id, agent=agent, owner_task_id=owner_task_id)
        return conversation_id

    async def append(self, conversation_id: str, *, kind: str, data: Any = None, entry_id: str | None = None) -> int:
        """Append an entry and return the ``seq`` of its commit, once durable.

        ``entry_id`` (a new UUIDv7 by default) makes a retry after :class:`ConnectionLost` safe: the owner
        refuses a second entry with the same id (:class:`~protocol.Duplicate`). Kinds under ``tether.`` are the
        runtime's (what a model reads): the owner refuses them from a client (:class:`~protocol.InvalidRequest`).
        """
        async with self.commit() as tx:
            tx.append(conversation_id, kind=kind, data=data, entry_id=entry_id)
        assert tx.seq is not None
        return tx.seq

    async def put_document(
        self,
        name: str,
        value: Any,
        *,
        conversation_id: str | None = None,
        expected_version: int | None = None,
    ) -> int:
        """Write a document (global when ``conversation_id`` is ``None``) and return its new version.

        With ``expected_version`` the write happens only if the document is at that version (0: absent);
        otherwise :class:`~protocol.Conflict` is raised and nothing changes.
        """
        async with self.commit() as tx:
            tx.put_document(name, value, conversation_id=conversation_id, expected_version=expected_version)
        return tx.results[0]

    @contextlib.asynccontextmanager
    async def commit(self) -> AsyncIterator[Transaction]:
        """Collect writes and apply them as one atomic commit when the block exits without an exception.

        ``tx.seq`` and ``tx.results`` are set once the commit is durable.
        """
        tx = Transaction()
        yield tx
        if tx.writes:
            committed = await self.commit_writes(tx.writes)
            tx.seq = committed.seq
            tx.results = committed.results

    async def commit_writes(self, writes: Sequence[Write], *, lease: LeaseRef | None = None) -> Committed:
        """Apply ``writes`` as one atomic commit and return the owner's ``Committed`` (the commit's ``seq`` and each
        write's result) once durable: what :meth:`commit` sends, for writes collected elsewhere. A worker's phase
        commits under its ``lease``: once the lease has ended the whole commit is refused
        (:class:`~protocol.StaleLease`) and nothing of it lands. A checkpoint."""
        return await self.connection.call(Commit(writes=tuple(writes), lease=lease), Committed)

    async def conversation(self, conversation_id: str) -> ConversationRecord:
        """The conversation's record; :class:`~protocol.NotFound` if it does not exist."""
        request = ReadConversation(conversation_id=conversation_id)
        reply = await self.connection.call(request, ConversationReply)
        return reply.conversation

    async def read_entries(
        self,
        conversation_id: str,
        *,
        order: Order = "asc",
        cursor: int | None = None,
        limit: int = ENTRY_PAGE,
    ) -> EntryPage:
        """One page of entries. ``cursor`` is exclusive; pass the page's ``next_cursor`` to continue."""
        request = ReadEntries(conversation_id=conversation_id, order=order, cursor=cursor, limit=limit)
        reply = await self.connection.call(request, EntriesReply)
        return EntryPage(entries=list(reply.entries), next_cursor=reply.next_cursor)

    async def entries(self, conversation_id: str, *, order: Order = "asc") -> list[EntryRecord]:
        """Every entry of the conversation, oldest first (``order="desc"``: newest first)."""
        result: list[EntryRecord] = []
        cursor: int | None = None
        while True:
            page = await self.read_entries(conversation_id, order=order, cursor=cursor)
            result.extend(page.entries)
            if page.next_cursor is None:
                return result
            if cursor is not None and (page.next_cursor <= cursor if order == "asc" else page.next_cursor >= cursor):
                raise ProtocolError(
                    f"read_entries ({order}) after {cursor} answered a page ending at {page.next_cursor}"
                )
            cursor = page.next_cursor

    async def document(self, name: str, *, conversation_id: str | None = None) -> DocumentRecord | None:
        """The document's current record, or ``None`` if it was never written."""
        request = ReadDocument(conversation_id=conversation_id, name=name)
        reply = await self.connection.call(request, DocumentReply)
        return reply.document

    async def submit(
        self,
        conversation_id: str,
        *,
        kind: str,
        payload: Any = None,
        request_id: str,
        submission_id: str | None = None,
        when_busy: WhenBusy = "follow_up",
    ) -> SubmissionRecord:
        """Admit a submission, deduplicated by ``(conversation_id, request_id)``.

        A repeat with the same kind and payload returns the original record (also after a restart); the same
        ``request_id`` with other content raises :class:`~protocol.Conflict`. An ``input`` to a conversation bound
        to an agent starts a run (``record.run_id``); while another run of the conversation is active it is
        ``queued`` behind it, or, with ``when_busy="reject"``, refused with :class:`~protocol.Conflict`.
        """
        request = Submit(
            conversation_id=conversation_id,
            submission_id=submission_id or new_id(),
            request_id=request_id,
            kind=kind,
            payload=json_value(payload, "payload"),
            when_busy=when_busy,
        )
        reply = await self.connection.call(request, Submitted)
        return reply.submission

    async def submission(self, conversation_id: str, request_id: str) -> SubmissionRecord | None:
        """The submission admitted under ``request_id`` in this conversation, or ``None``."""
        request = ReadSubmission(conversation_id=conversation_id, request_id=request_id)
        reply = await self.connection.call(request, SubmissionReply)
        return reply.submission

    def watch(self, *, conversation_id: str | None = None, from_seq: int = 0) -> WatchStream:
        """Every commit after ``from_seq`` touching ``conversation_id`` (every commit when ``None``), in order.

        Use as ``async for change in client.watch(...)``, or ``async with`` it to unsubscribe on exit.
        """
        return WatchStream(self.connection, conversation_id, from_seq)

    # ---------------------------------------------------------------------------------------------- tasks

    async def create_task(
        self,
        kind: str,
        input: Any = None,
        *,
        conversation_id: str | None = None,
        owner_task_id: str | None = None,
        task_id: str | None = None,
        version: int = 0,
        background: bool = False,
        abandon_on_restart: bool = False,
    ) -> str:
        """Create a task and return its id once durable.

        It is owned by ``owner_task_id``, or else by ``conversation_id``, or else by a new conversation created in
        the same commit. ``version`` 0 lets the first worker that runs it bind its definition's version. A
        ``task_id`` chosen by the caller makes a retry after :class:`ConnectionLost` safe (a second create is
        refused as :class:`~protocol.Duplicate`).
        """
        async with self.commit() as tx:
            task_id = tx.create_task(
                kind,
                input,
                conversation_id=conversation_id,
                owner_task_id=owner_task_id,
                task_id=task_id,
                version=version,
                background=background,
                abandon_on_restart=abandon_on_restart,
            )
        return task_id

    async def task(self, task_id: str) -> TaskRecord:
        """The task's record (live or terminal); :class:`~protocol.NotFound` if there is none."""
        return (await self.task_state(task_id)).task

    async def task_state(self, task_id: str) -> TaskReply:
        """The task's record with its input and current checkpoint."""
        return await self.connection.call(ReadTask(task_id=task_id), TaskReply)

    async def wait_for_task(self, task_id: str) -> TaskRecord:
        """Return the task's record once it is terminal (``record.outcome`` says how it ended).

        Survives reconnections and owner restarts: the wait is simply asked again. Bound it with
        ``trio.fail_after``.
        """
        reply = await self._wait(WaitTask(task_id=task_id), TaskReply)
        return reply.task

    async def _wait(self, request: Request, expected: type[_R]) -> _R:
        """Make a long-poll ``request`` until it is answered, asking again after each lost connection; raise
        :class:`ConnectionLost` once the connection cannot come back (closed, ``reconnect=False``, refused)."""
        while True:
            try:
                return await self.connection.call(request, expected)
            except ConnectionLost:
                if not self.connection.can_reconnect():
                    raise  # closed, or reconnect=False: asking again would fail again at once, forever

    async def abort_task(self, task_id: str) -> bool:
        """Mark the task for abort once durable; ``False`` if it was already marked or terminal.

        The abort runs bottom-up: owned work first, then the task's abort handler. Wait for its end with
        :meth:`wait_for_task`.
        """
        async with self.commit() as tx:
            tx.abort_task(task_id)
        return tx.results[0] == 1

    async def outcomes(self, task_ids: Sequence[str]) -> dict[str, TaskOutcome | None]:
        """The outcome of each task, ``None`` for one that is not terminal yet."""
        outcomes: dict[str, TaskOutcome | None] = {}
        start = 0
        while start < len(task_ids):
            page = tuple(task_ids[start : start + OUTCOMES_PAGE])
            reply = await self.connection.call(ReadOutcomes(task_ids=page), OutcomesReply)
            if not 1 <= len(reply.outcomes) <= len(page):
                raise ProtocolError(f"read_outcomes of {len(page)} tasks answered {len(reply.outcomes)} outcomes")
            # The owner answers the first ones that fit its read budget: ask again for the rest.
            outcomes.update(zip(page, reply.outcomes, strict=False))
            start += len(reply.outcomes)
        return outcomes

    async def task_graph(self) -> TaskGraph:
        """Every live task, with its owner edge, state, restarts, and why it is blocked if it is."""
        seq: int | None = None

        async def page(after: str | None) -> tuple[Sequence[TaskNode], str | None]:
            nonlocal seq
            reply = await self.connection.call(ReadTaskGraph(after_task_id=after), TaskGraphReply)
            seq = reply.seq if seq is None else seq  # later pages may be newer than the first: records carry seq
            return reply.nodes, reply.next_after_task_id

        nodes = await _read_pages(page, "read_task_graph")
        assert seq is not None
        return TaskGraph(seq=seq, nodes={node.task.task_id: node for node in nodes})

    async def watch_task_graph(self) -> AsyncIterator[TaskGraph]:
        """The live task graph now, then again after every commit that changes it.

        A task appears with the commit that creates it and leaves with the commit that makes it terminal. The
        ``blocked`` reasons are those of the first read (a change carries committed state only).
        """
        graph = await self.task_graph()
        yield graph
        async with self.watch(from_seq=graph.seq) as changes:
            async for change in changes:
                nodes = dict(graph.nodes)
                touched = False
                for record in change.records:
                    if not isinstance(record, TaskRecord):
                        continue
                    previous = nodes.get(record.task_id)
                    if previous is not None and previous.task.seq > record.seq:
                        continue  # a later page of the first read showed a newer state already
                    touched = True
                    if record.status == "terminal":
                        nodes.pop(record.task_id, None)
                    else:
                        nodes[record.task_id] = (
                            TaskNode(task=record) if previous is None else attrs.evolve(previous, task=record)
                        )
                if touched:
                    graph = TaskGraph(seq=change.seq, nodes=nodes)
                    yield graph

    # ----------------------------------------------------------------------------------------------- runs

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
        """Every run (of one conversation and/or in one status when given), in run id order: the order they were
        submitted (exactly for one process's submissions, whose UUIDv7 ids strictly increase; to the millisecond
        across processes)."""
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

        async for records in _pages(page, "read_runs"):
            for run in records:
                yield run

    async def operations(self, run_id: str) -> list[OperationRecord]:
        """The run's operation journal (model calls and tool calls, their intents and results), oldest first."""

        async def page(after: int | None) -> tuple[Sequence[OperationRecord], int | None]:
            request = ReadOperations(run_id=run_id, cursor=0 if after is None else after, limit=RUNS_PAGE)
            reply = await self.connection.call(request, OperationsReply)
            return reply.operations, reply.next_cursor

        return await _read_pages(page, "read_operations")

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
        approve: bool,
        note: str | None = None,
        responded_by: str | None = None,
    ) -> InteractionRecord:
        """Answer an interaction (an approval: ``approve`` it or not), once durable. It is answered once: the same
        answer again is a no-op, another raises :class:`~protocol.Conflict`."""
        request = Respond(interaction_id=interaction_id, approve=approve, note=note, responded_by=responded_by)
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

        return await _read_pages(page, "read_interactions")

    async def usage(self, conversation_id: str | None = None) -> dict[str, RunUsage]:
        """Token usage totals: the conversation's (keyed by its id; empty if it has used none) or, without one,
        each model's (keyed by model). :class:`~protocol.NotFound` for a conversation that does not exist."""
        reply = await self.connection.call(ReadUsage(conversation_id=conversation_id), UsageReply)
        return {total.key: total.usage for total in reply.totals}

    async def usage_totals(
        self, scope: Literal["model", "conversation", "tree"], key: str | None = None, *, limit: int | None = None
    ) -> tuple[list[UsageTotal], list[Budget]]:
        """Usage totals of ``scope`` (every model's, conversation's or task tree's; or the one ``key`` names, zero when
        it used nothing: for ``tree`` any task of the tree, the total keyed by its root task) and the budgets set on
        them. Reads page by page: all of them, or the first ``limit`` (1 or more) in key order (see
        :meth:`usage_listing` for how many there are). A checkpoint."""
        totals, budgets, _ = await self.usage_listing(scope, key, limit=limit)
        return totals, budgets

    async def usage_listing(
        self, scope: Literal["model", "conversation", "tree"], key: str | None = None, *, limit: int | None = None
    ) -> tuple[list[UsageTotal], list[Budget], int]:
        """As :meth:`usage_totals`, and how many totals there are in all (``limit`` may leave some out). A
        checkpoint."""
        if limit is not None and limit < 1:
            await trio.lowlevel.checkpoint()
            raise UsageError(f"limit must be 1 or more (or None: every total), not {limit}")
        totals: list[UsageTotal] = []
        budgets: list[Budget] = []
        count: int | None = None
        after: str | None = None
        while True:
            page = RUNS_PAGE if limit is None else min(RUNS_PAGE, limit - len(totals))
            request = ReadUsageTotals(scope=scope, key=key, after_key=after, limit=page)
            reply = await self.connection.call(request, UsageTotalsReply)
            count = reply.count if count is None else count
            totals.extend(reply.totals)
            budgets.extend(reply.budgets)
            if reply.next_after_key is None or (limit is not None and len(totals) >= limit):
                return totals, budgets, max(count or 0, len(totals))
            if not reply.totals or reply.next_after_key == after:  # an owner answering the same page over and over
                raise ProtocolError(f"read_usage_totals made no progress after key {after!r}")
            after = reply.next_after_key

    async def prices(self) -> list[ModelPrice]:
        """The price table (per model, per million tokens), by model. A checkpoint."""
        return list((await self.connection.call(ReadPrices(), PricesReply)).prices)

    async def set_prices(self, prices: Iterable[ModelPrice] = (), *, remove: Iterable[str] = ()) -> list[ModelPrice]:
        """Set (or replace) these models' prices and drop those in ``remove``, all at once or not at all (a bad price:
        :class:`~protocol.InvalidRequest`, nothing changed); the whole table after. Results committed from now on are
        costed with it; committed costs never change. A checkpoint."""
        request = SetPrices(prices=tuple(prices), remove=tuple(remove))
        return list((await self.connection.call(request, PricesReply)).prices)

    async def set_budget(
        self,
        *,
        conversation_id: str | None = None,
        task_id: str | None = None,
        max_tokens: int | None = None,
        max_cost: float | None = None,
    ) -> Budget | None:
        """Set the budget of a conversation, or of the task tree ``task_id`` belongs to (kept under its root task);
        without ``max_tokens`` and ``max_cost`` remove it. A run's model request past it ends the run ``failed``
        (``budget_exceeded``) before the model is called. Returns the budget as stored (``None``: removed). A
        checkpoint, even when it raises :class:`~protocol.UsageError` for a bad call."""
        if (conversation_id is None) == (task_id is None):
            await trio.lowlevel.checkpoint()
            raise UsageError("set_budget() needs exactly one of conversation_id=ID or task_id=ID")
        if conversation_id is not None:
            request = SetBudget(scope="conversation", key=conversation_id, max_tokens=max_tokens, max_cost=max_cost)
        else:
            assert task_id is not None
            request = SetBudget(scope="tree", key=task_id, max_tokens=max_tokens, max_cost=max_cost)
        return (await self.connection.call(request, BudgetReply)).budget

    # ---------------------------------------------------------------------------------------------- peers

    async def peers(self) -> list[PeerInfo]:
        """The connections attached to the owner: clients, readers and workers with what they announced, by peer
        id (read page by page: a peer attached or gone between two pages may be in the list or not)."""

        async def page(after: int | None) -> tuple[Sequence[PeerInfo], int | None]:
            reply = await self.connection.call(ReadPeers(after_peer_id=after), PeersReply)
            return reply.peers, reply.next_after_peer_id

        return await _read_pages(page, "read_peers")

    async def announce(self, announcement: Announce) -> None:
        """Tell the owner what this worker runs (role ``worker`` only). Used by :func:`actors.serve`."""
        await self.connection.call(announcement, Ok)

    async def release(self, lease: LeaseRef, *, migration_error: str | None = None) -> None:
        """Give a lease back without a new state (role ``worker`` only; used by :func:`actors.serve`): the task is
        pending again, no restart counted. ``migration_error`` says why this worker could not run the stored task.
        :class:`~protocol.StaleLease` if the lease is not current any more. A checkpoint."""
        await self.connection.call(Release(lease=lease, migration_error=migration_error), Ok)

    async def ping(self) -> Pong:
        """A round trip to the owner: its clock and newest ``seq``."""
        return await self.connection.call(Ping(), Pong)

    async def advance_clock(self, by_ms: int) -> int:
        """Move a manual owner clock forward and return its new time (owners run with ``--clock manual``)."""
        reply = await self.connection.call(AdvanceClock(by_ms=by_ms), ClockReply)
        return reply.now_ms


@attrs.define
class EntryPage:
    """A page of entries and the cursor that continues after it (``None``: nothing further)."""

    entries: list[EntryRecord]
    next_cursor: int | None


@attrs.frozen
class TaskGraph:
    """The live tasks as of commit ``seq``, by id."""

    seq: int
    nodes: dict[str, TaskNode]


@attrs.define
class Transaction:
    """Writes collected by :meth:`Client.commit`, applied atomically when its block exits."""

    writes: list[Write] = attrs.Factory(list)
    seq: int | None = None
    results: tuple[int, ...] = ()
    default_owner_task_id: str | None = None
    """The owner of a task created with neither ``owner_task_id`` nor ``conversation_id`` (a phase's own task);
    without one, such a task gets a new conversation of its own."""

    def create_task(
        self,
        kind: str,
        input: Any = None,
        *,
        conversation_id: str | None = None,
        owner_task_id: str | None = None,
        task_id: str | None = None,
        version: int = 0,
        background: bool = False,
        abandon_on_restart: bool = False,
    ) -> str:
        """Create a task in this commit (see :meth:`Client.create_task`) and return its id."""
        task_id = task_id or new_id()
        if conversation_id is None and owner_task_id is None:
            if self.default_owner_task_id is not None:
                owner_task_id = self.default_owner_task_id
            else:
                conversation_id = self.create_conversation()
        self.writes.append(
            CreateTask(
                task_id=task_id,
                kind=kind,
                version=version,
                input=json_value(input, "input"),
                conversation_id=conversation_id,
                owner_task_id=owner_task_id,
                background=background,
                abandon_on_restart=abandon_on_restart,
            )
        )
        return task_id

    def abort_task(self, task_id: str) -> None:
        """Mark a task for abort in this commit."""
        self.writes.append(AbortTask(task_id=task_id))

    def create_conversation(
        self, conversation_id: str | None = None, *, owner_task_id: str | None = None, agent: str | None = None
    ) -> str:
        conversation_id = conversation_id or new_id()
        write = CreateConversation(conversation_id=conversation_id, owner_task_id=owner_task_id, agent=agent)
        self.writes.append(write)
        return conversation_id

    def append(self, conversation_id: str, *, kind: str, data: Any = None, entry_id: str | None = None) -> str:
        entry_id = entry_id or new_id()
        write = AppendEntry(
            conversation_id=conversation_id, entry_id=entry_id, kind=kind, data=json_value(data, "data")
        )
        self.writes.append(write)
        return entry_id

    def put_document(
        self,
        name: str,
        value: Any,
        *,
        conversation_id: str | None = None,
        expected_version: int | None = None,
    ) -> None:
        self.writes.append(
            PutDocument(
                conversation_id=conversation_id,
                name=name,
                value=json_value(value, "value"),
                expected_version=expected_version,
            )
        )


@contextlib.asynccontextmanager
async def connect(
    db: str | os.PathLike[str] | None = None,
    *,
    url: str | None = None,
    token: str | None = None,
    role: str = "client",
    name: str = "",
    reconnect: bool = True,
    reconnect_timeout_s: float = RECONNECT_TIMEOUT_S,
    wait_for_owner_s: float = 0.0,
    ca: str | os.PathLike[str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
    on_attempt: Callable[[TetherError | None, float], None] | None = None,
) -> AsyncIterator[Client]:
    """Connect to the owner of ``db`` (found through its runtime file) or at ``url`` with ``token``.

    A ``wss://`` owner is verified against ``ca`` (a PEM file of the CA that signed its certificate; for a
    self-signed certificate, the certificate itself), or the CA the runtime file names (``db=``), or the system's
    CAs; ``ssl_context`` replaces all of that with a context of your own.

    ``role`` is ``"client"`` (read and write), ``"reader"`` (read and watch only) or ``"worker"``. Raises
    :class:`~protocol.OwnerUnavailable` if no owner can be reached within ``wait_for_owner_s`` (0: try once; an
    owner that is starting or restarting is waited for otherwise), :class:`~protocol.HandshakeRefused` if the owner
    refuses the token, version or role, and :class:`~protocol.UsageError`, before trying anything, for what no
    retry can mend: both or neither of ``db`` and ``url``, a ``url`` that is not ``ws://`` or ``wss://``, a ``url``
    without ``token``, a ``ca`` file that cannot be read as PEM. ``on_attempt`` is called after each failed attempt
    to reach the owner (while waiting for it, or reconnecting) with why and the back-off before the next, and with
    ``(None, 0.0)`` when an attempt after failures succeeds (:func:`actors.serve` logs them).
    """
    check_target(db=db, url=url, token=token, ca=ca, ssl_context=ssl_context)
    async with open_connection(
        db=None if db is None else os.fspath(db),
        url=url,
        token=token,
        role=role,
        name=name,
        reconnect=reconnect,
        reconnect_timeout_s=reconnect_timeout_s,
        wait_for_owner_s=wait_for_owner_s,
        ca=None if ca is None else os.fspath(ca),
        ssl_context=ssl_context,
        on_attempt=on_attempt,
    ) as connection:
        yield Client(connection)


def check_target(
    *,
    db: str | os.PathLike[str] | None,
    url: str | None,
    token: str | None,
    ca: str | os.PathLike[str] | None,
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    """Raise :class:`~protocol.UsageError` for a way to reach an owner that no retry can mend (see :func:`connect`);
    nothing is tried. The owner's absence is not such an error: a runtime file that is missing now may appear."""
    if (db is None) == (url is None):
        raise UsageError("connect() needs exactly one of db=PATH or url=URL")
    if url is None:
        return
    if not url.startswith(("ws://", "wss://")):
        raise UsageError(f"an owner's url starts with ws:// or wss://, not {url!r}; nothing was tried")
    if not token:
        raise UsageError(
            f"connecting to the owner at {url} needs its access token (token=..., or TETHER_TOKEN for tether "
            "worker): it is in DB.runtime.json on the owner's host; nothing was tried"
        )
    if ca is not None and ssl_context is None and url.startswith("wss://"):
        try:
            ssl.create_default_context(cafile=os.fspath(ca))
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(
                f"cannot use the CA certificate {os.fspath(ca)} to verify the owner at {url}: {exc}; give a readable "
                "PEM file (the CA that signed the owner's certificate, or the certificate itself if self-signed); "
                "nothing was tried"
            ) from exc


async def _read_pages(
    read_page: Callable[[_C | None], Awaitable[tuple[Sequence[_T], _C | None]]], what: str
) -> list[_T]:
    """Every record of a keyset-paged read, joined: ``read_page(after)`` answers one page and the cursor after it
    (``None``: that was the last page), starting from ``None``. The owner's cursors only move forward (the pages
    are in key order); one that does not is the owner's error, raised as :class:`ProtocolError` rather than read
    again forever. A checkpoint (each page is a call)."""
    return [record async for page in _pages(read_page, what) for record in page]


async def _pages(
    read_page: Callable[[_C | None], Awaitable[tuple[Sequence[_T], _C | None]]], what: str
) -> AsyncIterator[Sequence[_T]]:
    """The pages of :func:`_read_pages`, one at a time, each read when the previous one was taken."""
    after: _C | None = None
    while True:
        page, next_after = await read_page(after)
        yield page
        if next_after is None:
            return
        if after is not None and next_after <= after:
            raise ProtocolError(f"{what} after {after!r} answered a page ending at {next_after!r}")
        after = next_after


MAX_PARTIAL_REREADS: Final = 16
"""Times :meth:`Client.partials` reads a text again from its start because its attempt changed between two pages."""


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

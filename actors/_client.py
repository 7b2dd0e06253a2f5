"""The client: ``actors.connect(db=... | url=..., token=...)``.

One WebSocket connection per client, shared by every task that uses the client. Requests from all tasks are
coalesced: whatever is pending when the sender runs travels as one message. Replies are matched by ``call_id``.

If the connection drops, calls in flight raise :class:`~protocol.ConnectionLost` (their outcome is unknown), the
client reconnects with back-off (re-reading the runtime file when it was opened with ``db=``, since a restarted
owner listens on a new port), and watches resume from the last ``seq`` they delivered, with no gap and no
duplicate. Calls made while disconnected wait for the reconnection, at most ``reconnect_timeout_s``.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import os
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Final, TypeVar

import attrs
import trio
import trio_websocket

from protocol import (
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    WEBSOCKET_HARD_LIMIT_BYTES,
    AbortTask,
    AdvanceClock,
    Announce,
    AppendEntry,
    BadFrame,
    CancelLease,
    Change,
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
    Error,
    Frame,
    Goodbye,
    HandshakeRefused,
    Hello,
    Lease,
    Ok,
    Order,
    OutcomesReply,
    OwnerUnavailable,
    PeerInfo,
    PeersReply,
    Ping,
    Pong,
    ProtocolError,
    PutDocument,
    ReadConversation,
    ReadDocument,
    ReadEntries,
    ReadOutcomes,
    ReadPeers,
    ReadSubmission,
    ReadTask,
    ReadTaskGraph,
    Refused,
    Request,
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
    Unwatch,
    UsageError,
    WaitTask,
    Watch,
    Watching,
    Welcome,
    Write,
    collapse_group,
    decode_frame,
    decode_message,
    encode_frame,
    error_for_code,
    json_value,
    new_id,
    read_runtime,
    take_message,
)
from protocol.io import PEER_GONE  # handled by reconnecting, never raised

R = TypeVar("R")

CONNECT_TIMEOUT_S: Final = 3.0
"""For the TCP connection, the WebSocket upgrade and the hello. A connection attempted while an owner is being
killed is accepted by the kernel and then reset, and trio-websocket does not notice a reset during its opening
handshake: the attempt only ends at this timeout."""
RECONNECT_ATTEMPT_TIMEOUT_S: Final = 0.5
"""The first reconnection attempts give up sooner (doubling up to ``CONNECT_TIMEOUT_S``): the owner that died
may have been caught mid-teardown, and the next attempt reaches its successor."""
RECONNECT_TIMEOUT_S: Final = 30.0
BACKOFF_INITIAL_S: Final = 0.05
BACKOFF_MAX_S: Final = 0.1
"""Reconnection attempts are cheap (a refused connection, or a runtime file not yet rewritten), so they stay
frequent: a restarted owner is found within a tenth of a second of listening."""
CLOSE_TIMEOUT_S: Final = 1.0
ENTRY_PAGE: Final = 500
OUTCOMES_PAGE: Final = 1000
"""Outcomes read per request (the owner's limit)."""
WATCH_BUFFER_LIMIT: Final = 10_000
"""Changes a watch holds for a slow consumer before it stops receiving and re-reads from the log later."""
RECEIVE_BUFFER_BYTES: Final = 1 << 16


class _Waiter:
    __slots__ = ("event", "reply")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.reply: Frame | TetherError | None = None


class Client:
    """A connection to one owner. Create it with :func:`connect`; every method is a trio checkpoint."""

    def __init__(
        self,
        *,
        db: str | None,
        url: str | None,
        token: str | None,
        role: str,
        name: str,
        reconnect: bool,
        reconnect_timeout_s: float,
    ) -> None:
        self._db = db
        self._url = url
        self._token = token
        self._role = role
        self._name = name
        self._reconnect = reconnect
        self._reconnect_timeout_s = reconnect_timeout_s
        self._call_ids = itertools.count(1)
        self._watch_ids = itertools.count(1)
        self._waiters: dict[int, _Waiter] = {}
        self._outbox: list[bytes] = []
        self._outbox_ready = trio.Event()
        self._ws: trio_websocket.WebSocketConnection | None = None
        self._connected = trio.Event()
        self._closed = False
        self._failure: TetherError | None = None
        self._watches: dict[int, WatchStream] = {}
        self._nursery: trio.Nursery | None = None
        self.welcome: Welcome | None = None
        """The owner's last ``Welcome`` (its instance, clock and head ``seq`` at connect time)."""
        self.reconnects = 0
        """How many times the connection was re-established."""
        self._last_heard_s = 0.0
        self.announcement: Callable[[], Announce] | None = None
        """Called after every (re)connection for an announcement sent before anything else: how a worker
        re-announces itself (with the leases it still runs)."""
        self.on_lease: Callable[[Lease | CancelLease], None] | None = None
        """Receives the leases and cancellations the owner pushes to a worker."""
        self.on_connection_lost: Callable[[], None] | None = None
        """Called when the connection ends (before reconnecting): a worker's leases ended with it."""

    # ------------------------------------------------------------------------------------------- public API

    async def create_conversation(self, conversation_id: str | None = None) -> str:
        """Create a conversation (with a new UUIDv7 id unless one is given) and return its id once durable."""
        async with self.commit() as tx:
            conversation_id = tx.create_conversation(conversation_id)
        return conversation_id

    async def append(self, conversation_id: str, *, kind: str, data: Any = None, entry_id: str | None = None) -> int:
        """Append an entry and return the ``seq`` of its commit, once durable.

        ``entry_id`` (a new UUIDv7 by default) makes a retry after :class:`ConnectionLost` safe: the owner
        refuses a second entry with the same id (:class:`~protocol.Duplicate`).
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
            committed = await self._call(Commit(call_id=0, writes=tuple(tx.writes)), Committed)
            tx.seq = committed.seq
            tx.results = committed.results

    async def conversation(self, conversation_id: str) -> ConversationRecord:
        """The conversation's record; :class:`~protocol.NotFound` if it does not exist."""
        reply = await self._call(ReadConversation(call_id=0, conversation_id=conversation_id), ConversationReply)
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
        request = ReadEntries(call_id=0, conversation_id=conversation_id, order=order, cursor=cursor, limit=limit)
        reply = await self._call(request, EntriesReply)
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
            cursor = page.next_cursor

    async def document(self, name: str, *, conversation_id: str | None = None) -> DocumentRecord | None:
        """The document's current record, or ``None`` if it was never written."""
        reply = await self._call(ReadDocument(call_id=0, conversation_id=conversation_id, name=name), DocumentReply)
        return reply.document

    async def submit(
        self,
        conversation_id: str,
        *,
        kind: str,
        payload: Any = None,
        request_id: str,
        submission_id: str | None = None,
    ) -> SubmissionRecord:
        """Admit a submission, deduplicated by ``(conversation_id, request_id)``.

        A repeat with the same kind and payload returns the original record (also after a restart); the same
        ``request_id`` with other content raises :class:`~protocol.Conflict`.
        """
        request = Submit(
            call_id=0,
            conversation_id=conversation_id,
            submission_id=submission_id or new_id(),
            request_id=request_id,
            kind=kind,
            payload=json_value(payload, "payload"),
        )
        reply = await self._call(request, Submitted)
        return reply.submission

    async def submission(self, conversation_id: str, request_id: str) -> SubmissionRecord | None:
        """The submission admitted under ``request_id`` in this conversation, or ``None``."""
        request = ReadSubmission(call_id=0, conversation_id=conversation_id, request_id=request_id)
        reply = await self._call(request, SubmissionReply)
        return reply.submission

    def watch(self, *, conversation_id: str | None = None, from_seq: int = 0) -> WatchStream:
        """Every commit after ``from_seq`` touching ``conversation_id`` (every commit when ``None``), in order.

        Use as ``async for change in client.watch(...)``, or ``async with`` it to unsubscribe on exit.
        """
        return WatchStream(self, conversation_id, from_seq)

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
        return await self._call(ReadTask(call_id=0, task_id=task_id), TaskReply)

    async def wait_for_task(self, task_id: str) -> TaskRecord:
        """Return the task's record once it is terminal (``record.outcome`` says how it ended).

        Survives reconnections and owner restarts: the wait is simply asked again. Bound it with
        ``trio.fail_after``.
        """
        while True:
            try:
                reply = await self._call(WaitTask(call_id=0, task_id=task_id), TaskReply)
            except ConnectionLost:
                if not self._can_reconnect():
                    raise  # closed, or reconnect=False: asking again would fail again at once, forever
                continue
            return reply.task

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
        for start in range(0, len(task_ids), OUTCOMES_PAGE):
            page = tuple(task_ids[start : start + OUTCOMES_PAGE])
            reply = await self._call(ReadOutcomes(call_id=0, task_ids=page), OutcomesReply)
            outcomes.update(zip(page, reply.outcomes, strict=True))
        return outcomes

    async def task_graph(self) -> TaskGraph:
        """Every live task, with its owner edge, state, restarts, and why it is blocked if it is."""
        reply = await self._call(ReadTaskGraph(call_id=0), TaskGraphReply)
        seq = reply.seq
        nodes = {node.task.task_id: node for node in reply.nodes}
        while reply.next_after_task_id is not None:  # later pages may be newer than the first: records carry seq
            reply = await self._call(ReadTaskGraph(call_id=0, after_task_id=reply.next_after_task_id), TaskGraphReply)
            nodes.update((node.task.task_id, node) for node in reply.nodes)
        return TaskGraph(seq=seq, nodes=nodes)

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

    async def peers(self) -> list[PeerInfo]:
        """The connections attached to the owner: clients, readers and workers with what they announced."""
        reply = await self._call(ReadPeers(call_id=0), PeersReply)
        return list(reply.peers)

    async def announce(self, announcement: Announce) -> None:
        """Tell the owner what this worker runs (role ``worker`` only). Used by :func:`actors.serve`."""
        await self._call(announcement, Ok)

    async def ping(self) -> Pong:
        """A round trip to the owner: its clock and newest ``seq``."""
        return await self._call(Ping(call_id=0), Pong)

    async def advance_clock(self, by_ms: int) -> int:
        """Move a manual owner clock forward and return its new time (owners run with ``--clock manual``)."""
        reply = await self._call(AdvanceClock(call_id=0, by_ms=by_ms), ClockReply)
        return reply.now_ms

    # ----------------------------------------------------------------------------------------- requests

    async def _call(self, request: Request, expected: type[R]) -> R:
        reply = await self._request(request)
        if isinstance(reply, Error):
            raise error_for_code(reply.code, reply.message)
        if not isinstance(reply, expected):
            raise ProtocolError(f"expected a {expected.__name__} reply to {request.TYPE}, got {reply.TYPE}")
        return reply

    async def _request(self, request: Request) -> Frame:
        await self._wait_connected()
        call_id = next(self._call_ids)
        encoded = encode_frame(request, call_id=call_id)
        if len(encoded) > MAX_MESSAGE_BYTES:
            await trio.lowlevel.checkpoint()  # a checkpoint on every path, failure included
            raise ProtocolError(
                f"the {request.TYPE} request encodes to {len(encoded)} bytes, over the limit of "
                f"{MAX_MESSAGE_BYTES}; nothing was sent"
            )
        waiter = _Waiter()
        self._waiters[call_id] = waiter
        self._outbox.append(encoded)
        self._outbox_ready.set()
        try:
            await waiter.event.wait()
        finally:
            self._waiters.pop(call_id, None)
        reply = waiter.reply
        if isinstance(reply, TetherError):
            raise copy.copy(reply)  # one error is shared by every waiter it failed: each raise gets its own
        assert reply is not None
        return reply

    def _send_nowait(self, request: Request) -> None:
        """Queue a request whose reply nobody awaits (an unsubscribe)."""
        call_id = next(self._call_ids)
        self._outbox.append(encode_frame(request, call_id=call_id))
        self._outbox_ready.set()

    def _can_reconnect(self) -> bool:
        """Whether a call that failed with :class:`ConnectionLost` may succeed if made again."""
        return self._reconnect and not self._closed and self._failure is None

    async def _wait_connected(self) -> None:
        """Return once connected; raise why not. A checkpoint on every path (a failed client raises at once,
        and a caller that retries in a loop must still be cancellable)."""
        if self._failure is not None or self._closed:
            await trio.lowlevel.checkpoint()
            raise copy.copy(self._failure or self._closed_error())
        if self._connected.is_set():
            return
        with trio.move_on_after(self._reconnect_timeout_s):
            await self._connected.wait()
        if self._failure is not None:
            raise copy.copy(self._failure)
        if not self._connected.is_set():
            raise OwnerUnavailable(
                f"no connection to the owner for {self._reconnect_timeout_s:g} s ({self._describe_target()}); "
                "the request was not sent"
            )

    # ------------------------------------------------------------------------------------------ connection

    def _describe_target(self) -> str:
        return f"database {self._db}" if self._db else f"url {self._url}"

    async def _open(
        self, nursery: trio.Nursery, *, timeout_s: float = CONNECT_TIMEOUT_S
    ) -> trio_websocket.WebSocketConnection:
        """Connect and complete the handshake; raise a :class:`TetherError` saying why not."""
        url, token = self._url, self._token
        if self._db is not None:
            info = read_runtime(self._db)
            url, token = info.url, token or info.token
        if url is None or token is None:
            raise OwnerUnavailable("connect needs db=PATH, or url=URL with token=TOKEN")
        try:
            with trio.fail_after(timeout_s):
                ws = await trio_websocket.connect_websocket_url(
                    nursery,
                    url,
                    max_message_size=WEBSOCKET_HARD_LIMIT_BYTES,
                    receive_buffer_size=RECEIVE_BUFFER_BYTES,
                )
        except (OSError, trio_websocket.HandshakeError, trio.TooSlowError) as exc:
            raise OwnerUnavailable(f"cannot reach the owner at {url} ({self._describe_target()}): {exc}") from exc
        try:
            with trio.fail_after(timeout_s):
                hello = Hello(protocol_version=PROTOCOL_VERSION, token=token, role=self._role, peer_name=self._name)
                await ws.send_message(encode_frame(hello))
                answer = decode_frame(_binary(await ws.get_message()))
        except (trio_websocket.ConnectionClosed, trio.TooSlowError) as exc:
            await _close_quietly(ws)
            raise OwnerUnavailable(f"the owner at {url} did not complete the handshake: {exc!r}") from exc
        except ProtocolError:
            await _close_quietly(ws)
            raise
        if isinstance(answer, Refused):
            await _close_quietly(ws)
            raise HandshakeRefused(
                answer.code, f"the owner refused the connection: {answer.message}", answer.supported_versions
            )
        if not isinstance(answer, Welcome):
            await _close_quietly(ws)
            raise ProtocolError(f"expected welcome or refused, got {answer.TYPE}")
        self.welcome = answer
        return ws

    async def _open_first(self, nursery: trio.Nursery, wait_s: float) -> trio_websocket.WebSocketConnection:
        """The first connection: tried once, or again with back-off for ``wait_s`` while no owner answers."""
        deadline = trio.current_time() + wait_s
        backoff = BACKOFF_INITIAL_S
        while True:
            try:
                return await self._open(nursery)
            except OwnerUnavailable:
                if trio.current_time() + backoff > deadline:
                    raise
            await trio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _run(self, first: trio_websocket.WebSocketConnection) -> None:
        """Serve the connection; on loss fail what was in flight, reconnect, resume watches."""
        assert self._nursery is not None
        ws = first
        backoff = BACKOFF_INITIAL_S
        attempt_timeout_s = RECONNECT_ATTEMPT_TIMEOUT_S
        while True:
            await self._serve(ws)
            self._connected = trio.Event()
            if self.on_connection_lost is not None:
                self.on_connection_lost()
            self._fail_in_flight(
                ConnectionLost(
                    f"the connection to the owner ({self._describe_target()}) was lost before the reply arrived; "
                    "the request may or may not have been applied"
                )
            )
            if self._closed or not self._reconnect:
                self._failure = ConnectionLost(f"the connection to the owner ({self._describe_target()}) ended")
                self._connected.set()
                return
            while True:
                await trio.sleep(backoff)
                try:
                    ws = await self._open(self._nursery, timeout_s=attempt_timeout_s)
                except HandshakeRefused as exc:
                    self._failure = exc
                    self._connected.set()
                    return
                except (OwnerUnavailable, ProtocolError):
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
                    attempt_timeout_s = min(attempt_timeout_s * 2, CONNECT_TIMEOUT_S)
                    continue
                backoff = BACKOFF_INITIAL_S
                attempt_timeout_s = RECONNECT_ATTEMPT_TIMEOUT_S
                self.reconnects += 1
                break

    async def _serve(self, ws: trio_websocket.WebSocketConnection) -> None:
        self._ws = ws
        self._outbox.clear()  # requests queued for the old connection were failed with ConnectionLost
        self._last_heard_s = trio.current_time()
        if self.announcement is not None:
            self._send_nowait(self.announcement())
        for stream in list(self._watches.values()):
            stream._resubscribe()
        self._connected.set()
        assert self.welcome is not None
        interval_s = max(self.welcome.heartbeat_ms, 10) / 1000
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._send_loop, ws, nursery.cancel_scope)
                nursery.start_soon(self._heartbeat, interval_s, nursery.cancel_scope)
                await self._receive_loop(ws)
                nursery.cancel_scope.cancel(reason="connection closed")
        finally:
            self._ws = None
            with trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
                scope.shield = True
                await _close_quietly(ws)

    async def _heartbeat(self, interval_s: float, connection_scope: trio.CancelScope) -> None:
        """Ping the owner every ``interval_s``; give the connection up if the owner stays silent 4 times as long
        (a stopped or wedged owner never closes the connection by itself)."""
        while True:
            await trio.sleep(interval_s)
            if trio.current_time() - self._last_heard_s > 4 * interval_s:
                connection_scope.cancel(reason="the owner went silent")
                return
            self._send_nowait(Ping(call_id=0))

    async def _send_loop(self, ws: trio_websocket.WebSocketConnection, connection_scope: trio.CancelScope) -> None:
        """Send what is queued, coalesced; when the connection breaks, end the connection (not the client)."""
        try:
            await self._send_queued(ws)
        except PEER_GONE:
            connection_scope.cancel(reason="the connection broke while sending")

    async def _send_queued(self, ws: trio_websocket.WebSocketConnection) -> None:
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready = trio.Event()
            while self._outbox:
                message, _ = take_message(self._outbox)
                await ws.send_message(message)

    async def _receive_loop(self, ws: trio_websocket.WebSocketConnection) -> None:
        while True:
            try:
                message = await ws.get_message()
            except PEER_GONE:
                return
            self._last_heard_s = trio.current_time()
            try:
                frames = decode_message(message, max_bytes=WEBSOCKET_HARD_LIMIT_BYTES)
            except ProtocolError:
                return  # an owner we cannot understand: drop the connection and reconnect
            for frame in frames:
                self._deliver(frame)

    def _deliver(self, frame: Frame | BadFrame) -> None:
        if isinstance(frame, Change):
            stream = self._watches.get(frame.watch_id)
            if stream is not None:
                stream._deliver(frame)
            return
        if isinstance(frame, Lease | CancelLease):
            if self.on_lease is not None:
                self.on_lease(frame)
            return
        if isinstance(frame, Goodbye | BadFrame):
            return  # the connection ends next; in-flight calls fail with ConnectionLost then
        call_id = getattr(frame, "call_id", None)
        waiter = self._waiters.pop(call_id, None) if call_id is not None else None
        if waiter is not None:
            waiter.reply = frame
            waiter.event.set()

    def _fail_in_flight(self, error: TetherError) -> None:
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            waiter.reply = error
            waiter.event.set()

    def _closed_error(self) -> ConnectionLost:
        return ConnectionLost(f"the client of the owner ({self._describe_target()}) is closed")

    async def _aclose(self) -> None:
        self._closed = True
        self._fail_in_flight(self._closed_error())
        ws = self._ws
        if ws is not None:
            with trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
                scope.shield = True
                await _close_quietly(ws)


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

    def create_conversation(self, conversation_id: str | None = None, *, owner_task_id: str | None = None) -> str:
        conversation_id = conversation_id or new_id()
        self.writes.append(CreateConversation(conversation_id=conversation_id, owner_task_id=owner_task_id))
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


class WatchStream:
    """An ordered stream of :class:`~protocol.Change` for one watch; survives reconnects without gaps."""

    def __init__(self, client: Client, conversation_id: str | None, from_seq: int) -> None:
        self._client = client
        self.conversation_id = conversation_id
        self._buffered_seq = from_seq
        """The newest seq put in the buffer: where a resubscription resumes."""
        self.last_seq = from_seq
        """The newest seq handed to the consumer."""
        self._buffer: deque[Change] = deque()
        self._ready = trio.Event()
        self._watch_id: int | None = None
        self._subscribed = False
        self._lagging = False
        self._closed = False

    async def __aenter__(self) -> WatchStream:
        await self._subscribe()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> Change:
        if not self._subscribed:
            await self._subscribe()
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            if self._lagging:
                self._lagging = False
                await self._subscribe()
                continue
            self._ready = trio.Event()
            await self._ready.wait()
        change = self._buffer.popleft()
        self.last_seq = change.seq
        return change

    async def aclose(self) -> None:
        """Stop the watch. Buffered changes are dropped."""
        self._closed = True
        self._ready.set()
        self._unsubscribe()

    async def _subscribe(self) -> None:
        self._subscribed = True
        request = self._new_subscription()
        try:
            await self._client._call(request, Watching)
        except ConnectionLost:
            pass  # resubscribed from the buffered seq when the connection returns
        except TetherError:
            self._drop_subscription()
            raise

    def _resubscribe(self) -> None:
        """The connection was re-established: subscribe again from where the buffer ends."""
        if self._closed or not self._subscribed or self._lagging:
            return
        self._client._send_nowait(self._new_subscription())

    def _new_subscription(self) -> Watch:
        """Register under a fresh watch id (a late change of an old subscription is then ignored) and return the
        request that subscribes from where the buffer ends."""
        self._drop_subscription()
        watch_id = next(self._client._watch_ids)
        self._watch_id = watch_id
        self._client._watches[watch_id] = self
        return Watch(call_id=0, watch_id=watch_id, conversation_id=self.conversation_id, from_seq=self._buffered_seq)

    def _unsubscribe(self) -> None:
        """Forget the subscription and tell the owner, if it can be told."""
        watch_id = self._watch_id
        self._drop_subscription()
        client = self._client
        if watch_id is not None and client._connected.is_set() and client._failure is None:
            client._send_nowait(Unwatch(call_id=0, watch_id=watch_id))

    def _drop_subscription(self) -> None:
        if self._watch_id is not None:
            self._client._watches.pop(self._watch_id, None)
            self._watch_id = None

    def _deliver(self, change: Change) -> None:
        if change.seq <= self._buffered_seq or self._lagging:
            return
        if len(self._buffer) >= WATCH_BUFFER_LIMIT:
            # The consumer is slow: stop receiving, and re-read from the log once the buffer has drained.
            self._lagging = True
            self._unsubscribe()
            self._ready.set()
            return
        self._buffer.append(change)
        self._buffered_seq = change.seq
        self._ready.set()


def _binary(message: str | bytes) -> bytes:
    if isinstance(message, str):
        raise ProtocolError("the owner sent a text message; the protocol is binary msgpack")
    return message


async def _close_quietly(ws: trio_websocket.WebSocketConnection) -> None:
    with contextlib.suppress(Exception):
        await ws.aclose()


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
) -> AsyncIterator[Client]:
    """Connect to the owner of ``db`` (found through its runtime file) or at ``url`` with ``token``.

    ``role`` is ``"client"`` (read and write), ``"reader"`` (read and watch only) or ``"worker"``. Raises
    :class:`~protocol.OwnerUnavailable` if no owner can be reached within ``wait_for_owner_s`` (0: try once; an
    owner that is starting or restarting is waited for otherwise), :class:`~protocol.HandshakeRefused` if the owner
    refuses the token, version or role.
    """
    if (db is None) == (url is None):
        raise UsageError("connect() needs exactly one of db=PATH or url=URL")
    client = Client(
        db=None if db is None else os.fspath(db),
        url=url,
        token=token,
        role=role,
        name=name,
        reconnect=reconnect,
        reconnect_timeout_s=reconnect_timeout_s,
    )
    try:
        async with trio.open_nursery() as nursery:
            client._nursery = nursery
            first = await client._open_first(nursery, wait_for_owner_s)
            nursery.start_soon(client._run, first)
            try:
                yield client
            finally:
                await client._aclose()
                nursery.cancel_scope.cancel(reason="the client is closing")
    except BaseExceptionGroup as group:
        raise collapse_group(group) from None

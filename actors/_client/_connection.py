"""The connection layer of a client: one WebSocket to the owner, shared by every task that uses it.

Requests from all tasks are coalesced: whatever is pending when the sender runs travels as one message. Replies
are matched by ``call_id``. If the connection drops, calls in flight raise :class:`~protocol.ConnectionLost`
(their outcome is unknown), the connection is re-established with back-off (re-reading the runtime file when it
was opened with ``db=``, since a restarted owner listens on a new port), and watches are told to resume. Calls
made while disconnected wait for the reconnection, at most ``reconnect_timeout_s``. Each WebSocket is opened by
``_handshake.py`` (TCP, TLS, the upgrade, the hello).

The surface the client's calls (:class:`~actors.Client`) and the watches use, and a worker its hooks, and nothing else:

- :meth:`Connection.call` (a request and its typed reply) and :meth:`Connection.send_nowait` (no reply awaited);
- :meth:`Connection.add_watch` / :meth:`Connection.remove_watch`, :attr:`Connection.is_up`,
  :meth:`Connection.can_reconnect`;
- :attr:`Connection.welcome`, :attr:`Connection.reconnects`, :meth:`Connection.describe_target`;
- :meth:`Connection.live_since`, whether what the owner said at a moment still holds (a worker's leases);
- a worker's hooks (:class:`WorkerHooks`), registered in one call: :meth:`Connection.attach_worker`;
- :func:`open_connection`, which owns its lifetime.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Final, Protocol, TypeVar

import trio
import trio_websocket

from protocol import (
    HEARTBEATS_PER_SILENCE,
    MAX_MESSAGE_BYTES,
    WEBSOCKET_HARD_LIMIT_BYTES,
    Announce,
    BadFrame,
    CancelLease,
    Change,
    ConnectionLost,
    Error,
    ErrorCode,
    Frame,
    Goodbye,
    HandshakeRefused,
    Lease,
    OwnerUnavailable,
    Ping,
    ProtocolError,
    Request,
    TetherError,
    Welcome,
    decode_message,
    encode_frame,
    error_for_code,
    raise_collapsed,
    read_runtime,
    take_message,
)
from protocol.io import PEER_GONE  # handled by reconnecting, never raised

from ._handshake import close_quietly, open_owner_socket

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
OVERLOADED_BACKOFF_INITIAL_S: Final = 0.02
OVERLOADED_BACKOFF_MAX_S: Final = 1.0
OVERLOADED_RETRY_S: Final = 60.0
"""A request refused ``overloaded`` (the owner holds too much unread output) is asked again with back-off from
20 ms doubling to 1 s, for this long at most; then :class:`~protocol.Overloaded` is raised."""
LIVE_SILENCE_HEARTBEATS: Final = 2
"""How many heartbeat intervals the owner may be silent, as seen here, before what this side knew from it (that a
lease is live) needs asking again (:meth:`Connection.live_since`): half the silence after which the owner drops a
peer (``HEARTBEATS_PER_SILENCE``), since the owner's view of our silence may be longer than ours by the interval
since our last ping. A live owner answers a ping every interval, so a healthy connection never looks this silent."""


class WatchSubscriber(Protocol):
    """What the connection needs of a watch (see :class:`~actors.WatchStream`)."""

    def deliver(self, change: Change) -> None:
        """A change pushed for this watch's id."""

    def resume(self) -> None:
        """The connection was re-established: subscribe again (with :meth:`Connection.send_nowait`)."""


class WorkerHooks(Protocol):
    """What a worker gives its connection (:meth:`Connection.attach_worker`), all in one place: the connection calls
    these for what only a worker's connection meets."""

    def announcement(self) -> Announce:
        """Called after every (re)connection for an announcement sent before anything else: how a worker
        re-announces itself (with the leases it still runs)."""

    def on_lease(self, frame: Lease | CancelLease) -> None:
        """Receives the leases and cancellations the owner pushes to a worker."""

    def on_connection_lost(self) -> None:
        """Called when the connection ends (before reconnecting): a worker's leases ended with it."""


class _AfterSent:
    """A callback to run once ``frames`` more frames have gone out (fault injection: a worker stopped with its
    commit sent and its acknowledgement unread)."""

    __slots__ = ("callback", "frames")

    def __init__(self, frames: int, callback: Callable[[], None]) -> None:
        self.frames = frames
        self.callback = callback


class _Waiter:
    __slots__ = ("event", "reply")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.reply: Frame | TetherError | None = None


class Connection:
    """One owner connection and its reconnection; see the module's docstring for the surface it offers."""

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
        ca: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        on_attempt: Callable[[TetherError | None, float], None] | None = None,
    ) -> None:
        self._db = db
        self._ca = ca
        self._ssl_context = ssl_context
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
        self._watches: dict[int, WatchSubscriber] = {}
        self._nursery: trio.Nursery | None = None
        self.welcome: Welcome | None = None
        """The owner's last ``Welcome`` (its instance, clock and head ``seq`` at connect time)."""
        self.reconnects = 0
        """How many times the connection was re-established."""
        self._last_heard_s = 0.0
        self._last_sent_s = 0.0
        self._heartbeat_due: trio.CancelScope | None = None
        """The heartbeat's wait, whose deadline :meth:`_sent` moves on."""
        self._heartbeat_interval_s = 0.0
        self._worker: WorkerHooks | None = None
        """The worker this connection serves (:meth:`attach_worker`), if it serves one."""
        self._late_s = -math.inf
        """When the owner was last heard on this connection after a silence past :attr:`live_silence_s` (a pause of
        this process, a stopped or stalled owner): what was known then may no longer hold."""
        self._connected_s = math.inf
        """When this connection began: nothing known before it is known on it."""
        self.live_silence_s = math.inf
        """A silence of the owner, as seen here, past which a lease may have been lost without this side knowing:
        ``LIVE_SILENCE_HEARTBEATS`` heartbeat intervals (see :meth:`live_since`)."""
        self._after_sent: _AfterSent | None = None
        """Fault injection's ``intent_sent`` point (:meth:`after_next_sent`)."""
        self._on_attempt = on_attempt
        """Called after each failed attempt to reach the owner (the first connection waiting for it, or a
        reconnection) with why and the back-off before the next, and with ``(None, 0.0)`` once an attempt that
        followed failures succeeded: how a worker logs its retries."""

    # ------------------------------------------------------------------------------ the surface it offers

    def attach_worker(self, hooks: WorkerHooks) -> None:
        """Serve ``hooks``, a worker: from now on it announces itself after every (re)connection, receives the leases
        and cancellations the owner pushes, and hears of the end of each connection (see :class:`WorkerHooks`)."""
        self._worker = hooks

    def add_watch(self, watch: WatchSubscriber) -> int:
        """Register ``watch`` under a fresh watch id (a late change of an older subscription is then ignored)."""
        watch_id = next(self._watch_ids)
        self._watches[watch_id] = watch
        return watch_id

    def remove_watch(self, watch_id: int) -> None:
        """Forget the watch registered under ``watch_id``: its later changes are dropped."""
        self._watches.pop(watch_id, None)

    async def call(self, request: Request, expected: type[R]) -> R:
        """Send ``request`` (under a fresh ``call_id``, its envelope's) and return its reply, an ``expected``.

        Raises the error the owner answered with (see :func:`~protocol.error_for_code`), :class:`ConnectionLost`
        if the connection ended before the reply (the outcome is unknown) or the connection has failed for good
        (closed, ``reconnect=False``, refused), :class:`OwnerUnavailable` if no connection came back within
        ``reconnect_timeout_s``. A request refused ``overloaded`` (not handled) is asked again with back-off (see
        :data:`OVERLOADED_RETRY_S`). Always a checkpoint, failure included.
        """
        reply = await self._request(request)
        backoff_s = OVERLOADED_BACKOFF_INITIAL_S
        deadline = trio.current_time() + OVERLOADED_RETRY_S
        while isinstance(reply, Error) and reply.code == ErrorCode.OVERLOADED:
            # Not handled, nothing changed: ask again once the owner had time to send what it holds for us.
            if trio.current_time() + backoff_s > deadline:
                break
            await trio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, OVERLOADED_BACKOFF_MAX_S)
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

    def send_nowait(self, request: Request) -> None:
        """Queue a request whose reply nobody awaits (an unsubscribe, a ping); sent with the next message, or
        dropped with the connection if it ends first."""
        call_id = next(self._call_ids)
        self._outbox.append(encode_frame(request, call_id=call_id))
        self._outbox_ready.set()

    def live_since(self, since_s: float) -> bool:
        """Whether what the owner said at ``since_s`` (``trio.current_time()``) on this connection still holds as far
        as this side can tell: it was at most :attr:`live_silence_s` ago, and nothing heard since came after a silence
        past that bound. A worker asks it before a step it cannot take back, under a lease it knew live at ``since_s``
        (when it sent a request the owner then accepted under that lease, or received the lease): after a pause (a
        stopped process, once continued, reads what a dead owner had sent, as if it were new) or a stall, the lease
        is confirmed by a round trip first. Not a checkpoint."""
        fresh = self._late_s < since_s and trio.current_time() - since_s <= self.live_silence_s
        return fresh and since_s >= self._connected_s

    def after_next_sent(self, callback: Callable[[], None]) -> None:
        """Fault injection (``WorkerKill("intent_sent", ...)``): call ``callback`` once the next request queued has gone
        out on the socket, with what is queued before it. A connection lost meanwhile drops it."""
        self._after_sent = _AfterSent(len(self._outbox) + 1, callback)

    @property
    def is_up(self) -> bool:
        """Connected now, and not failed for good: what is sent now reaches this owner connection."""
        return self._connected.is_set() and self._failure is None and not self._closed

    def can_reconnect(self) -> bool:
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
                f"no connection to the owner for {self._reconnect_timeout_s:g} s ({self.describe_target()}); "
                "the request was not sent"
            )

    # ------------------------------------------------------------------------------------------ connection

    def describe_target(self) -> str:
        """What this connection reaches, for error messages: ``database PATH`` or ``url URL``."""
        return f"database {self._db}" if self._db else f"url {self._url}"

    async def _open(
        self, nursery: trio.Nursery, *, timeout_s: float = CONNECT_TIMEOUT_S
    ) -> trio_websocket.WebSocketConnection:
        """Connect and complete the handshake; raise a :class:`TetherError` saying why not."""
        url, token, ca = self._url, self._token, self._ca
        if self._db is not None:
            info = read_runtime(self._db)
            url, token, ca = info.url, token or info.token, ca or info.tls_ca
        if url is None or token is None:
            raise OwnerUnavailable("connect needs db=PATH, or url=URL with token=TOKEN")
        ws, self.welcome = await open_owner_socket(
            nursery,
            url=url,
            token=token,
            ca=ca,
            ssl_context=self._ssl_context,
            role=self._role,
            name=self._name,
            target=self.describe_target(),
            timeout_s=timeout_s,
        )
        return ws

    async def _open_first(self, nursery: trio.Nursery, wait_s: float) -> trio_websocket.WebSocketConnection:
        """The first connection: tried once, or again with back-off for ``wait_s`` while no owner answers."""
        deadline = trio.current_time() + wait_s
        backoff = BACKOFF_INITIAL_S
        failed = False
        while True:
            try:
                ws = await self._open(nursery)
            except OwnerUnavailable as exc:
                if trio.current_time() + backoff > deadline:
                    raise
                failed = True
                self._attempted(exc, backoff)
            else:
                if failed:
                    self._attempted(None, 0.0)
                return ws
            await trio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _attempted(self, error: TetherError | None, backoff_s: float) -> None:
        if self._on_attempt is not None:
            self._on_attempt(error, backoff_s)

    async def _run(self, first: trio_websocket.WebSocketConnection) -> None:
        """Serve the connection; on loss fail what was in flight, reconnect, resume watches."""
        assert self._nursery is not None
        ws = first
        backoff = BACKOFF_INITIAL_S
        attempt_timeout_s = RECONNECT_ATTEMPT_TIMEOUT_S
        while True:
            await self._serve(ws)
            self._connected = trio.Event()
            if self._worker is not None:
                self._worker.on_connection_lost()
            self._fail_in_flight(
                ConnectionLost(
                    f"the connection to the owner ({self.describe_target()}) was lost before the reply arrived; "
                    "the request may or may not have been applied"
                )
            )
            if self._closed or not self._reconnect:
                self._failure = ConnectionLost(f"the connection to the owner ({self.describe_target()}) ended")
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
                except (OwnerUnavailable, ProtocolError) as exc:
                    self._attempted(exc, backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
                    attempt_timeout_s = min(attempt_timeout_s * 2, CONNECT_TIMEOUT_S)
                    continue
                if backoff > BACKOFF_INITIAL_S:  # it followed failed attempts
                    self._attempted(None, 0.0)
                backoff = BACKOFF_INITIAL_S
                attempt_timeout_s = RECONNECT_ATTEMPT_TIMEOUT_S
                self.reconnects += 1
                break

    async def _serve(self, ws: trio_websocket.WebSocketConnection) -> None:
        self._ws = ws
        self._outbox.clear()  # requests queued for the old connection were failed with ConnectionLost
        self._after_sent = None
        self._last_heard_s = self._last_sent_s = self._connected_s = trio.current_time()
        self._late_s = -math.inf
        if self._worker is not None:
            self.send_nowait(self._worker.announcement())
        for watch in list(self._watches.values()):
            watch.resume()
        self._connected.set()
        assert self.welcome is not None
        interval_s = self._heartbeat_interval_s = max(self.welcome.heartbeat_ms, 10) / 1000
        self.live_silence_s = LIVE_SILENCE_HEARTBEATS * interval_s
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
                await close_quietly(ws)

    async def _heartbeat(self, interval_s: float, connection_scope: trio.CancelScope) -> None:
        """Make sure the owner hears from us every ``interval_s``: a ping once nothing else was sent for that long (a
        connection that sends requests anyway needs none); give the connection up if the owner stays silent
        ``HEARTBEATS_PER_SILENCE`` times as long (a stopped or wedged owner never closes it by itself).

        The wait is a deadline that each message sent moves on (:meth:`_sent`), not a task waking to look: an idle
        connection wakes once per ping, a busy one not at all."""
        while True:
            self._heartbeat_due = trio.CancelScope(deadline=self._next_heartbeat_s(interval_s))
            with self._heartbeat_due:
                await trio.sleep_forever()
            now_s = trio.current_time()
            if now_s - self._last_heard_s > HEARTBEATS_PER_SILENCE * interval_s:
                connection_scope.cancel(reason="the owner went silent")
                return
            if now_s - self._last_sent_s >= interval_s and not self._outbox:  # (what is queued goes out at once)
                self.send_nowait(Ping())
                self._last_sent_s = now_s

    def _next_heartbeat_s(self, interval_s: float) -> float:
        """When the heartbeat must look again: a ping due, or the owner silent for too long."""
        return min(self._last_sent_s + interval_s, self._last_heard_s + HEARTBEATS_PER_SILENCE * interval_s)

    def _sent(self) -> None:
        """A message goes out: the next ping is due an interval from now."""
        self._last_sent_s = trio.current_time()
        if self._heartbeat_due is not None:
            self._heartbeat_due.deadline = self._next_heartbeat_s(self._heartbeat_interval_s)

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
                queued = len(self._outbox)
                message, _ = take_message(self._outbox)
                taken = queued - len(self._outbox)
                self._sent()
                await ws.send_message(message)
                after = self._after_sent
                if after is not None:
                    after.frames -= taken
                    if after.frames <= 0:
                        self._after_sent = None
                        after.callback()

    async def _receive_loop(self, ws: trio_websocket.WebSocketConnection) -> None:
        while True:
            try:
                message = await ws.get_message()
            except PEER_GONE:
                return
            now_s = trio.current_time()
            if now_s - self._last_heard_s > self.live_silence_s:
                self._late_s = now_s  # heard again after a silence: what it says comes late (see live_since)
            self._last_heard_s = now_s
            try:
                frames = decode_message(message, max_bytes=WEBSOCKET_HARD_LIMIT_BYTES)
            except ProtocolError:
                return  # an owner we cannot understand: drop the connection and reconnect
            for received in frames:
                self._deliver(received.call_id, received.frame)

    def _deliver(self, call_id: int | None, frame: Frame | BadFrame) -> None:
        if isinstance(frame, Change):
            watch = self._watches.get(frame.watch_id)
            if watch is not None:
                watch.deliver(frame)
            return
        if isinstance(frame, Lease | CancelLease):
            if self._worker is not None:
                self._worker.on_lease(frame)
            return
        if isinstance(frame, Goodbye | BadFrame):
            return  # the connection ends next; in-flight calls fail with ConnectionLost then
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
        return ConnectionLost(f"the client of the owner ({self.describe_target()}) is closed")

    async def aclose(self) -> None:
        """Close for good: calls in flight and later calls fail with :class:`ConnectionLost`."""
        self._closed = True
        self._fail_in_flight(self._closed_error())
        ws = self._ws
        if ws is not None:
            with trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
                scope.shield = True
                await close_quietly(ws)


@contextlib.asynccontextmanager
async def open_connection(
    *,
    db: str | None,
    url: str | None,
    token: str | None,
    role: str,
    name: str,
    reconnect: bool,
    reconnect_timeout_s: float,
    wait_for_owner_s: float,
    ca: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    on_attempt: Callable[[TetherError | None, float], None] | None = None,
) -> AsyncIterator[Connection]:
    """Connect (see :func:`actors.connect` for the arguments and errors), serve and reconnect in the background
    until the block exits, then close."""
    connection = Connection(
        db=db,
        url=url,
        token=token,
        role=role,
        name=name,
        reconnect=reconnect,
        reconnect_timeout_s=reconnect_timeout_s,
        ca=ca,
        ssl_context=ssl_context,
        on_attempt=on_attempt,
    )
    try:
        async with trio.open_nursery() as nursery:
            connection._nursery = nursery
            first = await connection._open_first(nursery, wait_for_owner_s)
            nursery.start_soon(connection._run, first)
            try:
                yield connection
            finally:
                await connection.aclose()
                nursery.cancel_scope.cancel(reason="the client is closing")
    except BaseExceptionGroup as group:
        raise_collapsed(group)

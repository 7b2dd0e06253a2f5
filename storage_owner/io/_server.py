"""The owner's trio shell: the WebSocket server, the commit loop and the process lifecycle.

How a commit flows::

    peer ──message──► _Connection.receive_loop ──decode──► OwnerServer.pending (one list for every peer)
                                                                 │
    OwnerServer._commit_loop: take what is pending (_batch_size) ◄┘
        BEGIN IMMEDIATE; core.run_batch(frames)  (a savepoint per multi-write request; then the engine settles); COMMIT
        core.take_output() ──encode──► each peer's send queue ──coalesce──► one message per send
                                                                           (acknowledgements go out only now)

Everything between BEGIN and COMMIT is synchronous, so a COMMIT is never cancelled half-way, and nothing a batch
produced is sent before its COMMIT returned. A storage error fails the owner closed, wherever the commit loop meets
it (a batch, a watch's catch-up, a checkpoint handed over from its thread): every request of the failed batch and
every pending one gets a ``storage_failed`` error, every peer a ``storage_failed`` goodbye, and the owner stops with
:class:`OwnerFailed` (``tether owner`` exits non-zero).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import signal
import socket
import ssl
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs
import trio
import trio_websocket

from protocol import (
    DEFAULT_HEARTBEAT_TIMEOUT_S,
    HEARTBEATS_PER_SILENCE,
    WEBSOCKET_HARD_LIMIT_BYTES,
    BadFrame,
    Commit,
    Error,
    ErrorCode,
    FinishOperation,
    Frame,
    Goodbye,
    Hello,
    ProtocolError,
    Received,
    Refused,
    RuntimeInfo,
    StorageError,
    TetherError,
    decode_message,
    encode_frame,
    is_batch_message,
    new_id,
    otel_from_environment,
    remove_runtime,
    take_message,
    write_runtime,
)
from protocol.io import PEER_GONE, log_stderr
from storage_owner.core import (
    DEFAULT_MAX_CONCURRENT_RUNS,
    DEFAULT_PEER_OUTPUT_BYTES,
    DEFAULT_TOTAL_OUTPUT_BYTES,
    MODEL_GRACE_MS,
    ORPHAN_GRACE_MS,
    CoreGauges,
    Output,
    OwnerCore,
    PeerId,
)
from storage_owner.store import (
    CHECKPOINT_HOLD_PAGES,
    CHECKPOINT_PASS_PAGES,
    CHECKPOINT_START_PAGES,
    FILE_MODE,
    GROUP_READABLE_FILE_MODE,
    MIGRATIONS,
    QUICK_CHECK_BUDGET_S,
    SCHEMA_VERSION,
    Checkpointer,
    Ownership,
    OwnershipWait,
    SqliteStore,
    Sync,
    refuse_foreign,
    storage_errors,
)

from ._clock import Clock, ManualClock, WallClock
from ._listener import (
    DEFAULT_HANDSHAKE_TIMEOUT_S,
    DEFAULT_MAX_UNAUTHENTICATED,
    HandshakeGate,
    HandshakeSlot,
    check_exposure,
    reachable_host,
    serve_listeners,
    server_ssl_context,
    websocket_request,
)

if TYPE_CHECKING:
    from ._telemetry import OwnerTelemetry

MAX_BATCH_REQUESTS: Final = 8192
"""At most this many frames are handled in one transaction; the rest wait for the next one."""
PIPELINE_BELOW_FRAMES: Final = 64
"""Fewer frames than this pending: split the batch in two (see ``_batch_size``)."""
MAX_PENDING_FRAMES: Final = 32768
"""Connections stop reading while this many frames wait for the commit loop."""
SEND_HIGH_WATER_BYTES: Final = 8 << 20
"""A peer whose unsent output passes this size is congested: its watches fall back to reading the log."""
SEND_LOW_WATER_BYTES: Final = 1 << 20
SEND_HARD_LIMIT_BYTES: Final = 64 << 20
"""A peer that leaves this much unread (replies to requests it keeps sending) is dropped: its unread output must not
grow without bound in the owner."""
CLOSE_TIMEOUT_S: Final = 2.0
RECEIVE_BUFFER_BYTES: Final = 1 << 16
ENGINE: Final = "tether/0.1"


@attrs.frozen(kw_only=True)
class OwnerConfig:
    """How to run one owner. ``port`` 0 picks a free port."""

    db: str
    host: str = "127.0.0.1"
    port: int = 0
    sync: Sync = "normal"
    clock: Literal["wall", "manual"] = "wall"
    token: str | None = None
    """The access token peers must present; a random one when ``None``."""
    kill_before_commit: int | None = None
    """Fault injection: SIGKILL this process right before its k-th writing COMMIT (counting from 1)."""
    kill_after_commit: int | None = None
    """Fault injection: SIGKILL this process right after its k-th writing COMMIT."""
    kill_before_result: int | None = None
    """Fault injection: SIGKILL this process right before the COMMIT of the batch holding the k-th operation result
    (a ``finish_operation`` write) it receives: the result is lost, whatever else the batch held."""
    kill_after_result: int | None = None
    """Fault injection: SIGKILL this process right after the COMMIT of the batch holding the k-th operation result it
    receives: the result is durable, its acknowledgement never sent. Counting results, not commits, pins a point of
    a run's journal however many commits a step takes."""
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
    """A peer silent for this long is dropped (its connection closed, its leases cut off); peers are told to send
    something every ``HEARTBEATS_PER_SILENCE``-th of it."""
    storage_error_at_commit: int | None = None
    """Fault injection: fail the k-th writing COMMIT with a storage error (the owner fails closed)."""
    orphan_grace_ms: int = ORPHAN_GRACE_MS
    """How long (on the owner's clock) a task marked for abort that no attached worker can run waits for one, after
    the owner starts and after the last worker of its kind left, before it ends ``orphaned``."""
    model_grace_ms: int = MODEL_GRACE_MS
    """How long (on the owner's clock) a run whose conversation's model no attached worker of its agent names waits
    for one before it fails ``no_model`` (``tether owner --model-grace``)."""
    max_concurrent_runs: int = DEFAULT_MAX_CONCURRENT_RUNS
    """Runs ``pending``, ``running`` or ``retry_wait`` at once, across conversations (see docs/runs.md)."""
    max_peer_output: int = DEFAULT_PEER_OUTPUT_BYTES
    """Unread output one peer may have in the owner before its requests are refused ``overloaded`` and its watches
    read the log instead of being fed (see ``storage_owner.core._output``)."""
    max_queued_output: int = DEFAULT_TOTAL_OUTPUT_BYTES
    """Unread output across every peer: past it, requests are refused ``overloaded``, and the peers holding the most
    (past the high-water mark) are dropped until the total is back under it."""
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S
    """A connection must finish TLS, the WebSocket upgrade and its hello within this time of being accepted."""
    max_unauthenticated: int = DEFAULT_MAX_UNAUTHENTICATED
    """Connections in their handshake at once; one accepted past it is closed at once (see ``_listener``)."""
    tls_cert: str | None = None
    """Serve ``wss://`` with this PEM certificate (chain) and ``tls_key``."""
    tls_key: str | None = None
    tls_ca: str | None = None
    """The CA certificate the runtime file tells local peers to verify the owner with (default ``tls_cert``: right
    for a self-signed certificate)."""
    insecure_listen: bool = False
    """Allow a ``host`` other than loopback without TLS (the token then crosses the network in clear)."""

    group_readable: bool = False
    """Create a new database (and its ``-wal``, ``-shm``) 0640 instead of 0600."""
    start_check_s: float = QUICK_CHECK_BUDGET_S
    """The start check (``PRAGMA quick_check``) of an existing database stops after this long (see docs)."""
    standby: bool = False
    """Wait for ownership instead of refusing when another owner holds the database: ``tether up`` keeps such a
    warm standby (started, imported) so that an owner's death is followed by a takeover within milliseconds."""


@attrs.frozen(kw_only=True)
class _Stop:
    """Why the owner stops, as its peers are told: the code, the goodbye, and the answer to unhandled requests."""

    code: ErrorCode
    reason: str
    unhandled: str


class OwnerFailed(TetherError):
    """The owner stopped because its storage failed (it failed closed); the message says what happened."""


class _Connection:
    """One attached peer: a receive loop feeding the commit loop, a send loop draining its queue."""

    def __init__(self, server: OwnerServer, peer: PeerId, ws: trio_websocket.WebSocketConnection) -> None:
        self.server = server
        self.peer = peer
        self.ws = ws
        self.queue: list[bytes] = []
        self.queued_bytes = 0
        self.last_heard_s = trio.current_time()
        self.scope = trio.CancelScope()
        """Cancelled to drop the peer (silent past the heartbeat timeout)."""
        self.congested = False
        self.wakeup = trio.Event()

    def report_queued(self) -> None:
        """Tell the core what this peer has unsent (its output budget counts on it); wake the commit loop if that
        let the peer's lagging watches catch up again."""
        if self.server.core.set_queued(self.peer, self.queued_bytes):
            self.server.work.set()

    def enqueue(self, encoded: bytes) -> None:
        self.queue.append(encoded)
        self.queued_bytes += len(encoded)
        self.wakeup.set()
        if not self.congested and self.queued_bytes > SEND_HIGH_WATER_BYTES:
            self.congested = True
            self.server.core.set_congested(self.peer, True)
        if self.queued_bytes > SEND_HARD_LIMIT_BYTES and not self.scope.cancel_called:
            self.server.log(f"tether owner: dropping peer {self.peer}: {self.queued_bytes} bytes of replies unread")
            self.scope.cancel(reason="the peer does not read its replies")

    async def receive_loop(self) -> None:
        """Feed the commit loop until the peer closes the connection."""
        server = self.server
        while True:
            try:
                message = await self.ws.get_message()
            except PEER_GONE:
                return
            self.last_heard_s = trio.current_time()
            try:
                frames: list[Received] = decode_message(message)
            except ProtocolError as exc:
                frames = [Received(None, BadFrame(code=exc.code, message=str(exc)))]
            server.submit(self.peer, frames)
            while len(server.pending) >= MAX_PENDING_FRAMES:
                await server.space_available.wait()

    async def send_loop(self, done: trio.CancelScope) -> None:
        """Drain the send queue until the connection breaks; then cancel ``done`` (the connection's scope)."""
        while True:
            await self.wakeup.wait()
            self.wakeup = trio.Event()
            try:
                await self.flush()
            except PEER_GONE:
                done.cancel(reason="the connection broke while sending")
                return

    async def flush(self) -> None:
        """Send everything queued, as few messages as the limits allow."""
        while self.queue:
            message, size = take_message(self.queue)
            self.queued_bytes -= size
            self.report_queued()
            await self.ws.send_message(message)
            if self.congested and self.queued_bytes < SEND_LOW_WATER_BYTES:
                self.congested = False
                self.server.core.set_congested(self.peer, False)
                self.server.work.set()


def _owner_telemetry(server: OwnerServer, tracer_provider: Any, meter_provider: Any) -> OwnerTelemetry:
    """The owner's telemetry; only now is OpenTelemetry imported."""
    try:
        from ._telemetry import OwnerTelemetry
    except ImportError as exc:
        raise TetherError(
            f"telemetry needs OpenTelemetry, which is not installed ({exc}): pip install 'tether[otel]'"
        ) from exc
    return OwnerTelemetry(
        server.telemetry_gauges, log=server.log, tracer_provider=tracer_provider, meter_provider=meter_provider
    )


def _batch_size(pending: int) -> int:
    """How many pending frames the next transaction takes.

    Under heavy load (many frames pending) one transaction takes them all: fewer COMMITs. With few pending, the
    peers that sent them are waiting on us, so the batch is split in two: the first half is answered one COMMIT
    sooner, and its peers' next requests arrive while the second half commits. Measured with 16 actors in one
    client process, this pipelining raised acknowledged commits per second by about 30 %.
    """
    if pending >= PIPELINE_BELOW_FRAMES:
        return min(pending, MAX_BATCH_REQUESTS)
    return max(1, (pending + 1) // 2)


class OwnerServer:
    """One running owner: ownership, store, core, server and commit loop."""

    def __init__(
        self,
        config: OwnerConfig,
        *,
        log: Callable[[str], None] | None = None,
        otel: bool | None = None,
        tracer_provider: Any = None,
        meter_provider: Any = None,
    ) -> None:
        """``otel``: telemetry (docs/telemetry.md) on ``tracer_provider`` and ``meter_provider`` (the global
        OpenTelemetry ones when ``None``); ``None`` turns it on if a provider is given or ``TETHER_OTEL=1``. Off, the
        owner never imports OpenTelemetry."""
        self.config = config
        self.db = os.path.abspath(config.db)
        self.instance = new_id()
        self.token = config.token or os.urandom(24).hex()
        self.started_at_ms = WallClock().now_ms()
        self.log = log or log_stderr
        self.pending: list[tuple[PeerId, Received]] = []
        self.work = trio.Event()
        self.space_available = trio.Event()
        self._connections: dict[PeerId, _Connection] = {}
        self._peer_ids = itertools.count(1)
        self._writing_commits = 0
        self._results_received = 0
        self._stop = _Stop(
            code=ErrorCode.SHUTTING_DOWN,
            reason="the owner is stopping",
            unhandled="the owner stopped before handling this request; nothing was written",
        )
        self._checkpointing = False
        self._committed = trio.Event()
        """Set (and replaced) after each commit that wrote to the WAL: a caught-up checkpoint waits for the next."""
        self._held: trio.Event | None = None
        """While the checkpoint thread copies the WAL's tail with the commit loop held: the loop waits for it before
        its next batch (see :meth:`_copy_back`)."""
        self._storage_failed: StorageError | None = None
        """A storage error met outside the commit loop (on the checkpoint thread), for the loop to fail closed on."""
        self._wal_commits_seen = 0
        """``SqliteStore.wal_commits`` at the last batch: one more means a batch wrote (see :attr:`_committed`)."""
        self._nursery: trio.Nursery | None = None
        self._checkpointer: Checkpointer | None = None
        self.url = ""
        self._ssl_context: ssl.SSLContext | None = None
        tls_ca = config.tls_ca or config.tls_cert
        self._tls_ca = None if tls_ca is None else os.path.abspath(tls_ca)
        self._gate = HandshakeGate(config.max_unauthenticated)
        if otel is None:
            otel = tracer_provider is not None or meter_provider is not None or otel_from_environment()
        self._telemetry: OwnerTelemetry | None = None
        """The owner's metrics and run spans; ``None`` (the default): off, and a batch pays this one check."""
        if otel:
            self._telemetry = _owner_telemetry(self, tracer_provider, meter_provider)
        self.core: OwnerCore
        self._store: SqliteStore
        self._clock: Clock

    def submit(self, peer: PeerId, frames: list[Received]) -> None:
        self.pending.extend((peer, frame) for frame in frames)
        self.work.set()

    # ------------------------------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the database and serve until cancelled. ``task_status.started`` gets the URL once listening.

        Raises ``NotATetherDatabase`` (before anything is created beside the file), ``OwnerAlreadyRunning``,
        ``TetherError`` (the address cannot be bound), ``SchemaTooNew`` or
        ``StorageError`` before listening, and :class:`OwnerFailed` if storage fails later. The address is bound
        before the database is opened, so an address in use changes nothing.
        """
        config = self.config
        check_exposure(config.host, tls=config.tls_cert is not None, insecure_listen=config.insecure_listen)
        if (config.tls_cert is None) != (config.tls_key is None):
            raise TetherError("TLS needs both a certificate and its key (--tls-cert FILE --tls-key FILE)")
        if config.tls_cert is not None and config.tls_key is not None:
            self._ssl_context = server_ssl_context(config.tls_cert, config.tls_key)

        refuse_foreign(self.db, MIGRATIONS)  # before its lock file is created beside it
        if config.standby:
            ownership = await self._wait_for_ownership()
        else:
            ownership = Ownership.acquire(self.db, started_at_ms=self.started_at_ms, instance=self.instance)
        try:
            try:
                listeners = await trio.open_tcp_listeners(config.port, host=config.host)
            except OSError as exc:
                raise TetherError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from exc
            try:
                await self._own(listeners, task_status)
            finally:
                with trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
                    scope.shield = True
                    for listener in listeners:
                        await listener.aclose()
        finally:
            ownership.release()

    async def _wait_for_ownership(self) -> Ownership:
        """A standby's wait: block on the ownership lock until the owner holding it is gone (the kernel hands the
        lock over the moment its holder dies, however it died). No polling: a waiting standby uses no CPU.

        The wait blocks a thread of its own (``flock`` on its own descriptor; see :class:`OwnershipWait`). A
        checkpoint, cancelled by SIGTERM like everything else: the cancellation returns at once, and the thread,
        which cannot be interrupted, lets go of the lock the instant it is granted, so a standby that was told to
        stop never keeps the database from the next owner.
        """
        wait = OwnershipWait(self.db)
        try:
            await trio.to_thread.run_sync(wait.block, abandon_on_cancel=True, limiter=trio.CapacityLimiter(1))
        except BaseException:
            wait.abandon()
            raise
        self.started_at_ms = WallClock().now_ms()
        return wait.claim(started_at_ms=self.started_at_ms, instance=self.instance)

    async def _own(self, listeners: list[trio.SocketListener], task_status: trio.TaskStatus[str]) -> None:
        """Open the store and serve on ``listeners`` until cancelled."""
        config = self.config
        self._store = SqliteStore.open(
            self.db,
            sync=config.sync,
            file_mode=GROUP_READABLE_FILE_MODE if config.group_readable else FILE_MODE,
            start_check_s=config.start_check_s,
        )
        self._say_how_opened()
        try:
            # Before the first write: a WAL left by a killed owner would otherwise be checkpointed inside it.
            self._checkpointer = self._store.use_background_checkpoints()
            self._store.record_owner(
                pid=os.getpid(),
                host=socket.gethostname(),
                started_at_ms=self.started_at_ms,
                instance=self.instance,
                engine=ENGINE,
            )
            with storage_errors("reading the commit log head"):
                self.core = OwnerCore(
                    self._store,
                    token=self.token,
                    instance=self.instance,
                    clock=config.clock,
                    heartbeat_ms=int(config.heartbeat_timeout_s * 1000 / HEARTBEATS_PER_SILENCE),
                    orphan_grace_ms=config.orphan_grace_ms,
                    model_grace_ms=config.model_grace_ms,
                    max_concurrent_runs=config.max_concurrent_runs,
                    peer_output_budget=config.max_peer_output,
                    total_output_budget=config.max_queued_output,
                )
                self._clock = ManualClock(self.core.stored_clock_ms()) if config.clock == "manual" else WallClock()
            if self._telemetry is not None:
                self.core.observe()
            await self._serve(listeners, task_status)
        finally:
            self._close()

    def _say_how_opened(self) -> None:
        store = self._store
        mode = GROUP_READABLE_FILE_MODE if self.config.group_readable else FILE_MODE
        if store.created:
            self.log(f"tether owner: created a new database {self.db} (mode {mode:04o})")
        elif not store.checked_fully and self.config.start_check_s > 0:
            self.log(
                f"tether owner: the start check of {self.db} stopped after {self.config.start_check_s:g} s "
                f"(a large database), so it was not checked fully; run `tether check --db {self.db}` for a full check"
            )

    def _close(self) -> None:
        """Close what :meth:`_own` opened, each step whatever the others did: a runtime file that cannot be removed
        (a read-only directory) never keeps the database from closing. Every step that failed is reported; a
        database that did not close raises :class:`StorageError` (unless the stop already has an error)."""
        steps: list[tuple[str, Callable[[], object]]] = [
            (
                "removing the runtime file (left behind, it names a stopped owner: harmless, the next owner replaces "
                "it)",
                partial(remove_runtime, self.db, instance=self.instance),
            ),
        ]
        if self._checkpointer is not None:
            steps.append(("closing the checkpoint connection", self._checkpointer.close))
        steps.append(("closing the database", self._store.close))
        store_error: BaseException | None = None
        for action, step in steps:
            try:
                step()
            except Exception as exc:  # each failure is reported, and the next step still runs
                self.log(f"tether owner: stopping: {action} failed: {exc}")
                if action == "closing the database":
                    store_error = exc
        if store_error is not None:
            raise StorageError(f"the database did not close cleanly: {store_error}") from store_error

    async def _serve(self, listeners: list[trio.SocketListener], task_status: trio.TaskStatus[str]) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._listen_and_commit(nursery, listeners, task_status)

    async def _listen_and_commit(
        self, nursery: trio.Nursery, listeners: list[trio.SocketListener], task_status: trio.TaskStatus[str]
    ) -> None:
        config = self.config
        port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(
            partial(
                serve_listeners,
                listeners,
                self._handle_stream,
                gate=self._gate,
                log=self.log,
                handler_nursery=nursery,
            )
        )
        scheme = "ws" if self._ssl_context is None else "wss"
        self.url = f"{scheme}://{reachable_host(config.host)}:{port}"
        write_runtime(
            RuntimeInfo(
                db=self.db,
                url=self.url,
                token=self.token,
                pid=os.getpid(),
                host=socket.gethostname(),
                started_at_ms=self.started_at_ms,
                instance=self.instance,
                schema_version=SCHEMA_VERSION,
                clock=config.clock,
                tls_ca=self._tls_ca,
            )
        )
        task_status.started(self.url)
        nursery.start_soon(self._drop_silent_peers)
        if self._telemetry is not None:
            self._telemetry.start(self.core.head_seq)
        try:
            await self._commit_loop()
        finally:
            if self._telemetry is not None:
                self._telemetry.stop()
            with trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
                scope.shield = True
                await self._say_goodbye()
            nursery.cancel_scope.cancel(reason="the owner is stopping")

    async def _say_goodbye(self) -> None:
        """Answer every request not handled, say why to every peer, and close: the one way an owner stops."""
        stop = self._stop
        self._refuse(self.pending, stop.code, stop.unhandled)
        self.pending.clear()
        goodbye = encode_frame(Goodbye(code=stop.code, message=stop.reason))
        for connection in list(self._connections.values()):
            connection.enqueue(goodbye)
        async with trio.open_nursery() as nursery:
            for connection in list(self._connections.values()):
                nursery.start_soon(self._flush_and_close, connection)

    async def _flush_and_close(self, connection: _Connection) -> None:
        with contextlib.suppress(*PEER_GONE):
            await connection.flush()
            await connection.ws.aclose()

    # --------------------------------------------------------------------------------------- connections

    async def _handle_stream(self, stream: trio.SocketStream, slot: HandshakeSlot) -> None:
        """Serve one accepted TCP connection: the handshake (within the handshake timeout), then the peer.

        Runs in the server's nursery: nothing a peer does may raise out of here. ``slot`` is given back once the
        hello was answered or the connection ended, whichever comes first.
        """
        try:
            async with trio.open_nursery() as nursery:  # the WebSocket's reader task
                try:
                    ws = await self._upgrade_and_hello(nursery, stream, slot)
                finally:
                    slot.leave()
                if ws is None:
                    nursery.cancel_scope.cancel(reason="the handshake did not complete")
                    return
                websocket, connection = ws
                try:
                    if connection is not None:
                        await self._serve_peer(connection)
                finally:
                    with trio.move_on_after(CLOSE_TIMEOUT_S), contextlib.suppress(*PEER_GONE):
                        await websocket.aclose()
                    nursery.cancel_scope.cancel(reason="the connection ended")
        finally:
            # A WebSocket closed by its peer or by a limit (1009) does not close its stream: this does.
            await trio.aclose_forcefully(stream)

    async def _upgrade_and_hello(
        self, nursery: trio.Nursery, stream: trio.SocketStream, slot: HandshakeSlot
    ) -> tuple[trio_websocket.WebSocketConnection, _Connection | None] | None:
        """TLS (when configured), the WebSocket upgrade and the hello, within the handshake timeout. The WebSocket
        and the attached connection (``None`` if the hello was refused); ``None`` if the connection broke or timed
        out before it was a WebSocket."""
        ws: trio_websocket.WebSocketConnection | None = None
        with trio.move_on_after(self.config.handshake_timeout_s):
            try:
                transport: trio.abc.Stream = stream
                if self._ssl_context is not None:
                    transport = trio.SSLStream(stream, self._ssl_context, server_side=True)
                    await transport.do_handshake()
                request = await websocket_request(
                    nursery,
                    transport,
                    max_message_size=WEBSOCKET_HARD_LIMIT_BYTES,
                    receive_buffer_size=RECEIVE_BUFFER_BYTES,
                )
                if request is None:
                    return None
                ws = await request.accept()
                return ws, await self._handshake(ws)
            except PEER_GONE:
                return None if ws is None else (ws, None)
        return None if ws is None else (ws, None)

    async def _serve_peer(self, connection: _Connection) -> None:
        try:
            with connection.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(connection.send_loop, nursery.cancel_scope)
                    await connection.receive_loop()
                    nursery.cancel_scope.cancel(reason="the peer closed its connection")
        finally:
            self._connections.pop(connection.peer, None)
            self.core.detach(connection.peer)  # its leases are cut off: settled by the next batch
            self.work.set()

    async def _handshake(self, ws: trio_websocket.WebSocketConnection) -> _Connection | None:
        """Read the Hello and answer it; the attached connection, or ``None`` if it was refused. The caller bounds
        the time it takes."""
        message = await ws.get_message()
        try:
            if isinstance(message, bytes | bytearray) and is_batch_message(message):
                raise ProtocolError("the hello must travel alone, not in a batch", code=ErrorCode.PROTOCOL_VIOLATION)
            frames = decode_message(message)
        except ProtocolError as exc:
            frames = [Received(None, BadFrame(code=exc.code, message=str(exc)))]
        hello = frames[0].frame
        answer = self.core.hello(hello)
        if isinstance(answer, Refused):
            await ws.send_message(encode_frame(answer))
            return None
        assert isinstance(hello, Hello)
        await ws.send_message(encode_frame(answer))
        peer = next(self._peer_ids)
        connection = _Connection(self, peer, ws)
        self._connections[peer] = connection
        self.core.attach(peer, hello.role, peer_name=hello.peer_name, now_ms=self._clock.now_ms())
        return connection

    async def _drop_silent_peers(self) -> None:
        """Close connections that sent nothing for the heartbeat timeout: a stopped (SIGSTOP) or wedged peer.

        Wakes when the connection heard from longest ago would pass the timeout (a peer that spoke since is looked
        at again later), not on a fixed tick: an idle owner does not wake for nothing."""
        timeout_s = self.config.heartbeat_timeout_s
        while True:
            connections = [c for c in self._connections.values() if not c.scope.cancel_called]
            oldest_s = min((connection.last_heard_s for connection in connections), default=trio.current_time())
            await trio.sleep_until(oldest_s + timeout_s)
            now_s = trio.current_time()
            for connection in list(self._connections.values()):
                silent_s = now_s - connection.last_heard_s
                if silent_s >= timeout_s and not connection.scope.cancel_called:
                    self.log(f"tether owner: dropping peer {connection.peer}: silent for {silent_s:.1f} s")
                    connection.scope.cancel(reason="silent past the heartbeat timeout")

    # ---------------------------------------------------------------------------------------- commit loop

    async def _commit_loop(self) -> None:
        """Run batches, feed lagging watches and copy the WAL back, until cancelled or storage fails.

        Every storage error met here (a batch, a watch's catch-up, a checkpoint on its thread) takes the one
        fail-closed path: :meth:`_fail_closed`.
        """
        core = self.core
        clock = self._clock
        batch: list[tuple[PeerId, Received]] = []
        try:
            while True:
                if self._storage_failed is not None:
                    raise self._storage_failed
                if not self.pending and not core.has_lagging_watches and not core.needs_settle(clock.now_ms()):
                    deadline_ms = core.next_deadline_ms()
                    wait_s = math.inf if deadline_ms is None else clock.seconds_until(deadline_ms)
                    with trio.move_on_after(wait_s):
                        await self.work.wait()
                self.work = trio.Event()
                if self._held is not None:
                    await self._held.wait()
                if self._storage_failed is not None:
                    raise self._storage_failed
                if self.pending or core.needs_settle(clock.now_ms()):
                    take = _batch_size(len(self.pending))
                    batch = self.pending[:take]
                    del self.pending[:take]
                    self._run_batch(batch)
                    batch = []
                    self.space_available.set()
                    self.space_available = trio.Event()
                if core.has_lagging_watches:
                    with storage_errors("reading the commit log for a watch"):
                        out = core.catch_up()
                    self._dispatch(out, core.take_encoded())
                await trio.lowlevel.checkpoint()
        except StorageError as exc:
            self._fail_closed(batch, exc)

    def _kill_at_result(self, batch: list[tuple[PeerId, Received]]) -> Literal["before", "after"] | None:
        """Fault injection: whether this batch holds the operation result a ``kill_*_result`` setting names."""
        config = self.config
        if config.kill_before_result is None and config.kill_after_result is None:
            return None
        for _, received in batch:
            frame = received.frame
            if isinstance(frame, Commit):
                self._results_received += sum(isinstance(write, FinishOperation) for write in frame.writes)
        if self._results_received == 0:
            return None
        if config.kill_before_result is not None and self._results_received >= config.kill_before_result:
            return "before"
        if config.kill_after_result is not None and self._results_received >= config.kill_after_result:
            return "after"
        return None

    def _run_batch(self, batch: list[tuple[PeerId, Received]]) -> None:
        """One transaction: BEGIN, the core's batch, COMMIT; then what it produced goes out (never before)."""
        core = self.core
        store = self._store
        kill_at_result = self._kill_at_result(batch)
        with storage_errors("committing a batch"):
            store.begin()
            wrote = core.run_batch(batch, self._clock.now_ms())
            if kill_at_result == "before":
                os.kill(os.getpid(), signal.SIGKILL)
            if wrote:
                self._writing_commits += 1
                if self._writing_commits == self.config.kill_before_commit:
                    os.kill(os.getpid(), signal.SIGKILL)
                if self._writing_commits == self.config.storage_error_at_commit:
                    raise StorageError(f"injected storage failure at writing commit {self._writing_commits}")
            store.commit()
            if (wrote and self._writing_commits == self.config.kill_after_commit) or kill_at_result == "after":
                os.kill(os.getpid(), signal.SIGKILL)
        out, effects = core.take_output()
        if effects.clock_ms is not None:
            self._clock.advance_to(effects.clock_ms)
        self._dispatch(out, core.take_encoded())
        if self._telemetry is not None:
            self._telemetry.batch(len(batch), core.head_seq, wrote, effects.ended_runs)
        self._maybe_checkpoint()

    def telemetry_gauges(self) -> tuple[CoreGauges, int, int, int]:
        """What the owner's observable instruments read (on its trio thread): the core's gauges, the frames waiting
        for the commit loop, the output queued for peers (bytes), the peers attached."""
        queued = sum(connection.queued_bytes for connection in self._connections.values())
        return self.core.gauges(), len(self.pending), queued, len(self._connections)

    def _maybe_checkpoint(self) -> None:
        """After a batch: wake a copy-back that waits for a commit, and start one once the WAL holds
        ``CHECKPOINT_START_PAGES`` (it runs until the WAL starts over; see :meth:`_copy_back`)."""
        store = self._store
        if store.wal_commits != self._wal_commits_seen:
            self._wal_commits_seen = store.wal_commits
            self._committed.set()
            self._committed = trio.Event()
        if self._checkpointing or self._nursery is None or store.wal_pages < CHECKPOINT_START_PAGES:
            return
        self._checkpointing = True
        self._nursery.start_soon(self._copy_back)

    async def _copy_back(self) -> None:
        """Copy the WAL back into the database on the checkpoint thread, pass after pass, until a transaction of the
        commit loop starts the WAL over; the commit loop waits for none of it but past a hard bound.

        SQLite starts the WAL over in a transaction that began while every frame was copied (see
        ``SqliteStore.use_background_checkpoints``). Each pass copies what was committed since the one before (once
        that is ``CHECKPOINT_PASS_PAGES``, or at the next commit if the pass before copied everything); a pass
        during which nothing was committed has copied everything, and the next transaction starts the WAL over (this
        is how an owner that pauses, even briefly, restarts it without ever holding a batch). An owner that is never
        idle never lets a pass end between two of its transactions: once the WAL passes ``CHECKPOINT_HOLD_PAGES``
        one pass runs with the commit loop held before its next batch (two fsyncs and the frames committed since the
        pass before; the loop awaits it, so the owner still reads and sends meanwhile).

        A pass that could not copy everything (a reader's old snapshot is in the way) is tried again once the WAL has
        grown by ``CHECKPOINT_START_PAGES``, not at every commit; one that SQLite answered busy, after the next
        commit. A storage error is handed to the commit loop, which fails closed."""
        assert self._checkpointer is not None
        checkpointer = self._checkpointer
        store = self._store
        restarts = store.wal_restarts
        hold_at_pages = CHECKPOINT_HOLD_PAGES
        try:
            while store.wal_restarts == restarts:
                commits = store.wal_commits
                if store.wal_pages < hold_at_pages:
                    result = await trio.to_thread.run_sync(checkpointer.checkpoint)
                else:
                    result = await self._copy_holding_the_loop(checkpointer)
                    hold_at_pages = store.wal_pages + CHECKPOINT_START_PAGES
                if result is not None and result[1] < result[0]:  # a reader's old snapshot is in the way
                    await self._wal_grown_to(store.wal_pages + CHECKPOINT_START_PAGES, restarts)
                elif result is None or store.wal_commits == commits:
                    # Copied up to the last commit: the next transaction restarts the WAL. Or SQLite answered busy
                    # (another checkpoint runs, or the pass met the writer at a moment it does not wait out): retry.
                    await self._committed.wait()
                else:  # writes went on during the pass: the next one copies them once they are worth its fsyncs
                    await self._wal_grown_to(min(result[0] + CHECKPOINT_PASS_PAGES, hold_at_pages), restarts)
        except StorageError as exc:
            self._storage_failed = exc
        finally:
            self._checkpointing = False
            self.work.set()

    async def _copy_holding_the_loop(self, checkpointer: Checkpointer) -> tuple[int, int] | None:
        """One checkpoint pass while the commit loop waits before its next batch (from its next turn on: this task
        runs only while the loop is between two transactions)."""
        held = trio.Event()
        self._held = held
        try:
            return await trio.to_thread.run_sync(checkpointer.checkpoint)
        finally:
            self._held = None
            held.set()

    async def _wal_grown_to(self, pages: int, restarts: int) -> None:
        """Wait until the WAL holds ``pages`` pages, or a transaction started it over since ``restarts``."""
        store = self._store
        while store.wal_pages < pages and store.wal_restarts == restarts:
            await self._committed.wait()

    def _fail_closed(self, batch: list[tuple[PeerId, Received]], exc: StorageError) -> None:
        """The one way a storage error stops the owner: answer the failed batch (if one was running) with
        ``storage_failed``, make the stop that follows answer every pending request and say goodbye the same way,
        and raise :class:`OwnerFailed`."""
        self.log(f"tether owner: {exc}; failing closed: nothing uncommitted was acknowledged")
        unhandled = f"{exc}; nothing of this request was acknowledged, the owner is failing closed"
        self._stop = _Stop(code=ErrorCode.STORAGE_FAILED, reason=str(exc), unhandled=unhandled)
        self._refuse(batch, ErrorCode.STORAGE_FAILED, unhandled)
        with contextlib.suppress(Exception):  # the store is already broken; the rollback is a courtesy
            if self._store.in_transaction:  # not after a failed catch-up or checkpoint
                self._store.rollback()
        raise OwnerFailed(str(exc)) from exc

    def _refuse(self, requests: list[tuple[PeerId, Received]], code: ErrorCode, message: str) -> None:
        for peer, received in requests:
            self._send(peer, received.call_id, Error(code=code, message=message))

    def _dispatch(self, out: list[Output], encoded: list[bytes]) -> None:
        """Queue a batch's (or catch-up turn's) output, encoded by the core, then tell the core what each peer it
        touched holds unsent, and drop the largest readers if the owner's total is past its budget."""
        assert len(encoded) == len(out), "the core's encoded output does not match its frames"
        connections = self._connections
        touched: dict[PeerId, _Connection] = {}
        for (peer, _, _), data in zip(out, encoded, strict=True):
            connection = connections.get(peer)
            if connection is not None:  # else gone: nobody is left to read it
                connection.enqueue(data)
                touched[peer] = connection
        for connection in touched.values():
            connection.report_queued()
        if self.core.queued_output_bytes > self.config.max_queued_output:
            self._shed_readers()

    def _shed_readers(self) -> None:
        """Drop the peers holding the most unread output (each past the high-water mark) until the owner's total
        is back under its budget: one peer that reads its output is never dropped for the others'."""
        total = sum(connection.queued_bytes for connection in self._connections.values())
        largest = sorted(self._connections.values(), key=lambda connection: connection.queued_bytes, reverse=True)
        for connection in largest:
            if total <= self.config.max_queued_output or connection.queued_bytes <= SEND_HIGH_WATER_BYTES:
                return
            if not connection.scope.cancel_called:
                self.log(
                    f"tether owner: dropping peer {connection.peer}: {connection.queued_bytes} bytes unread, and "
                    f"{total} across peers is past the budget of {self.config.max_queued_output}"
                )
                connection.scope.cancel(reason="the owner's unread output is past its budget")
            total -= connection.queued_bytes

    def _send(self, peer: PeerId, call_id: int | None, frame: Frame) -> None:
        """Queue ``frame`` for ``peer`` with its envelope's ``call_id`` (dropped if the peer is gone: nobody is
        left to read it)."""
        connection = self._connections.get(peer)
        if connection is not None:
            connection.enqueue(encode_frame(frame, call_id=call_id))

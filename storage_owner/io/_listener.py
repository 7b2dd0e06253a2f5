"""Accepting connections: what a connection may cost the owner before it has become a peer.

A TCP connection is a peer only once its hello was welcomed. Until then it has proved nothing, so what it may
hold is bounded (docs/operations.md, "Limits"):

1. **Time.** TLS, the WebSocket upgrade and the hello together must finish within the handshake timeout
   (``OwnerConfig.handshake_timeout_s``, 10 s by default) of the accept, or the connection is closed.
2. **Count.** At most ``OwnerConfig.max_unauthenticated`` connections are in their handshake at once; one accepted
   past that is closed at once, unread, so that idle half-open connections cannot lock peers out (they hold a
   slot for the handshake timeout at most).
3. **Accept failures.** When ``accept`` fails for lack of resources (``EMFILE``: no file descriptor left,
   ``ENFILE``, ``ENOBUFS``, ``ENOMEM``), the listener backs off (doubling from 10 ms to 500 ms) instead of
   spinning, and the failures are logged as one line per interval with their count, never one per attempt (a
   count still pending is written when its interval is up, or as the listener stops). Connections closed for the
   count bound are summarised the same way.

Exposure: an address other than loopback needs TLS or an explicit ``insecure_listen`` (:func:`check_exposure`);
the runtime file names an address a local peer can reach (:func:`reachable_host`), never a wildcard.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import ssl
from collections.abc import Awaitable, Callable
from typing import Final

import trio
import trio_websocket
from wsproto import ConnectionType, WSConnection

from protocol import TetherError

DEFAULT_HANDSHAKE_TIMEOUT_S: Final = 10.0
"""TLS, the WebSocket upgrade and the hello must be done within this time of the accept."""
DEFAULT_MAX_UNAUTHENTICATED: Final = 64
"""Connections in their handshake at once; one more is closed at once."""
ACCEPT_BACKOFF_INITIAL_S: Final = 0.01
ACCEPT_BACKOFF_MAX_S: Final = 0.5
"""After an accept failed for lack of resources, wait this long (doubling from the initial) before the next one."""
LOG_INTERVAL_S: Final = 10.0
"""At most one summary line per kind of trouble (accept failures, connections over the bound) per interval."""
CAPACITY_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""``accept`` failures that mean "no resources now": retried after a back-off. Any other error ends the owner."""
WILDCARD_HOSTS: Final = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}
"""A wildcard listen address, and the address the runtime file names instead (reachable from this host)."""


class ExposureRefused(TetherError):
    """``--listen`` names an address other than loopback without TLS and without ``--insecure-listen``."""


class HandshakeGate:
    """Counts the connections in their handshake; refuses a slot past the bound."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.open = 0

    def enter(self) -> HandshakeSlot | None:
        """A slot for a new connection, or ``None`` when ``most`` are taken (close the connection at once)."""
        if self.open >= self.most:
            return None
        self.open += 1
        return HandshakeSlot(self)


class HandshakeSlot:
    """One connection's place among the unauthenticated; :meth:`leave` once its hello is answered or it ended."""

    def __init__(self, gate: HandshakeGate) -> None:
        self._gate: HandshakeGate | None = gate

    def leave(self) -> None:
        """Give the slot back; later calls do nothing."""
        if self._gate is not None:
            self._gate.open -= 1
            self._gate = None


class CountedLog:
    """A line per interval with how often something happened, instead of a line each time.

    The first occurrence is logged at once (the operator learns of the trouble without waiting); later ones are
    counted and summarised at the first occurrence after ``interval_s`` has passed since the last line, or by
    :meth:`flush` (called on a timer and when the listener stops), so no count is lost when the trouble stops.
    """

    def __init__(self, log: Callable[[str], None], what: str, *, interval_s: float = LOG_INTERVAL_S) -> None:
        self._log = log
        self._what = what
        self.interval_s = interval_s
        self._count = 0
        self._last_line_s: float | None = None
        self._detail = ""
        self.total = 0
        """Every occurrence since the owner started."""
        self.reported = 0
        """The occurrences the lines written so far account for (``total`` less :attr:`pending`)."""

    def record(self, detail: str, now_s: float) -> None:
        self._count += 1
        self.total += 1
        self._detail = detail
        if self._last_line_s is None or now_s - self._last_line_s >= self.interval_s:
            self._write(now_s)

    @property
    def pending(self) -> int:
        """Occurrences counted since the last line, not reported yet."""
        return self._count

    def next_due_s(self) -> float | None:
        """When :meth:`flush` would report the pending count (``None``: nothing pending)."""
        if not self._count or self._last_line_s is None:
            return None
        return self._last_line_s + self.interval_s

    def next_look_s(self, now_s: float) -> float:
        """When to call :meth:`flush` next: no later than any count that may become pending meanwhile is due (the
        interval after the last line, or after ``now_s`` when that has passed)."""
        if self._last_line_s is not None and self._last_line_s + self.interval_s > now_s:
            return self._last_line_s + self.interval_s
        return now_s + self.interval_s

    def flush(self, now_s: float, *, force: bool = False) -> None:
        """Report the pending count if the interval has passed since the last line (any time with ``force``,
        as the listener stops); nothing when none is pending."""
        due = self.next_due_s()
        if due is not None and (force or now_s >= due):
            self._write(now_s)

    def _write(self, now_s: float) -> None:
        since = "" if self._last_line_s is None else f" in the last {now_s - self._last_line_s:.0f} s"
        self._log(f"tether owner: {self._what}: {self._count} time(s){since} ({self._detail})")
        self.reported += self._count
        self._count = 0
        self._last_line_s = now_s


async def serve_listeners(
    listeners: list[trio.SocketListener],
    handle: Callable[[trio.SocketStream, HandshakeSlot], Awaitable[None]],
    *,
    gate: HandshakeGate,
    log: Callable[[str], None],
    handler_nursery: trio.Nursery,
) -> None:
    """Accept on every listener until cancelled; each connection given a slot runs ``handle`` in
    ``handler_nursery``. Raises the ``OSError`` of an accept failure that is not a lack of resources."""
    failures = CountedLog(log, "could not accept a connection, backing off")
    over = CountedLog(log, f"closed a new connection at once: {gate.most} connections are already in their handshake")
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_flush_counts, (failures, over))
            for listener in listeners:
                nursery.start_soon(_accept_loop, listener, handle, gate, failures, over, handler_nursery)
    finally:  # stopping (cancelled, or an accept failed otherwise): what was counted since the last line is said
        for counted in (failures, over):
            counted.flush(trio.current_time(), force=True)


async def _flush_counts(logs: tuple[CountedLog, ...]) -> None:
    """Report each log's pending count once its interval has passed, even when nothing more happens."""
    while True:
        now_s = trio.current_time()
        await trio.sleep_until(min(counted.next_look_s(now_s) for counted in logs))
        for counted in logs:
            counted.flush(trio.current_time())


async def _accept_loop(
    listener: trio.SocketListener,
    handle: Callable[[trio.SocketStream, HandshakeSlot], Awaitable[None]],
    gate: HandshakeGate,
    failures: CountedLog,
    over: CountedLog,
    handler_nursery: trio.Nursery,
) -> None:
    backoff_s = ACCEPT_BACKOFF_INITIAL_S
    while True:
        try:
            stream = await listener.accept()
        except OSError as exc:
            if exc.errno not in CAPACITY_ERRNOS:
                raise
            code = exc.errno or 0
            failures.record(f"{errno.errorcode.get(code, code)}: {os.strerror(code)}", trio.current_time())
            await trio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, ACCEPT_BACKOFF_MAX_S)
            continue
        backoff_s = ACCEPT_BACKOFF_INITIAL_S
        slot = gate.enter()
        if slot is None:
            over.record("new connections are closed until some finish or time out", trio.current_time())
            await trio.aclose_forcefully(stream)
            continue
        handler_nursery.start_soon(handle, stream, slot)


async def websocket_request(
    nursery: trio.Nursery, stream: trio.abc.Stream, *, max_message_size: int, receive_buffer_size: int
) -> trio_websocket.WebSocketRequest | None:
    """The WebSocket upgrade request read from ``stream``, or ``None`` if the connection ended before one arrived.

    ``trio_websocket.wrap_server_stream`` waits for the request even after the connection ended (its server
    bounds that with its connect timeout), so a peer that connects and closes would hold a handshake slot for the
    whole handshake timeout. This is the same function, ending when the connection's reader task does. It uses
    the two private methods ``wrap_server_stream`` uses; the reader task runs in ``nursery`` for the connection's
    whole life.
    """
    connection = trio_websocket.WebSocketConnection(
        stream,
        WSConnection(ConnectionType.SERVER),
        message_queue_size=4,
        max_message_size=max_message_size,
        receive_buffer_size=receive_buffer_size,
    )
    request: trio_websocket.WebSocketRequest | None = None
    with trio.CancelScope() as waiting:

        async def read() -> None:
            try:
                await connection._reader_task()
            finally:
                waiting.cancel(reason="the connection ended before its upgrade request")

        nursery.start_soon(read)
        request = await connection._get_request()
    return request


# ----------------------------------------------------------------------------------------------------- exposure


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is this machine's loopback only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def check_exposure(host: str, *, tls: bool, insecure_listen: bool) -> None:
    """Raise :class:`ExposureRefused` for a listen address other than loopback without TLS and without
    ``insecure_listen``: the access token would cross the network in clear."""
    if is_loopback(host) or tls or insecure_listen:
        return
    raise ExposureRefused(
        f"refusing to listen on {host}: it is not a loopback address, and without TLS the access token and every "
        "frame would cross the network in clear. Give --tls-cert FILE --tls-key FILE to serve wss://, or "
        "--insecure-listen to accept that (on a network you trust); nothing was started"
    )


def reachable_host(host: str) -> str:
    """The address the runtime file names for a listen address: a wildcard becomes this host's loopback (a
    wildcard is not an address a peer can connect to); IPv6 addresses are bracketed for a URL."""
    host = WILDCARD_HOSTS.get(host, host)
    return f"[{host}]" if ":" in host else host


def server_ssl_context(cert: str, key: str) -> ssl.SSLContext:
    """The TLS context the owner serves with; raise :class:`TetherError` saying which file is wrong."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except FileNotFoundError as exc:
        raise TetherError(
            f"cannot read the TLS certificate or key: {exc.filename or cert}: no such file; nothing was started"
        ) from exc
    except (OSError, ssl.SSLError) as exc:
        raise TetherError(
            f"cannot use the TLS certificate {cert} with the key {key}: {exc} (both must be PEM files, the key "
            "unencrypted and matching the certificate); nothing was started"
        ) from exc
    return context

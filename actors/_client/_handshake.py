"""How a client opens one WebSocket to the owner: the TCP connection, the TLS handshake, the WebSocket upgrade and the
hello, each failure mapped at this one boundary to a :class:`~protocol.TetherError` that says which step failed
(:class:`~protocol.OwnerUnavailable`, :class:`~protocol.HandshakeRefused`, :class:`~protocol.ProtocolError`)."""

from __future__ import annotations

import contextlib
import ssl
import urllib.parse
from typing import Final

import trio
import trio_websocket

from protocol import (
    PROTOCOL_VERSION,
    WEBSOCKET_HARD_LIMIT_BYTES,
    HandshakeRefused,
    Hello,
    OwnerUnavailable,
    ProtocolError,
    Refused,
    Welcome,
    decode_frame,
    encode_frame,
)

RECEIVE_BUFFER_BYTES: Final = 1 << 16


async def open_owner_socket(
    nursery: trio.Nursery,
    *,
    url: str,
    token: str,
    ca: str | None,
    ssl_context: ssl.SSLContext | None,
    role: str,
    name: str,
    target: str,
    timeout_s: float,
) -> tuple[trio_websocket.WebSocketConnection, Welcome]:
    """A WebSocket to the owner at ``url`` whose hello (``token``, ``role``, ``name``) the owner welcomed, and its
    ``Welcome``, each step within ``timeout_s``; raise a :class:`TetherError` saying why not. ``target`` is what the
    connection reaches, for the errors (``database PATH`` or ``url URL``)."""
    context = None
    if url.startswith("wss://"):
        context = ssl_context or _client_ssl_context(ca)
    step = ["the TCP connection"]
    """Which step of the connection runs (``_open_websocket`` moves it on), for the error of one that fails."""
    try:
        with trio.fail_after(timeout_s):
            ws = await _open_websocket(nursery, url, context, step)
    except (OSError, trio_websocket.HandshakeError, trio.TooSlowError, trio.BrokenResourceError) as exc:
        unverified = exc if isinstance(exc, ssl.SSLCertVerificationError) else exc.__cause__
        if isinstance(unverified, ssl.SSLCertVerificationError):
            raise OwnerUnavailable(
                f"the owner at {url} could not be verified ({target}): "
                f"{unverified.verify_message}; give the CA that signed its certificate (connect(ca=FILE)); "
                "nothing was sent"
            ) from exc
        why = f"{step[0]} did not complete within {timeout_s:g} s" if isinstance(exc, trio.TooSlowError) else exc
        raise OwnerUnavailable(f"cannot reach the owner at {url} ({target}): {why}") from exc
    try:
        with trio.fail_after(timeout_s):
            hello = Hello(protocol_version=PROTOCOL_VERSION, token=token, role=role, peer_name=name)
            await ws.send_message(encode_frame(hello))
            answer = decode_frame(_binary(await ws.get_message()))
    except trio.TooSlowError as exc:
        await close_quietly(ws)
        raise OwnerUnavailable(
            f"cannot reach the owner at {url} ({target}): the owner did not answer the hello within {timeout_s:g} s"
        ) from exc
    except trio_websocket.ConnectionClosed as exc:
        await close_quietly(ws)
        raise OwnerUnavailable(
            f"cannot reach the owner at {url} ({target}): the owner closed the connection "
            f"before answering the hello ({exc.reason})"
        ) from exc
    except ProtocolError:
        await close_quietly(ws)
        raise
    if isinstance(answer, Refused):
        await close_quietly(ws)
        raise HandshakeRefused(
            answer.code, f"the owner refused the connection: {answer.message}", answer.supported_versions
        )
    if not isinstance(answer, Welcome):
        await close_quietly(ws)
        raise ProtocolError(f"expected welcome or refused, got {answer.TYPE}")
    return ws, answer


async def _open_websocket(
    nursery: trio.Nursery, url: str, context: ssl.SSLContext | None, step: list[str]
) -> trio_websocket.WebSocketConnection:
    """A WebSocket to ``url``: the TCP connection, the TLS handshake (with ``context``, done and verified before the
    upgrade: trio-websocket would do it inside its reader task, where a verification failure only shows as an upgrade
    that never ends), then the upgrade. ``step[0]`` says which of them runs, for the caller's error."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"the owner's URL must be ws://HOST:PORT or wss://HOST:PORT, not {url!r}")
    host, port = parts.hostname, parts.port or (443 if context is not None else 80)
    resource = parts.path or "/"
    step[0] = f"the TCP connection to {host}:{port}"
    tcp = await trio.open_tcp_stream(host, port)
    stream: trio.SocketStream | trio.SSLStream[trio.SocketStream] = tcp
    try:
        if context is not None:
            step[0] = "the TLS handshake"
            stream = trio.SSLStream(tcp, context, server_hostname=host, https_compatible=True)
            await stream.do_handshake()
        step[0] = "the WebSocket upgrade"
        host_header = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return await trio_websocket.wrap_client_stream(
            nursery,
            stream,
            host_header,
            resource,
            max_message_size=WEBSOCKET_HARD_LIMIT_BYTES,
            receive_buffer_size=RECEIVE_BUFFER_BYTES,
        )
    except BaseException:
        await trio.aclose_forcefully(tcp)
        raise


def _client_ssl_context(ca: str | None) -> ssl.SSLContext:
    """A context that verifies the owner's certificate: against ``ca`` (a PEM file) or the system's CAs."""
    try:
        return ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise OwnerUnavailable(f"cannot read the CA certificate {ca}: {exc}") from exc


def _binary(message: str | bytes) -> bytes:
    if isinstance(message, str):
        raise ProtocolError("the owner sent a text message; the protocol is binary msgpack")
    return message


async def close_quietly(ws: trio_websocket.WebSocketConnection) -> None:
    with contextlib.suppress(Exception):
        await ws.aclose()

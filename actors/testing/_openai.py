"""An OpenAI-compatible server for tests: plain HTTP/1.1 on a trio socket (loopback, port 0), answering each request
to ``POST /v1/chat/completions`` with the next scripted :class:`Reply`, and recording every request it got.

Replies replay recorded stream transcripts (``actors/testing/transcripts/*.sse``, :data:`TRANSCRIPTS`, in the formats
of OpenAI, vLLM, Ollama, llama.cpp and OpenRouter) or inline chunks (:func:`sse_body`), byte for byte, with the
network's quirks on demand: the body written in small pieces (``data:`` lines split across reads), slowly
(``delay_s`` before each piece), cut off (``cut_after``: the connection closes mid-body), or ended by closing the
connection (``chunked=False``). Error replies carry a status, headers (``Retry-After``) and a JSON body. A request
with no reply left gets a 500 saying so.
"""

from __future__ import annotations

import contextlib
import json
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from protocol import UsageError

TRANSCRIPTS_DIR: Final = Path(__file__).resolve().parent / "transcripts"
TRANSCRIPTS: Final = tuple(sorted(path.stem for path in TRANSCRIPTS_DIR.glob("*.sse")))
"""The names of the recorded transcripts :func:`recorded_transcript` replays."""
MAX_REQUEST_BYTES: Final = 8 * 1024 * 1024
REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    409: "Conflict",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


@attrs.frozen(kw_only=True)
class Reply:
    """One scripted answer. ``piece_bytes`` writes the body that many bytes at a time (each piece its own send and,
    when ``chunked``, its own HTTP chunk); ``delay_s`` sleeps before each piece; ``cut_after`` closes the connection
    after that many bytes of the body, without ending it; ``chunked=False`` sends no length: the body ends when the
    connection closes."""

    status: int = 200
    headers: tuple[tuple[str, str], ...] = (("content-type", "text/event-stream"),)
    body: bytes = b""
    piece_bytes: int | None = None
    delay_s: float = 0.0
    cut_after: int | None = None
    chunked: bool = True


@attrs.frozen(kw_only=True)
class RecordedRequest:
    """A request the server got: method, path, headers (names lowercased) and the JSON body."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: Any


def recorded_transcript(name: str) -> bytes:
    """The recorded stream ``NAME`` (one of :data:`TRANSCRIPTS`), as bytes; :class:`~protocol.UsageError` names the
    recorded ones for another name."""
    if name not in TRANSCRIPTS:
        raise UsageError(f"no recorded transcript {name!r}; the recorded ones: {', '.join(TRANSCRIPTS)}")
    return (TRANSCRIPTS_DIR / f"{name}.sse").read_bytes()


def sse_body(*chunks: object, done: bool = True) -> bytes:
    """An event stream of ``chunks`` (a dict is sent as its JSON, a str as is), then ``data: [DONE]`` if ``done``."""
    lines = [f"data: {chunk if isinstance(chunk, str) else json.dumps(chunk)}\n\n" for chunk in chunks]
    if done:
        lines.append("data: [DONE]\n\n")
    return "".join(lines).encode()


def stream_reply(body: bytes, **options: Any) -> Reply:
    """A 200 event stream of ``body`` (a :func:`recorded_transcript` or an :func:`sse_body`), with the
    :class:`Reply` ``options`` (``piece_bytes``, ``delay_s``, ``cut_after``, ``chunked``)."""
    return Reply(body=body, **options)


def error_reply(status: int, payload: object, *headers: tuple[str, str]) -> Reply:
    """An error response: ``payload`` as its JSON body (a str as is), with ``headers``."""
    body = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
    return Reply(status=status, headers=(("content-type", "application/json"), *headers), body=body)


class OpenAIServer:
    """The server; start it with :func:`openai_server`. ``url`` is the ``base_url`` to give ``OpenAIChat``;
    ``requests`` what it got, in order; :meth:`add` scripts more replies."""

    def __init__(self, replies: Iterable[Reply] = ()) -> None:
        self.replies: deque[Reply] = deque(replies)
        self.requests: list[RecordedRequest] = []
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def add(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, connection: trio.SocketStream) -> None:
        async with connection:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
                request = await _read_request(connection)
                if request is None:
                    return
                self.requests.append(request)
                if request.method != "POST" or not request.path.endswith("/chat/completions"):
                    reply = error_reply(404, {"error": {"message": f"no route {request.method} {request.path}"}})
                elif self.replies:
                    reply = self.replies.popleft()
                else:
                    reply = error_reply(
                        500, {"error": {"message": "the test server has no reply left", "type": "test"}}
                    )
                await _write_reply(connection, reply)


async def _read_request(connection: trio.SocketStream) -> RecordedRequest | None:
    data = bytearray()
    while b"\r\n\r\n" not in data:
        piece = await connection.receive_some(65536)
        if not piece:
            return None
        data += piece
        if len(data) > MAX_REQUEST_BYTES:
            raise ConnectionError("request too large")
    head, _, rest = bytes(data).partition(b"\r\n\r\n")
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    method, path, _ = request_line.split(" ", 2)
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = bytearray(rest)
    while len(body) < length:
        piece = await connection.receive_some(65536)
        if not piece:
            return None
        body += piece
    text = bytes(body[:length])
    parsed: Any = json.loads(text) if text else None
    return RecordedRequest(method=method, path=path, headers=headers, body=parsed)


async def _write_reply(connection: trio.SocketStream, reply: Reply) -> None:
    head = [f"HTTP/1.1 {reply.status} {REASONS.get(reply.status, 'Status')}", "connection: close"]
    head += [f"{name}: {value}" for name, value in reply.headers]
    streaming = reply.piece_bytes is not None or reply.delay_s > 0 or reply.cut_after is not None
    if reply.chunked and (streaming or reply.status == 200):
        head.append("transfer-encoding: chunked")
    elif reply.chunked:
        head.append(f"content-length: {len(reply.body)}")
    await connection.send_all(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
    body = reply.body if reply.cut_after is None else reply.body[: reply.cut_after]
    size = reply.piece_bytes or max(1, len(body))
    chunked = reply.chunked and (streaming or reply.status == 200)
    for start in range(0, len(body), size):
        if reply.delay_s:
            await trio.sleep(reply.delay_s)
        piece = body[start : start + size]
        await connection.send_all(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
    if reply.cut_after is not None:
        return  # the connection closes mid-body: no last chunk
    if chunked:
        await connection.send_all(b"0\r\n\r\n")


@contextlib.asynccontextmanager
async def openai_server(*replies: Reply) -> AsyncIterator[OpenAIServer]:
    """A started :class:`OpenAIServer` with ``replies`` scripted; stopped when the block ends."""
    server = OpenAIServer(replies)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel(reason="the test is done with the model server")

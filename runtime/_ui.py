"""``tether ui``: a web page to operate a database's agents, served under trio by Hypercorn with Starlette.

The server is a client of the owner like any script (``actors.connect``): every page and action is a typed call of
the client, every update comes from one watch of everything (:class:`Hub`), pushed to the pages as server-sent
events. The page itself is plain HTML, CSS and one small script (``runtime/_ui_page``): no build step.

Security (docs/ui.md):

- It listens on loopback unless told otherwise, and then only over TLS (``--tls-cert``, ``--tls-key``), or with
  ``--insecure-listen``: the owner's rules.
- Every request needs the login token ``tether ui`` prints in its URL (as Jupyter does), checked once for all
  routes by :class:`LoginRequired`: the URL's ``?token=`` sets an HttpOnly, ``SameSite=Strict`` session cookie;
  ``Authorization: Bearer TOKEN`` works for scripts.
- Actions are POSTs of JSON that carry the page's anti-forgery value (``X-Tether-CSRF``, from the page's own HTML)
  and, when the browser sends one, an ``Origin`` naming the host the request was sent to: a cross-site page can
  neither read nor act.
- What a page may ask is bounded as for any client: request bodies at :data:`MAX_BODY_BYTES`, event streams at
  :data:`MAX_STREAMS`, each stream's unsent events at :data:`MAX_QUEUED_EVENTS` (past it the stream is told to read
  again, and starts afresh), pages of lists at :data:`MAX_LISTED`.

The owner may not run yet, or stop and come back (:class:`OwnerLink`): the page is served either way, says so, and
reads again once the owner answers; no read or action waits for it longer than :data:`REQUEST_TIMEOUT_S`. Every
error the API answers is ``{"error": {"code", "message"}}``, the code one of :class:`~protocol.ErrorCode`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import secrets
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

import actors
from protocol import (
    RUN_ACTIVE,
    Change,
    ConnectionLost,
    EntryRecord,
    ErrorCode,
    InteractionRecord,
    OperationRecord,
    OwnerUnavailable,
    PartialRecord,
    RunRecord,
    StorageError,
    SubmissionRecord,
    TetherError,
    UsageError,
    converter,
    runtime_path,
)

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

PAGE_DIR: Final = Path(__file__).with_name("_ui_page")
MAX_BODY_BYTES: Final = 1 << 20
"""The largest action a page may send."""
MAX_STREAMS: Final = 64
"""Event streams (open pages) served at once; one more is refused (503)."""
MAX_QUEUED_EVENTS: Final = 1000
"""Events waiting for one slow page; past it the page is told to read everything again."""
MAX_LISTED: Final = 500
"""The most runs, entries or tasks one read returns (the newest)."""
REQUEST_TIMEOUT_S: Final = 10.0
"""The longest a read or an action waits for the owner's answer; then it answers ``owner_unavailable`` (504)."""
OWNER_WAIT_S: Final = 2.0
"""How long a read or an action waits for a dropped connection to the owner to come back (a supervised restart)
before it answers ``owner_unavailable`` (503). Once an attempt to reach the owner failed, they answer at once."""
FIRST_LINK_S: Final = 5.0
"""How long ``tether ui`` waits for its first attempt to reach the owner before it serves (and prints its URL), so
that a page opened at once finds the owner's data, or is told that no owner answers."""
RELINK_S: Final = 1.0
"""How often the link looks whether its connection failed for good, and the pause before it connects anew."""
SESSION_COOKIE: Final = "tether_ui"
CSRF_HEADER: Final = "x-tether-csrf"
STATUS_OF_CODE: Final[dict[str, int]] = {
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.DUPLICATE: 409,
    ErrorCode.CONFLICT: 409,
    ErrorCode.STALE_LEASE: 409,
    ErrorCode.BUDGET_EXCEEDED: 409,
    ErrorCode.INVALID: 400,
    ErrorCode.BAD_FRAME: 400,
    ErrorCode.FRAME_TOO_LARGE: 413,
    ErrorCode.READ_ONLY: 403,
    ErrorCode.NOT_ALLOWED: 403,
    ErrorCode.OVERLOADED: 503,
    ErrorCode.SHUTTING_DOWN: 503,
    ErrorCode.OWNER_UNAVAILABLE: 503,
}
"""The HTTP status of an owner's refusal, by its code (any other: 502, the owner failed us)."""


def _record(record: Any) -> Any:
    return converter.unstructure(record)


@attrs.define(eq=False)
class _Stream:
    send: trio.MemorySendChannel[dict[str, Any]]
    receive: trio.MemoryReceiveChannel[dict[str, Any]]
    overflowed: bool = False


class Hub:
    """One watch of everything, fanned out to the open pages as small events: which conversations and runs a commit
    touched (the page reads what it shows again), the pieces of partial output (appended as they stream), and
    whether the owner answers (``owner``, from :class:`OwnerLink`)."""

    def __init__(self) -> None:
        self._streams: set[_Stream] = set()
        self._runs: dict[str, tuple[int, int, RunRecord]] = {}
        """The :data:`MAX_LISTED` newest runs, as the watch last showed each, keyed for their order: when the owner
        created them (``created_at_ms``), then the order they were first seen here (the owner lists and logs runs in
        creation order; a run's id does not sort by time: a subagent's is derived). The overview reads them here,
        not from the owner on each change (that read grew with every run stored)."""
        self._seen = 0

    @property
    def newest_runs(self) -> list[RunRecord]:
        """The newest runs, newest first."""
        return [run for _, _, run in sorted(self._runs.values(), key=lambda kept: kept[:2], reverse=True)]

    def remember(self, run: RunRecord) -> None:
        """Keep ``run`` if it is among the newest (a later state of one replaces an earlier, never the reverse)."""
        known = self._runs.get(run.run_id)
        if known is not None:
            if known[2].seq <= run.seq:
                self._runs[run.run_id] = (known[0], known[1], run)
            return
        self._seen += 1
        self._runs[run.run_id] = (run.created_at_ms, self._seen, run)
        if len(self._runs) > MAX_LISTED:
            oldest = min(self._runs, key=lambda run_id: self._runs[run_id][:2])
            del self._runs[oldest]

    def open(self) -> _Stream | None:
        if len(self._streams) >= MAX_STREAMS:
            return None
        send, receive = trio.open_memory_channel[dict[str, Any]](MAX_QUEUED_EVENTS)
        stream = _Stream(send, receive)
        self._streams.add(stream)
        return stream

    def close(self, stream: _Stream) -> None:
        self._streams.discard(stream)
        stream.send.close()

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    async def run(
        self, client: actors.Client, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Read the newest runs once, then follow every commit from before that read (nothing falls between); the
        client's watch resumes by itself after a reconnection, with no gap."""
        head = (await client.ping()).head_seq
        async for run in client.iter_runs():
            self.remember(run)
        async with client.watch(from_seq=head) as changes:
            task_status.started()
            async for change in changes:
                for record in change.records:
                    if isinstance(record, RunRecord):
                        self.remember(record)
                for event in events_of(change):
                    self.publish(event)

    def publish(self, event: dict[str, Any]) -> None:
        for stream in list(self._streams):
            try:
                stream.send.send_nowait(event)
            except trio.WouldBlock:
                stream.overflowed = True  # the page reads everything again once it has caught up
            except trio.BrokenResourceError:
                self._streams.discard(stream)


def events_of(change: Change) -> list[dict[str, Any]]:
    """What the pages need of one commit: the pieces of partial output, then one ``change`` event naming the
    conversations and runs it touched."""
    conversations: set[str] = set()
    runs: set[str] = set()
    events: list[dict[str, Any]] = []
    for record in change.records:
        conversation_id = getattr(record, "conversation_id", None)
        if isinstance(conversation_id, str):
            conversations.add(conversation_id)
        run_id = getattr(record, "run_id", None)
        if isinstance(run_id, str):
            runs.add(run_id)
        if isinstance(record, PartialRecord):
            events.append(
                {
                    "type": "partial",
                    "operation_id": record.operation_id,
                    "conversation_id": record.conversation_id,
                    "run_id": record.run_id,
                    "attempt": record.attempt,
                    "offset": record.offset,
                    "text": record.text,
                    "status": record.status,
                }
            )
    events.append({"type": "change", "seq": change.seq, "conversations": sorted(conversations), "runs": sorted(runs)})
    return events


class Refused(Exception):
    """A read or an action the API refuses, nothing done: its HTTP status, its code (an :class:`ErrorCode` value)
    and what happened, in words. Answered as ``{"error": {"code", "message"}}``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}


def refusal_of(exc: TetherError) -> Refused:
    """The API's answer to an error of the client: the owner's refusal with its own code (and a status that says
    the same), or ``owner_unavailable`` when no owner answered. Never the exception's class name."""
    if isinstance(exc, OwnerUnavailable | ConnectionLost):
        code: str = ErrorCode.OWNER_UNAVAILABLE
    elif isinstance(exc, StorageError):
        code = ErrorCode.STORAGE_FAILED
    elif isinstance(exc, UsageError):  # the client refused the call before sending it (a value it cannot send)
        code = ErrorCode.INVALID
    else:  # a refusal of the owner (RequestFailed), a frame it could not read (ProtocolError), a refused hello
        code = str(getattr(exc, "code", ErrorCode.PROTOCOL_VIOLATION))  # (every other error of a client has one)
    return Refused(STATUS_OF_CODE.get(code, 502), code, str(exc))


async def bounded(call: Awaitable[Any], *, action: bool) -> Any:
    """Await ``call`` (a read or an action of the client) for at most :data:`REQUEST_TIMEOUT_S`; its errors as
    :class:`Refused`."""
    try:
        with trio.fail_after(REQUEST_TIMEOUT_S):
            return await call
    except trio.TooSlowError:
        kept = (
            "the action may or may not have been applied: look at it again before you repeat it"
            if action
            else "nothing was changed; the page reads again at the next change"
        )
        message = f"the owner did not answer within {REQUEST_TIMEOUT_S:g} s; {kept}"
        raise Refused(504, ErrorCode.OWNER_UNAVAILABLE, message) from None
    except TetherError as exc:
        raise refusal_of(exc) from exc


class OwnerLink:
    """The ui's connection to the database's owner, which may not run yet, or stop and come back: the page is
    served either way.

    1. Until an owner answers, and from the first failed attempt to reach it again after its connection dropped,
       :meth:`client` refuses at once (``owner_unavailable``, saying how to start it): no read or action waits.
    2. Each change (it answers, it stopped answering) is pushed to the pages as an ``owner`` event: a page says
       that no owner runs, and reads again once one does.
    3. The client reconnects by itself (its watch resumes with no gap); a connection that failed for good (a
       refused hello) is given up, and a new one opened :data:`RELINK_S` later.
    """

    def __init__(self, db: str, hub: Hub) -> None:
        self.db = db
        self.hub = hub
        self.up = False
        self.why = "not connected to the owner yet"
        """What the last attempt to reach the owner met, while it does not answer."""
        self.known = trio.Event()
        """Set once the first attempt to reach the owner succeeded or failed."""
        self._client: actors.Client | None = None

    def status(self) -> dict[str, Any]:
        """What the pages are told (the ``hello`` and ``owner`` events): whether the owner answers, and if not, why
        and what to do."""
        if self.up:
            return {"up": True, "db": self.db, "why": "", "message": ""}
        return {"up": False, "db": self.db, "why": self.why, "message": self.unavailable()}

    def unavailable(self) -> str:
        return (
            f"no owner answers for {self.db} ({self.why}): start it with `tether up --db {self.db}` (or `tether "
            f"owner --db {self.db}`), and this page reconnects by itself; nothing was done"
        )

    def client(self) -> actors.Client:
        """The client, while the owner answers; else :class:`Refused` (503, ``owner_unavailable``) at once."""
        if not self.up or self._client is None:
            raise Refused(503, ErrorCode.OWNER_UNAVAILABLE, self.unavailable())
        return self._client

    def _set(self, up: bool, why: str | None = None) -> None:
        changed = up != self.up or not self.known.is_set()
        self.up = up
        if why is not None:
            self.why = why
        self.known.set()
        if changed:
            self.hub.publish({"type": "owner", **self.status()})

    def _attempted(self, error: TetherError | None, backoff_s: float) -> None:
        """The client's report of an attempt to reach the owner (see ``actors.connect(on_attempt=...)``)."""
        if error is not None:
            written = runtime_path(self.db)  # a running owner writes it; without it the error says no more
            self._set(False, str(error) if written.exists() else f"no owner is running: {written} does not exist")
        elif self._client is not None:  # back after failed attempts (the first connection is up once followed)
            self._set(True)

    async def run(self) -> None:
        """Connect, follow the owner with the hub, and connect anew whenever that fails; until cancelled."""
        while True:
            try:
                async with actors.connect(
                    db=self.db,
                    name="tether-ui",
                    wait_for_owner_s=math.inf,
                    reconnect_timeout_s=OWNER_WAIT_S,
                    on_attempt=self._attempted,
                ) as client:
                    await self._follow(client)
                why = "the connection to the owner ended"
            except* TetherError as group:
                why = str(group.exceptions[0])
            self._client = None
            self._set(False, why)
            await trio.sleep(RELINK_S)

    async def _follow(self, client: actors.Client) -> None:
        """Run the hub on ``client`` until its connection failed for good; raise why."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.hub.run, client)
            self._client = client
            self._set(True)
            while client.connection.can_reconnect():  # noqa: ASYNC110 (the connection has no event for it)
                await trio.sleep(RELINK_S)
            await client.ping()  # raises why the connection failed for good
            nursery.cancel_scope.cancel(reason="the connection to the owner ended")


def _text(body: dict[str, Any], name: str, *, optional: bool = False) -> str | None:
    value = body.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise Refused(400, ErrorCode.INVALID, f"{name} is a non-empty string; nothing was done")
    return value


class Actions:
    """What a page may do, each one typed call of the client; a refusal of the owner comes back in its words."""

    def __init__(self, link: OwnerLink) -> None:
        self._link = link
        self.table: dict[str, Callable[[dict[str, Any]], Awaitable[Any]]] = {
            "respond": self.respond,
            "resolve": self.resolve,
            "retry": self.retry,
            "cancel": self.cancel,
            "submit": self.submit,
            "withdraw": self.withdraw,
        }

    async def respond(self, body: dict[str, Any]) -> Any:
        interaction_id = _text(body, "interaction_id")
        assert interaction_id is not None
        if "answer" in body:
            record = await self._link.client().respond(interaction_id, answer=body["answer"], responded_by="tether ui")
        else:
            approve = body.get("approve")
            if type(approve) is not bool:
                message = "respond takes approve (true or false) or answer (a JSON value); nothing was done"
                raise Refused(400, ErrorCode.INVALID, message)
            note = _text(body, "note", optional=True)
            record = await self._link.client().respond(
                interaction_id, approve=approve, note=note, responded_by="tether ui"
            )
        return _record(record)

    async def resolve(self, body: dict[str, Any]) -> Any:
        operation_id = _text(body, "operation_id")
        assert operation_id is not None
        if "output" not in body:
            message = "resolve takes output: what the model reads as the call's result (JSON); nothing was done"
            raise Refused(400, ErrorCode.INVALID, message)
        return _record(await self._link.client().resolve(operation_id, body["output"], resolved_by="tether ui"))

    async def retry(self, body: dict[str, Any]) -> Any:
        run_id = _text(body, "run_id")
        assert run_id is not None
        return _record(await self._link.client().retry(run_id))

    async def cancel(self, body: dict[str, Any]) -> Any:
        run_id = _text(body, "run_id")
        assert run_id is not None
        return _record(await self._link.client().cancel_run(run_id))

    async def submit(self, body: dict[str, Any]) -> Any:
        conversation_id, text = _text(body, "conversation_id"), _text(body, "text")
        assert conversation_id is not None and text is not None
        when_busy = body.get("when_busy", "follow_up")
        if when_busy not in ("follow_up", "steer"):
            raise Refused(400, ErrorCode.INVALID, "when_busy is follow_up or steer; nothing was done")
        record = await self._link.client().submit(conversation_id, kind="input", payload=text, when_busy=when_busy)
        return _record(record)

    async def withdraw(self, body: dict[str, Any]) -> Any:
        submission_id = _text(body, "submission_id")
        assert submission_id is not None
        return {"outcome": await self._link.client().withdraw(submission_id)}


class Reads:
    """What a page shows, each read bounded (:data:`MAX_LISTED`, the newest)."""

    def __init__(self, link: OwnerLink) -> None:
        self._link = link

    async def overview(self) -> dict[str, Any]:
        client = self._link.client()
        runs = self._link.hub.newest_runs
        interactions = await client.interactions(status="open")
        blocked = [  # what a person resolves: the tool, its attempt and its arguments
            await client.operation(run.operation_id)
            for run in runs
            if run.status == "needs_attention" and run.operation_id is not None
        ]
        return {
            "runs": [_record(run) for run in runs],
            "interactions": [_record(one) for one in interactions[:MAX_LISTED]],
            "operations": [_record(op) for op in blocked],
        }

    async def conversation(self, conversation_id: str) -> dict[str, Any]:
        client = self._link.client()
        conversation = await client.conversation(conversation_id)
        page = await client.read_entries(conversation_id, order="desc", limit=MAX_LISTED)
        entries: list[EntryRecord] = page.entries[::-1]
        runs: deque[RunRecord] = deque(maxlen=MAX_LISTED)
        async for run in client.iter_runs(conversation_id=conversation_id):
            runs.append(run)
        submissions: list[SubmissionRecord] = await client.submissions(conversation_id)
        active = next((run for run in runs if run.status in RUN_ACTIVE), None)
        partials, pending, asking = None, [], []
        if active is not None:  # what it does now: its output streaming, its tool calls unfinished, its questions
            partials = await client.partials(run_id=active.run_id)
            pending = [op for op in await client.operations(active.run_id) if _unfinished_call(op)]
            asking = await client.interactions(status="open", run_id=active.run_id)
        return {
            "conversation": _record(conversation),
            "entries": [_record(entry) for entry in entries],
            "earlier": page.next_cursor is not None,
            "runs": [_record(run) for run in runs],
            "submissions": [_record(one) for one in submissions[-MAX_LISTED:]],
            "partials": [] if partials is None else [_record(one) for one in partials.partials],
            "operations": [_record(op) for op in pending[-MAX_LISTED:]],
            "interactions": [_record(one) for one in asking[-MAX_LISTED:]],
        }

    async def run(self, run_id: str) -> dict[str, Any]:
        client = self._link.client()
        run = await client.run(run_id)
        operations: list[OperationRecord] = await client.operations(run_id)
        interactions: list[InteractionRecord] = await client.interactions(status=None, run_id=run_id)
        return {
            "run": _record(run),
            "operations": [_record(op) for op in operations[-MAX_LISTED:]],
            "interactions": [_record(one) for one in interactions[-MAX_LISTED:]],
        }

    async def tasks(self) -> dict[str, Any]:
        from ._tasks import render_tree

        graph = await self._link.client().task_graph()
        return {"seq": graph.seq, "count": len(graph.nodes), "lines": render_tree(graph.nodes)[: MAX_LISTED * 2]}

    async def usage(self) -> dict[str, Any]:
        client = self._link.client()
        totals: dict[str, Any] = {}
        for scope in ("model", "tool", "conversation"):
            found, _ = await client.usage_totals(scope)
            totals[scope] = [_record(total) for total in found[:MAX_LISTED]]
        return totals


def _unfinished_call(op: OperationRecord) -> bool:
    """A tool call that has no result yet: running (``started``), or cut off and waiting to be resolved."""
    return op.kind == "tool" and op.status in ("started", "interrupted")


@attrs.frozen
class Login:
    """The login token ``tether ui`` prints, the session cookie's value derived from it, and the page's
    anti-forgery value."""

    token: str
    session: str
    csrf: str

    @staticmethod
    def new(token: str | None = None) -> Login:
        token = token or secrets.token_urlsafe(24)
        session = hashlib.sha256(f"tether-ui-session/{token}".encode()).hexdigest()
        csrf = hashlib.sha256(f"tether-ui-csrf/{token}".encode()).hexdigest()
        return Login(token, session, csrf)

    def admits(self, cookie: str | None, authorization: str | None) -> bool:
        if cookie is not None and hmac.compare_digest(cookie, self.session):
            return True
        bearer = (authorization or "").removeprefix("Bearer ").strip()
        return bool(bearer) and hmac.compare_digest(bearer, self.token)


LOGIN_REFUSED: Final = (
    "open the URL tether ui printed (it carries the login token), or send Authorization: Bearer TOKEN; nothing is "
    "shown or done without it"
)


def error_response(path: str, refused: Refused) -> Any:
    """A refusal as the API answers it (``{"error": {"code", "message"}}``), or as plain text for a person who
    opened another address than the API's."""
    from starlette.responses import JSONResponse, PlainTextResponse

    headers = {"Cache-Control": "no-store"}
    if refused.status == 413:
        # Refused before its body was read whole: the server closes this connection, so the client must not send
        # its next request on it (it would find it closed, without an answer).
        headers["Connection"] = "close"
    if path.startswith("/api/"):
        return JSONResponse(refused.body(), status_code=refused.status, headers=headers)
    return PlainTextResponse(f"tether ui: {refused.message}", status_code=refused.status)


class LoginRequired:
    """The login, checked once for every request whatever it asks for (a route added later included), before any
    route sees it (ASGI middleware):

    1. ``?token=TOKEN`` on any address opens the session: a 303 to that address without it, setting the session
       cookie (``HttpOnly``, ``SameSite=Strict``, ``Secure`` over TLS); another token is refused.
    2. Otherwise the session cookie, or ``Authorization: Bearer TOKEN`` (scripts), is needed.
    3. Refused: 401, ``bad_token``, nothing shown or done (a WebSocket is closed before it is accepted).
    """

    def __init__(self, app: ASGIApp, login: Login, secure: bool) -> None:
        self.app = app
        self.login = login
        self.secure = secure

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        from starlette.requests import HTTPConnection
        from starlette.responses import RedirectResponse

        request = HTTPConnection(scope)
        token = request.query_params.get("token")
        admitted = token is None and self.login.admits(
            request.cookies.get(SESSION_COOKIE), request.headers.get("authorization")
        )
        if admitted:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        elif token is not None and hmac.compare_digest(token, self.login.token):
            response = RedirectResponse(request.url.path, status_code=303)
            response.set_cookie(
                SESSION_COOKIE, self.login.session, httponly=True, samesite="strict", secure=self.secure, path="/"
            )
            await response(scope, receive, send)
        else:
            refused = Refused(401, ErrorCode.BAD_TOKEN, LOGIN_REFUSED)
            await error_response(request.url.path, refused)(scope, receive, send)


FAVICON: Final = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><rect width="32" height="32" rx="6" '
    'fill="#2b59c3"/><path d="M8 9h16v4h-6v12h-4V13H8z" fill="#fff"/></svg>'
)
"""The page's icon (``/favicon.ico``, as an SVG): a T."""


def build_app(link: OwnerLink, login: Login, *, secure: bool = False) -> Any:
    """The ASGI application (Starlette): the page, its reads, its actions and its event stream, every route behind
    :class:`LoginRequired`. ``secure``: served over TLS (the session cookie is then ``Secure``, and the origin
    actions must come from is ``https``)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    reads = Reads(link)
    actions = Actions(link)
    hub = link.hub
    page = (PAGE_DIR / "index.html").read_text(encoding="utf-8").replace("{{CSRF}}", login.csrf)

    async def index(request: Request) -> Response:
        return HTMLResponse(page, headers={"Cache-Control": "no-store", "X-Frame-Options": "DENY"})

    async def favicon(request: Request) -> Response:
        return Response(FAVICON, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ("app.js", "style.css"):
            raise Refused(404, ErrorCode.NOT_FOUND, f"no asset {name!r}")
        return FileResponse(PAGE_DIR / name, headers={"Cache-Control": "no-store"})

    def read_route(function: Callable[..., Awaitable[Any]], *names: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            found = await bounded(function(*(request.path_params[name] for name in names)), action=False)
            return JSONResponse(found, headers={"Cache-Control": "no-store"})

        return endpoint

    async def act(request: Request) -> Response:
        sent_origin = request.headers.get("origin")
        origin = f"{'https' if secure else 'http'}://{request.headers.get('host', '')}"
        csrf = request.headers.get(CSRF_HEADER, "")
        if (sent_origin is not None and sent_origin != origin) or not hmac.compare_digest(csrf, login.csrf):
            message = "refused: not sent by this server's page (origin or anti-forgery value); nothing was done"
            raise Refused(403, ErrorCode.NOT_ALLOWED, message)
        name = request.path_params["name"]
        action = actions.table.get(name)
        if action is None:
            raise Refused(404, ErrorCode.NOT_FOUND, f"no action {name!r} (there are {', '.join(actions.table)})")
        body = await _body(request)
        return JSONResponse(await bounded(action(body), action=True))

    async def events(request: Request) -> Response:
        stream = hub.open()
        if stream is None:
            raise Refused(503, ErrorCode.OVERLOADED, f"too many open pages (at most {MAX_STREAMS}); close one")

        async def body() -> AsyncIterator[str]:
            try:
                yield f"event: hello\ndata: {json.dumps(link.status())}\n\n"
                while True:
                    event: dict[str, Any] | None = None
                    with trio.move_on_after(15):  # (never held across a yield: the consumer is another task)
                        try:
                            event = await stream.receive.receive()
                        except trio.EndOfChannel:
                            return
                    if event is None:
                        yield ": keep-alive\n\n"
                        continue
                    if stream.overflowed:
                        stream.overflowed = False
                        while True:  # what was queued is stale: read everything again
                            try:
                                stream.receive.receive_nowait()
                            except (trio.WouldBlock, trio.EndOfChannel):
                                break
                        event = {"type": "resync"}
                    yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
            finally:
                hub.close(stream)

        return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})

    async def refused(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Refused)
        response: Response = error_response(request.url.path, exc)
        return response

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.NOT_ALLOWED}.get(exc.status_code, ErrorCode.INVALID)
        response: Response = error_response(request.url.path, Refused(exc.status_code, code, str(exc.detail)))
        return response

    routes = [
        Route("/", index),
        Route("/favicon.ico", favicon),
        Route("/assets/{name}", asset),
        Route("/api/overview", read_route(reads.overview)),
        Route("/api/conversations/{conversation_id}", read_route(reads.conversation, "conversation_id")),
        Route("/api/runs/{run_id}", read_route(reads.run, "run_id")),
        Route("/api/tasks", read_route(reads.tasks)),
        Route("/api/usage", read_route(reads.usage)),
        Route("/api/events", events),
        Route("/api/actions/{name}", act, methods=["POST"]),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(LoginRequired, login=login, secure=secure)],
        exception_handlers={Refused: refused, HTTPException: http_error},
    )


async def _body(request: Any) -> dict[str, Any]:
    size = 0
    chunks: list[bytes] = []
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise Refused(
                413, ErrorCode.FRAME_TOO_LARGE, f"an action is at most {MAX_BODY_BYTES} bytes; nothing was done"
            )
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks) or b"{}")
    except ValueError as exc:
        raise Refused(400, ErrorCode.INVALID, f"the action's body is not JSON ({exc}); nothing was done") from None
    if not isinstance(body, dict):
        raise Refused(400, ErrorCode.INVALID, "the action's body is a JSON object; nothing was done")
    return body


def database_problem(db: str) -> str | None:
    """Why ``tether ui --db DB`` cannot serve ``DB`` at all (no such file: a mistyped path), said at once and
    nothing started; ``None`` if it can. A database whose owner does not run yet is served: the page says so."""
    if os.path.isfile(db):
        return None
    what = "is not a file" if os.path.exists(db) else "does not exist"
    return (
        f"{db} {what}: there is no database to show. Pass --db the path of a Tether database, or start its owner "
        f"first (`tether up --db {db}` creates it); nothing was started"
    )


async def serve_ui(
    db: str,
    host: str,
    port: int,
    *,
    say: Callable[[str], None],
    token: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the page until cancelled (over TLS with ``tls_cert`` and ``tls_key``); ``say`` gets the URL to open
    first (its login token in it). Where it may listen is the caller's to check (``tether ui``: loopback, or TLS).

    Raises :class:`~protocol.UsageError` at once, nothing started, if ``db`` is not a file
    (:func:`database_problem`). An owner that does not run is no error: the page says so until one answers."""
    problem = database_problem(db)
    if problem is not None:
        raise UsageError(problem)
    from hypercorn.config import Config
    from hypercorn.trio import serve

    login = Login.new(token)
    link = OwnerLink(db, Hub())
    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = "-"  # a failure inside a request is printed to stderr, with its traceback
    config.loglevel = "WARNING"
    config.graceful_timeout = 1
    if tls_cert is not None:
        config.certfile, config.keyfile = tls_cert, tls_key
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run)
        with trio.move_on_after(FIRST_LINK_S):
            await link.known.wait()
        bound: list[str] = await nursery.start(
            lambda task_status: serve(
                build_app(link, login, secure=tls_cert is not None), config, task_status=task_status
            )
        )
        address = bound[0]
        url = f"{address}/?token={login.token}"
        say(url)
        task_status.started(url)
        await trio.sleep(math.inf)

"""``tether ui``: a web page to operate a database's agents, served under trio by Hypercorn with Starlette.

The server is a client of the owner like any script (``actors.connect``): every page and action is a typed call of
the client, every update comes from one watch of everything (:class:`Hub`), pushed to the pages as server-sent
events. The page itself is plain HTML, CSS and one small script (``runtime/_ui_page``): no build step.

Security (docs/ui.md):

- It listens on loopback unless told otherwise, and then only over TLS (``--tls-cert``, ``--tls-key``), or with
  ``--insecure-listen``: the owner's rules.
- Every page, read and action needs the login token ``tether ui`` prints in its URL (as Jupyter does): the URL's
  ``?token=`` sets an HttpOnly, ``SameSite=Strict`` session cookie; ``Authorization: Bearer TOKEN`` works for scripts.
- Actions are POSTs of JSON that carry the page's anti-forgery value (``X-Tether-CSRF``, from the page's own HTML)
  and, when the browser sends one, an ``Origin`` naming the host the request was sent to: a cross-site page can
  neither read nor act.
- What a page may ask is bounded as for any client: request bodies at :data:`MAX_BODY_BYTES`, event streams at
  :data:`MAX_STREAMS`, each stream's unsent events at :data:`MAX_QUEUED_EVENTS` (past it the stream is told to read
  again, and starts afresh), pages of lists at :data:`MAX_LISTED`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import secrets
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import attrs
import trio

import actors
from protocol import (
    Change,
    EntryRecord,
    InteractionRecord,
    OperationRecord,
    PartialRecord,
    RunRecord,
    SubmissionRecord,
    TetherError,
    converter,
)

PAGE_DIR: Final = Path(__file__).with_name("_ui_page")
MAX_BODY_BYTES: Final = 1 << 20
"""The largest action a page may send."""
MAX_STREAMS: Final = 64
"""Event streams (open pages) served at once; one more is refused (503)."""
MAX_QUEUED_EVENTS: Final = 1000
"""Events waiting for one slow page; past it the page is told to read everything again."""
MAX_LISTED: Final = 500
"""The most runs, entries or tasks one read returns (the newest)."""
SESSION_COOKIE: Final = "tether_ui"
CSRF_HEADER: Final = "x-tether-csrf"


def _record(record: Any) -> Any:
    return converter.unstructure(record)


@attrs.define(eq=False)
class _Stream:
    send: trio.MemorySendChannel[dict[str, Any]]
    receive: trio.MemoryReceiveChannel[dict[str, Any]]
    overflowed: bool = False


class Hub:
    """One watch of everything, fanned out to the open pages as small events: which conversations and runs a commit
    touched (the page reads what it shows again) and the pieces of partial output (appended as they stream)."""

    def __init__(self, client: actors.Client) -> None:
        self._client = client
        self._streams: set[_Stream] = set()
        self._runs: dict[str, RunRecord] = {}
        """The :data:`MAX_LISTED` newest runs (by id: UUIDv7, so by creation), as the watch last showed each: the
        overview reads them here, not from the owner on each change (that read grew with every run stored)."""

    @property
    def newest_runs(self) -> list[RunRecord]:
        """The newest runs, newest first."""
        return sorted(self._runs.values(), key=lambda run: run.run_id, reverse=True)

    def remember(self, run: RunRecord) -> None:
        """Keep ``run`` if it is among the newest (a later state of one replaces an earlier, never the reverse)."""
        known = self._runs.get(run.run_id)
        if known is not None and known.seq > run.seq:
            return
        self._runs[run.run_id] = run
        if len(self._runs) > MAX_LISTED:
            del self._runs[min(self._runs)]

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

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read the newest runs once, then follow every commit from before that read (nothing falls between)."""
        head = (await self._client.ping()).head_seq
        async for run in self._client.iter_runs():
            self.remember(run)
        async with self._client.watch(from_seq=head) as changes:
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
    """An action the page asked for that was refused: its status and what was wrong (nothing changed)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _text(body: dict[str, Any], name: str, *, optional: bool = False) -> str | None:
    value = body.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise Refused(400, f"{name} is a non-empty string")
    return value


class Actions:
    """What a page may do, each one typed call of the client; a refusal of the owner comes back in its words."""

    def __init__(self, client: actors.Client) -> None:
        self._client = client
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
            record = await self._client.respond(interaction_id, answer=body["answer"], responded_by="tether ui")
        else:
            approve = body.get("approve")
            if type(approve) is not bool:
                raise Refused(400, "respond takes approve (true or false) or answer (a JSON value)")
            note = _text(body, "note", optional=True)
            record = await self._client.respond(interaction_id, approve=approve, note=note, responded_by="tether ui")
        return _record(record)

    async def resolve(self, body: dict[str, Any]) -> Any:
        operation_id = _text(body, "operation_id")
        assert operation_id is not None
        if "output" not in body:
            raise Refused(400, "resolve takes output: what the model reads as the call's result (JSON)")
        return _record(await self._client.resolve(operation_id, body["output"], resolved_by="tether ui"))

    async def retry(self, body: dict[str, Any]) -> Any:
        run_id = _text(body, "run_id")
        assert run_id is not None
        return _record(await self._client.retry(run_id))

    async def cancel(self, body: dict[str, Any]) -> Any:
        run_id = _text(body, "run_id")
        assert run_id is not None
        return _record(await self._client.cancel_run(run_id))

    async def submit(self, body: dict[str, Any]) -> Any:
        conversation_id, text = _text(body, "conversation_id"), _text(body, "text")
        assert conversation_id is not None and text is not None
        when_busy = body.get("when_busy", "follow_up")
        if when_busy not in ("follow_up", "steer"):
            raise Refused(400, "when_busy is follow_up or steer")
        record = await self._client.submit(conversation_id, kind="input", payload=text, when_busy=when_busy)
        return _record(record)

    async def withdraw(self, body: dict[str, Any]) -> Any:
        submission_id = _text(body, "submission_id")
        assert submission_id is not None
        return {"outcome": await self._client.withdraw(submission_id)}


class Reads:
    """What a page shows, each read bounded (:data:`MAX_LISTED`, the newest)."""

    def __init__(self, client: actors.Client, hub: Hub) -> None:
        self._client = client
        self._hub = hub

    async def overview(self) -> dict[str, Any]:
        runs = self._hub.newest_runs
        interactions = await self._client.interactions(status="open")
        return {
            "runs": [_record(run) for run in runs],
            "interactions": [_record(one) for one in interactions[:MAX_LISTED]],
        }

    async def conversation(self, conversation_id: str) -> dict[str, Any]:
        conversation = await self._client.conversation(conversation_id)
        page = await self._client.read_entries(conversation_id, order="desc", limit=MAX_LISTED)
        entries: list[EntryRecord] = page.entries[::-1]
        runs: deque[RunRecord] = deque(maxlen=MAX_LISTED)
        async for run in self._client.iter_runs(conversation_id=conversation_id):
            runs.append(run)
        submissions: list[SubmissionRecord] = await self._client.submissions(conversation_id)
        live = [run for run in runs if run.status not in ("completed", "failed", "cancelled")]
        partials = await self._client.partials(run_id=live[-1].run_id) if live else None
        return {
            "conversation": _record(conversation),
            "entries": [_record(entry) for entry in entries],
            "earlier": page.next_cursor is not None,
            "runs": [_record(run) for run in runs],
            "submissions": [_record(one) for one in submissions[-MAX_LISTED:]],
            "partials": [] if partials is None else [_record(one) for one in partials.partials],
        }

    async def run(self, run_id: str) -> dict[str, Any]:
        run = await self._client.run(run_id)
        operations: list[OperationRecord] = await self._client.operations(run_id)
        interactions: list[InteractionRecord] = await self._client.interactions(status=None, run_id=run_id)
        return {
            "run": _record(run),
            "operations": [_record(op) for op in operations[-MAX_LISTED:]],
            "interactions": [_record(one) for one in interactions[-MAX_LISTED:]],
        }

    async def tasks(self) -> dict[str, Any]:
        from ._tasks import render_tree

        graph = await self._client.task_graph()
        return {"seq": graph.seq, "count": len(graph.nodes), "lines": render_tree(graph.nodes)[: MAX_LISTED * 2]}

    async def usage(self) -> dict[str, Any]:
        totals: dict[str, Any] = {}
        for scope in ("model", "tool", "conversation"):
            found, _ = await self._client.usage_totals(scope)
            totals[scope] = [_record(total) for total in found[:MAX_LISTED]]
        return totals


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


def build_app(client: actors.Client, hub: Hub, login: Login, *, secure: bool = False) -> Any:
    """The ASGI application (Starlette): the page, its reads, its actions and its event stream. ``secure``: served
    over TLS (the session cookie is then ``Secure``, and the origin actions must come from is ``https``)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import (
        FileResponse,
        HTMLResponse,
        JSONResponse,
        PlainTextResponse,
        RedirectResponse,
        Response,
        StreamingResponse,
    )
    from starlette.routing import Route

    reads = Reads(client, hub)
    actions = Actions(client)
    page = (PAGE_DIR / "index.html").read_text(encoding="utf-8").replace("{{CSRF}}", login.csrf)

    def admitted(request: Request) -> bool:
        return login.admits(request.cookies.get(SESSION_COOKIE), request.headers.get("authorization"))

    def denied() -> Response:
        return PlainTextResponse(
            "tether ui: open the URL tether ui printed (it carries the login token); nothing is shown without it",
            status_code=401,
        )

    async def index(request: Request) -> Response:
        token = request.query_params.get("token")
        if token is not None:
            if not hmac.compare_digest(token, login.token):
                return denied()
            response = RedirectResponse("/", status_code=303)
            response.set_cookie(
                SESSION_COOKIE, login.session, httponly=True, samesite="strict", secure=secure, path="/"
            )
            return response
        if not admitted(request):
            return denied()
        return HTMLResponse(page, headers={"Cache-Control": "no-store", "X-Frame-Options": "DENY"})

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ("app.js", "style.css") or not admitted(request):
            return denied() if name in ("app.js", "style.css") else PlainTextResponse("not found", status_code=404)
        return FileResponse(PAGE_DIR / name, headers={"Cache-Control": "no-store"})

    def read_route(function: Callable[..., Awaitable[Any]], *names: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if not admitted(request):
                return denied()
            try:
                found = await function(*(request.path_params[name] for name in names))
            except TetherError as exc:
                return JSONResponse({"error": str(exc), "kind": type(exc).__name__}, status_code=_status_of(exc))
            return JSONResponse(found, headers={"Cache-Control": "no-store"})

        return endpoint

    async def act(request: Request) -> Response:
        if not admitted(request):
            return denied()
        sent_origin = request.headers.get("origin")
        origin = f"{'https' if secure else 'http'}://{request.headers.get('host', '')}"
        csrf = request.headers.get(CSRF_HEADER, "")
        if (sent_origin is not None and sent_origin != origin) or not hmac.compare_digest(csrf, login.csrf):
            return JSONResponse(
                {"error": "refused: not sent by this server's page (origin or anti-forgery value)"}, 403
            )
        action = actions.table.get(request.path_params["name"])
        if action is None:
            return JSONResponse({"error": f"no action {request.path_params['name']!r}"}, status_code=404)
        try:
            body = await _body(request)
            return JSONResponse(await action(body))
        except Refused as exc:
            return JSONResponse({"error": exc.message}, status_code=exc.status)
        except TetherError as exc:
            return JSONResponse({"error": str(exc), "kind": type(exc).__name__}, status_code=_status_of(exc))

    async def events(request: Request) -> Response:
        if not admitted(request):
            return denied()
        stream = hub.open()
        if stream is None:
            return PlainTextResponse(f"too many open pages (at most {MAX_STREAMS})", status_code=503)

        async def body() -> AsyncIterator[str]:
            try:
                yield "event: hello\ndata: {}\n\n"
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

    routes = [
        Route("/", index),
        Route("/assets/{name}", asset),
        Route("/api/overview", read_route(reads.overview)),
        Route("/api/conversations/{conversation_id}", read_route(reads.conversation, "conversation_id")),
        Route("/api/runs/{run_id}", read_route(reads.run, "run_id")),
        Route("/api/tasks", read_route(reads.tasks)),
        Route("/api/usage", read_route(reads.usage)),
        Route("/api/events", events),
        Route("/api/actions/{name}", act, methods=["POST"]),
    ]
    return Starlette(routes=routes)


async def _body(request: Any) -> dict[str, Any]:
    size = 0
    chunks: list[bytes] = []
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise Refused(413, f"an action is at most {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks) or b"{}")
    except ValueError as exc:
        raise Refused(400, f"the action's body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise Refused(400, "the action's body is a JSON object")
    return body


def _status_of(exc: TetherError) -> int:
    code = getattr(exc, "code", None)
    return {"not_found": 404, "conflict": 409, "invalid": 400, "not_allowed": 403}.get(str(code), 502)


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
    first (its login token in it). Where it may listen is the caller's to check (``tether ui``: loopback, or TLS)."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    login = Login.new(token)
    async with actors.connect(db=db, name="tether-ui", wait_for_owner_s=10) as client:
        hub = Hub(client)
        config = Config()
        config.bind = [f"{host}:{port}"]
        config.accesslog = None
        config.errorlog = "-"  # a failure inside a request is printed to stderr, with its traceback
        config.loglevel = "WARNING"
        config.graceful_timeout = 1
        if tls_cert is not None:
            config.certfile, config.keyfile = tls_cert, tls_key
        async with trio.open_nursery() as nursery:
            await nursery.start(hub.run)
            bound: list[str] = await nursery.start(
                lambda task_status: serve(
                    build_app(client, hub, login, secure=tls_cert is not None), config, task_status=task_status
                )
            )
            address = bound[0]
            url = f"{address}/?token={login.token}"
            say(url)
            task_status.started(url)
            await trio.sleep(math.inf)

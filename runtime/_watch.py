"""``tether watch``: follow a database's commits as they land: a live terminal view, plain lines, or JSON lines.

It reads what exists first (a watch from ``--from-seq``, 0 by default, replays the commit log), then follows the
watch live; the client's watch resubscribes from the last seq it delivered after the owner restarts, so nothing is
missed or shown twice. SIGINT (Ctrl-C) and SIGTERM end it with exit status 0 and the terminal as it was.
"""

from __future__ import annotations

import json
import signal
import sys
from typing import Any, Final, Literal, TextIO

import trio

import actors
from protocol import Change, NotFound, converter

from ._connect import check_db, connect
from ._watch_view import WatchView

REPAINT_S: Final = 0.1
"""The terminal view is drawn again at most this often (a busy stream is shown in steps, not character by
character); a trio-clock interval for the screen, not durable time."""
CONNECTION_POLL_S: Final = 0.5
"""How often the view checks whether the owner is reachable (to say so on screen) and the terminal's size."""

Mode = Literal["live", "plain", "json"]


def json_line(record: Any, seq: int) -> str:
    """One record as a JSON line: its fields, ``record`` (its kind: entry, run, operation, ...) and ``seq`` (of its
    commit)."""
    document = converter.unstructure(record)
    document["record"] = record.RECORD
    document["seq"] = seq
    return json.dumps(document, ensure_ascii=False)


async def watch(
    db: str,
    *,
    conversation_id: str | None,
    run_id: str | None,
    from_seq: int,
    mode: Mode,
    out: TextIO | None = None,
) -> int:
    """Follow the database ``db`` (as the person named it) until SIGINT or SIGTERM; return the exit status (0)."""
    stream = out or sys.stdout
    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            nursery.start_soon(_follow, db, conversation_id, run_id, from_seq, mode, stream, nursery.cancel_scope)
            async for _ in signals:
                nursery.cancel_scope.cancel(reason="SIGINT or SIGTERM")
                break
    return 0


async def _follow(
    db: str,
    conversation_id: str | None,
    run_id: str | None,
    from_seq: int,
    mode: Mode,
    out: TextIO,
    done: trio.CancelScope,
) -> None:
    path = check_db(db)
    async with connect(path, "tether-watch", role="reader") as client:
        view = WatchView(db, conversation_id=conversation_id, run_id=run_id)
        if run_id is not None:
            try:
                run = await client.run(run_id)
            except NotFound as exc:
                raise NotFound(exc.code, f"there is no run {run_id} in {path}; see tether runs --db {db}") from None
            conversation_id = run.conversation_id
            view.follow(run)  # its conversation and task, before the replay (from --from-seq) reaches them
        elif conversation_id is not None:
            try:
                await client.conversation(conversation_id)
            except NotFound as exc:
                message = f"there is no conversation {conversation_id} in {path}; see tether runs --db {db}"
                raise NotFound(exc.code, message) from None
        changes = client.watch(conversation_id=conversation_id, from_seq=from_seq)
        async with changes:
            if mode == "json":
                await _json(view, changes, out)
            elif mode == "plain":
                await _plain(view, changes, out)
            else:
                await _live(view, client, changes, out)
    done.cancel(reason="the watch ended")


async def _json(view: WatchView, changes: actors.WatchStream, out: TextIO) -> None:
    async for change in changes:
        _, records = view.fold(change.seq, change.records)
        if records:
            out.write("".join(json_line(record, change.seq) + "\n" for record in records))
            out.flush()


def plain_lines(view: WatchView, change: Change) -> str:
    """Fold one commit into ``view``; return what ``tether watch --plain`` prints for it (``""`` if nothing)."""
    return "".join(f"[{change.seq}] {line}\n" for line in view.apply(change.seq, change.records))


async def _plain(view: WatchView, changes: actors.WatchStream, out: TextIO) -> None:
    async for change in changes:
        text = plain_lines(view, change)
        if text:
            out.write(text)
            out.flush()


async def _live(view: WatchView, client: actors.Client, changes: actors.WatchStream, out: TextIO) -> None:
    from rich.console import Console
    from rich.live import Live

    from ._watch_render import render

    console = Console(file=out)
    dirty = trio.Event()
    connected = True

    async def fold() -> None:
        nonlocal dirty
        change: Change
        async for change in changes:
            view.apply(change.seq, change.records)
            dirty.set()

    async def check_terminal() -> None:
        """Say on screen when the owner is out of reach (and when it is back); redraw after a resize."""
        nonlocal connected
        size = console.size
        while True:
            await trio.sleep(CONNECTION_POLL_S)
            if client.connection.is_up != connected or console.size != size:
                connected = client.connection.is_up
                size = console.size
                dirty.set()

    with Live(
        render(view, console),
        console=console,
        auto_refresh=False,
        redirect_stdout=False,
        redirect_stderr=False,
        vertical_overflow="crop",
    ) as live:
        live.refresh()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fold)
            nursery.start_soon(check_terminal)
            while True:
                await dirty.wait()
                dirty = trio.Event()
                live.update(render(view, console, connected=connected), refresh=True)
                await trio.sleep(REPAINT_S)

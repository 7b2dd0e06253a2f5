"""``tether demo --part agent``: an agent's answer streaming into ``tether watch``'s lines, under ``tether up``.

The agent ``tracker`` of :mod:`runtime.demo_app` looks an order up (a safe tool) and streams its answer a few
characters at a time. The demo follows the conversation the way ``tether watch --conversation ID --plain`` does
(the same :class:`~runtime._watch_view.WatchView` and the same lines, from :func:`runtime._watch.plain_lines`), so
the text shows up in pieces as the worker commits them (every 100 ms), before the answer is committed. It then
checks what a reader of the database sees: the run completed, its answer is the text that streamed, and the answer
arrived in more than one piece.

With ``model`` (``--model NAME``) the worker runs the same agent on :class:`actors.OpenAIChat` ``NAME``, reached
through ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` from the environment; the answer is then whatever the model says.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Final

import trio

import actors
from protocol import Change, PartialRecord, RunRecord

from ._demo_up import demo_up
from ._watch import plain_lines
from ._watch_view import WatchView
from .demo_app import DESK_ENV, MODEL_ENV, TRACKER_ANSWER, Desk

SCRIPTED_TIMEOUT_S: Final = 60.0
REAL_MODEL_TIMEOUT_S: Final = 180.0
"""A real model answers in its own time (and a retryable error waits durably before the next attempt)."""
QUESTION: Final = "My order A1 never arrived. Where is it?"
AGENT: Final = "tracker"
MODEL_ENVIRONMENT: Final = ("OPENAI_API_KEY", "OPENAI_BASE_URL")
DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"


def real_model_problem(environ: Mapping[str, str]) -> str | None:
    """Why ``--model`` cannot run here (``None`` if it can): it needs a server to talk to."""
    if any(environ.get(name, "").strip() for name in MODEL_ENVIRONMENT):
        return None
    return (
        "--model NAME runs the agent on a real model, and neither OPENAI_API_KEY (for api.openai.com) nor "
        "OPENAI_BASE_URL (an OpenAI-compatible server such as http://127.0.0.1:8000/v1) is set; set one, or leave "
        "--model out to run the scripted model. Nothing was started."
    )


async def run_stream_demo(db: str, model: str | None = None) -> int:
    desk_path = db + ".stream-desk.jsonl"
    with open(desk_path, "w", encoding="utf-8"):
        pass  # a fresh ledger for this run
    if model is None:
        source = "a scripted model that streams a few characters every 40 ms"
    else:
        source = f"model {model} at {os.environ.get('OPENAI_BASE_URL') or DEFAULT_BASE_URL}"
    print(f"Tether demo: an agent streaming its answer on {db} ({source})\n", flush=True)
    problems: list[str] = []
    async with demo_up(db, workers=1, env={DESK_ENV: desk_path, MODEL_ENV: model or ""}) as (up, log_path):
        with trio.fail_after(SCRIPTED_TIMEOUT_S if model is None else REAL_MODEL_TIMEOUT_S):
            async with actors.connect(db=db, name="tether-demo", wait_for_owner_s=30) as client:
                worker = await _wait_for_worker(client)
                _say(f"tether up (pid {up.pid}): the owner, and worker {worker}; log in {log_path}")
                problems = await _scenario(client, db, expect_script=model is None)
    if model is None:
        problems += _check_desk(Desk(desk_path))
    for problem in problems:
        _say(f"FAILED: {problem}")
    print("\n" + ("The answer streamed in pieces, then was committed." if not problems else "FAILED: see above."))
    return 1 if problems else 0


async def _scenario(client: actors.Client, db: str, *, expect_script: bool) -> list[str]:
    head = (await client.ping()).head_seq
    conversation_id = await client.create_conversation(agent=AGENT)
    _title(f"1. A customer writes to the agent {AGENT}: {QUESTION!r}")
    _say(f"$ tether watch --db {db} --conversation {conversation_id} --plain    (its lines follow)")
    view = _Follow(WatchView(db, conversation_id=conversation_id))
    changes = client.watch(conversation_id=conversation_id, from_seq=head)
    async with changes, trio.open_nursery() as nursery:
        nursery.start_soon(view.run, changes)
        submission = await client.submit(conversation_id, kind="input", payload=QUESTION, request_id="demo")
        run_id = submission.run_id
        assert run_id is not None
        run = await client.wait_for_run(run_id)
        await view.settled(run.seq)
        nursery.cancel_scope.cancel(reason="the run ended and the watch showed it")
    _title("2. What the database holds")
    return _check_run(run, view.pieces.get(run_id, 0), expect_script, db, conversation_id)


def _check_run(run: RunRecord, pieces: int, expect_script: bool, db: str, conversation_id: str) -> list[str]:
    if run.status != "completed" or run.answer is None:
        return [f"the run ended {run.status}" + (f" ({run.reason})" if run.reason else "") + ", not completed"]
    _say(f"run {run.run_id}: completed; its answer: {run.answer.text}")
    _say(f"{pieces} piece(s) of streamed text were committed while the model streamed, each shown at once")
    usage = run.usage
    _say(
        f"usage: {usage.input_tokens} input, {usage.output_tokens} output tokens "
        f"($ tether usage --db {db} --conversation {conversation_id})"
    )
    if not expect_script:
        return []
    problems = []
    if run.answer.text != TRACKER_ANSWER:
        problems.append(f"the answer is {run.answer.text!r}, not the script's")
    if pieces < 2:
        problems.append(f"the text streamed in {pieces} piece(s), not several")
    return problems


def _check_desk(desk: Desk) -> list[str]:
    lookups = [line for line in desk.ledger() if line["op"] == "lookup"]
    if len(lookups) != 1:
        return [f"the order was looked up {len(lookups)} time(s), not once"]
    return []


class _Follow:
    """Prints ``tether watch --plain``'s lines for each commit of the conversation, and counts the pieces of streamed
    text per run; a step waits with :meth:`settled` until a commit was shown."""

    def __init__(self, view: WatchView) -> None:
        self.view = view
        self.pieces: dict[str, int] = {}
        self._seq = 0
        self._seen = trio.Event()

    async def run(self, changes: actors.WatchStream) -> None:
        change: Change
        async for change in changes:
            for record in change.records:
                if isinstance(record, PartialRecord) and record.text:
                    self.pieces[record.run_id] = self.pieces.get(record.run_id, 0) + 1
            text = plain_lines(self.view, change)
            if text:
                sys.stdout.write("".join(f"     {line}\n" for line in text.splitlines()))
                sys.stdout.flush()
            self._seq = change.seq
            self._seen.set()

    async def settled(self, seq: int) -> None:
        while self._seq < seq:
            self._seen = trio.Event()
            await self._seen.wait()


async def _wait_for_worker(client: actors.Client) -> str:
    while True:
        workers = [peer.peer_name for peer in await client.peers() if peer.role == "worker" and peer.announced]
        if workers:
            return workers[0]
        await trio.sleep(0.05)


def _title(text: str) -> None:
    print(f"\n  {text}", flush=True)


def _say(text: str) -> None:
    print(f"  {text}", flush=True)

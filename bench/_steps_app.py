"""The app ``bench/steps.py`` runs on its worker (importable as ``_steps_app:app`` with ``bench/`` on the path).

- Task kind ``bench.steps`` (variant ``task``): one committed checkpoint per phase.
- Agent ``bench-stream``: a slowly streaming model (partial output), see below.
- Agent ``bench-stream-steps`` (variant ``stream``): a streaming model whose tool call notes when its stream ended
  and when the call started, see below.
- Agent ``bench-tools`` (variant ``tool``) on a :class:`actors.ScriptedModel`: ``BENCH_TOOL_STEPS`` calls of the
  trivial ``safe`` tool ``noop`` per run, ``BENCH_TOOL_CALLS_PER_TURN`` calls per model turn (environment, read at
  import, since the worker imports the app), then one closing text turn.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from typing import Any

import actors

app = actors.App("bench-steps")

TOOL_STEPS = int(os.environ.get("BENCH_TOOL_STEPS", "100"))
CALLS_PER_TURN = int(os.environ.get("BENCH_TOOL_CALLS_PER_TURN", "1"))


async def step(rt: actors.Phase) -> None:
    """One durable step: the trivial work, then one new committed checkpoint (the last step completes instead)."""
    done = int(rt.checkpoint["done"]) + 1
    if done >= int(rt.input["steps"]):
        await rt.complete(done)
        return
    await rt.advance({"phase": "step", "done": done})


app.define_task("bench.steps", version=1, initial=lambda _: {"phase": "step", "done": 0}, phases={"step": step})


async def noop(call: actors.ToolCall, args: dict[str, Any]) -> dict[str, Any]:
    """The trivial work of one tool step."""
    return {"n": args["n"]}


def script(steps: int, calls_per_turn: int) -> actors.ScriptedModel:
    """``steps`` tool calls, ``calls_per_turn`` to a turn (the last turn may have fewer), then a text answer."""
    turns = [
        actors.ScriptedTurn(tool_calls=[("noop", {"n": n}) for n in range(first, min(first + calls_per_turn, steps))])
        for first in range(0, steps, calls_per_turn)
    ]
    return actors.ScriptedModel([*turns, actors.ScriptedTurn(text="done")])


app.define_tool(
    "noop",
    noop,
    description="Do nothing durable-worthy.",
    parameters={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    recovery="safe",
)
app.define_agent(
    "bench-tools", version=1, model=script(TOOL_STEPS, CALLS_PER_TURN), instructions="Bench.", tools=["noop"]
)


# Agent ``bench-stream``: a model that streams (the cost of partial output). ``BENCH_STREAM_TURNS`` turns, each
# streaming ``BENCH_STREAM_CHARS`` characters of text, ``BENCH_STREAM_CHUNK_CHARS`` to a delta every
# ``BENCH_STREAM_DELAY_MS``, then calling ``noop`` once; then one closing text turn. The worker sends the text in
# pieces at most every ``BENCH_PARTIAL_INTERVAL_MS`` (100 by default; 0: only with the result).
STREAM_TURNS = int(os.environ.get("BENCH_STREAM_TURNS", "10"))
STREAM_CHARS = int(os.environ.get("BENCH_STREAM_CHARS", "2000"))
STREAM_CHUNK_CHARS = int(os.environ.get("BENCH_STREAM_CHUNK_CHARS", "16"))
STREAM_DELAY_MS = int(os.environ.get("BENCH_STREAM_DELAY_MS", "10"))
PARTIAL_INTERVAL_MS = int(os.environ.get("BENCH_PARTIAL_INTERVAL_MS", "100"))


def streaming_script(turns: int, chars: int, chunk_chars: int, delay_ms: int) -> actors.ScriptedModel:
    """``turns`` turns that stream ``chars`` characters of text and then call ``noop``, then a text answer."""
    text = ("Streaming partial output for the bench. " * (chars // 40 + 1))[:chars]
    streamed = [
        actors.ScriptedTurn(
            text=text, tool_calls=[("noop", {"n": n})], chunk_chars=chunk_chars, delay_s=delay_ms / 1000
        )
        for n in range(turns)
    ]
    return actors.ScriptedModel([*streamed, actors.ScriptedTurn(text="done")])


app.define_agent(
    "bench-stream",
    version=1,
    model=streaming_script(STREAM_TURNS, STREAM_CHARS, STREAM_CHUNK_CHARS, STREAM_DELAY_MS),
    instructions="Bench.",
    tools=["noop"],
    partial_interval_ms=PARTIAL_INTERVAL_MS,
)


# Agent ``bench-stream-steps`` (``bench/steps.py --variant stream``): the owner's overhead per step while models
# stream. Each run's input is a tag; its model streams ``BENCH_STEP_STREAM_CHARS`` characters of text,
# ``BENCH_STEP_STREAM_CHUNK_CHARS`` to a delta every ``BENCH_STEP_STREAM_DELAY_MS``, then calls ``stamp`` with the
# tag and the turn, for ``BENCH_STEP_STREAM_TURNS`` turns; then one closing text turn. The worker sends the text
# in pieces every ``BENCH_PARTIAL_INTERVAL_MS`` (100 by default). The model notes when each stream ended (its
# generator exhausted: the run loop has every event) in ``STREAM_ENDS`` and ``stamp`` returns that time with its
# own start, both ``time.monotonic()`` in this worker process, so the gap is the run loop's result commit, the
# owner's tool task, its lease and the tool's start: the owner's overhead per step, with nothing of the model's.
STEP_STREAM_TURNS = int(os.environ.get("BENCH_STEP_STREAM_TURNS", "8"))
STEP_STREAM_CHARS = int(os.environ.get("BENCH_STEP_STREAM_CHARS", "400"))
STEP_STREAM_CHUNK_CHARS = int(os.environ.get("BENCH_STEP_STREAM_CHUNK_CHARS", "8"))
STEP_STREAM_DELAY_MS = int(os.environ.get("BENCH_STEP_STREAM_DELAY_MS", "20"))
STREAM_ENDS: dict[tuple[str, int], float] = {}
"""(tag, turn) -> when that model stream ended; taken by ``stamp``, so it holds only streams whose call has not
started (at most one per run)."""


class StampedStream:
    """A scripted model whose tool calls carry the run's tag, and which notes when each of its streams ended."""

    name = "bench-stamped"

    async def stream(self, request: actors.ModelRequest) -> AsyncIterator[actors.StreamEvent]:
        tag = next((m.text for m in reversed(request.messages) if isinstance(m, actors.UserMessage)), "")
        text = ("Streaming while the owner steps. " * (STEP_STREAM_CHARS // 33 + 1))[:STEP_STREAM_CHARS]
        turns = [
            actors.ScriptedTurn(
                text=text,
                tool_calls=[("stamp", {"tag": tag, "turn": turn})],
                chunk_chars=STEP_STREAM_CHUNK_CHARS,
                delay_s=STEP_STREAM_DELAY_MS / 1000,
            )
            for turn in range(STEP_STREAM_TURNS)
        ]
        async for event in actors.ScriptedModel([*turns, actors.ScriptedTurn(text="done")]).stream(request):
            yield event
        turn = _turn_of(request.messages)
        if turn < STEP_STREAM_TURNS:
            STREAM_ENDS[(tag, turn)] = time.monotonic()


def _turn_of(messages: tuple[actors.Message, ...]) -> int:
    """The request's turn in its run (as the scripted model counts it): assistant messages after the last user's."""
    count = 0
    for message in reversed(messages):
        if isinstance(message, actors.UserMessage):
            break
        count += isinstance(message, actors.AssistantMessage)
    return count


async def stamp(call: actors.ToolCall, args: dict[str, Any]) -> dict[str, Any]:
    """The start of the step's tool call, and the end of the stream that asked for it (``None`` if this worker did
    not see that stream end: a re-run after a restart)."""
    started = time.monotonic()
    ended = STREAM_ENDS.pop((args["tag"], args["turn"]), None)
    return {"stream_ended_s": ended, "started_s": started}


app.define_tool(
    "stamp",
    stamp,
    description="Note when the step's tool call started.",
    parameters={
        "type": "object",
        "properties": {"tag": {"type": "string"}, "turn": {"type": "integer"}},
        "required": ["tag", "turn"],
    },
    recovery="safe",
)
app.define_agent(
    "bench-stream-steps",
    version=1,
    model=StampedStream(),
    instructions="Bench.",
    tools=["stamp"],
    partial_interval_ms=PARTIAL_INTERVAL_MS,
)

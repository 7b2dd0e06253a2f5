"""The app ``bench/capacity.py`` runs on its two workers (importable as ``_capacity_app:app`` with ``bench/`` on the
path).

- Agent ``bench-capacity``: a model that thinks ``BENCH_CAPACITY_TURN_S`` seconds (a ``trio.sleep``, like a model
  server that takes that long to answer) before each of its first ``BENCH_CAPACITY_TURNS`` turns, each of which
  calls the trivial ``safe`` tool ``noop`` once; then a closing text turn that answers at once. A run's ideal wall
  time is therefore ``TURNS * TURN_S`` (10 x 1 s by default): everything else is Tether's.
- Agent ``bench-capacity-warm``: the same script without the wait, one tool turn (the warm-up).

Both read the environment at import, since the worker imports the app.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any, Final

import trio

import actors

app = actors.App("bench-capacity")

TURNS_ENV: Final = "BENCH_CAPACITY_TURNS"
TURN_S_ENV: Final = "BENCH_CAPACITY_TURN_S"
AGENT: Final = "bench-capacity"
WARM_AGENT: Final = "bench-capacity-warm"
ANSWER: Final = "done"
TURNS = int(os.environ.get(TURNS_ENV, "10"))
TURN_S = float(os.environ.get(TURN_S_ENV, "1.0"))


def _script(turns: int) -> actors.ScriptedModel:
    """``turns`` turns of one ``noop`` call each, then the answer; streamed without pauses."""
    calls = [actors.ScriptedTurn(tool_calls=[("noop", {"n": n})]) for n in range(turns)]
    return actors.ScriptedModel([*calls, actors.ScriptedTurn(text=ANSWER)])


class ThinkingModel:
    """A scripted model that waits ``turn_s`` before each of its ``turns`` tool turns, not before its answer.

    The wait is one sleep before the first event (a model server's time to first token), not one per chunk as
    ``ScriptedTurn.delay_s`` would be, so a turn takes ``turn_s`` however its arguments are chunked.
    """

    def __init__(self, turns: int, turn_s: float) -> None:
        self.name = "bench-thinking"
        self._script = _script(turns)
        self._turns = turns
        self._turn_s = turn_s

    async def stream(self, request: actors.ModelRequest) -> AsyncIterator[actors.StreamEvent]:
        if request.turn is not None and request.turn <= self._turns:
            await trio.sleep(self._turn_s)
        async for event in self._script.stream(request):
            yield event


async def noop(call: actors.ToolCall, args: dict[str, Any]) -> dict[str, Any]:
    """The trivial work of one tool call."""
    return {"n": args["n"]}


app.define_tool(
    "noop",
    noop,
    description="Do nothing durable-worthy.",
    parameters={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    recovery="safe",
)
app.define_agent(AGENT, version=1, model=ThinkingModel(TURNS, TURN_S), instructions="Bench.", tools=["noop"])
app.define_agent(WARM_AGENT, version=1, model=_script(1), instructions="Bench.", tools=["noop"])

"""The app ``bench/steps.py`` runs on its worker (importable as ``_steps_app:app`` with ``bench/`` on the path).

- Task kind ``bench.steps`` (variant ``task``): one committed checkpoint per phase.
- Agent ``bench-tools`` (variant ``tool``) on a :class:`actors.ScriptedModel`: ``BENCH_TOOL_STEPS`` calls of the
  trivial ``safe`` tool ``noop`` per run, ``BENCH_TOOL_CALLS_PER_TURN`` calls per model turn (environment, read at
  import, since the worker imports the app), then one closing text turn.
"""

from __future__ import annotations

import os
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

"""The app ``bench/acting.py`` runs on its worker (importable as ``_acting_app:app`` with ``bench/`` on the path).

Three agents on a :class:`actors.ScriptedModel`, each making ``BENCH_ACTING_STEPS`` model turns of one tool call
(environment, read at import, since the worker imports the app), then one closing text turn:

- ``bench-plain``: each turn calls ``noop``, a trivial ``safe`` tool (the baseline tool step);
- ``bench-nested``: each turn calls ``relay``, which makes one nested call (``call.execute_tool``) of the trivial
  ``inner`` (only ``relay`` may call it) and returns its value;
- ``bench-subagent``: each turn calls ``ask``, an ``actors.subagent_tool`` whose agent ``bench-answerer`` answers at
  once with a text (one model turn, no tools).
"""

from __future__ import annotations

import os
from typing import Any

import actors

app = actors.App("bench-acting")

STEPS = int(os.environ.get("BENCH_ACTING_STEPS", "50"))
NUMBERED = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
PLAIN_AGENT = "bench-plain"
NESTED_AGENT = "bench-nested"
SUBAGENT_AGENT = "bench-subagent"
ANSWERER_AGENT = "bench-answerer"
ANSWER = "answered"


async def noop(call: actors.ToolCall, args: dict[str, Any]) -> dict[str, Any]:
    """The trivial work of one tool step (``noop``) and of one nested call (``inner``)."""
    return {"n": args["n"]}


async def relay(call: actors.ToolCall, args: dict[str, Any]) -> Any:
    """One nested call of ``inner``, whose value it returns."""
    return await call.execute_tool("inner", {"n": args["n"]}, key="inner")


def script(steps: int, tool: str, args: Any) -> actors.ScriptedModel:
    """``steps`` turns of one call of ``tool`` (``args(n)`` its arguments), then a text answer."""
    turns = [actors.ScriptedTurn(tool_calls=[(tool, args(n))]) for n in range(steps)]
    return actors.ScriptedModel([*turns, actors.ScriptedTurn(text="done")])


app.define_tool("noop", noop, description="Do nothing durable-worthy.", parameters=NUMBERED, recovery="safe")
app.define_tool(
    "inner", noop, description="Do nothing, for relay.", parameters=NUMBERED, recovery="safe", callers=["relay"]
)
app.define_tool("relay", relay, description="Call inner once.", parameters=NUMBERED, recovery="safe")
app.define_tool("ask", actors.subagent_tool(agent=ANSWERER_AGENT), description="Ask the answerer.", recovery="safe")

app.define_agent(
    PLAIN_AGENT, version=1, model=script(STEPS, "noop", lambda n: {"n": n}), instructions="Bench.", tools=["noop"]
)
app.define_agent(
    NESTED_AGENT, version=1, model=script(STEPS, "relay", lambda n: {"n": n}), instructions="Bench.", tools=["relay"]
)
app.define_agent(
    SUBAGENT_AGENT,
    version=1,
    model=script(STEPS, "ask", lambda n: {"task": f"question {n}"}),
    instructions="Bench.",
    tools=["ask"],
)
app.define_agent(
    ANSWERER_AGENT, version=1, model=actors.ScriptedModel([actors.ScriptedTurn(text=ANSWER)]), instructions="Answer."
)

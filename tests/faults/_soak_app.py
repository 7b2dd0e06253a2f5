"""The app of the soak (``tests/faults/test_soak.py``), importable as ``tests.faults._soak_app:app``.

- ``soak.tree`` creates ``input["children"]`` ``soak.leaf`` tasks it owns and waits on them (``all_settled``), then
  completes with their outcomes' statuses.
- ``soak.leaf`` advances through ``input["steps"]`` checkpoints (``step_s`` of work each), then completes.
- ``soak.nap`` sleeps on the owner's clock until ``input["ms"]`` after its first phase, then completes: with a long
  nap it is the live task the checker must find sleeping.
- agent ``soaker``: its scripted model calls the ``ledger`` tool twice, then answers. ``ledger`` is a ``safe`` tool
  that appends one JSON line per execution to the file named by ``TETHER_SOAK_LEDGER``.
"""

from __future__ import annotations

import json
import os
from typing import Any, Final

import trio

import actors

TREE: Final = "soak.tree"
LEAF: Final = "soak.leaf"
NAP: Final = "soak.nap"
AGENT: Final = "soaker"
TOOL: Final = "ledger"
ANSWER: Final = "Both lines are in the ledger."


async def _spawn(rt: actors.Phase) -> None:
    leaf = {"steps": int(rt.input.get("steps", 2)), "step_s": float(rt.input.get("step_s", 0.05))}
    async with rt.commit() as tx:
        ids = [tx.create_task(LEAF, leaf) for _ in range(int(rt.input.get("children", 2)))]
        tx.wait(on=ids, policy="all_settled", checkpoint={"phase": "decide", "children": ids})


async def _decide(rt: actors.Phase) -> None:
    outcomes = await rt.outcomes(rt.checkpoint["children"])
    await rt.complete({task_id: None if outcome is None else outcome.status for task_id, outcome in outcomes.items()})


async def _step(rt: actors.Phase) -> None:
    step = int(rt.checkpoint["n"])
    await trio.sleep(float(rt.input.get("step_s", 0.05)))
    if step + 1 < int(rt.input.get("steps", 2)):
        await rt.advance({"phase": "step", "n": step + 1})
    else:
        await rt.complete({"steps": step + 1})


async def _nap(rt: actors.Phase) -> None:
    await rt.sleep_until(rt.now_ms() + int(rt.input["ms"]), {"phase": "wake"})


async def _wake(rt: actors.Phase) -> None:
    await rt.complete({"napped_ms": int(rt.input["ms"])})


async def _ledger(call: actors.ToolCall, args: dict[str, Any]) -> Any:
    line = {"operation_id": call.operation_id, "run_id": call.run_id, "attempt": call.attempt, "args": args}
    with open(os.environ["TETHER_SOAK_LEDGER"], "a", encoding="utf-8") as file:
        file.write(json.dumps(line, sort_keys=True) + "\n")
    return {"written": args["line"]}


app = actors.App("soak")
app.define_task(TREE, version=1, initial=lambda _input: {"phase": "spawn"}, phases={"spawn": _spawn, "decide": _decide})
app.define_task(LEAF, version=1, initial=lambda _input: {"phase": "step", "n": 0}, phases={"step": _step})
app.define_task(NAP, version=1, initial=lambda _input: {"phase": "nap"}, phases={"nap": _nap, "wake": _wake})
app.define_tool(
    TOOL,
    _ledger,
    description="Write a line to the ledger.",
    parameters={"type": "object", "properties": {"line": {"type": "string"}}, "required": ["line"]},
    recovery="safe",
)
app.define_agent(
    AGENT,
    version=1,
    model=actors.ScriptedModel(
        [
            actors.ScriptedTurn(tool_calls=[(TOOL, {"line": "first"}), (TOOL, {"line": "second"})]),
            actors.ScriptedTurn(text=ANSWER),
        ]
    ),
    tools=[TOOL],
    model_retry=actors.Retry(attempts=10, first_delay_ms=100, max_delay_ms=1_000),
)

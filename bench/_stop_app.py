"""The app of ``bench/stop.py``: an agent whose one ``manual`` tool writes the time it started to the file named by
``TETHER_BENCH_STARTED`` and then sleeps ``TETHER_BENCH_TOOL_S`` seconds (a tool in flight when the stop comes)."""

from __future__ import annotations

import os
import time
from typing import Any

import trio

import actors

app = actors.App("stop-bench")


async def transfer(call: actors.ToolCall, args: dict[str, Any]) -> dict[str, Any]:
    with open(os.environ["TETHER_BENCH_STARTED"], "a", encoding="utf-8") as file:
        file.write(f"{time.time()}\n")
    await trio.sleep(float(os.environ.get("TETHER_BENCH_TOOL_S", "2")))
    return {"moved": args.get("amount")}


app.define_tool("transfer", transfer, description="Move money.", parameters={"type": "object"}, recovery="manual")
app.define_agent(
    "banker",
    version=1,
    model=actors.ScriptedModel(
        [actors.ScriptedTurn(tool_calls=[("transfer", {"amount": 5})]), actors.ScriptedTurn(text="Moved 5.")]
    ),
    tools=["transfer"],
)

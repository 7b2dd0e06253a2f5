"""The app ``bench/inbox.py`` serves in its own process: agent ``steerable`` calls its ``hold`` tool, which waits
until the benchmark lets it go (:data:`HELD`), then answers; a steer submitted meanwhile is placed when the call
ends."""

from __future__ import annotations

from typing import Any

import trio

import actors


class Held:
    """Per conversation: the tool call has started (:meth:`started`), and the benchmark lets it go (:meth:`release`)."""

    def __init__(self) -> None:
        self._started: dict[str, trio.Event] = {}
        self._released: dict[str, trio.Event] = {}

    def _event(self, table: dict[str, trio.Event], key: str) -> trio.Event:
        return table.setdefault(key, trio.Event())

    async def started(self, conversation_id: str) -> None:
        await self._event(self._started, conversation_id).wait()

    def release(self, conversation_id: str) -> None:
        self._event(self._released, conversation_id).set()

    async def hold(self, conversation_id: str) -> None:
        self._event(self._started, conversation_id).set()
        await self._event(self._released, conversation_id).wait()


HELD = Held()


async def hold(call: actors.ToolCall, args: dict[str, Any]) -> str:
    await HELD.hold(call.conversation_id)
    return "let go"


app = actors.App("bench-inbox")
app.define_tool("hold", hold, description="Wait to be let go.", parameters={"type": "object"}, recovery="safe")
app.define_agent(
    "steerable",
    version=1,
    model=actors.ScriptedModel([actors.ScriptedTurn(tool_calls=[("hold", {})]), actors.ScriptedTurn(text="Done.")]),
    tools=["hold"],
)

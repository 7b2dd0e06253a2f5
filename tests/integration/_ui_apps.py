"""Apps for ``tests/integration/test_ui.py``, served in-process with ``actors.serve``.

``asking``: agent ``support`` answers an input that starts with "ask" by calling tool ``confirm``, which says what
it does (``call.output``) and asks a person a yes-or-no question (``call.ask``) before it returns; then it answers
:data:`REFUNDED`. Any other input gets :data:`NOTED` at once (a follow-up's run, say).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Final

import actors

QUESTION: Final = "Refund order A1 in full?"
REFUNDED: Final = "Refunded order A1."
NOTED: Final = "Noted."


async def confirm(call: actors.ToolCall, args: dict[str, Any]) -> Any:
    await call.output(f"looking up {args['order_id']}... ")
    refund = await call.ask(QUESTION, schema={"type": "boolean"})
    return {"order": args["order_id"], "refunded": refund}


class ByInput:
    """The script of a run whose input starts with "ask" (a tool call, then the answer), else one plain answer."""

    name = "by-input"

    def __init__(self) -> None:
        self.asking = actors.ScriptedModel(
            [
                actors.ScriptedTurn(tool_calls=[("confirm", {"order_id": "A1"})]),
                actors.ScriptedTurn(text=REFUNDED),
            ]
        )
        self.plain = actors.ScriptedModel([actors.ScriptedTurn(text=NOTED)])

    async def stream(self, request: actors.ModelRequest) -> AsyncIterator[Any]:
        users = [message.text for message in request.messages if isinstance(message, actors.UserMessage)]
        asks = request.turn != 1 or (bool(users) and users[-1].startswith("ask"))
        async for event in (self.asking if asks else self.plain).stream(request):
            yield event


asking = actors.App("ui")
asking.define_tool(
    "confirm",
    confirm,
    description="Confirm a refund with a person.",
    parameters={"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
    recovery="safe",
)
asking.define_agent("support", version=1, model=ByInput(), tools=["confirm"])

"""Apps for ``tests/faults/test_acting_tools_kills.py``, importable as ``tests.faults._acting_apps:ATTR`` (by ``tether
worker --app``) or served in-process: an agent whose ``refund`` tool (``safe``: a re-run after a crash is allowed)
looks the order up with a nested call, asks a person whether to refund in full, and pays out with another nested
call. Every handler appends a line to the ledger (``tests.integration._agent_apps.record``); ``look_up_order`` waits
for the gate file when its arguments say ``"block": true``. The ``settle`` tool (``manual`` or ``report``: never run
again after a crash) looks an order up with a nested call that blocks, for the abandonment of nested calls.
"""

from __future__ import annotations

from typing import Any, Final

import actors
from tests.integration._agent_apps import gate, lookup, record

ORDER: Final = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "block": {"type": "boolean"}},
    "required": ["order_id"],
}
AMOUNT: Final = {"type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]}


async def refund(call: actors.ToolCall, args: dict[str, Any]) -> actors.ToolResult:
    record(call, args)
    order = await call.execute_tool("look_up_order", args, key="lookup")
    full = await call.ask(f"Refund {order['total']} EUR in full?", schema={"type": "boolean"})
    amount = order["total"] if full else order["total"] / 2
    receipt = await call.execute_tool("pay_out", {"amount": amount}, key="pay")
    return actors.ToolResult(output=f"refunded {amount} EUR", structured={"receipt": receipt})


async def look_up_order(call: actors.ToolCall, args: dict[str, Any]) -> actors.ToolResult:
    record(call, args)
    await gate(args)
    return actors.ToolResult(output="found", structured={"order_id": args["order_id"], "total": 40})


async def pay_out(call: actors.ToolCall, args: dict[str, Any]) -> str:
    record(call, args)
    return f"receipt-{call.operation_id[:8]}"


def _app(name: str, *, caller: bool, children: bool) -> actors.App:
    app = actors.App(name)
    if caller:
        app.define_tool("refund", refund, description="Refund an order.", parameters=ORDER, recovery="safe")
        turns = [actors.ScriptedTurn(tool_calls=[("refund", {"order_id": "A1", "block": True})])]
        turns.append(actors.ScriptedTurn(text="Refunded."))
        app.define_agent("support", version=1, model=actors.ScriptedModel(turns), tools=["refund"])
    if children:
        app.define_tool(
            "look_up_order", look_up_order, description="Read an order.", parameters=ORDER, callers=["refund"]
        )
        app.define_tool(
            "pay_out", pay_out, description="Pay out.", parameters=AMOUNT, recovery="idempotent", callers=["refund"]
        )
    return app


full_app = _app("acting", caller=True, children=True)
caller_app = _app("acting-callers", caller=True, children=False)
children_app = _app("acting-children", caller=False, children=True)


async def settle(call: actors.ToolCall, args: dict[str, Any]) -> str:
    record(call, args)
    order = await call.execute_tool("look_up_order", {"order_id": args["order_id"], "block": True}, key="lookup")
    return f"settled {order['order_id']}"


def _settling_app(recovery: actors.Recovery, *, children: bool) -> actors.App:
    """``support`` calls ``settle`` (a caller that is not replay-safe, ``recovery``), whose nested ``look_up_order``
    blocks at the gate; with ``children``, this app runs the nested call too."""
    app = actors.App(f"settling-{recovery}")
    app.define_tool("settle", settle, description="Settle an order.", parameters=ORDER, recovery=recovery)
    if children:
        app.define_tool(
            "look_up_order", look_up_order, description="Read an order.", parameters=ORDER, callers=["settle"]
        )
    turns = [actors.ScriptedTurn(tool_calls=[("settle", {"order_id": "A1"})]), actors.ScriptedTurn(text="Settled.")]
    app.define_agent("support", version=1, model=actors.ScriptedModel(turns), tools=["settle"])
    return app


manual_settling_app = _settling_app("manual", children=True)
manual_caller_app = _settling_app("manual", children=False)
report_settling_app = _settling_app("report", children=True)
report_caller_app = _settling_app("report", children=False)
lookups_app = actors.App("lookups")
lookups_app.define_tool(
    "look_up_order", look_up_order, description="Read an order.", parameters=ORDER, callers=["settle"]
)


def _research_app(*, background: bool) -> actors.App:
    """``support`` asks the ``researcher`` subagent (a ``safe`` subagent tool, in the foreground or the background);
    the researcher looks an order up with ``lookup`` (``safe``, gated) before it answers."""
    app = actors.App("research")
    app.define_tool(
        "research",
        actors.subagent_tool(agent="researcher", background=background),
        description="Ask a researcher.",
        recovery="safe",
    )
    app.define_tool("lookup", lookup, description="Look an order up.", parameters=ORDER, recovery="safe")
    parent = [actors.ScriptedTurn(tool_calls=[("research", {"task": "Where is A1?"})])]
    parent.append(actors.ScriptedTurn(text="It shipped."))
    app.define_agent("support", version=1, model=actors.ScriptedModel(parent), tools=["research"])
    child = [actors.ScriptedTurn(tool_calls=[("lookup", {"order_id": "A1", "block": True})])]
    child.append(actors.ScriptedTurn(text="A1 shipped."))
    app.define_agent("researcher", version=1, model=actors.ScriptedModel(child), tools=["lookup"])
    return app


research_app = _research_app(background=False)
background_research_app = _research_app(background=True)

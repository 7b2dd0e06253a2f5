"""Agent apps for ``tests/faults/test_run_owner_kills.py`` (served in the test's process with ``actors.serve``) and
``tests/faults/test_run_worker_kills.py`` (``tether worker --app tests.faults._run_apps:ATTR``: the ``*_dies_*`` apps
SIGKILL their own worker process once at a chosen point; ``configured_dies_mid_request`` once its first model
request's intent is committed, in a conversation configured to use the model ``fast``; ``handoff_dies`` once its
second request's intent is committed, after a tool's handoff was placed).

The tool apps are ``tests.integration._agent_apps``'s (a ``lookup`` tool that appends a line per execution to the
ledger ``TETHER_TEST_LEDGER`` and blocks while the file ``TETHER_TEST_GATE`` does not exist). ``streaming`` is an
agent whose model appends a line to the same ledger per request (``{"tool": "model", "attempt": n}``), streams its
first chunk and then blocks on the gate: a test kills the owner while the stream is open.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

import actors
from tests.integration._agent_apps import BLOCKING_CALL, ONE_CALL, ORDER, build, lookup


class StreamGatedModel:
    """The script, except that each request is written to the ledger and its stream stops after its first event
    until the gate file exists."""

    name = "gated-stream"

    def __init__(self, turns: list[actors.ScriptedTurn]) -> None:
        self.inner = actors.ScriptedModel(turns)

    async def stream(self, request: actors.ModelRequest) -> AsyncIterator[Any]:
        line = {"tool": "model", "operation_id": None, "attempt": request.attempt, "args": {}}
        with open(os.environ["TETHER_TEST_LEDGER"], "a", encoding="utf-8") as file:
            file.write(json.dumps(line, sort_keys=True) + "\n")
        gate = Path(os.environ["TETHER_TEST_GATE"])
        first = True
        async for event in self.inner.stream(request):
            yield event
            if first:
                first = False
                while not gate.exists():  # noqa: ASYNC110 (the test creates the file)
                    await trio.sleep(0.02)


def streaming_app() -> actors.App:
    app = actors.App("streaming")
    app.define_agent(
        "support",
        version=1,
        model=StreamGatedModel([actors.ScriptedTurn(text="A streamed answer.")]),
        model_retry=actors.Retry(attempts=3, first_delay_ms=1000, max_delay_ms=10_000),
    )
    return app


def tool_app(policy: actors.Recovery) -> actors.App:
    """The agent calls ``lookup`` once (arguments ``{"order_id": "A1", "block": true}``), then answers."""
    return build(BLOCKING_CALL, recovery=policy)


# ---------------------------------------------------------------------------------- apps whose worker dies


def die_once(point: str) -> None:
    """SIGKILL this worker process the first time ``point`` is reached in the test (a marker file next to the gate
    remembers it), so the worker that replaces it gets through."""
    marker = Path(f"{os.environ['TETHER_TEST_GATE']}.died-{point}")
    if not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)


def dies_before_intent(policy: actors.Recovery) -> actors.App:
    """The tool's ``needs_approval`` runs in its task's phase before the intent: the worker dies there."""

    def check(args: dict[str, Any]) -> bool:
        die_once("before-intent")
        return False

    app = actors.App("dies-before-intent")
    app.define_tool(
        "lookup", lookup, description="Look an order up.", parameters=ORDER, recovery=policy, needs_approval=check
    )
    app.define_agent("support", version=1, model=actors.ScriptedModel(ONE_CALL), tools=["lookup"])
    return app


class DiesOnSecondTurn:
    """The script, except that the worker dies when the run's second model request (after the tool's result is
    committed) starts, once."""

    name = "scripted"

    def __init__(self, turns: list[actors.ScriptedTurn]) -> None:
        self.inner = actors.ScriptedModel(turns)

    async def stream(self, request: actors.ModelRequest) -> AsyncIterator[Any]:
        if any(isinstance(message, actors.AssistantMessage) for message in request.messages):
            die_once("second-turn")
        async for event in self.inner.stream(request):
            yield event


def dies_after_tool_result(policy: actors.Recovery) -> actors.App:
    app = actors.App("dies-after-tool-result")
    app.define_tool("lookup", lookup, description="Look an order up.", parameters=ORDER, recovery=policy)
    app.define_agent(
        "support",
        version=1,
        model=DiesOnSecondTurn(ONE_CALL),
        tools=["lookup"],
        model_retry=actors.Retry(attempts=3, first_delay_ms=1000, max_delay_ms=10_000),
    )
    return app


def restart_limited() -> actors.App:
    """The agent calls ``lookup`` (``safe``, ``restart_limit=2``) once, then answers: a test kills the worker at the
    call until its limit."""
    app = actors.App("restart-limited", restart_limit=None)  # the app's limit: none (the tool's wins)
    app.define_tool(
        "lookup", lookup, description="Look an order up.", parameters=ORDER, recovery="safe", restart_limit=2
    )
    app.define_agent("support", version=1, model=actors.ScriptedModel(ONE_CALL), tools=["lookup"])
    return app


restart_limited_app = restart_limited()
manual_dies_before_intent = dies_before_intent("manual")
safe_dies_before_intent = dies_before_intent("safe")
idempotent_dies_before_intent = dies_before_intent("idempotent")
manual_dies_after_tool_result = dies_after_tool_result("manual")
safe_dies_after_tool_result = dies_after_tool_result("safe")
idempotent_dies_after_tool_result = dies_after_tool_result("idempotent")


HANDOFF = "Order A1 is refunded; the customer asks about B2 next."


async def hand_off(call: actors.ToolCall, args: dict[str, Any]) -> actors.ToolResult:
    """``lookup``'s ledger line, then a handoff: the run goes on from its text."""
    await lookup(call, args)
    return actors.ToolResult(output="handed off", handoff=HANDOFF)


class DiesOnTurn:
    """The script, except that each request's first message goes to the ledger (``{"tool": "model", "turn", "first"}``)
    and the worker dies once when its run's request ``turn`` starts (its intent is committed)."""

    name = "scripted"

    def __init__(self, turn: int, turns: list[actors.ScriptedTurn]) -> None:
        self.turn = turn
        self.inner = actors.ScriptedModel(turns)

    async def stream(self, request: actors.ModelRequest) -> AsyncIterator[Any]:
        first = request.messages[0]
        line = {"tool": "model", "turn": request.turn, "first": getattr(first, "text", None)}
        with open(os.environ["TETHER_TEST_LEDGER"], "a", encoding="utf-8") as file:
            file.write(json.dumps(line, sort_keys=True) + "\n")
        if request.turn == self.turn:
            die_once(f"turn-{self.turn}")
        async for event in self.inner.stream(request):
            yield event


def handoff_dies_on_second_turn() -> actors.App:
    """The agent calls ``hand_off`` once; the worker dies at the next request, after the run placed the handoff."""
    turns = [
        actors.ScriptedTurn(tool_calls=[("hand_off", {"order_id": "A1"})]),
        actors.ScriptedTurn(text="B2 ships tomorrow."),
    ]
    app = actors.App("handoff-dies")
    app.define_tool("hand_off", hand_off, description="Hand off.", parameters=ORDER, recovery="safe")
    app.define_agent(
        "support",
        version=1,
        model=DiesOnTurn(2, turns),
        tools=["hand_off"],
        model_retry=actors.Retry(attempts=3, first_delay_ms=1000, max_delay_ms=10_000),
    )
    return app


handoff_dies = handoff_dies_on_second_turn()


class NotingModel:
    """The script, except that each request's model name, instructions and attempt go to the ledger first; the
    worker dies at its first request, once (its intent, with the configuration it recorded, is committed)."""

    def __init__(self, name: str, turns: list[actors.ScriptedTurn]) -> None:
        self.name = name
        self.inner = actors.ScriptedModel(turns)

    async def stream(self, request: actors.ModelRequest) -> AsyncIterator[Any]:
        line = {"tool": "model", "model": self.name, "instructions": request.instructions, "attempt": request.attempt}
        with open(os.environ["TETHER_TEST_LEDGER"], "a", encoding="utf-8") as file:
            file.write(json.dumps(line, sort_keys=True) + "\n")
        die_once("mid-request")
        async for event in self.inner.stream(request):
            yield event


def configured_dies_mid_request() -> actors.App:
    app = actors.App("configured")
    answers = [actors.ScriptedTurn(text="Answered.")]
    app.define_agent(
        "support",
        version=1,
        model=NotingModel("agent-model", answers),
        model_retry=actors.Retry(attempts=3, first_delay_ms=1000, max_delay_ms=10_000),
    )
    app.define_model("fast", NotingModel("fast-model", answers))
    return app


configured = configured_dies_mid_request()

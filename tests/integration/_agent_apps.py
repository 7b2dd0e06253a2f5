"""Agent apps for ``tests/integration/test_agents.py``, importable as ``tests.integration._agent_apps:ATTR`` (by
``tether worker --app``) or served in-process with ``actors.serve``.

Every tool appends one JSON line per execution to the ledger file named by the environment variable
``TETHER_TEST_LEDGER`` (``{"tool", "operation_id", "attempt", "args"}``), so a test counts executions in any process.
A tool whose arguments say ``"block": true`` waits until the file ``TETHER_TEST_GATE`` exists (a test controls it).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import trio

import actors


def record(call: actors.ToolCall, args: dict[str, Any]) -> None:
    ledger = os.environ.get("TETHER_TEST_LEDGER")
    if ledger is None:
        return
    line = {"tool": call.tool, "operation_id": call.operation_id, "attempt": call.attempt, "args": args}
    with open(ledger, "a", encoding="utf-8") as file:
        file.write(json.dumps(line, sort_keys=True) + "\n")


def read_ledger(path: str | Path) -> list[dict[str, Any]]:
    ledger = Path(path)
    if not ledger.exists():
        return []
    return [json.loads(line) for line in ledger.read_text(encoding="utf-8").splitlines() if line.strip()]


async def gate(args: dict[str, Any]) -> None:
    if not args.get("block"):
        return
    path = Path(os.environ["TETHER_TEST_GATE"])
    while not path.exists():  # noqa: ASYNC110 (another process creates the file)
        await trio.sleep(0.02)


async def lookup(call: actors.ToolCall, args: dict[str, Any]) -> Any:
    record(call, args)
    await gate(args)
    return {"order": args["order_id"], "status": "shipped"}


async def progressing_lookup(call: actors.ToolCall, args: dict[str, Any]) -> Any:
    """``lookup``, saying what it does first (``call.output``): an interrupted call's progress is in its result."""
    await call.output(f"looking up {args['order_id']}... ")
    return await lookup(call, args)


async def boom(call: actors.ToolCall, args: dict[str, Any]) -> Any:
    record(call, args)
    raise RuntimeError("the service is down")


ORDER = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "block": {"type": "boolean"}},
    "required": ["order_id"],
    "additionalProperties": False,
}


def build(
    turns: list[actors.ScriptedTurn],
    *,
    recovery: actors.Recovery = "manual",
    approval: bool = False,
    version: int = 1,
    retry: actors.Retry | None = None,
    max_turns: int | None = None,
    tool_version: int = 1,
    progress: bool = False,
) -> actors.App:
    app = actors.App("agents")
    app.define_tool(
        "lookup",
        progressing_lookup if progress else lookup,
        description="Look an order up.",
        parameters=ORDER,
        recovery=recovery,
        version=tool_version,
        needs_approval=(lambda args: True) if approval else None,
    )
    app.define_tool("boom", boom, description="Always fails.", parameters={"type": "object"})
    app.define_agent(
        "support",
        version=version,
        model=actors.ScriptedModel(turns),
        tools=["lookup", "boom"],
        model_retry=retry or actors.Retry(attempts=3, first_delay_ms=1000, max_delay_ms=10_000),
        max_turns=max_turns,
    )
    return app


ONE_CALL = [
    actors.ScriptedTurn(tool_calls=[("lookup", {"order_id": "A1"})]),
    actors.ScriptedTurn(text="Your order shipped."),
]
BLOCKING_CALL = [
    actors.ScriptedTurn(tool_calls=[("lookup", {"order_id": "A1", "block": True})]),
    actors.ScriptedTurn(text="Your order shipped."),
]
manual = build(BLOCKING_CALL, recovery="manual")
safe = build(BLOCKING_CALL, recovery="safe")
idempotent = build(BLOCKING_CALL, recovery="idempotent")
report = build(BLOCKING_CALL, recovery="report", progress=True)
approving = build(ONE_CALL, approval=True)
version_2 = build(ONE_CALL, version=2)
slow_model = build([actors.ScriptedTurn(text="A slow answer, streamed.", delay_s=0.3)])


class GatedModel:
    """The script, except that every request after the first of a run fails finally (``bad_request``) while the gate
    file does not exist: a run that fails, then succeeds once retried."""

    name = "gated"

    def __init__(self, turns: list[actors.ScriptedTurn]) -> None:
        self.inner = actors.ScriptedModel(turns)

    async def stream(self, request: actors.ModelRequest) -> AsyncIterator[Any]:
        answered = any(isinstance(message, actors.AssistantMessage) for message in request.messages)
        if answered and not Path(os.environ["TETHER_TEST_GATE"]).exists():
            raise actors.ModelError("refused until the gate opens", kind="bad_request")
        async for event in self.inner.stream(request):
            yield event


gated = actors.App("gated")
gated.define_tool("lookup", lookup, description="Look an order up.", parameters=ORDER, recovery="safe")
gated.define_agent("support", version=1, model=GatedModel(ONE_CALL), tools=["lookup"])

STREAMED_ANSWER = "Your order A1 left the warehouse on Monday and should arrive by Thursday; tracking follows."
"""The answer of ``streaming`` / ``streaming_cut``: 92 characters, 4 to a chunk, every 40 ms (about 1 s)."""


class RecordedModel:
    """``inner``, each request recorded first (:func:`record_request`)."""

    def __init__(self, inner: actors.Model) -> None:
        self.inner = inner
        self.name = inner.name

    async def stream(self, request: actors.ModelRequest) -> AsyncIterator[Any]:
        record_request(request)
        async for event in self.inner.stream(request):
            yield event


def build_streaming(
    *, cut_after_chars: int | None = None, delay_s: float = 0.04, recorded: bool = False, attempts: int = 3
) -> actors.App:
    """An agent whose model streams ``STREAMED_ANSWER`` slowly (partial output every 100 ms, the default); with
    ``cut_after_chars``, its first attempt is cut there (a retryable ``cut_stream``); ``recorded``: its requests are
    recorded (:func:`read_requests`); ``attempts``: its model retry's."""
    app = actors.App("streaming")
    turn = actors.ScriptedTurn(
        text=STREAMED_ANSWER,
        chunk_chars=4,
        delay_s=delay_s,
        cut_after_chars=cut_after_chars,
        fail_attempts=1 if cut_after_chars is not None else 0,
    )
    model: actors.Model = actors.ScriptedModel([turn])
    app.define_agent(
        "support",
        version=1,
        model=RecordedModel(model) if recorded else model,
        model_retry=actors.Retry(attempts=attempts, first_delay_ms=1000, max_delay_ms=10_000),
    )
    return app


streaming = build_streaming()
streaming_slow = build_streaming(delay_s=0.25)
"""About 6 s for the answer: a worker process killed mid-stream (tests/faults/test_partials_faults.py)."""
streaming_slow_recorded = build_streaming(delay_s=0.25, recorded=True)
"""``streaming_slow``, its requests recorded (tests/faults/test_aborted_answer_faults.py)."""
streaming_slow_once = build_streaming(delay_s=0.25, attempts=1)
"""``streaming_slow`` with one model attempt: cut off, the run ends (tests/faults/test_aborted_answer_faults.py)."""


def record_request(request: actors.ModelRequest) -> None:
    """Append the request's messages (``{"role", ...}`` each) as one JSON line to the ledger's ``.requests`` file
    (beside ``TETHER_TEST_LEDGER``): what the model was sent, read by a test in any process (:func:`read_requests`)."""
    ledger = os.environ.get("TETHER_TEST_LEDGER")
    if ledger is None:
        return
    messages = [{"role": message.role, **attrs.asdict(message)} for message in request.messages]
    line = {"turn": request.turn, "attempt": request.attempt, "messages": messages}
    with open(ledger + ".requests", "a", encoding="utf-8") as file:
        file.write(json.dumps(line, sort_keys=True) + "\n")


def read_requests(ledger: str | Path) -> list[dict[str, Any]]:
    """The requests :func:`record_request` wrote beside ``ledger``, oldest first."""
    return read_ledger(str(ledger) + ".requests")


CUT_OFF_TEXT = "Let me look that up"
"""What ``cut_off`` says before its call is cut off."""
AFTER_CUT_OFF = "I was cut off before I could look it up; please ask again."


class CutOffModel:
    """Answers a context that ends in tool results with :data:`AFTER_CUT_OFF`; any other with a call of ``lookup``
    cut off at the output limit (finish reason ``length``). Every request is recorded (:func:`record_request`)."""

    name = "cut_off"

    def __init__(self) -> None:
        call = [("lookup", {"order_id": "A1"})]
        self.cut = actors.ScriptedModel(
            [actors.ScriptedTurn(text=CUT_OFF_TEXT, tool_calls=call, finish_reason="length")]
        )
        self.after = actors.ScriptedModel([actors.ScriptedTurn(text=AFTER_CUT_OFF)])

    async def stream(self, request: actors.ModelRequest) -> AsyncIterator[Any]:
        record_request(request)
        answered = bool(request.messages) and isinstance(request.messages[-1], actors.ToolMessage)
        async for event in (self.after if answered else self.cut).stream(attrs.evolve(request, turn=1)):
            yield event


cut_off = actors.App("cut_off")
cut_off.define_tool("lookup", lookup, description="Look an order up.", parameters=ORDER, recovery="safe")
cut_off.define_agent("support", version=1, model=CutOffModel(), tools=["lookup"])

cut_off_schema = actors.App("cut_off_schema")
"""``cut_off`` with an ``output_schema`` its cut-off answer cannot meet: the run fails ``invalid_output``."""
cut_off_schema.define_tool("lookup", lookup, description="Look an order up.", parameters=ORDER, recovery="safe")
cut_off_schema.define_agent(
    "support",
    version=1,
    model=CutOffModel(),
    tools=["lookup"],
    output_schema={"type": "object", "properties": {"status": {"type": "string"}}, "required": ["status"]},
)

uncallable = actors.App("uncallable")
"""Turn 1 calls a tool the agent lacks and ``lookup`` with arguments that are not JSON; turn 2 fails, not retryably
(``model_error``): a retry of the run goes on from turn 1's committed answer, whose error results it wrote."""
uncallable.define_tool("lookup", lookup, description="Look an order up.", parameters=ORDER, recovery="safe")
uncallable.define_agent(
    "support",
    version=1,
    model=actors.ScriptedModel(
        [
            actors.ScriptedTurn(tool_calls=[("nosuch", {}), ("lookup", "{not json")]),
            actors.ScriptedTurn(text="never", error="invalid_request", fail_attempts=99),
        ]
    ),
    tools=["lookup"],
)

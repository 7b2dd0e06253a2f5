"""Agent apps for ``tests/faults/test_run_owner_kills.py`` (served in the test's process with ``actors.serve``).

The tool apps are ``tests.integration._agent_apps``'s (a ``lookup`` tool that appends a line per execution to the
ledger ``TETHER_TEST_LEDGER`` and blocks while the file ``TETHER_TEST_GATE`` does not exist). ``streaming`` is an
agent whose model appends a line to the same ledger per request (``{"tool": "model", "attempt": n}``), streams its
first chunk and then blocks on the gate: a test kills the owner while the stream is open.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

import actors
from tests.integration._agent_apps import BLOCKING_CALL, build


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

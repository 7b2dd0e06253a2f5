"""Agent apps for ``tests/integration/test_inbox.py``, served in the test's process: a scripted model that records
the user messages of every request it answers, so a test sees what the model was asked."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import actors
from tests.integration._agent_apps import ORDER, lookup


class RecordingModel:
    """``actors.ScriptedModel(turns)``, noting each request's turn and user messages in :attr:`asked`."""

    name = "recording"

    def __init__(self, turns: list[actors.ScriptedTurn]) -> None:
        self.inner = actors.ScriptedModel(turns)
        self.asked: list[tuple[int | None, list[str]]] = []
        self.prepared: list[tuple[str, list[str]]] = []
        """Each request's instructions and the tools it offered."""

    async def stream(self, request: actors.ModelRequest) -> AsyncIterator[Any]:
        users = [message.text for message in request.messages if isinstance(message, actors.UserMessage)]
        self.asked.append((request.turn, users))
        self.prepared.append((request.instructions, [tool.name for tool in request.tools]))
        async for event in self.inner.stream(request):
            yield event


def build(turns: list[actors.ScriptedTurn]) -> tuple[actors.App, RecordingModel]:
    model = RecordingModel(turns)
    app = actors.App("inbox")
    app.define_tool("lookup", lookup, description="Look an order up.", parameters=ORDER, recovery="safe")
    app.define_tool("track", lookup, description="Track an order.", parameters=ORDER, recovery="safe")
    app.define_agent("support", version=1, model=model, tools=["lookup"], instructions="Be helpful.")
    return app, model


class GatedModel(RecordingModel):
    """A :class:`RecordingModel` whose every request fails finally (``bad_request``) while the gate file
    (``TETHER_TEST_GATE``) does not exist: a run that fails, then answers once continued."""

    async def stream(self, request: actors.ModelRequest) -> AsyncIterator[Any]:
        if not Path(os.environ["TETHER_TEST_GATE"]).exists():
            self.asked.append((request.turn, []))
            raise actors.ModelError("refused until the gate opens", kind="bad_request")
        async for event in super().stream(request):
            yield event


def build_gated(turns: list[actors.ScriptedTurn]) -> tuple[actors.App, GatedModel]:
    model = GatedModel(turns)
    app = actors.App("inbox-gated")
    app.define_agent("support", version=1, model=model)
    return app, model


def build_with_models(
    turns: list[actors.ScriptedTurn], fast_turns: list[actors.ScriptedTurn]
) -> tuple[actors.App, actors.App, RecordingModel]:
    """Two apps of the same agent: ``plain`` with the agent's model only, and ``fast``, which also names a model
    ``fast`` (returned) that a conversation may be configured to use."""
    plain, _ = build(turns)
    fast, _ = build(turns)
    fast_model = RecordingModel(fast_turns)
    fast_model.name = "fast-model"
    fast.define_model("fast", fast_model)
    return plain, fast, fast_model

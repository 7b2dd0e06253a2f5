"""An agent on a real-model adapter for the end-to-end test of ``actors.OpenAIChat`` under ``tether up``
(``--app tests.integration._openai_apps:app``). The model's server is found the way users find theirs: from
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` in the worker's environment (the test points them at its replay server).
Its tool records each execution in the ledger of ``tests/integration/_agent_apps.py`` (``TETHER_TEST_LEDGER``)."""

from __future__ import annotations

import actors
from tests.integration._agent_apps import ORDER, lookup

app = actors.App("openai")
app.define_tool("lookup", lookup, description="Look an order up.", parameters=ORDER, recovery="safe")
app.define_agent(
    "support",
    version=1,
    model=actors.OpenAIChat("gpt-4o-mini"),
    instructions="You look orders up.",
    tools=["lookup"],
    model_retry=actors.Retry(attempts=3, first_delay_ms=1000, max_delay_ms=10_000),
)

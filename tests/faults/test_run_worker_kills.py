"""SIGKILL of a WORKER at the points of a run's journal that tests/integration/test_agents.py does not cover (it
kills a worker mid-tool and mid-stream): before a tool call's intent, and after a tool's result is committed, when
the run's next model request starts. The worker process kills itself there once (``tests/faults/_run_apps.py``);
a worker served in this process then takes the run over.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import pytest
import trio

import actors
from protocol import new_id
from runtime import stop_gracefully, tether_command
from tests.conftest import OwnerProcess
from tests.faults import _run_apps
from tests.integration._agent_apps import read_ledger
from tests.integration._up_helpers import CHILD_ENV, ROOT

TIMEOUT_S: Final = 60
POLL_S: Final = 0.02


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("TETHER_TEST_LEDGER", str(path))
    monkeypatch.setenv("TETHER_TEST_GATE", str(tmp_path / "gate"))
    return path


@contextlib.asynccontextmanager
async def worker_process(db: str, attribute: str, ledger: Path) -> AsyncIterator[trio.Process]:
    """``tether worker --app tests.faults._run_apps:ATTRIBUTE`` with the test's ledger and gate; reaped."""
    command = tether_command("worker", "--db", db, "--app", f"tests.faults._run_apps:{attribute}")
    env = {**CHILD_ENV, "TETHER_TEST_LEDGER": str(ledger), "TETHER_TEST_GATE": os.environ["TETHER_TEST_GATE"]}
    process = await trio.lowlevel.open_process(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    try:
        yield process
    finally:
        await stop_gracefully(process)


@contextlib.asynccontextmanager
async def serving(db: str, app: actors.App) -> AsyncIterator[None]:
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def run(*, task_status: trio.TaskStatus[Any]) -> None:
            with scope:
                await actors.serve(app, db=db, name="second", task_status=task_status)

        await nursery.start(run)
        try:
            yield
        finally:
            scope.cancel()


async def start_run(client: actors.Client) -> tuple[str, str]:
    conversation_id = await client.create_conversation(agent="support")
    submission = await client.submit(conversation_id, kind="input", payload="Where?", request_id=new_id())
    assert submission.run_id is not None
    return conversation_id, submission.run_id


async def run_in(client: actors.Client, run_id: str, status: str) -> None:
    while True:
        if (await client.run(run_id)).status == status:
            return
        await trio.sleep(POLL_S)


@pytest.mark.parametrize("policy", ["manual", "safe", "idempotent"])
async def test_worker_killed_before_a_tool_intent_runs_it_once_under_every_policy(
    owner: OwnerProcess, ledger: Path, policy: str
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(owner.db) as client:
            async with worker_process(owner.db, f"{policy}_dies_before_intent", ledger) as process:
                conversation_id, run_id = await start_run(client)
                assert await process.wait() == -signal.SIGKILL
            # No intent was stored: nothing is interrupted, a manual tool does not stop the run.
            ops = await client.operations(run_id)
            assert [(op.kind, op.status) for op in ops] == [("model", "completed")]
            assert read_ledger(ledger) == []
            async with serving(owner.db, getattr(_run_apps, f"{policy}_dies_before_intent")):
                run = await client.wait_for_run(run_id)
            ops = await client.operations(run_id)
            entries = await client.entries(conversation_id)
    assert run.status == "completed"
    [execution] = read_ledger(ledger)
    tool = ops[1]
    assert (tool.kind, tool.status, tool.attempt, tool.policy) == ("tool", "completed", 1, policy)
    assert execution["operation_id"] == tool.operation_id and execution["attempt"] == 1
    assert [entry.kind for entry in entries] == [
        "tether.user",
        "tether.assistant",
        "tether.tool_result",
        "tether.assistant",
    ]


@pytest.mark.parametrize("policy", ["manual", "safe", "idempotent"])
async def test_worker_killed_after_a_tool_result_never_runs_it_again(
    manual_owner: OwnerProcess, ledger: Path, policy: str
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(manual_owner.db) as client:
            async with worker_process(manual_owner.db, f"{policy}_dies_after_tool_result", ledger) as process:
                conversation_id, run_id = await start_run(client)
                assert await process.wait() == -signal.SIGKILL
            # The second model request was cut off: a failed attempt, retried after its back-off.
            await run_in(client, run_id, "retry_wait")
            _, tool, model_second = await client.operations(run_id)
            assert (tool.status, tool.attempt) == ("completed", 1)
            assert (model_second.status, model_second.attempt) == ("interrupted", 1)
            async with serving(manual_owner.db, getattr(_run_apps, f"{policy}_dies_after_tool_result")):
                await client.advance_clock(1000)
                run = await client.wait_for_run(run_id)
            ops = await client.operations(run_id)
            entries = await client.entries(conversation_id)
    assert run.status == "completed" and run.answer is not None and run.answer.text == "Your order shipped."
    assert len(read_ledger(ledger)) == 1  # the committed result was reused, under every policy
    assert [(op.kind, op.status, op.attempt) for op in ops] == [
        ("model", "completed", 1),
        ("tool", "completed", 1),
        ("model", "completed", 2),
    ]
    assert [entry.kind for entry in entries] == [
        "tether.user",
        "tether.assistant",
        "tether.tool_result",
        "tether.assistant",
    ]

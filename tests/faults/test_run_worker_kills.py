"""SIGKILL of a WORKER at the points of a run's journal that tests/integration/test_agents.py does not cover (it
kills a worker mid-tool and mid-stream): before a tool call's intent (for a safe or idempotent call, in the run's
turn, before the model result's commit that carries it), and after a tool's result is committed, when
the run's next model request starts (also after a tool's handoff: its reset is placed once); and mid-request in a
configured conversation whose configuration changes before the request is tried again (the retry runs with what the
intent recorded). The worker process kills itself there once (``tests/faults/_run_apps.py``); a worker served in this
process then takes the run over.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Final

import pytest
import trio

import actors
from actors.testing import WorkerKill, WorkerProcess
from tests.conftest import OwnerProcess
from tests.faults import _run_apps
from tests.integration._agent_apps import read_ledger
from tests.integration._agent_helpers import ledger, run_in, served, start_run, worker_process
from tests.integration._up_helpers import ROOT

__all__ = ["ledger"]  # the fixture

TIMEOUT_S: Final = 60
RUN_APPS: Final = "tests.faults._run_apps"


async def killed_at_its_point(client: actors.Client, db: str, attribute: str, ledger: Path) -> tuple[str, str]:
    """Start a run for a ``tether worker`` serving ``tests.faults._run_apps:ATTRIBUTE``, which kills itself at its
    point of the run: (conversation id, run id) once it is dead (its exit status checked)."""
    async with worker_process(db, attribute, ledger, module=RUN_APPS) as process:
        ids = await start_run(client, "Where?")
        assert await process.wait() == -signal.SIGKILL
    return ids


@pytest.mark.parametrize("policy", ["manual", "safe", "idempotent"])
async def test_worker_killed_before_a_tool_intent_runs_it_once_under_every_policy(
    owner: OwnerProcess, ledger: Path, policy: str
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(owner.db) as client:
            attribute = f"{policy}_dies_before_intent"
            conversation_id, run_id = await killed_at_its_point(client, owner.db, attribute, ledger)
            ops = await client.operations(run_id)
            if policy == "manual":
                # No intent was stored: nothing is interrupted, a manual tool does not stop the run.
                assert [(op.kind, op.status) for op in ops] == [("model", "completed")]
            else:
                # A safe or idempotent call's intent goes in the model result's commit, so its needs_approval runs in
                # the run's turn, before that commit: the model request is cut off (once the owner saw the worker
                # go), and is tried again.
                while [(op.kind, op.status) for op in ops] == [("model", "started")]:
                    await trio.sleep(0.02)
                    ops = await client.operations(run_id)
                assert [(op.kind, op.status) for op in ops] == [("model", "interrupted")]
            assert read_ledger(ledger) == []
            async with served(owner.db, getattr(_run_apps, attribute), name="second"):
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
            attribute = f"{policy}_dies_after_tool_result"
            conversation_id, run_id = await killed_at_its_point(client, manual_owner.db, attribute, ledger)
            # The second model request was cut off: a failed attempt, retried after its back-off.
            await run_in(client, run_id, "retry_wait")
            _, tool, model_second = await client.operations(run_id)
            assert (tool.status, tool.attempt) == ("completed", 1)
            assert (model_second.status, model_second.attempt) == ("interrupted", 1)
            async with served(manual_owner.db, getattr(_run_apps, attribute), name="second"):
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


async def test_worker_killed_mid_request_the_retry_runs_with_the_configuration_its_intent_recorded(
    manual_owner: OwnerProcess, ledger: Path
) -> None:
    db = manual_owner.db
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(db) as client:
            conversation_id = await client.create_conversation(agent="support")
            await client.configure(conversation_id, model="fast", instructions="First.", force=True)  # no worker yet
            async with worker_process(db, "configured", ledger, module=RUN_APPS) as process:
                own = await client.submit(conversation_id, kind="input", payload="Hi?")
                assert await process.wait() == -signal.SIGKILL
            assert own.run_id is not None
            await run_in(client, own.run_id, "retry_wait")
            # Changed while the turn's request waits to be tried again: the retry must not see it...
            await client.configure(conversation_id, instructions="Second.")
            async with served(db, _run_apps.configured_dies_mid_request(), name="second"):
                await client.advance_clock(1000)
                run = await client.wait_for_run(own.run_id)
                assert run.status == "completed"
                # ... the next turn boundary does (here: the next run's first request).
                later = await client.submit(conversation_id, kind="input", payload="And now?")
                assert later.run_id is not None
                assert (await client.wait_for_run(later.run_id)).status == "completed"
            [request] = await client.operations(own.run_id)  # one model request: attempt 1 cut off, 2 answered
    asked = [(line["model"], line["instructions"], line["attempt"]) for line in read_ledger(ledger)]
    assert asked == [("fast-model", "First.", 1), ("fast-model", "First.", 2), ("fast-model", "Second.", 1)]
    assert request.arguments == {"configuration": {"version": 1, "value": {"model": "fast", "instructions": "First."}}}
    assert (request.kind, request.status, request.attempt) == ("model", "completed", 2)


async def test_worker_killed_after_a_handoff_was_placed_places_it_once_and_the_run_goes_on_from_it(
    manual_owner: OwnerProcess, ledger: Path
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(manual_owner.db) as client:
            conversation_id, run_id = await killed_at_its_point(client, manual_owner.db, "handoff_dies", ledger)
            # Killed once the run placed the handoff and committed its next request's intent: that request is a
            # failed attempt, and the run's tools phase runs again after its back-off.
            await run_in(client, run_id, "retry_wait")
            placed = await client.entries(conversation_id)
            async with served(manual_owner.db, _run_apps.handoff_dies, name="second"):
                await client.advance_clock(1000)
                run = await client.wait_for_run(run_id)
            ops = await client.operations(run_id)
            entries = await client.entries(conversation_id)
    assert [entry.kind for entry in placed] == ["tether.user", "tether.assistant", "tether.tool_result", "tether.reset"]
    assert run.status == "completed" and run.answer is not None and run.answer.text == "B2 ships tomorrow."
    assert [entry.kind for entry in entries] == [
        "tether.user",
        "tether.assistant",
        "tether.tool_result",
        "tether.reset",  # once: the phase run again found it placed
        "tether.assistant",
    ]
    assert entries[3] == placed[3]
    reset = entries[3].data
    assert isinstance(reset, dict) and (reset["handoff"], reset["run_id"]) == (_run_apps.HANDOFF, run_id)
    assert [(op.kind, op.status, op.attempt) for op in ops] == [
        ("model", "completed", 1),
        ("tool", "completed", 1),
        ("model", "completed", 2),
    ]
    lines = read_ledger(ledger)
    assert [line["tool"] for line in lines] == ["model", "hand_off", "model", "model"]  # the tool ran once
    # Both attempts of the second request started from the handoff text.
    assert [(line["turn"], line["first"]) for line in lines if line["tool"] == "model"] == [
        (1, "Where?"),
        (2, _run_apps.HANDOFF),
        (2, _run_apps.HANDOFF),
    ]


async def test_a_safe_call_killed_at_its_restart_limit_ends_with_a_restart_limit_error_the_model_reads(
    owner: OwnerProcess, ledger: Path
) -> None:
    """The tool's ``restart_limit=2``: its worker SIGKILLed as the call starts, twice (each time a worker process of
    its own); then the call is not run again, it ends with an error result coded ``restart_limit``, and the run goes
    on: the model reads it and answers."""
    kill = WorkerKill("after_intent", kind="tool", name="lookup")
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(owner.db) as client:
            for attempt in (1, 2):
                async with WorkerProcess(owner.db, f"{RUN_APPS}:restart_limited_app", kill=kill, cwd=ROOT) as worker:
                    if attempt == 1:
                        conversation_id, run_id = await start_run(client, "Where?")
                    await worker.killed()
                [_, call] = await client.operations(run_id)
                while call.status == "started":  # until the owner sees the worker gone: the call cut off
                    await trio.sleep(0.02)
                    [_, call] = await client.operations(run_id)
            assert (call.status, call.code, call.attempt) == ("failed", "restart_limit", 2)  # not run a third time
            async with served(owner.db, _run_apps.restart_limited_app, name="finisher"):
                run = await client.wait_for_run(run_id)
            entries = await client.entries(conversation_id)
    assert read_ledger(ledger) == []  # the handler never ran: each worker died as it would have started
    assert (run.status, run.answer.text if run.answer else None) == ("completed", "Your order shipped.")
    assert [entry.kind for entry in entries] == [
        "tether.user",
        "tether.assistant",
        "tether.tool_result",
        "tether.assistant",  # the model read the error and answered: the run went on
    ]
    result = entries[2].data
    assert isinstance(result, dict) and (result["is_error"], result["code"]) == (True, "restart_limit"), result
    assert "cut off 2 times (the restart limit is 2)" in str(result["content"])

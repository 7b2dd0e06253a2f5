"""SIGKILL of a worker or of the owner while a tool acts (docs/agents.md, "Questions", "Tools calling tools",
"Subagents"): the ``refund`` tool of ``tests/faults/_acting_apps.py`` looks an order up with a nested call, asks a
person, and pays out with another nested call; the ``research`` tool runs a subagent (in the foreground or the
background). Whatever dies, and wherever: no nested call runs twice (a ``manual`` one cut off stops the run for a
person, whose output its caller reads), no question is asked twice, the answer given once is the one the tool goes on
with, and no subagent gets a second conversation or run.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Final

import pytest
import trio

import actors
from tests.conftest import OwnerProcess
from tests.faults import _acting_apps
from tests.integration._agent_apps import read_ledger
from tests.integration._agent_helpers import ledger, served, start_run, worker_process

__all__ = ["ledger"]  # the fixture

TIMEOUT_S: Final = 60
POLL_S: Final = 0.02
APPS: Final = "tests.faults._acting_apps"


async def open_question(client: actors.Client, run_id: str) -> actors.InteractionRecord:
    while True:
        found = await client.interactions(status="open", run_id=run_id)
        if found:
            [question] = found
            return question
        await trio.sleep(POLL_S)


async def ledger_has(path: Path, tool: str) -> None:
    while not any(line["tool"] == tool for line in read_ledger(path)):  # noqa: ASYNC110 (another process writes it)
        await trio.sleep(POLL_S)


def executions(path: Path) -> list[tuple[str, int]]:
    return [(line["tool"], line["attempt"]) for line in read_ledger(path)]


async def finished(client: actors.Client, conversation_id: str, run_id: str) -> actors.RunRecord:
    run = await client.wait_for_run(run_id)
    entries = await client.entries(conversation_id)
    [result] = [entry.data for entry in entries if entry.kind == "tether.tool_result"]
    assert isinstance(result, dict) and result["content"] == "refunded 20.0 EUR", result
    [question] = await client.interactions(status=None, run_id=run_id)  # asked once
    assert question.status == "answered" and question.answer is not None and question.answer.value is False
    return run


async def test_a_caller_killed_while_its_nested_call_runs_reattaches_and_the_nested_call_runs_once(
    owner: OwnerProcess, ledger: Path
) -> None:
    gate = Path(str(ledger)).with_name("gate")
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(owner.db) as client, served(owner.db, _acting_apps.children_app, name="children"):
            async with worker_process(owner.db, "caller_app", ledger, module=APPS) as process:
                conversation_id, run_id = await start_run(client, "Refund A1")
                await ledger_has(ledger, "look_up_order")  # its intent is committed; it waits for the gate
                process.kill()
                assert await process.wait() == -signal.SIGKILL
            while (ops := {op.name: op for op in await client.operations(run_id)})["refund"].status == "started":  # noqa: ASYNC110
                await trio.sleep(POLL_S)  # until the owner sees the worker gone: its phase cut off
            assert (ops["refund"].status, ops["look_up_order"].status) == ("interrupted", "started")
            async with served(owner.db, _acting_apps.caller_app, name="callers"):
                gate.touch()  # the nested call, never cut off, finishes in its own worker
                question = await open_question(client, run_id)
                await client.respond(question.interaction_id, answer=False)
                run = await finished(client, conversation_id, run_id)
            ops = {op.name: op for op in await client.operations(run_id)}
    assert run.status == "completed"
    # refund ran twice (safe: its first run was cut off); the nested calls once each, the lookup in its first attempt.
    assert sorted(executions(ledger)) == [("look_up_order", 1), ("pay_out", 1), ("refund", 1), ("refund", 2)]
    assert (ops["look_up_order"].attempt, ops["look_up_order"].parent_operation_id) == (1, ops["refund"].operation_id)


@pytest.mark.parametrize("answered", ["while_down", "after_restart"])
async def test_a_question_open_when_its_worker_is_killed_is_asked_once_and_its_answer_used(
    owner: OwnerProcess, ledger: Path, answered: str
) -> None:
    Path(str(ledger)).with_name("gate").touch()
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(owner.db) as client:
            async with worker_process(owner.db, "full_app", ledger, module=APPS) as process:
                conversation_id, run_id = await start_run(client, "Refund A1")
                question = await open_question(client, run_id)
                process.kill()
                assert await process.wait() == -signal.SIGKILL
            if answered == "while_down":
                await client.respond(question.interaction_id, answer=False)
            async with served(owner.db, _acting_apps.full_app, name="second"):
                if answered == "after_restart":
                    again = await open_question(client, run_id)
                    assert again == question  # the re-run asked nothing new
                    await client.respond(question.interaction_id, answer=False)
                run = await finished(client, conversation_id, run_id)
    assert run.status == "completed"
    # The nested lookup completed before the kill: its committed result was read again, never re-run.
    assert sorted(executions(ledger)) == [("look_up_order", 1), ("pay_out", 1), ("refund", 1), ("refund", 2)]


async def test_a_question_open_when_the_owner_is_killed_is_asked_once_and_answered_after_its_restart(
    owner: OwnerProcess, ledger: Path
) -> None:
    Path(str(ledger)).with_name("gate").touch()
    with trio.fail_after(TIMEOUT_S):
        async with served(owner.db, _acting_apps.full_app, name="tools"):
            async with actors.connect(owner.db) as client:
                conversation_id, run_id = await start_run(client, "Refund A1")
                question = await open_question(client, run_id)
            assert await owner.kill() == -signal.SIGKILL
            await owner.start()
            async with actors.connect(owner.db) as client:
                again = await open_question(client, run_id)
                assert again.interaction_id == question.interaction_id
                await client.respond(question.interaction_id, answer=False)
                run = await finished(client, conversation_id, run_id)
    assert run.status == "completed"
    lines = executions(ledger)
    assert lines.count(("look_up_order", 1)) == 1 and lines.count(("pay_out", 1)) == 1  # each nested call once
    assert ("refund", 1) in lines and all(tool != "look_up_order" or attempt == 1 for tool, attempt in lines)


@pytest.mark.parametrize("attribute", ["research_app", "background_research_app"])
async def test_a_subagent_whose_worker_is_killed_mid_run_goes_on_with_no_second_conversation_nor_run(
    owner: OwnerProcess, ledger: Path, attribute: str
) -> None:
    gate = Path(str(ledger)).with_name("gate")
    background = attribute == "background_research_app"
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(owner.db) as client:
            async with worker_process(owner.db, attribute, ledger, module=APPS) as process:
                conversation_id, run_id = await start_run(client, "Where is A1?")
                await ledger_has(ledger, "lookup")  # the subagent's run is in its tool round
                process.kill()
                assert await process.wait() == -signal.SIGKILL
            async with served(owner.db, getattr(_acting_apps, attribute), name="second"):
                gate.touch()
                run = await client.wait_for_run(run_id)
                entries = await client.entries(conversation_id)
                [result] = [entry.data for entry in entries if entry.kind == "tether.tool_result"]
                [call] = [op for op in await client.operations(run_id) if op.kind == "tool"]
                assert isinstance(result, dict) and isinstance(call.structured, dict), (result, call)
                child_id = str(call.structured["conversation_id"])
                if background:  # the caller answered at once; the subagent's task ends with its answer
                    anchor = await client.wait_for_task(str(call.structured["task_id"]))
                    assert anchor.outcome is not None and anchor.outcome.status == "completed"
                    assert isinstance(anchor.outcome.result, dict) and anchor.outcome.result["answer"] == "A1 shipped."
                else:
                    assert result["content"] == "A1 shipped."
                child_runs = await client.runs(conversation_id=child_id)
                graph = await client.task_graph()
    assert run.status == "completed"
    assert [(one.agent, one.status) for one in child_runs] == [("researcher", "completed")]  # one run, no second
    assert not graph.nodes  # nothing left live
    # The subagent's lookup, cut off, ran again once (safe); no second subagent ran it.
    assert sorted(executions(ledger)) == [("lookup", 1), ("lookup", 2)]


async def test_the_owner_killed_while_a_nested_manual_call_runs_stops_the_run_for_a_person_and_the_caller_reads_it(
    owner: OwnerProcess, ledger: Path
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with served(owner.db, _acting_apps.full_app, name="tools"):
            async with actors.connect(owner.db) as client:
                conversation_id, run_id = await start_run(client, "Refund A1")
                await ledger_has(
                    ledger, "look_up_order"
                )  # the nested call's intent is committed; it waits for the gate
            assert await owner.kill() == -signal.SIGKILL
            await owner.start()
            async with actors.connect(owner.db) as client:
                # Every phase was cut off: the nested look-up (manual) is not run again, a person settles it.
                while (await client.run(run_id)).status != "needs_attention":  # noqa: ASYNC110
                    await trio.sleep(POLL_S)
                lookup = {op.name: op for op in await client.operations(run_id)}["look_up_order"]
                assert (lookup.status, lookup.policy) == ("interrupted", "manual")
                await client.resolve(lookup.operation_id, {"order_id": "A1", "total": 40}, resolved_by="ops")
                question = await open_question(client, run_id)  # the caller, run again, read the person's output
                await client.respond(question.interaction_id, answer=False)
                run = await finished(client, conversation_id, run_id)
    assert run.status == "completed"
    lines = executions(ledger)
    assert lines.count(("look_up_order", 1)) == 1 and ("look_up_order", 2) not in lines
    assert lines.count(("pay_out", 1)) == 1


async def test_the_owner_killed_while_a_subagent_runs_makes_no_second_conversation_nor_run(
    owner: OwnerProcess, ledger: Path
) -> None:
    gate = Path(str(ledger)).with_name("gate")
    with trio.fail_after(TIMEOUT_S):
        async with served(owner.db, _acting_apps.research_app, name="tools"):
            async with actors.connect(owner.db) as client:
                conversation_id, run_id = await start_run(client, "Where is A1?")
                await ledger_has(ledger, "lookup")  # the subagent's run is in its tool round
            assert await owner.kill() == -signal.SIGKILL
            await owner.start()
            gate.touch()
            async with actors.connect(owner.db) as client:
                run = await client.wait_for_run(run_id)
                entries = await client.entries(conversation_id)
                [result] = [entry.data for entry in entries if entry.kind == "tether.tool_result"]
                [call] = [op for op in await client.operations(run_id) if op.kind == "tool"]
                assert isinstance(result, dict) and isinstance(call.structured, dict), (result, call)
                child_runs = await client.runs(conversation_id=str(call.structured["conversation_id"]))
                researcher_runs = [one for one in await client.runs() if one.agent == "researcher"]
    assert run.status == "completed" and result["content"] == "A1 shipped."
    assert [(one.agent, one.status) for one in child_runs] == [("researcher", "completed")]
    assert len(researcher_runs) == 1  # no second conversation ran the subagent

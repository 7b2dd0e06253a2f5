"""SIGKILL of the OWNER at each point of a run's journal, then a restart on the same database: what the journal, the
transcript and the tools' ledger hold afterwards (docs/runs.md, "Interrupted operations").

The points, for a run whose agent calls one ``lookup`` tool and then answers (``tests/faults/_run_apps.py``):

- ``before_intent``: right after the commit of the model's first result, which creates the tool task: no tool
  intent is stored (``--fault-kill-after-result 1``);
- ``mid_tool``: the tool's intent is committed and its handler runs (blocked on the gate): plain SIGKILL;
- ``result_lost``: the handler returned; the owner dies right before committing its result
  (``--fault-kill-before-result 2``);
- ``result_kept``: right after that commit, before anything else (``--fault-kill-after-result 2``);

and for a model request: killed while the stream is open, before its result commits, after it.

The worker runs in this process (``actors.serve``): it survives the owner's death and reconnects to the next owner,
as a worker under ``tether up`` does. Every owner runs on the manual clock; every process is reaped.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import pytest
import trio

import actors
from protocol import EntryRecord
from tests.conftest import OwnerProcess
from tests.faults._run_apps import streaming_app, tool_app
from tests.integration._agent_apps import read_ledger
from tests.integration._agent_helpers import lease_holder, ledger, run_in, served, start_run

__all__ = ["ledger"]  # the fixture

TIMEOUT_S: Final = 90
POLL_S: Final = 0.02
MANUAL: Final = ("--clock", "manual")
KILL_FLAGS: Final = {
    "before_intent": ("--fault-kill-after-result", "1"),
    "mid_tool": (),
    "result_lost": ("--fault-kill-before-result", "2"),
    "result_kept": ("--fault-kill-after-result", "2"),
    "model_stream": (),
    "model_result_lost": ("--fault-kill-before-result", "1"),
    "model_result_kept": ("--fault-kill-after-result", "1"),
}


@contextlib.asynccontextmanager
async def two_owners(db: str, *kill_flags: str) -> AsyncIterator[tuple[OwnerProcess, OwnerProcess]]:
    """The owner to kill (run with ``kill_flags``) and the one started after it on the same database, both on the
    manual clock; both closed (reaped) at the end of the block."""
    faulty = OwnerProcess(db, *MANUAL, *kill_flags)
    healthy = OwnerProcess(db, *MANUAL)
    try:
        yield faulty, healthy
    finally:
        await faulty.close()
        await healthy.close()


async def until(predicate: Any) -> Any:
    """Poll ``predicate`` (async; the state is another process's) until it returns something truthy."""
    while True:
        found = await predicate()
        if found:
            return found
        await trio.sleep(POLL_S)


def executions(ledger: Path, tool: str = "lookup") -> list[dict[str, Any]]:
    return [line for line in read_ledger(ledger) if line["tool"] == tool]


def calls_and_results(entries: list[EntryRecord]) -> tuple[list[str], list[str]]:
    calls = [c["call_id"] for e in entries if e.kind == "tether.assistant" for c in e.data["tool_calls"]]  # type: ignore[index]
    results = [e.data["call_id"] for e in entries if e.kind == "tether.tool_result"]  # type: ignore[index]
    return calls, results


def no_orphan_result(entries: list[EntryRecord]) -> bool:
    """No result without its call, none twice (a call may still wait for its result while the run is blocked)."""
    calls, results = calls_and_results(entries)
    return len(results) == len(set(results)) and set(results) <= set(calls)


def transcript_whole(entries: list[EntryRecord]) -> bool:
    """Every call has exactly one result and every result its call."""
    calls, results = calls_and_results(entries)
    return sorted(calls) == sorted(results) and len(results) == len(set(results))


async def start_run_in(db: str) -> tuple[str, str]:
    async with actors.connect(db) as client:
        return await start_run(client, "Where?")


async def kill_at(point: str, owner: OwnerProcess, db: str, run_id: str, ledger: Path) -> int:
    """Kill the owner at ``point`` (or wait for its fault flag to): its exit status."""
    if point == "mid_tool":
        await until(lambda: _async(executions(ledger)))  # the handler runs, blocked on the gate
        return await owner.kill()
    if point == "model_stream":
        await until(lambda: _async(executions(ledger, "model")))  # the stream's first chunk is out, then it blocks
        async with actors.connect(db) as client:  # and stored: the cut-off attempt said something

            async def stored() -> bool:
                return any(record.text for record in (await client.partials(run_id=run_id)).partials)

            await until(stored)
        return await owner.kill()
    return await owner.wait()


async def _async(value: Any) -> Any:
    return value


@pytest.mark.parametrize(
    ("policy", "point"),
    [
        ("manual", "before_intent"),
        ("manual", "mid_tool"),
        ("safe", "mid_tool"),
        ("idempotent", "mid_tool"),
        ("manual", "result_lost"),
        ("safe", "result_lost"),
        ("idempotent", "result_lost"),
        ("manual", "result_kept"),
        ("safe", "result_kept"),
        ("idempotent", "result_kept"),
    ],
)
async def test_owner_killed_around_a_tool_call(
    db_path: str, ledger: Path, tmp_path: Path, policy: actors.Recovery, point: str
) -> None:
    gate = tmp_path / "gate"
    if point != "mid_tool":
        gate.touch()  # the handler returns at once: the kill flag picks the point
    async with two_owners(db_path, *KILL_FLAGS[point]) as (faulty, healthy):
        with trio.fail_after(TIMEOUT_S):
            await faulty.start()
            async with served(db_path, tool_app(policy), name="survivor"):
                conversation_id, run_id = await start_run_in(db_path)
                status = await kill_at(point, faulty, db_path, run_id, ledger)
                assert status == -signal.SIGKILL
                ran_before = executions(ledger)
                await healthy.start()
                async with actors.connect(db_path) as client:
                    interrupted = point in ("mid_tool", "result_lost")
                    if interrupted and policy == "manual":
                        run = await run_in(client, run_id, "needs_attention")
                        [first] = ran_before
                        assert (run.reason, run.operation_id) == ("tool_interrupted", first["operation_id"])
                        ops = await client.operations(run_id)
                        assert [(op.kind, op.status, op.attempt) for op in ops] == [
                            ("model", "completed", 1),
                            ("tool", "interrupted", 1),
                        ]
                        assert no_orphan_result(await client.entries(conversation_id))
                        gate.touch()  # a handler still blocked there would return now: it was cancelled
                        output = {"order": "A1", "status": "checked by hand"}
                        resolved = await client.resolve(first["operation_id"], output, resolved_by="ops")
                        assert (resolved.status, resolved.resolved_by) == ("resolved", "ops")
                    else:
                        gate.touch()
                    run = await client.wait_for_run(run_id)
                    ops = await client.operations(run_id)
                    entries = await client.entries(conversation_id)
    assert run.status == "completed" and run.answer is not None
    assert run.answer.text == "Your order shipped."
    assert transcript_whole(entries)
    assert [entry.kind for entry in entries] == [
        "tether.user",
        "tether.assistant",
        "tether.tool_result",
        "tether.assistant",
    ]
    ran = executions(ledger)
    assert {line["operation_id"] for line in ran} == {ops[1].operation_id}
    model_first, tool, model_second = ops
    assert (model_first.status, model_first.attempt) == ("completed", 1)  # the committed model result is reused
    assert (model_second.status, model_second.attempt) == ("completed", 1)
    assert tool.policy == policy  # the stored policy
    [result] = [e for e in entries if e.kind == "tether.tool_result"]
    if point in ("before_intent", "result_kept"):
        # No intent yet, or the result committed: the tool ran exactly once, under every policy.
        assert [line["attempt"] for line in ran] == [1]
        assert (tool.status, tool.attempt) == ("completed", 1)
    elif policy == "manual":
        assert [line["attempt"] for line in ran] == [1]  # never run again: a person resolved it
        assert (tool.status, tool.resolved_by) == ("resolved", "ops")
        assert "checked by hand" in result.data["content"]  # type: ignore[index]
    else:
        # safe: run again once; idempotent: run again under the same operation id (its idempotency key).
        assert [line["attempt"] for line in ran] == [1, 2]
        assert (tool.status, tool.attempt) == ("completed", 2)
        assert result.data["is_error"] is False  # type: ignore[index]


@pytest.mark.parametrize("point", ["model_stream", "model_result_lost", "model_result_kept"])
async def test_owner_killed_around_a_model_request(db_path: str, ledger: Path, tmp_path: Path, point: str) -> None:
    gate = tmp_path / "gate"
    if point != "model_stream":
        gate.touch()
    async with two_owners(db_path, *KILL_FLAGS[point]) as (faulty, healthy):
        with trio.fail_after(TIMEOUT_S):
            await faulty.start()
            async with served(db_path, streaming_app(), name="survivor"):
                conversation_id, run_id = await start_run_in(db_path)
                assert await kill_at(point, faulty, db_path, run_id, ledger) == -signal.SIGKILL
                await healthy.start()
                async with actors.connect(db_path) as client:
                    if point != "model_result_kept":
                        # The interrupted request is a failed attempt: the run waits out its back-off durably.
                        run = await run_in(client, run_id, "retry_wait")
                        [op] = await client.operations(run_id)
                        assert (op.status, op.attempt, op.error) == ("interrupted", 1, "interrupted")
                        assert [e.kind for e in await client.entries(conversation_id)] == ["tether.user"]
                        gate.touch()
                        await client.advance_clock(999)
                        # The advance commits whatever fell due before it answers: no real-time wait is needed.
                        assert (await client.run(run_id)).status == "retry_wait"
                        await client.advance_clock(1)  # the agent's Retry: first_delay_ms=1000
                    run = await client.wait_for_run(run_id)
                    ops = await client.operations(run_id)
                    entries = await client.entries(conversation_id)
    assert run.status == "completed" and run.answer is not None
    assert run.answer.text == "A streamed answer."
    kinds = [entry.kind for entry in entries]
    if point == "model_result_kept":
        assert kinds == ["tether.user", "tether.assistant"]
    else:
        # What the cut-off attempt had stored of its text is kept, marked, before the answer of the attempt that
        # replaced it: always mid-stream (the kill waits for a stored piece); with its result lost, only if a piece
        # was stored before the result's commit (a short answer may ride in that commit whole).
        if point == "model_stream" or len(kinds) == 3:
            assert kinds == ["tether.user", "tether.aborted_answer", "tether.assistant"]
            data = entries[1].data
            assert isinstance(data, dict) and (data["attempt"], data["ended"]) == (1, "interrupted")
            assert data["text"] and "A streamed answer.".startswith(data["text"])
        else:
            assert kinds == ["tether.user", "tether.assistant"]
    [op] = ops
    requests = [line["attempt"] for line in executions(ledger, "model")]
    if point == "model_result_kept":
        assert (op.status, op.attempt) == ("completed", 1)
        assert requests == [1]  # the committed result is never asked for again
    else:
        assert (op.status, op.attempt) == ("completed", 2)  # the crash consumed attempt 1
        assert requests == [1, 2]
    assert op.usage is not None and op.usage == run.usage  # counted once


@pytest.mark.parametrize(("stored", "registered"), [("manual", "safe"), ("safe", "manual"), ("idempotent", "manual")])
async def test_the_stored_policy_wins_over_a_new_registration_after_an_owner_kill(
    db_path: str, ledger: Path, tmp_path: Path, stored: actors.Recovery, registered: actors.Recovery
) -> None:
    # The owner dies mid-tool; the tool comes back registered under another policy: the intent's policy decides.
    gate = tmp_path / "gate"
    async with two_owners(db_path) as (faulty, healthy):
        with trio.fail_after(TIMEOUT_S):
            await faulty.start()
            async with served(db_path, tool_app(stored), name="survivor"):
                conversation_id, run_id = await start_run_in(db_path)
                assert await kill_at("mid_tool", faulty, db_path, run_id, ledger) == -signal.SIGKILL
            [first] = executions(ledger)
            await healthy.start()
            gate.touch()
            async with served(db_path, tool_app(registered), name="survivor"), actors.connect(db_path) as client:
                if stored == "manual":
                    run = await run_in(client, run_id, "needs_attention")
                    assert (run.reason, run.operation_id) == ("tool_interrupted", first["operation_id"])
                    # a worker registering the tool as safe is attached (its announcement committed): not leased to it
                    [tool_task] = [op.task_id for op in await client.operations(run_id) if op.kind == "tool"]
                    assert await lease_holder(client, tool_task) is None
                    assert executions(ledger) == [first]
                    await client.resolve(first["operation_id"], {"order": "A1", "status": "by hand"})
                run = await client.wait_for_run(run_id)
                ops = await client.operations(run_id)
                entries = await client.entries(conversation_id)
    assert run.status == "completed" and transcript_whole(entries)
    tool = ops[1]
    assert tool.policy == stored
    if stored == "manual":
        assert executions(ledger) == [first] and tool.status == "resolved"
    else:
        assert [line["attempt"] for line in executions(ledger)] == [1, 2]
        assert (tool.status, tool.attempt) == ("completed", 2)

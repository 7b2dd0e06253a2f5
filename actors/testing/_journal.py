"""Assertions on what a run left in the database: its operation journal in a compact form, a tool call that ran
exactly once, a transcript without a call missing its result, a journal without an operation left open. Each reads
through a :class:`~actors.Client` and fails with ``AssertionError`` saying what it found."""

from __future__ import annotations

from typing import Final

import trio

from protocol import EntryRecord, OperationRecord, RunRecord, RunStatus, new_id

from .._client._client import Client

POLL_S: Final = 0.02
OPEN_STATUSES: Final = frozenset({"started", "interrupted"})
"""An operation in these has no result: its attempt runs, or was cut off and waits (a retry, or a person)."""
CALL_ENTRY: Final = "tether.assistant"
RESULT_ENTRY: Final = "tether.tool_result"

Step = tuple[str, str, str, int]
"""One operation as :func:`journal` shows it: ``(kind, name, status, attempt)``."""


async def journal(client: Client, run_id: str) -> list[Step]:
    """The run's operations, oldest first, as ``(kind, name, status, attempt)``: ``[("model", "scripted",
    "completed", 1), ("tool", "refund", "completed", 2), ...]``; the attempt is the last one started. A checkpoint."""
    return [(op.kind, op.name, op.status, op.attempt) for op in await client.operations(run_id)]


async def assert_ran_once(client: Client, run_id: str, *, tool: str) -> OperationRecord:
    """Assert that the run called ``tool`` exactly once and that call completed at its first attempt: it was never
    started again (by a crash under ``safe`` or ``idempotent``, a retry) nor settled by a person. Returns its
    operation. A checkpoint."""
    ops = [op for op in await client.operations(run_id) if op.kind == "tool" and op.name == tool]
    if len(ops) != 1:
        raise AssertionError(f"run {run_id} called {tool} {len(ops)} times, not once: {await journal(client, run_id)}")
    [op] = ops
    if (op.status, op.attempt) != ("completed", 1):
        raise AssertionError(
            f"run {run_id}'s call of {tool} ({op.operation_id}) is {op.status} at attempt {op.attempt}, not completed "
            f"at its first: {await journal(client, run_id)}"
        )
    return op


def _calls_and_results(entries: list[EntryRecord]) -> tuple[list[str], list[str]]:
    calls = [
        str(call["call_id"])
        for entry in entries
        if entry.kind == CALL_ENTRY and isinstance(entry.data, dict)
        for call in entry.data.get("tool_calls") or ()
    ]
    results = [
        str(entry.data["call_id"]) for entry in entries if entry.kind == RESULT_ENTRY and isinstance(entry.data, dict)
    ]
    return calls, results


async def assert_transcript_whole(client: Client, conversation_id: str) -> list[EntryRecord]:
    """Assert that in the conversation's transcript every tool call the model made has exactly one result and every
    result its call (what a finished run leaves, whatever crashed). Returns the entries. A checkpoint."""
    entries = await client.entries(conversation_id)
    calls, results = _calls_and_results(entries)
    missing = [call for call in calls if call not in results]
    twice = sorted({result for result in results if results.count(result) > 1})
    orphans = [result for result in results if result not in calls]
    if missing or twice or orphans:
        raise AssertionError(
            f"conversation {conversation_id}'s transcript is not whole: calls without a result {missing}, results "
            f"given twice {twice}, results without a call {orphans}; entries: {[entry.kind for entry in entries]}"
        )
    return entries


async def assert_nothing_open(client: Client, run_id: str) -> list[OperationRecord]:
    """Assert that no operation of the run is left open (``started`` or ``interrupted``: every one has its result,
    an error result included, or was resolved). Returns the journal. A checkpoint."""
    ops = await client.operations(run_id)
    left = [(op.kind, op.name, op.status, op.operation_id) for op in ops if op.status in OPEN_STATUSES]
    if left:
        raise AssertionError(f"run {run_id} left operations open: {left}")
    return ops


async def start_run(client: Client, agent: str, text: str) -> tuple[str, str]:
    """A new conversation bound to ``agent``, and ``text`` submitted to it as an input: ``(conversation_id,
    run_id)`` once both are durable. A checkpoint."""
    conversation_id = await client.create_conversation(agent=agent)
    submission = await client.submit(conversation_id, kind="input", payload=text, request_id=new_id())
    assert submission.run_id is not None, "an input to an idle conversation starts a run"
    return conversation_id, submission.run_id


async def wait_for_status(client: Client, run_id: str, *statuses: RunStatus) -> RunRecord:
    """The run's record once its status is one of ``statuses`` (``"retry_wait"``, ``"needs_attention"``, ...),
    read every 20 ms. Unbounded: bound it with ``trio.fail_after``. A checkpoint."""
    while True:
        run = await client.run(run_id)
        if run.status in statuses:
            return run
        await trio.sleep(POLL_S)

"""What a model attempt had streamed before it failed is kept as a ``tether.aborted_answer`` entry, against a real
owner: placed before the answer of the attempt that replaced it, never sent to the model, and shown by ``tether watch
--plain`` as not an answer; an attempt that failed before any text keeps none (docs/agents.md, "Partial output").
A worker killed mid-stream keeps one too: tests/faults/test_aborted_answer_faults.py."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Final

import trio

import actors
from runtime import kill_and_reap, tether_command
from tests.conftest import OwnerProcess
from tests.integration._agent_apps import STREAMED_ANSWER, build, build_streaming, read_requests
from tests.integration._agent_helpers import ledger, run_in, serving, start_run
from tests.integration._up_helpers import CHILD_ENV, ROOT

__all__ = ["ledger"]  # the fixture

TIMEOUT_S: Final = 30
CUT_AT: Final = 40


async def plain_watch_until(db: str, conversation_id: str, last: str) -> list[str]:
    """The lines ``tether watch --plain`` prints for the conversation (each without its seq), up to the first that
    holds ``last``."""
    command = tether_command("watch", "--db", db, "--conversation", conversation_id, "--plain")
    process = await trio.lowlevel.open_process(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT, env=CHILD_ENV
    )
    try:
        assert process.stdout is not None
        buffer = b""
        while last.encode() not in buffer:
            chunk = await process.stdout.receive_some()
            assert chunk, f"tether watch ended before it printed {last!r}: {buffer.decode()!r}"
            buffer += chunk
        return [line.split("] ", 1)[-1] for line in buffer.decode().splitlines()]  # without the "[seq] " prefix
    finally:
        await kill_and_reap(process)


async def test_a_failed_attempts_streamed_text_is_kept_before_the_answer_and_never_sent(
    manual_owner: OwnerProcess, ledger: Path
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with serving(manual_owner.db, build_streaming(cut_after_chars=CUT_AT, recorded=True)) as client:
            conversation_id, run_id = await start_run(client)
            await run_in(client, run_id, "retry_wait")
            # Kept in the commit of the attempt's failure, before the retry.
            kinds = [entry.kind for entry in await client.entries(conversation_id)]
            assert kinds == ["tether.user", "tether.aborted_answer"]
            await client.advance_clock(1000)  # the agent's Retry: first_delay_ms=1000
            run = await client.wait_for_run(run_id)
            assert run.status == "completed" and run.answer is not None and run.answer.text == STREAMED_ANSWER
            entries = await client.entries(conversation_id)
            assert [entry.kind for entry in entries] == ["tether.user", "tether.aborted_answer", "tether.assistant"]
            [op] = await client.operations(run_id)
            assert entries[1].data == {
                "run_id": run_id,
                "turn": 1,
                "operation_id": op.operation_id,
                "attempt": 1,
                "ended": "failed",
                "text": STREAMED_ANSWER[:CUT_AT],
            }
            first, second = read_requests(ledger)
            assert first["messages"] == second["messages"] == [{"role": "user", "text": "Where is my order?"}]

            lines = await plain_watch_until(manual_owner.db, conversation_id, f"assistant: {STREAMED_ANSWER}")
            shown = "assistant (attempt 1, failed; not an answer, never sent to the model): " + STREAMED_ANSWER[:CUT_AT]
            assert shown in lines
            assert lines.index(shown) < lines.index(f"assistant: {STREAMED_ANSWER}")


async def test_an_attempt_that_failed_before_any_text_keeps_no_entry(manual_owner: OwnerProcess, ledger: Path) -> None:
    turns = [actors.ScriptedTurn(text="Fine now.", error="rate_limit", fail_attempts=1)]
    with trio.fail_after(TIMEOUT_S):
        async with serving(manual_owner.db, build(turns)) as client:
            conversation_id, run_id = await start_run(client)
            await run_in(client, run_id, "retry_wait")
            await client.advance_clock(10_000)
            run = await client.wait_for_run(run_id)
            assert run.status == "completed"
            kinds = [entry.kind for entry in await client.entries(conversation_id)]
            assert kinds == ["tether.user", "tether.assistant"]

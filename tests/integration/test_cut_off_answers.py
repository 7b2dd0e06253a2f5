"""An answer cut off at its output limit (finish reason ``length``) with tool calls, against a real owner and a
``tether worker`` process: its calls never run (no tool task, no intent), the context ends in one ``cut_off`` error
result per call, the run completes with its answer, and a continue goes on from those results, the model sent every
call with its result (docs/runs.md, "Continue"; docs/agents.md, "Tool results"). A retried run goes on from such an
answer, and from one whose calls could not run, without writing their results a second time."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pytest
import trio

import actors
from actors import testing
from actors._worker._journal import _derived, tool_operation_id
from actors._worker._messages import CUT_OFF
from tests.conftest import OwnerProcess
from tests.integration import _agent_apps
from tests.integration._agent_apps import AFTER_CUT_OFF, CUT_OFF_TEXT, read_ledger, read_requests
from tests.integration._agent_helpers import ledger, run_in, serving, start_run, worker_process

__all__ = ["ledger"]  # the fixture

TIMEOUT_S: Final = 30


async def test_the_calls_of_an_answer_cut_off_never_run_and_a_continue_answers_their_error_results(
    owner: OwnerProcess, ledger: Path
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(owner.db) as client:
            conversation_id, run_id = await start_run(client)
            async with worker_process(owner.db, "cut_off", ledger):
                run = await client.wait_for_run(run_id)
                assert (run.status, run.reason) == ("completed", None), run
                assert run.answer is not None and run.answer.text == CUT_OFF_TEXT
                user, assistant, result = await client.entries(conversation_id)
                assert (user.kind, assistant.kind, result.kind) == (
                    "tether.user",
                    "tether.assistant",
                    "tether.tool_result",
                )
                assert isinstance(assistant.data, dict) and assistant.data["cut_off"] is True
                [call] = assistant.data["tool_calls"]
                operation_id = tool_operation_id(run_id, 1, call["call_id"])
                assert result.data == {
                    "run_id": run_id,
                    "operation_id": operation_id,
                    "call_id": call["call_id"],
                    "name": "lookup",
                    "content": CUT_OFF,
                    "is_error": True,
                    "code": "cut_off",
                }
                # Never run: no intent in the journal, no tool task, no execution in the handler's ledger.
                [model_request] = await client.operations(run_id)
                assert (model_request.kind, model_request.status) == ("model", "completed")
                assert isinstance(model_request.result, dict) and model_request.result["cut_off"] is True
                with pytest.raises(actors.NotFound):
                    await client.task(_derived(run.task_id, "tool", 1, call["call_id"]))
                with pytest.raises(actors.NotFound):
                    await client.operation(operation_id)
                await testing.assert_transcript_whole(client, conversation_id)  # every call has its result

                resumed = await client.submit(conversation_id, kind="continue")
                assert resumed.run_id is not None
                after = await client.wait_for_run(resumed.run_id)
                assert after.status == "completed" and after.answer is not None
                assert after.answer.text == AFTER_CUT_OFF
            assert read_ledger(ledger) == []  # the handler never ran, not even after the continue
            first, second = read_requests(ledger)
            assert first["messages"] == [{"role": "user", "text": "Where is my order?"}]
            # The continue's request: every call with its result, as an OpenAI-compatible API requires.
            assert second["messages"] == [
                {"role": "user", "text": "Where is my order?"},
                {
                    "role": "assistant",
                    "text": CUT_OFF_TEXT,
                    "tool_calls": [
                        {
                            "call_id": call["call_id"],
                            "name": "lookup",
                            "arguments": {"order_id": "A1"},
                            "invalid_arguments": None,
                        }
                    ],
                },
                {"role": "tool", "call_id": call["call_id"], "content": CUT_OFF, "is_error": True},
            ]
            kinds = [entry.kind for entry in await client.entries(conversation_id)]
            assert kinds == ["tether.user", "tether.assistant", "tether.tool_result", "tether.assistant"]


async def test_a_retried_run_goes_on_from_a_cut_off_answer_without_writing_its_results_again(
    owner: OwnerProcess, ledger: Path
) -> None:
    # The cut-off answer cannot meet the agent's output_schema: the run fails invalid_output, its calls' results
    # written. Its retry goes on from the committed answer: the same decision, no result written twice (which the
    # owner would refuse, faulting the run).
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, _agent_apps.cut_off_schema) as client:
            conversation_id, run_id = await start_run(client)
            failed = await client.wait_for_run(run_id)
            assert (failed.status, failed.reason) == ("failed", "invalid_output"), failed
            kinds = [entry.kind for entry in await client.entries(conversation_id)]
            assert kinds == ["tether.user", "tether.assistant", "tether.tool_result"]
            await client.retry(run_id)
            again = await run_in(client, run_id, "failed", "completed")
            assert (again.status, again.reason) == ("failed", "invalid_output"), again
            assert [entry.kind for entry in await client.entries(conversation_id)] == kinds
        assert read_ledger(ledger) == [] and len(read_requests(ledger)) == 1  # the retry asked the model nothing


async def test_a_retried_run_goes_on_from_an_answer_whose_calls_could_not_run_without_writing_their_results_again(
    owner: OwnerProcess, ledger: Path
) -> None:
    # Turn 1's calls cannot run (a tool the agent lacks, arguments that are not JSON): their error results are
    # written with the answer. Turn 2 fails the run; its retry replays turn 1 from the journal and must not write
    # those results a second time (the owner would refuse their ids, faulting the retried run).
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, _agent_apps.uncallable) as client:
            conversation_id, run_id = await start_run(client)
            failed = await client.wait_for_run(run_id)
            assert (failed.status, failed.reason) == ("failed", "model_error"), failed
            entries = await client.entries(conversation_id)
            codes = [entry.data["code"] for entry in entries if entry.kind == "tether.tool_result"]  # type: ignore[index]
            assert codes == ["unknown_tool", "invalid_arguments"]
            await client.retry(run_id)
            again = await run_in(client, run_id, "failed", "completed")
            assert (again.status, again.reason) == ("failed", "model_error"), again  # turn 2 again, not a fault
            assert [entry.entry_id for entry in await client.entries(conversation_id)] == [
                entry.entry_id for entry in entries
            ]
        assert read_ledger(ledger) == []

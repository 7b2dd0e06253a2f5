"""SIGKILL of the OWNER around the commits that place a steer (docs/runs.md, "The inbox"), then a new owner on the same
database: the steer is placed exactly once, the model sees it once, and it settles with the run's answer.

The points, for a steer queued while the run works:

- ``round_result_lost``: the tool call's result (which ends the tool round, and so places the steer) is never
  committed (``--fault-kill-before-result 2``): the tool runs again (``safe``), and the steer is placed when that
  round ends;
- ``round_result_kept``: killed right after that commit (``--fault-kill-after-result 2``): the steer is placed already;
- ``answer_lost``: the run's answer, which would place the steer after it, is never committed
  (``--fault-kill-before-result 1``): the model is asked again, and that answer places it;
- ``answer_kept``: killed right after the answer's commit, which placed the steer and turned the completion into
  another turn (``--fault-kill-after-result 1``).

The same two points around the tool result for a reset queued during the round: it is placed once, after the
round's result, the run ends there (``reset``), and the follow-up queued behind it runs in the new context only.

The worker runs in this process (it reconnects to the next owner); every process is reaped.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Final

import pytest
import trio

import actors
from tests.conftest import OwnerProcess
from tests.integration._agent_helpers import ledger, run_in, served
from tests.integration._inbox_apps import build
from tests.integration.test_agents import ledger_lines

__all__ = ["ledger"]  # the fixture

TIMEOUT_S: Final = 60
KILL_FLAGS: Final = {
    "round_result_lost": ("--fault-kill-before-result", "2"),
    "round_result_kept": ("--fault-kill-after-result", "2"),
    "answer_lost": ("--fault-kill-before-result", "1"),
    "answer_kept": ("--fault-kill-after-result", "1"),
}
ROUND_TURNS: Final = [
    actors.ScriptedTurn(tool_calls=[("lookup", {"order_id": "A1", "block": True})]),
    actors.ScriptedTurn(text="A1 shipped; pnpm it is."),
]
ANSWER_TURNS: Final = [
    actors.ScriptedTurn(text="A slow first answer.", delay_s=0.4, chunk_chars=4),
    actors.ScriptedTurn(text="And B is fine too."),
]


@pytest.mark.parametrize("point", list(KILL_FLAGS))
async def test_a_steer_is_placed_once_whatever_commit_the_owner_dies_around(
    db_path: str, ledger: Path, tmp_path: Path, point: str
) -> None:
    at_round = point.startswith("round")
    app, model = build(ROUND_TURNS if at_round else ANSWER_TURNS)
    faulty, healthy = OwnerProcess(db_path, *KILL_FLAGS[point]), OwnerProcess(db_path)
    try:
        with trio.fail_after(TIMEOUT_S):
            await faulty.start()
            async with served(db_path, app, name="survivor"), actors.connect(db_path) as client:
                conversation_id = await client.create_conversation(agent="support")
                own = await client.submit(conversation_id, kind="input", payload="Is A fine?")
                assert own.run_id is not None
                if at_round:
                    await ledger_lines(ledger, 1)  # the tool call runs, held at its gate
                else:
                    await run_in(client, own.run_id, "running")  # the answer streams 2 s: the steer comes first
                steer = await client.submit(conversation_id, kind="input", payload="And B?", when_busy="steer")
                assert steer.status == "queued"
                (tmp_path / "gate").touch()
                assert await faulty.wait() == -signal.SIGKILL
                await healthy.start()
                done = await client.wait_for_submission(steer.submission_id)
                run = await client.wait_for_run(own.run_id)
            assert run.status == "completed" and run.answer is not None
            assert (done.status, done.answer, done.run_id) == ("done", run.answer, own.run_id)
            async with actors.connect(db_path, role="reader") as reader:
                entries = await reader.entries(conversation_id)
                assert (await reader.wait_for_submission(own.submission_id)).answer == run.answer
            users = [entry.data["text"] for entry in entries if entry.kind == "tether.user"]  # type: ignore[index]
            assert users == ["Is A fine?", "And B?"]
            # Every request after the steer's placement saw it once; none before did.
            for _, asked in model.asked:
                assert asked in (["Is A fine?"], ["Is A fine?", "And B?"])
            assert model.asked[-1] == (2, ["Is A fine?", "And B?"])
            # The lost answer was asked for again (its turn twice); a kept one was not.
            assert [turn for turn, _ in model.asked] == ([1, 1, 2] if point == "answer_lost" else [1, 2])
            if at_round:
                runs_of_tool = len([line for line in ledger.read_text().splitlines() if line.strip()])
                assert runs_of_tool == (2 if point == "round_result_lost" else 1)
    finally:
        await faulty.close()
        await healthy.close()


@pytest.mark.parametrize("point", ["round_result_lost", "round_result_kept"])
async def test_a_reset_at_a_tool_rounds_end_is_placed_once_whatever_commit_the_owner_dies_around(
    db_path: str, ledger: Path, tmp_path: Path, point: str
) -> None:
    app, model = build(ROUND_TURNS)
    faulty, healthy = OwnerProcess(db_path, *KILL_FLAGS[point]), OwnerProcess(db_path)
    try:
        with trio.fail_after(TIMEOUT_S):
            await faulty.start()
            async with served(db_path, app, name="survivor"), actors.connect(db_path) as client:
                conversation_id = await client.create_conversation(agent="support")
                own = await client.submit(conversation_id, kind="input", payload="Is A fine?")
                assert own.run_id is not None
                await ledger_lines(ledger, 1)  # the tool call runs, held at its gate
                reset = await client.reset(conversation_id, "From here.")
                follow = await client.submit(conversation_id, kind="input", payload="Then B?")
                assert (reset.status, follow.status) == ("queued", "queued")
                (tmp_path / "gate").touch()
                assert await faulty.wait() == -signal.SIGKILL
                await healthy.start()
                ended = await client.wait_for_run(own.run_id)
                assert follow.run_id is not None
                answered = await client.wait_for_run(follow.run_id)
            assert (ended.status, ended.reason) == ("failed", "reset")
            assert answered.status == "completed"
            async with actors.connect(db_path, role="reader") as reader:
                entries = await reader.entries(conversation_id)
                assert (await reader.wait_for_submission(reset.submission_id)).status == "done"
                settled = await reader.wait_for_submission(own.submission_id)
            assert (settled.status, settled.reason) == ("unanswered", "reset")
            kinds = [entry.kind for entry in entries]
            assert kinds.count("tether.reset") == 1
            # The reset follows the round's result; the follow-up's run saw only the new context.
            assert kinds[kinds.index("tether.reset") - 1] == "tether.tool_result"
            assert model.asked[-1][1] == ["From here.", "Then B?"]
            assert all("Is A fine?" not in asked for _, asked in model.asked[1:])  # no request of the first run after
    finally:
        await faulty.close()
        await healthy.close()

"""``tether demo --part agents`` end to end (``tether up``, a worker SIGKILLed mid-tool), and its ledger check;
``tether demo --part research`` (a subagent and a question, a worker SIGKILLed while it is open);
``tether demo --part agent`` (an answer streaming into tether watch's lines) on the scripted model and, with
``--model``, on an OpenAI-compatible server (the loopback replay server of the provider's tests)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Final

import attrs
import pytest
import trio

from actors.testing import openai_server
from actors.testing import sse_body as sse
from actors.testing import stream_reply as stream
from protocol import InteractionAnswer, InteractionRecord, JsonValue, OperationRecord, RunAnswer, RunRecord
from runtime import tether_command
from runtime._cli import main
from runtime._demo_agents import _check
from runtime._demo_research import _check as _check_research
from runtime._demo_stream import _check_run
from runtime.demo_app import TRACKER_ANSWER, Desk
from tests.integration._up_helpers import CHILD_ENV, ROOT, describe, nonblank_lines, run_tether, wait_gone

TIMEOUT_S: Final = 60.0


def desk_lines(path: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


async def test_agents_part(db_path: str) -> None:
    done = await run_tether("demo", "--part", "agents", "--db", db_path, timeout_s=TIMEOUT_S)
    left = await wait_gone(set(), db_path)
    assert not left, describe(left)
    output = "\n".join(nonblank_lines(done.stdout))
    assert done.returncode == 0, output + done.stderr.decode(errors="replace")
    assert "SIGKILL" in output and "tether respond" in output and "tether resolve" in output
    ledger = desk_lines(db_path + ".desk.jsonl")
    lookups = [line for line in ledger if line["op"] == "lookup"]
    refunds = [line for line in ledger if line["op"] == "refund"]
    repeats = [line for line in ledger if line["op"] == "refund_repeat"]
    shipments = [line for line in ledger if line["op"] == "shipment"]
    assert [line["attempt"] for line in lookups] == [1, 2]  # safe: ran again after the kill
    assert len({line["operation_id"] for line in lookups}) == 1
    [refund] = refunds  # idempotent: asked twice under one key, refunded once
    [repeat] = repeats
    assert (refund["attempt"], repeat["attempt"], repeat["key"]) == (1, 2, refund["key"])
    [shipment] = shipments  # manual: never run again, resolved by a person
    assert shipment["attempt"] == 1
    assert not Path(db_path + ".hold").exists()


async def test_research_part(db_path: str) -> None:
    done = await run_tether("demo", "--part", "research", "--db", db_path, timeout_s=TIMEOUT_S)
    left = await wait_gone(set(), db_path)
    assert not left, describe(left)
    output = "\n".join(nonblank_lines(done.stdout))
    assert done.returncode == 0, output + done.stderr.decode(errors="replace")
    assert "SIGKILL" in output and "--answer true" in output and "the researcher's run" in output
    assert "Nothing was asked, run or paid twice, and the run answered." in output
    ledger = desk_lines(db_path + ".desk.jsonl")
    assert [line["op"] for line in ledger] == ["lookup", "refund"]  # the subagent's look-up, the nested refund
    assert ledger[1]["amount"] == 25


def operation(name: str, status: Any, attempt: int, **fields: Any) -> OperationRecord:
    return OperationRecord(
        operation_id=f"op-{name}",
        run_id="run",
        conversation_id="conversation",
        task_id=f"task-{name}",
        kind="tool",
        name=name,
        version=1,
        turn=1,
        attempt=attempt,
        digest="d",
        status=status,
        seq=1,
        created_at_ms=0,
        updated_at_ms=0,
        **fields,
    )


GOOD_JOURNAL: Final = [
    operation("look_up_order", "completed", 2),
    operation("refund_order", "completed", 2),
    operation("ship_replacement", "resolved", 1, resolved_by="ops"),
]


@pytest.mark.parametrize("doubled", [None, "refund", "shipment"])
def test_the_check_fails_on_an_effect_done_twice(tmp_path: Path, doubled: str | None) -> None:
    desk = Desk(tmp_path / "desk.jsonl")
    desk.look_up("A1", "op-look_up_order", 1)
    desk.look_up("A1", "op-look_up_order", 2)
    desk.refund("A1", 25, "op-refund_order", 1)
    desk.refund("A1", 25, "op-refund_order", 2)  # answered from its key
    desk.ship("A1", "op-ship_replacement", 1)
    if doubled == "refund":
        desk.refund("A1", 25, "op-other", 2)  # a refund under another key: refunded twice
    elif doubled == "shipment":
        desk.ship("A1", "op-ship_replacement", 2)
    problems = _check(desk, GOOD_JOURNAL)
    assert (problems == []) is (doubled is None)


# ------------------------------------------------------------------------------------- part agent (streaming)


def streamed_text(output: str, after: str) -> str:
    """The text the demo's watch lines showed streaming after the line containing ``after``."""
    lines = output[output.index(after) :].splitlines()
    return "".join(line.split("streaming: ", 1)[1] for line in lines if "] streaming: " in line)


async def test_agent_part_streams_the_answer_into_watch_lines(db_path: str) -> None:
    done = await run_tether("demo", "--part", "agent", "--db", db_path, timeout_s=TIMEOUT_S)
    left = await wait_gone(set(), db_path)
    assert not left, describe(left)
    output = done.stdout.decode(errors="replace")
    assert done.returncode == 0, output + done.stderr.decode(errors="replace")
    # The answer reached the watch in pieces, before the assistant entry that holds it.
    answer_line = output.index(f"assistant: {TRACKER_ANSWER}")
    assert streamed_text(output[:answer_line], "tool look_up_order result") == TRACKER_ANSWER
    assert output[:answer_line].count("] streaming: ") >= 4
    lookups = [line for line in desk_lines(db_path + ".stream-desk.jsonl") if line["op"] == "lookup"]
    assert [(line["order"], line["attempt"]) for line in lookups] == [("A1", 1)]


def tracker_run(status: str, answer: str | None) -> RunRecord:
    return RunRecord(
        run_id="run",
        conversation_id="conversation",
        agent="tracker",
        version=1,
        status=status,  # type: ignore[arg-type]
        submission_id="submission",
        seq=9,
        created_at_ms=0,
        updated_at_ms=0,
        answer=None if answer is None else RunAnswer(seq=9, text=answer),
    )


@pytest.mark.parametrize("doubled", [None, "refund", "question", "subagent"])
def test_the_research_check_fails_on_anything_done_twice(tmp_path: Path, doubled: str | None) -> None:
    desk = Desk(str(tmp_path / "desk.jsonl"))
    desk.look_up("A1", "op-look_up_order", 1)
    settle = operation("settle_refund", "completed", 2)
    pay = operation("pay_refund", "completed", 1, parent_operation_id=settle.operation_id)
    desk.refund("A1", 25, pay.operation_id, 1)
    if doubled == "refund":
        desk.refund("A1", 25, "op-another", 1)
    researcher = attrs.evolve(tracker_run("completed", "A1 was lost."), agent="researcher")
    child_runs = [researcher, attrs.evolve(researcher, run_id="run-2")] if doubled == "subagent" else [researcher]
    asked = InteractionRecord(
        interaction_id="q",
        run_id="run",
        conversation_id="conversation",
        operation_id=settle.operation_id,
        task_id="t",
        kind="question",
        status="answered",
        args=JsonValue({"text": "Full?", "schema": None}),
        digest="d",
        answer=InteractionAnswer(approve=None, note=None, responded_by="ops", at_ms=0, value=JsonValue(True)),
        seq=1,
        created_at_ms=0,
        updated_at_ms=0,
    )
    interactions = [asked, attrs.evolve(asked, interaction_id="q2")] if doubled == "question" else [asked]
    problems = _check_research(desk, [settle, pay], child_runs, interactions)
    assert bool(problems) == (doubled is not None), problems


@pytest.mark.parametrize(
    ("status", "answer", "pieces", "expect_script", "fails"),
    [
        ("completed", TRACKER_ANSWER, 12, True, False),
        ("completed", TRACKER_ANSWER, 1, True, True),  # not streamed in pieces
        ("completed", "something else", 12, True, True),
        ("failed", None, 3, True, True),
        ("failed", None, 3, False, True),
        ("completed", "whatever a real model says", 0, False, False),
    ],
)
def test_the_agent_part_checks_what_the_database_holds(
    status: str, answer: str | None, pieces: int, expect_script: bool, fails: bool
) -> None:
    problems = _check_run(tracker_run(status, answer), pieces, expect_script, "t.db", "conversation")
    assert bool(problems) is fails


def _chunk(**delta: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-demo",
        "object": "chat.completion.chunk",
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
    }


def _finish(reason: str, usage: dict[str, int]) -> list[dict[str, Any]]:
    head = {"id": "chatcmpl-demo", "object": "chat.completion.chunk", "model": "gpt-4o-mini"}
    return [
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]},
        {**head, "choices": [], "usage": usage},
    ]


REAL_ANSWER: Final = "Order A1 was lost in transit; I can refund the 25 you paid or send a replacement."


async def test_agent_part_on_a_real_model_server(db_path: str) -> None:
    """``--model NAME`` with OPENAI_BASE_URL: the same agent, on OpenAIChat against the replay server; the server
    streams slowly, so the answer reaches the watch lines in several pieces."""
    call = {"index": 0, "id": "call_demo1", "type": "function", "function": {"name": "look_up_order", "arguments": ""}}
    tool_turn = sse(
        _chunk(role="assistant", tool_calls=[call]),
        _chunk(tool_calls=[{"index": 0, "function": {"arguments": '{"order_id": "A1"}'}}]),
        *_finish("tool_calls", {"prompt_tokens": 90, "completion_tokens": 12}),
    )
    words = REAL_ANSWER.split(" ")
    answer_turn = sse(
        _chunk(role="assistant", content=""),
        *[_chunk(content=word if i == 0 else " " + word) for i, word in enumerate(words)],
        *_finish("stop", {"prompt_tokens": 140, "completion_tokens": 20}),
    )
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(stream(tool_turn), stream(answer_turn, piece_bytes=96, delay_s=0.04)) as server:
            env = {**CHILD_ENV, "OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": ""}
            command = tether_command("demo", "--part", "agent", "--model", "gpt-4o-mini", "--db", db_path)
            done = await trio.run_process(
                command, capture_stdout=True, capture_stderr=True, check=False, cwd=ROOT, env=env
            )
            requests = list(server.requests)
    left = await wait_gone(set(), db_path)
    assert not left, describe(left)
    output = done.stdout.decode(errors="replace")
    assert done.returncode == 0, output + done.stderr.decode(errors="replace")
    assert [request.body["model"] for request in requests] == ["gpt-4o-mini", "gpt-4o-mini"]
    assert [tool["function"]["name"] for tool in requests[0].body["tools"]] == ["look_up_order"]
    assert requests[1].body["messages"][-1]["role"] == "tool"  # the look-up's result went back to the model
    answer_line = output.index(f"assistant: {REAL_ANSWER}")
    assert streamed_text(output[:answer_line], "tool look_up_order result") == REAL_ANSWER
    assert output[:answer_line].count("] streaming: ") >= 2
    lookups = [line for line in desk_lines(db_path + ".stream-desk.jsonl") if line["op"] == "lookup"]
    assert [line["order"] for line in lookups] == ["A1"]


@pytest.mark.parametrize(
    ("argv", "environment", "says"),
    [
        (["--part", "agent", "--model", "gpt-4o-mini"], {}, "neither OPENAI_API_KEY"),
        (["--part", "agent", "--model", "gpt-4o-mini"], {"OPENAI_API_KEY": "  "}, "neither OPENAI_API_KEY"),
        (["--part", "tasks", "--model", "gpt-4o-mini"], {"OPENAI_API_KEY": "sk-x"}, "--part agent"),
        (["--model", "gpt-4o-mini"], {"OPENAI_API_KEY": "sk-x"}, "--part agent"),
    ],
)
def test_model_option_without_a_server_or_for_another_part_is_refused(
    db_path: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    environment: dict[str, str],
    says: str,
) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert main(["demo", "--db", db_path, *argv]) == 2
    assert says in capsys.readouterr().err
    assert not os.path.exists(db_path) and not os.path.exists(db_path + ".stream-desk.jsonl")

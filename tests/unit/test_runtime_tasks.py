"""``tether tasks --json``: a task is its wire record, through the one converter, plus what the owner knows."""

from __future__ import annotations

import json

import attrs

from protocol import JsonValue, TaskNode, TaskOutcome, TaskRecord, converter
from runtime._tasks import render_tree, task_json

RECORD = TaskRecord(
    task_id="01a22a08-1e43-7c05-a2b3-188080e8f9f1",
    kind="shop.payment",
    version=1,
    conversation_id="01a22a08-1e43-7c05-a2b3-188080e8f9f0",
    owner_task_id="01a22a08-1e43-7c05-a2b3-188080e8f9f2",
    background=False,
    abandon_on_restart=True,
    status="completing",
    phase="charge",
    on=("01a22a08-1e43-7c05-a2b3-188080e8f9f3",),
    policy="fail_fast",
    abort="abort",
    restarts=2,
    held=TaskOutcome(status="completed", result=JsonValue({"receipt": [1, 2]})),
    seq=9,
    created_at_ms=1,
    updated_at_ms=2,
)


def test_a_task_shows_its_whole_record_and_what_the_owner_knows() -> None:
    node = TaskNode(task=RECORD, blocked="missing_task", blocked_detail="no worker", leased_to="worker-1")
    shown = json.loads(json.dumps(task_json(RECORD, node)))
    extra = {"owner", "blocked", "blocked_detail", "worker", "conversation_owner"}
    assert converter.structure({key: value for key, value in shown.items() if key not in extra}, TaskRecord) == RECORD
    assert shown["owner"] == {"task": RECORD.owner_task_id}
    assert (shown["blocked"], shown["blocked_detail"], shown["worker"]) == ("missing_task", "no worker", "worker-1")
    assert shown["held"] == {"status": "completed", "reason": None, "result": {"receipt": [1, 2]}, "error": None}


def test_a_task_read_from_the_database_has_no_owner_knowledge() -> None:
    shown = task_json(RECORD)
    assert (shown["blocked"], shown["blocked_detail"], shown["worker"]) == (None, None, None)


def test_a_subagents_run_shows_under_the_tool_call_whose_conversation_it_runs_in() -> None:
    parent = attrs.evolve(RECORD, task_id="p-run", kind="agent:support", owner_task_id=None, status="waiting")
    call = attrs.evolve(RECORD, task_id="p-tool", kind="tool:research", owner_task_id="p-run", status="running")
    child = attrs.evolve(
        RECORD, task_id="c-run", kind="agent:researcher", conversation_id="child", owner_task_id=None, status="running"
    )
    nodes = {
        "p-run": TaskNode(task=parent),
        "p-tool": TaskNode(task=call),
        "c-run": TaskNode(task=child, conversation_owner_task_id="p-tool"),
    }
    lines = render_tree(nodes)
    assert [line.split(",")[0] for line in lines] == [
        f"conversation {RECORD.conversation_id}",
        "  agent:support p-run",
        "    tool:research p-tool",
        "      conversation child (owned by it)",
        "        agent:researcher c-run",
    ]

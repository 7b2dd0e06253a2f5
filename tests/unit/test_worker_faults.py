"""A worker's fault injection (``actors.WorkerKill``, ``tether worker --fault-kill``): what each point counts, and
the errors of a point that cannot be used. The process-level checks are tests/faults/test_testing_kit.py."""

from __future__ import annotations

import pytest

import actors
from actors._worker._faults import KillSwitch
from protocol import AppendEntry, FinishOperation, JsonValue, StartOperation, Write


def intent(operation_id: str, kind: str = "tool", name: str = "lookup") -> StartOperation:
    return StartOperation(
        operation_id=operation_id,
        run_id="r",
        kind=kind,  # type: ignore[arg-type]
        name=name,
        version=1,
        turn=1,
        attempt=1,
        digest="d",
    )


def result(operation_id: str) -> FinishOperation:
    return FinishOperation(operation_id=operation_id, status="completed", result=JsonValue("ok"))


def entry() -> AppendEntry:
    return AppendEntry(conversation_id="c", kind="app.note", entry_id="e", data=JsonValue(None))


class Killed(Exception):
    pass


def switch(kill: actors.WorkerKill) -> KillSwitch:
    def die() -> None:
        raise Killed

    return KillSwitch(kill, lambda line: None, die)


def commits(kill: actors.WorkerKill, *batches: tuple[str, list[Write]]) -> list[str]:
    """Feed ``batches`` (the task kind, the writes) to a switch as acknowledged commits: where it killed, as
    ``before N`` or ``after N`` (N the commit's index), or nothing."""
    found = switch(kill)
    for index, (task_kind, writes) in enumerate(batches):
        try:
            found.before(writes, task_kind)
        except Killed:
            return [f"before {index}"]
        try:
            found.after(writes, task_kind)
        except Killed:
            return [f"after {index}"]
    return []


RUN: tuple[tuple[str, list[Write]], ...] = (
    ("agent:support", [intent("m1", "model", "scripted")]),
    ("agent:support", [result("m1"), entry()]),
    ("tool:lookup", [intent("t1")]),
    ("tool:lookup", [result("t1"), entry()]),
    ("agent:support", [intent("m2", "model", "scripted")]),
    ("agent:support", [result("m2"), entry()]),
)


@pytest.mark.parametrize(
    ("kill", "where"),
    [
        (actors.WorkerKill("before_commit", 3), ["before 2"]),
        (actors.WorkerKill("after_commit", 1), ["after 0"]),
        (actors.WorkerKill("after_intent", 2), ["after 2"]),
        (actors.WorkerKill("after_intent", kind="tool"), ["after 2"]),
        (actors.WorkerKill("after_intent", 2, kind="model"), ["after 4"]),
        (actors.WorkerKill("before_result", kind="tool", name="lookup"), ["before 3"]),
        (actors.WorkerKill("after_result", 2), ["after 3"]),
        (actors.WorkerKill("after_result", kind="model", name="scripted"), ["after 1"]),
        (actors.WorkerKill("after_intent", kind="tool", name="refund"), []),
        (actors.WorkerKill("before_commit", 7), []),
    ],
    ids=str,
)
def test_each_point_kills_at_its_commit(kill: actors.WorkerKill, where: list[str]) -> None:
    assert commits(kill, *RUN) == where


def test_a_result_whose_intent_another_worker_committed_counts_by_the_task_that_finishes_it() -> None:
    kill = actors.WorkerKill("before_result", kind="tool", name="lookup")
    assert commits(kill, ("agent:support", [result("m1")]), ("tool:lookup", [result("t1")])) == ["before 1"]


def test_a_refused_call_is_its_intent_and_its_result_in_one_commit() -> None:
    refused: list[Write] = [intent("t1"), result("t1")]
    assert commits(actors.WorkerKill("after_intent", kind="tool"), ("agent:a", refused)) == ["after 0"]
    assert commits(actors.WorkerKill("before_result", kind="tool"), ("agent:a", refused)) == ["before 0"]


@pytest.mark.parametrize(
    "text",
    [
        "after_intent:1:tool:refund",
        "before_result:2",
        "after_commit:5",
        "after_result:1:model",
        "SIGSTOP:intent_sent:1:tool:refund",
    ],
)
def test_the_text_form_reads_back(text: str) -> None:
    assert str(actors.WorkerKill.parse(text)) == text


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("after_intent", "POINT:N[:KIND[:NAME]], such as"),
        ("after_intent:x", "POINT:N[:KIND[:NAME]], such as"),
        (
            "mid_tool:1",
            "one of before_commit, after_commit, intent_sent, after_intent, before_result, after_result; not "
            "'mid_tool'",
        ),
        ("SIGHUP:after_intent:1", "signal is SIGKILL or SIGSTOP, not 'SIGHUP'"),
        ("after_intent:0", "counts from 1"),
        ("after_intent:1:thing", "kind is 'model' or 'tool'"),
        ("after_commit:1:tool", "after_commit counts commits, not operations"),
        ("after_intent:1:tool:", "name is a tool's or model's name"),
        ("after_intent:1:tool:a:b", "POINT:N[:KIND[:NAME]], such as"),
    ],
)
def test_a_bad_point_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(actors.UsageError) as caught:
        actors.WorkerKill.parse(text)
    assert says in str(caught.value)


def test_a_name_needs_its_kind_and_nth_is_a_whole_number() -> None:
    with pytest.raises(actors.UsageError, match="says its kind too"):
        actors.WorkerKill("after_intent", name="refund")
    with pytest.raises(actors.UsageError, match="counts from 1"):
        actors.WorkerKill("after_intent", True)  # type: ignore[arg-type]


def test_intent_sent_acts_once_the_commit_holding_the_intent_has_gone_out_and_only_once() -> None:
    """The point arms the connection with the commit about to be sent (the process stops once it is on the socket,
    its acknowledgement unread), and never again: a process stopped there and continued goes on."""
    armed: list[object] = []
    found = switch(actors.WorkerKill("intent_sent", 2, kind="tool", signal="SIGSTOP"))
    for task_kind, writes in RUN:
        found.before(writes, task_kind, armed.append)
        found.after(writes, task_kind)
    assert len(armed) == 0  # one tool intent in RUN: the second never comes
    found = switch(actors.WorkerKill("intent_sent", kind="tool", signal="SIGSTOP"))
    for task_kind, writes in RUN:
        found.before(writes, task_kind, armed.append)
    [stop] = armed
    assert callable(stop)
    with pytest.raises(Killed):
        stop()
    found.before([intent("t2")], "tool:lookup", armed.append)
    assert len(armed) == 1, "reached once: it never stops the process again"

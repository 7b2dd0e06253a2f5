"""``tether demo --part research``: an agent that asks a subagent and a person, under ``tether up``, its worker
SIGKILLed while the person has not answered yet.

The agent ``analyst`` of :mod:`runtime.demo_app` (a scripted model) asks the agent ``researcher`` what happened to
the customer's order (``research``, an ``actors.subagent_tool``: a conversation of its own, owned by the call), then
calls ``settle_refund``, which asks a person how much to refund (``call.ask``, a durable question) and pays it out
through ``pay_refund`` (``call.execute_tool``, a nested call; idempotent against the fake support desk). While the
question is open the demo SIGKILLs the worker: ``tether up`` restarts it, ``settle_refund`` (``safe``) runs again and
finds its question where it was, asked once. The demo answers it as a person would (printing the ``tether respond``
command it stands for), waits for the answer, and checks the desk's ledger and the journal: the subagent ran once,
the question was asked once, the refund was paid once. Everything the owner commits about the run is printed live.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any, Final

import trio

import actors
from protocol import InteractionRecord, OperationRecord, RunRecord, new_id

from ._demo_agents import _open_interaction, _say, _title, _wait_for_worker
from ._demo_up import demo_up
from ._demo_view import LiveView
from .demo_app import DESK_ENV, Desk

DEMO_TIMEOUT_S: Final = 60.0
POLL_S: Final = 0.02
QUESTION: Final = "My order A1 never arrived. What happened?"


async def run_research_demo(db: str) -> int:
    desk_path = db + ".desk.jsonl"
    with open(desk_path, "w", encoding="utf-8"):
        pass  # a fresh ledger for this run
    desk = Desk(desk_path)
    print(f"Tether demo: an agent that asks a subagent and a person, on {db}\n", flush=True)
    async with demo_up(db, workers=1, env={DESK_ENV: desk_path}) as (up, log_path):
        with trio.fail_after(DEMO_TIMEOUT_S):
            async with actors.connect(db=db, name="tether-demo", wait_for_owner_s=30) as client:
                worker = await _wait_for_worker(client)
                _say(f"tether up (pid {up.pid}): the owner, and worker {worker.peer_name}; log in {log_path}")
                show = _Show(client)
                async with trio.open_nursery() as nursery:
                    await nursery.start(show.run)
                    problems = await _scenario(client, show, desk, db)
                    nursery.cancel_scope.cancel()
    done = "Nothing was asked, run or paid twice, and the run answered."
    print("\n" + (done if not problems else "FAILED: see above."), flush=True)
    return 1 if problems else 0


async def _scenario(client: actors.Client, show: _Show, desk: Desk, db: str) -> list[str]:
    _title(f"1. A customer writes to the agent analyst (a scripted model): {QUESTION!r}")
    conversation_id = await client.create_conversation(agent="analyst")
    submission = await client.submit(conversation_id, kind="input", payload=QUESTION, request_id=new_id())
    run_id = submission.run_id
    assert run_id is not None
    show.run_id = run_id
    _say(f"conversation {conversation_id}, run {run_id}")

    _title("2. The analyst asks the researcher: a subagent, in a conversation the call owns")
    research = await _operation(client, run_id, "research", "completed")
    await show.settled(research.seq)
    report = research.structured if isinstance(research.structured, dict) else {}  # for programs: in the journal
    _say(f"the researcher, in conversation {report.get('conversation_id')}, reported: {report.get('answer')!r}")

    _title("3. settle_refund asks a person how much to refund; SIGKILL of the worker before anyone answers")
    question = await _open_interaction(client, run_id)
    await show.settled(question.seq)
    victim = await _wait_for_worker(client)
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)
    show.note(f"SIGKILL {victim.peer_name} (pid {victim.pid}); tether up restarts it")
    settle = await _operation(client, run_id, "settle_refund", "started", attempt=2)
    await show.settled(settle.seq)
    again = await _open_interaction(client, run_id)
    _say(f"settle_refund runs again (safe) and finds its question open, asked once: {again.interaction_id}")
    _say(f"$ tether respond {question.interaction_id} --db {db} --answer true")
    answered = await client.respond(question.interaction_id, answer=True, responded_by="ops")
    await show.settled(answered.seq)

    _title("4. The answer")
    run = await client.wait_for_run(run_id)
    await show.settled(run.seq)
    if run.status != "completed" or run.answer is None:
        return [f"the run ended {run.status} ({run.reason}), not completed"]
    _say(f"analyst: {run.answer.text}")
    child_runs = await client.runs(conversation_id=str(report.get("conversation_id")))
    interactions = await client.interactions(status=None, run_id=run_id)
    return _check(desk, await client.operations(run_id), child_runs, interactions)


def _check(
    desk: Desk, operations: list[OperationRecord], child_runs: list[RunRecord], interactions: list[InteractionRecord]
) -> list[str]:
    """The subagent ran once, the question was asked once, the refund was paid once (by the nested call)."""
    _title("The support desk's ledger and the journal")
    ledger = desk.ledger()
    tools = {op.name: op for op in operations if op.kind == "tool"}
    refunds = [line for line in ledger if line["op"] == "refund"]
    lookups = [line for line in ledger if line["op"] == "lookup"]
    problems: list[str] = []
    if [(run.agent, run.status) for run in child_runs] != [("researcher", "completed")] or len(lookups) != 1:
        problems.append(f"the researcher ran {len(child_runs)} time(s) and looked the order up {len(lookups)} time(s)")
    else:
        _say("research (a subagent): one conversation, one run, one look-up; never run again")
    answers: list[tuple[str, str, Any]] = [
        (one.kind, one.status, None if one.answer is None else one.answer.value) for one in interactions
    ]
    if answers != [("question", "answered", True)]:
        problems.append(f"the interactions of the run: {answers}")
    else:
        _say("settle_refund's question: asked once (its call ran twice), answered once: true")
    pay, settle = tools.get("pay_refund"), tools.get("settle_refund")
    if (
        pay is None
        or settle is None
        or [line["key"] for line in refunds] != [pay.operation_id]
        or pay.parent_operation_id != settle.operation_id
        or (pay.status, pay.attempt, settle.attempt) != ("completed", 1, 2)
    ):
        problems.append(f"refunds {refunds}, the nested call {pay}")
    else:
        _say(f"pay_refund (nested in settle_refund): paid {refunds[0]['amount']} once, operation {pay.operation_id}")
    for problem in problems:
        _say(f"FAILED: {problem}")
    return problems


async def _operation(
    client: actors.Client, run_id: str, name: str, status: str, *, attempt: int = 1
) -> OperationRecord:
    while True:
        for op in await client.operations(run_id):
            if op.name == name and op.status == status and op.attempt >= attempt:
                return op
        await trio.sleep(POLL_S)


class _Show(LiveView):
    """Prints what the owner commits about the run, live: its status, its operations (nested ones under their
    caller), its question."""

    LABEL_WIDTH = 30

    def __init__(self, client: actors.Client) -> None:
        super().__init__(client)
        self.run_id: str | None = None
        self._names: dict[str, str] = {}

    async def show(self, record: Any, seq: int) -> None:
        if isinstance(record, RunRecord) and record.run_id == self.run_id:
            why = f" ({record.reason})" if record.reason else ""
            self.line("run", (record.status, record.reason), f"{record.status}{why}")
        elif isinstance(record, RunRecord) and record.agent == "researcher":
            self.line(record.run_id, (record.status,), record.status, "  the researcher's run")
        elif isinstance(record, OperationRecord) and record.run_id == self.run_id:
            self._names[record.operation_id] = record.name
            label = f"model turn {record.turn}" if record.kind == "model" else record.name
            if record.parent_operation_id is not None:
                label = f"  {label} (in {self._names.get(record.parent_operation_id, 'its caller')})"
            detail = f"{record.status}, attempt {record.attempt}"
            if record.policy is not None:
                detail += f" ({record.policy})"
            if record.status == "completed" and record.kind == "tool":
                detail += f": {_short(record.result)}"
            self.line(record.operation_id, (record.status, record.attempt), detail, label)
        elif isinstance(record, InteractionRecord) and record.run_id == self.run_id:
            if record.answer is None:
                text = record.args.get("text") if isinstance(record.args, dict) else record.args
                detail = f"question asked: {text!r}"
            else:
                detail = f"question answered: {json.dumps(record.answer.value)} by {record.answer.responded_by}"
            self.line(record.interaction_id, (record.status,), detail, "  question")


def _short(value: Any, limit: int = 90) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"

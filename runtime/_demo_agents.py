"""``tether demo --part agents``: a durable agent run under ``tether up``, a worker SIGKILLed mid-tool.

The agent ``support`` of :mod:`runtime.demo_app` (a scripted model) calls three tools in parallel against the fake
support desk: ``look_up_order`` (safe), ``refund_order`` (idempotent, behind an approval) and ``ship_replacement``
(manual). The demo answers the approval as a person would (printing the ``tether respond`` command it stands for),
waits until the three tools did their effect and hold (the desk's hold file), SIGKILLs the worker, lets the customer
add a message to the running agent (a steer: placed when the tool round ends, answered by the same run), and
releases the hold: the supervisor restarts the worker, the safe tool runs again, the idempotent one runs again under
the same operation id (the desk answers the repeated refund from its key), the manual one stops the run as
``needs_attention``; the demo checks the desk's ledger and resolves it with the shipment that was made (printing the
``tether resolve`` command), then waits for the answer. It ends by checking the ledger: no effect done twice.
Everything the owner commits about the run (its status, the operation journal, the approval) is printed live, from
a watch.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from typing import Any, Final

import trio

import actors
from protocol import InteractionRecord, OperationRecord, RunRecord, new_id

from ._demo_up import demo_up
from ._demo_view import LiveView
from .demo_app import DESK_ENV, HOLD_ENV, Desk

DEMO_TIMEOUT_S: Final = 60.0
POLL_S: Final = 0.02
QUESTION: Final = "My order A1 never arrived."
STEER: Final = "Please send the replacement by express."


async def run_agents_demo(db: str) -> int:
    desk_path = db + ".desk.jsonl"
    hold_path = db + ".hold"
    with open(desk_path, "w", encoding="utf-8"):
        pass  # a fresh ledger for this run
    with open(hold_path, "w", encoding="utf-8"):
        pass  # the tools hold after their effect until the demo removes it
    desk = Desk(desk_path)
    print(f"Tether demo: a durable agent on {db}\n", flush=True)
    problems: list[str] = []
    try:
        async with demo_up(db, workers=1, env={DESK_ENV: desk_path, HOLD_ENV: hold_path}) as (up, log_path):
            with trio.fail_after(DEMO_TIMEOUT_S):
                async with actors.connect(db=db, name="tether-demo", wait_for_owner_s=30) as client:
                    worker = await _wait_for_worker(client)
                    _say(f"tether up (pid {up.pid}): the owner, and worker {worker.peer_name}; log in {log_path}")
                    show = _Show(client)
                    async with trio.open_nursery() as nursery:
                        await nursery.start(show.run)
                        problems = await _scenario(client, show, desk, hold_path, db)
                        nursery.cancel_scope.cancel()
    finally:
        if os.path.exists(hold_path):
            os.remove(hold_path)
    print("\n" + ("No effect was done twice, and the run answered." if not problems else "FAILED: see above."))
    return 1 if problems else 0


async def _scenario(client: actors.Client, show: _Show, desk: Desk, hold_path: str, db: str) -> list[str]:
    _title(f"1. A customer writes to the agent support (version 1, a scripted model): {QUESTION!r}")
    conversation_id = await client.create_conversation(agent="support")
    submission = await client.submit(conversation_id, kind="input", payload=QUESTION, request_id=new_id())
    run_id = submission.run_id
    assert run_id is not None
    show.run_id = run_id
    _say(f"$ tether submit --db {db} --agent support {QUESTION!r}")
    _say(f"conversation {conversation_id}, run {run_id}")

    _title("2. The refund asks for an approval; a person answers it")
    interaction = await _open_interaction(client, run_id)
    _say(f"$ tether respond {interaction.interaction_id} --db {db} --approve --note 'paid, never delivered'")
    answered = await client.respond(
        interaction.interaction_id, approve=True, note="paid, never delivered", responded_by="ops"
    )
    await show.settled(answered.seq)

    _title("3. SIGKILL of the worker while the three tools run (each did its effect, none has returned)")
    await _until(lambda: {line["op"] for line in desk.ledger()} >= {"lookup", "refund", "shipment"})
    victim = await _wait_for_worker(client)
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)
    show.note(f"SIGKILL {victim.peer_name} (pid {victim.pid}); tether up restarts it")
    steer = await client.submit(conversation_id, kind="input", payload=STEER, when_busy="steer")
    _say(f"the customer adds, while the tools run: $ tether submit --db {db} --conversation ... --when-busy steer")
    _say(f"  {STEER!r}: {steer.status}, joins run {steer.run_id} when its tool round ends")
    os.remove(hold_path)  # the tools run through from now on

    _title("4. The manual tool stopped the run; the desk's ledger says what it did, a person resolves it")
    run = await _run_in(client, run_id, "needs_attention")
    await show.settled(run.seq)
    shipments = [line for line in desk.ledger() if line["op"] == "shipment"]
    made = [line for line in shipments if line["operation_id"] == run.operation_id]
    if not made:
        return [f"the run needs attention ({run.reason}) on {run.operation_id}, which shipped nothing"]
    output = {"order": made[0]["order"], "shipment": made[0]["shipment"]}
    _say(f"the ledger shows shipment {made[0]['shipment']} made under operation {run.operation_id}")
    _say(f"$ tether resolve {run.operation_id} --db {db} --output '{json.dumps(output)}'")
    resolved = await client.resolve(run.operation_id or "", output, resolved_by="ops")
    await show.settled(resolved.seq)

    _title("5. The answer")
    run = await client.wait_for_run(run_id)
    await show.settled(run.seq)
    if run.status != "completed" or run.answer is None:
        return [f"the run ended {run.status} ({run.reason}), not completed"]
    _say(f"support: {run.answer.text}")
    problems = _check(desk, await client.operations(run_id))
    steered = await client.wait_for_submission(steer.submission_id)
    kinds = [entry.kind for entry in await client.entries(conversation_id)]
    # The steer's entry follows the round's calls (a result written late, such as the one a person resolved, comes
    # after it in the transcript; the model still sees the steer after every result of the round).
    after_round = (
        kinds.index("tether.assistant") < kinds.index("tether.user", 1) if kinds.count("tether.user") > 1 else False
    )
    if steered.status != "done" or steered.answer != run.answer or not after_round:
        problem = f"the steer was not placed after the tool round and answered by the run: {steered}"
        _say(f"FAILED: {problem}")
        problems.append(problem)
    else:
        _say(f"the steer was placed when the tool round ended and is {steered.status}, with the run's answer")
    return problems


def _check(desk: Desk, operations: list[OperationRecord]) -> list[str]:
    """Each effect at most once: the safe look-up ran twice (allowed), the refund was asked twice under one
    operation id and answered once from its key, the shipment was made once and resolved."""
    _title("The support desk's ledger")
    ledger = desk.ledger()
    tools = {op.name: op for op in operations if op.kind == "tool"}
    counts = Counter(line["op"] for line in ledger)
    refunds = Counter(line["key"] for line in ledger if line["op"] == "refund")
    repeats = [line for line in ledger if line["op"] == "refund_repeat"]
    lookups = [line for line in ledger if line["op"] == "lookup"]
    shipments = [line for line in ledger if line["op"] == "shipment"]
    _say(
        f"{counts['lookup']} look-ups, {counts['refund']} refund(s), {counts['refund_repeat']} repeated refund "
        f"request(s) answered from the idempotency key, {counts['shipment']} shipment(s)"
    )
    problems: list[str] = []
    lookup, refund, ship = (tools.get(name) for name in ("look_up_order", "refund_order", "ship_replacement"))
    if lookup is None or refund is None or ship is None:
        return [f"the journal holds tool calls {sorted(tools)}"]
    if [line["attempt"] for line in lookups] != [1, 2] or (lookup.status, lookup.attempt) != ("completed", 2):
        problems.append(f"the safe look-up ran {len(lookups)} time(s), its call ended {lookup.status}")
    else:
        _say("look_up_order (safe): ran twice, attempts 1 and 2; allowed, it only reads")
    if (
        list(refunds.values()) != [1]
        or [line["key"] for line in repeats] != [refund.operation_id]
        or list(refunds) != [refund.operation_id]
        or (refund.status, refund.attempt) != ("completed", 2)
    ):
        problems.append(f"refunds by key {dict(refunds)}, {len(repeats)} repeat(s), the call ended {refund.status}")
    else:
        _say(f"refund_order (idempotent): asked twice under operation {refund.operation_id}, refunded once")
    if len(shipments) != 1 or (ship.status, ship.attempt, ship.resolved_by) != ("resolved", 1, "ops"):
        problems.append(f"{len(shipments)} shipment(s), the call ended {ship.status}")
    else:
        _say("ship_replacement (manual): shipped once, never run again, resolved by a person")
    for problem in problems:
        _say(f"FAILED: {problem}")
    return problems


async def _open_interaction(client: actors.Client, run_id: str) -> InteractionRecord:
    while True:
        interactions = await client.interactions(run_id=run_id)
        if interactions:
            return interactions[0]
        await trio.sleep(POLL_S)


async def _run_in(client: actors.Client, run_id: str, status: str) -> RunRecord:
    while True:
        run = await client.run(run_id)
        if run.status == status:
            return run
        await trio.sleep(POLL_S)


async def _until(condition: Any) -> None:
    while not await trio.to_thread.run_sync(condition):
        await trio.sleep(POLL_S)


async def _wait_for_worker(client: actors.Client) -> actors.PeerInfo:
    while True:
        workers = [peer for peer in await client.peers() if peer.role == "worker" and peer.announced and peer.pid]
        if workers:
            return workers[0]
        await trio.sleep(0.05)


class _Show(LiveView):
    """Prints what the owner commits about the run, live: its status, its operations, its approval."""

    def __init__(self, client: actors.Client) -> None:
        super().__init__(client)
        self.run_id: str | None = None

    async def show(self, record: Any, seq: int) -> None:
        if isinstance(record, RunRecord) and record.run_id == self.run_id:
            self.line("run", (record.status, record.reason), f"{record.status}" + _why(record.reason))
        elif isinstance(record, OperationRecord) and record.run_id == self.run_id:
            label = f"model turn {record.turn}" if record.kind == "model" else f"{record.name}"
            detail = f"{record.status}, attempt {record.attempt}"
            if record.policy is not None:
                detail += f" ({record.policy})"
            if record.status in ("completed", "resolved") and record.kind == "tool":
                detail += f": {json.dumps(record.result)}"
            if record.resolved_by:
                detail += f", by {record.resolved_by}"
            self.line(record.operation_id, (record.status, record.attempt), detail, label)
        elif isinstance(record, InteractionRecord) and record.run_id == self.run_id:
            if record.answer is None:
                detail = f"approval asked: {json.dumps(record.args)}"
            else:
                verdict = "approved" if record.answer.approve else "denied"
                detail = f"approval answered: {verdict} by {record.answer.responded_by}"
            self.line(record.interaction_id, (record.status,), detail, "  approval")


def _why(reason: str | None) -> str:
    return f" ({reason})" if reason else ""


def _title(text: str) -> None:
    print(f"\n  {text}", flush=True)


def _say(text: str) -> None:
    print(f"  {text}", flush=True)

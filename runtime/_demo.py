"""``tether demo``: the main job, on the embedded default (a database in the working directory, the demo app).

Part 1, durable tasks: ``tether up`` with two workers serving :mod:`runtime.demo_app`, and three checkouts of four
payments each, watched live: a declined card (``fail_fast`` aborts the other payments bottom-up, each refunding
its charge), a cancelled checkout (every payment's abort handler ends before the checkout's), and a worker killed
with SIGKILL while payments run (they run again elsewhere; the bank's idempotency keys absorb the repeats). It
ends by checking the bank's ledger: every card charged at most once, every aborted charge refunded once.

Part 2, durable agents: a run of the demo app's support agent under ``tether up`` (:mod:`runtime._demo_agents`):
an approval answered, a worker SIGKILLed mid-tool, a manual tool resolved, no effect done twice.

Part 3, a streaming agent: the demo app's agent ``tracker`` streams its answer into ``tether watch``'s lines
(:mod:`runtime._demo_stream`); ``--model NAME`` runs it on a real model.

Part 4, the commit path: an owner SIGKILLed mid-stream under two writer processes (:mod:`runtime._demo_commits`).

Part 5, tools that act: the demo app's agent ``analyst`` asks a subagent and a person, its worker SIGKILLed while the
question is open (:mod:`runtime._demo_research`).
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from typing import Any, Final

import trio

import actors
from protocol import TaskRecord

from ._demo_agents import run_agents_demo
from ._demo_commits import run_commits_demo
from ._demo_research import run_research_demo
from ._demo_stream import run_stream_demo
from ._demo_up import demo_up
from ._demo_view import LiveView
from .demo_app import BANK_ENV, Bank

DEMO_TIMEOUT_S: Final = 120.0
WORKERS: Final = 2
GOOD_CARDS: Final = ("4242-4242-4242-4242", "5555-5555-5555-4444", "3782-822463-10005", "6011-1111-1111-1117")
DECLINED_CARD: Final = "4000-0000-0000-0002"


async def run_demo(db: str, entries_per_writer: int, part: str = "all", model: str | None = None) -> int:
    db = os.path.abspath(db)
    failed = False
    if part in ("all", "tasks"):
        failed |= await run_checkout_demo(db) != 0
    if part in ("all", "agents"):
        if part == "all":
            print()
        failed |= await run_agents_demo(db) != 0
    if part in ("all", "agent"):
        if part == "all":
            print()
        failed |= await run_stream_demo(db, model) != 0
    if part in ("all", "commits"):
        if part == "all":
            print()
        failed |= await run_commits_demo(db, entries_per_writer) != 0
    if part in ("all", "research"):
        if part == "all":
            print()
        failed |= await run_research_demo(db) != 0
    return 1 if failed else 0


async def run_checkout_demo(db: str) -> int:
    bank_path = db + ".bank.jsonl"
    with open(bank_path, "w", encoding="utf-8"):
        pass  # a fresh ledger for this run
    bank = Bank(bank_path)
    print(f"Tether demo: durable tasks on {db}\n", flush=True)
    async with demo_up(db, workers=WORKERS, env={BANK_ENV: bank_path}, new_log=True) as (up, log_path):
        with trio.fail_after(DEMO_TIMEOUT_S):
            async with actors.connect(db=db, name="tether-demo", wait_for_owner_s=30) as client:
                workers = await _wait_for_workers(client)
                _say(f"tether up (pid {up.pid}): the owner, and workers {', '.join(workers)}; log in {log_path}")
                show = _Show(client)
                async with trio.open_nursery() as nursery:
                    await nursery.start(show.run)
                    outcomes = [
                        await _declined_card(client, show),
                        await _cancelled_checkout(client, show, bank),
                        await _worker_killed(client, show, bank),
                    ]
                    nursery.cancel_scope.cancel()
                ok = _check_ledger(bank, outcomes, show)
    print(
        "\n" + ("Every payment was charged at most once, and every abort was undone." if ok else "FAILED: see above.")
    )
    return 0 if ok else 1


async def _declined_card(client: actors.Client, show: _Show) -> str:
    _title("1. A declined card: fail_fast aborts the other payments, bottom-up")
    cards: list[Any] = [{"card": card, "delay_s": 0.2, "confirm_s": 30} for card in GOOD_CARDS[:3]]
    cards.insert(1, {"card": DECLINED_CARD, "delay_s": 1.0})
    checkout = await client.create_task("shop.checkout", {"cards": cards})
    record = await client.wait_for_task(checkout)
    await show.settled(record.seq)
    return _expect(record, "failed")


async def _cancelled_checkout(client: actors.Client, show: _Show, bank: Bank) -> str:
    _title("2. A cancelled checkout: the payments' abort handlers finish before the checkout's")
    cards = [{"card": card, "delay_s": 0.1, "confirm_s": 30} for card in GOOD_CARDS]
    checkout = await client.create_task("shop.checkout", {"cards": cards})
    await _until_charged(bank, _charged(bank) + len(cards))
    show.note(f"abort {show.label(checkout)}")
    await client.abort_task(checkout)
    record = await client.wait_for_task(checkout)
    await show.settled(record.seq)
    graph_order = show.ended_order()
    payments_first = all(graph_order[task] < graph_order[checkout] for task in show.owned_by(checkout))
    show.note(f"every payment ended before the checkout: {'yes' if payments_first else 'NO'}")
    return _expect(record, "aborted") if payments_first else "payments ended after their checkout"


async def _worker_killed(client: actors.Client, show: _Show, bank: Bank) -> str:
    _title("3. SIGKILL of a worker while payments run: they run again elsewhere, charged once")
    cards = [{"card": card, "delay_s": 0.1, "confirm_s": 1.5} for card in GOOD_CARDS]
    checkout = await client.create_task("shop.checkout", {"cards": cards})
    await _until_charged(bank, _charged(bank) + len(cards))
    graph = await client.task_graph()
    busy = Counter(node.leased_to for node in graph.nodes.values() if node.leased_to is not None)
    victim_name = busy.most_common(1)[0][0]
    victim = next(peer for peer in await client.peers() if peer.peer_name == victim_name and peer.pid)
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)
    show.note(f"SIGKILL {victim_name} (pid {victim.pid}), running {busy[victim_name]} payment(s)")
    record = await client.wait_for_task(checkout)
    await show.settled(record.seq)
    restarted = [show.label(task) for task in show.owned_by(checkout) if show.restarts.get(task)]
    show.note(f"payments re-run after the kill: {', '.join(restarted) or 'none'}")
    return _expect(record, "completed")


async def _until_charged(bank: Bank, count: int) -> None:
    """Wait until the bank has recorded ``count`` charges in all (the payments are then confirming)."""
    while _charged(bank) < count:
        await trio.sleep(0.02)


def _charged(bank: Bank) -> int:
    return sum(1 for line in bank.ledger() if line["op"] == "charge")


def _expect(record: TaskRecord, status: str) -> str:
    assert record.outcome is not None
    return "" if record.outcome.status == status else f"the checkout ended {record.outcome.status}, not {status}"


def _check_ledger(bank: Bank, problems: list[str], show: _Show) -> bool:
    """Every key charged at most once and refunded at most once; a charge stands exactly for each completed
    payment, and was refunded for each aborted one."""
    _title("The bank's ledger")
    ledger = bank.ledger()
    charges = Counter(line["key"] for line in ledger if line["op"] == "charge")
    refunds = Counter(line["key"] for line in ledger if line["op"] == "refund")
    repeats = sum(1 for line in ledger if line["op"] == "charge_repeat")
    declined = sum(1 for line in ledger if line["op"] == "declined")
    payments = [record for record in show.outcomes.values() if record.kind == "shop.payment"]
    completed = sum(1 for record in payments if record.outcome is not None and record.outcome.status == "completed")
    doubled = [key for key, count in charges.items() if count > 1]
    bad_refunds = [key for key, count in refunds.items() if count > 1 or key not in charges]
    standing = len(charges) - len(refunds)
    _say(
        f"{sum(charges.values())} charges, {sum(refunds.values())} refunds, {declined} declined, "
        f"{repeats} repeated charge request(s) answered from the idempotency key"
    )
    _say(
        f"keys charged twice: {len(doubled)}; refunds twice or of nothing: {len(bad_refunds)}; "
        f"charges standing: {standing}, completed payments: {completed}"
    )
    if standing != completed:
        problems.append(f"{standing} charges stand for {completed} completed payments")
    for problem in problems:
        if problem:
            _say(f"FAILED: {problem}")
    return not doubled and not bad_refunds and not any(problems)


async def _wait_for_workers(client: actors.Client) -> list[str]:
    while True:
        workers = sorted(peer.peer_name for peer in await client.peers() if peer.role == "worker" and peer.announced)
        if len(workers) >= WORKERS:
            return workers
        await trio.sleep(0.05)


class _Show(LiveView):
    """Prints the task tree's changes live, from a watch of every commit."""

    def __init__(self, client: actors.Client) -> None:
        super().__init__(client)
        self._names: dict[str, str] = {}
        self._last: dict[str, tuple[str, str | None, int]] = {}
        self._ended: dict[str, int] = {}
        self.outcomes: dict[str, TaskRecord] = {}
        """The terminal record of every task seen ending."""
        self._owner: dict[str, str | None] = {}
        self.restarts: dict[str, int] = {}

    def name(self, task_id: str, name: str) -> None:
        self._names[task_id] = name

    def label(self, task_id: str) -> str:
        return self._names.get(task_id, f"task …{task_id[-6:]}")

    def note(self, text: str) -> None:
        print(f"     {'':<32}{text}", flush=True)

    def owned_by(self, task_id: str) -> list[str]:
        return [task for task, owner in self._owner.items() if owner == task_id]

    def ended_order(self) -> dict[str, int]:
        return dict(self._ended)

    async def show(self, record: Any, seq: int) -> None:
        if isinstance(record, TaskRecord):
            await self._show(record, seq)

    async def _show(self, record: TaskRecord, seq: int) -> None:
        task_id = record.task_id
        if task_id not in self._names:
            if record.kind == "shop.payment":
                payment: Any = (await self._client.task_state(task_id)).input
                card = payment["card"]
                self._names[task_id] = f"payment {card}"
            else:
                self._names[task_id] = f"{record.kind.rpartition('.')[2]} …{task_id[-6:]}"
        self._owner[task_id] = record.owner_task_id
        self.restarts[task_id] = max(self.restarts.get(task_id, 0), record.restarts)
        state = (record.status, record.abort, record.restarts)
        if self._last.get(task_id, ("pending", None, 0)) == state:
            return  # unchanged, or just created
        self._last[task_id] = state
        if record.status == "terminal":
            self._ended[task_id] = seq
            self.outcomes[task_id] = record
        indent = "  " if record.owner_task_id is not None else ""
        print(f"     {indent + self.label(task_id):<30}  {_describe(record)}", flush=True)


def _describe(record: TaskRecord) -> str:
    if record.status == "terminal" and record.outcome is not None:
        outcome = record.outcome
        detail = outcome.error or outcome.reason or _short(outcome.result)
        return f"{outcome.status}" + (f": {detail}" if detail else "")
    text: str = record.status
    if record.status == "waiting":
        text = f"waiting on {len(record.on)} payments ({record.policy})"
    if record.restarts:
        text += f" (restart {record.restarts})"
    if record.abort is not None:
        text += ", marked for abort"
    return text


def _short(result: Any) -> str:
    if isinstance(result, dict):
        if "refunded" in result:
            return "refunded" if result["refunded"] else "nothing to refund"
        if "receipt" in result:
            return f"receipt {result['receipt']}" + (" (repeat answered by the bank)" if result.get("repeat") else "")
        if "receipts" in result:
            return f"{len(result['receipts'])} receipts"
    return ""


def _title(text: str) -> None:
    print(f"\n  {text}", flush=True)


def _say(text: str) -> None:
    print(f"  {text}", flush=True)

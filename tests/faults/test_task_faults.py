"""Task faults with real processes under ``tether up``: the demo checkout with a declined card, an aborted checkout
and a worker SIGKILLed while payments run; a phase that kills its own worker every time (restart limit) or once
per checkpoint (progress resets the count); a SIGSTOPped worker whose lease goes to another worker and whose late
commit is refused, and whose late payment charge is declined: its abort handler voided the key.

The demo's fake bank is a ledger file under an exclusive ``flock``. Holding that lock from the test parks every
payment that reached the bank inside its charge (a worker thread, which a cancellation cannot interrupt), and
``/proc/locks`` shows which worker processes wait on it: that is how these tests stop payments at a known point
without sleeping for a guessed time.
"""

from __future__ import annotations

import collections
import fcntl
import json
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final, TextIO

import attrs
import pytest
import trio

import actors
from actors import TaskOutcome, TaskRecord
from protocol import JsonValue, OutcomeStatus
from runtime._exits import EXIT_OK
from runtime.demo_app import BANK_ENV, DECLINED_CARDS, Bank
from tests.faults import _task_apps
from tests.faults._task_apps import read_runs, task_file
from tests.integration import _up_helpers
from tests.integration._up_helpers import Up, all_up, pid_gone, supervised, tether_up, worker_named

TASK_APP: Final = "tests.faults._task_apps:app"
[DECLINED] = DECLINED_CARDS
CARDS: Final = ("4242-4242-4242-4242", "5555-5555-5555-4444", "3782-822463-10005", "6011-1111-1111-1117")
SLOW_S: Final = 30.0
"""A payment delay no test waits out: a payment this slow ends only by being aborted."""
STEADY_STEPS: Final = 50
"""Checkpoints of the tasks that run next to a crash loop (0.05 s each)."""
PAUSED_DELAY_S: Final = 2.0
"""The delay of payments whose worker is stopped: longer than the heartbeat timeout (1 s) that cuts its lease."""
POLL_S: Final = 0.02
WAIT_S: Final = 20.0


# ---------------------------------------------------------------------------------------------------- helpers


@pytest.fixture
def bank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Bank:
    """The demo's ledger in ``tmp_path``, named in the environment every ``tether up`` of the test starts with."""
    path = tmp_path / "bank.jsonl"
    path.touch()
    monkeypatch.setitem(_up_helpers.CHILD_ENV, BANK_ENV, str(path))
    return Bank(path)


@pytest.fixture
def work_dir(tmp_path: Path) -> Path:
    """Where the tasks of ``tests.faults._task_apps`` leave their files."""
    path = tmp_path / "work"
    path.mkdir()
    return path


@attrs.define
class LedgerLock:
    """The bank's ledger lock, held by the test: payments that reach the bank wait inside their charge."""

    bank: Bank
    file: TextIO | None = None

    def __enter__(self) -> LedgerLock:
        self.file = open(self.bank.path, "a+", encoding="utf-8")
        fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return self

    def release(self) -> None:
        if self.file is not None:
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()
            self.file = None

    def __exit__(self, *exc: object) -> None:
        self.release()

    def waiters(self) -> collections.Counter[int]:
        """How many threads of each process wait for this lock (``/proc/locks`` names blocked ones ``->``)."""
        stat = os.stat(self.bank.path)
        device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
        waiting: collections.Counter[int] = collections.Counter()
        for line in Path("/proc/locks").read_text(encoding="utf-8").splitlines():
            fields = line.split()
            if len(fields) > 6 and fields[1] == "->" and fields[2] == "FLOCK" and fields[6] == device:
                waiting[int(fields[5])] += 1
        return waiting


async def until(check: Callable[[], Awaitable[bool]], what: str, *, timeout_s: float = WAIT_S) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after ``timeout_s``."""
    with trio.move_on_after(timeout_s):
        while not await check():  # noqa: ASYNC110 - the state polled is in other processes
            await trio.sleep(POLL_S)
        return
    raise AssertionError(f"no {what} within {timeout_s:g} s")


@attrs.define
class TaskLog:
    """Every task record committed (from the first commit on), in commit order, through a watch."""

    records: list[TaskRecord] = attrs.Factory(list)

    async def run(
        self, client: actors.Client, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with client.watch(from_seq=0) as changes:
            task_status.started()
            async for change in changes:
                self.records.extend(record for record in change.records if isinstance(record, TaskRecord))

    def of(self, task_id: str) -> list[TaskRecord]:
        return [record for record in self.records if record.task_id == task_id]

    async def wait_terminal(self, task_id: str) -> TaskRecord:
        while True:
            ended = [record for record in self.of(task_id) if record.status == "terminal"]
            if ended:
                return ended[0]
            await trio.sleep(POLL_S)


async def stop(up: Up) -> None:
    up.process.send_signal(signal.SIGTERM)
    assert await up.wait_exit() == EXIT_OK, up.stderr_text()
    await up.assert_everything_gone(timeout_s=0.5)


async def payments_of(client: actors.Client, checkout_id: str) -> dict[str, str]:
    """The checkout's payments (from its stored checkpoint), by task id: their card numbers."""
    state = await client.task_state(checkout_id)
    assert isinstance(state.checkpoint, dict), state
    cards = {}
    for payment_id in state.checkpoint["payments"]:
        payment = await client.task_state(payment_id)
        assert isinstance(payment.input, dict)
        cards[payment_id] = payment.input["card"]
    return cards


@attrs.frozen
class Ledger:
    """What the bank recorded, by card (each checkout here charges distinct cards)."""

    lines: list[dict[str, Any]]

    def cards(self, op: str) -> list[str]:
        card_of = {line["key"]: line["card"] for line in self.lines if "card" in line}
        return [card_of.get(line["key"], f"?{line['key']}") for line in self.lines if line["op"] == op]

    def check(self) -> None:
        """No key charged twice, none refunded twice, nothing refunded that was never charged, one key per card."""
        charged = collections.Counter(line["key"] for line in self.lines if line["op"] == "charge")
        refunded = collections.Counter(line["key"] for line in self.lines if line["op"] == "refund")
        assert all(count == 1 for count in charged.values()), f"a key was charged twice: {self.lines}"
        assert all(count == 1 for count in refunded.values()), f"a key was refunded twice: {self.lines}"
        assert set(refunded) <= set(charged), f"a refund without a charge: {self.lines}"
        keys_of_card: dict[str, set[str]] = collections.defaultdict(set)
        for line in self.lines:
            if "card" in line:
                keys_of_card[line["card"]].add(line["key"])
        assert all(len(keys) == 1 for keys in keys_of_card.values()), f"a card under two keys: {self.lines}"


def outcome(status: OutcomeStatus, result: Any = None, *, error: str | None = None) -> TaskOutcome:
    return TaskOutcome(status=status, result=JsonValue(result), error=error)


def ledger(bank: Bank) -> Ledger:
    result = Ledger(bank.ledger())
    result.check()
    return result


async def task_graph_payments(client: actors.Client) -> dict[str, actors.TaskNode]:
    graph = await client.task_graph()
    return {task_id: node for task_id, node in graph.nodes.items() if node.task.kind == "shop.payment"}


# ------------------------------------------------------------------------------------------------ the checkout


async def test_a_declined_card_fails_the_checkout_and_aborts_the_slow_payments(
    db_path: str, tmp_path: Path, bank: Bank
) -> None:
    cards: list[Any] = [DECLINED, *({"card": card, "delay_s": SLOW_S} for card in CARDS[:3])]
    with trio.fail_after(60):
        async with tether_up(db_path, tmp_path, "--workers", "2") as up:
            await up.wait_status(all_up(2), "owner and two attached workers")
            async with actors.connect(db=db_path) as client, trio.open_nursery() as nursery:
                log = TaskLog()
                await nursery.start(log.run, client)
                checkout_id = await client.create_task("shop.checkout", {"cards": cards, "amount": 250})
                checkout = await client.wait_for_task(checkout_id)
                payments = await payments_of(client, checkout_id)
                ended = {payment_id: await client.task(payment_id) for payment_id in payments}
                await log.wait_terminal(checkout_id)
                nursery.cancel_scope.cancel(reason="the checkout ended")
            await stop(up)

    error = f"card {DECLINED} was declined"
    assert checkout.outcome == outcome("failed", error=error)
    by_card = {payments[payment_id]: record for payment_id, record in ended.items()}
    assert sorted(by_card) == sorted([DECLINED, *CARDS[:3]])
    assert by_card[DECLINED].outcome == outcome("failed", error=error)
    for card in CARDS[:3]:
        # Aborted in their delay, before reaching the bank: nothing to refund.
        assert by_card[card].outcome == outcome("aborted", {"card": card, "refunded": False})
        assert by_card[card].abort == "abort"
    # Bottom-up: every payment was terminal before the checkout's decide phase ran (it reads their outcomes).
    assert max(record.seq for record in ended.values()) < checkout.seq
    decide = [record for record in log.of(checkout_id) if record.status == "running" and record.phase == "decide"]
    assert decide and decide[0].seq > max(record.seq for record in ended.values())
    assert checkout.abort is None  # a failed checkout, not an aborted one: its own abort handler never ran

    bank_ledger = ledger(bank)
    assert bank_ledger.cards("declined") == [DECLINED]
    # Every charge made was refunded exactly once (the slow payments never reached the bank).
    assert sorted(bank_ledger.cards("refund")) == sorted(bank_ledger.cards("charge"))
    assert bank_ledger.cards("charge") == []


async def test_aborting_a_checkout_aborts_its_payments_first_and_refunds_what_they_charged(
    db_path: str, tmp_path: Path, bank: Bank
) -> None:
    """Two payments are stuck inside their charge (the test holds the ledger), two in a long delay, when the checkout
    is aborted: the charges that land anyway are refunded by their payments' abort handlers, all before the
    checkout's own handler runs."""
    in_bank, delayed = CARDS[:2], CARDS[2:]
    cards: list[Any] = [*in_bank, *({"card": card, "delay_s": SLOW_S} for card in delayed)]
    with trio.fail_after(60):
        async with tether_up(db_path, tmp_path, "--workers", "2") as up:
            await up.wait_status(all_up(2), "owner and two attached workers")
            async with actors.connect(db=db_path) as client, trio.open_nursery() as nursery:
                log = TaskLog()
                await nursery.start(log.run, client)
                with LedgerLock(bank) as lock:
                    checkout_id = await client.create_task("shop.checkout", {"cards": cards})

                    async def all_running() -> bool:
                        nodes = await task_graph_payments(client)
                        running = [node for node in nodes.values() if node.task.status == "running"]
                        return len(running) == 4 and sum(lock.waiters().values()) == 2

                    await until(all_running, "four running payments, two of them waiting in the bank")
                    assert await client.abort_task(checkout_id) is True
                    payments = await payments_of(client, checkout_id)

                    async def all_marked() -> bool:
                        return all([(await client.task(payment_id)).abort == "abort" for payment_id in payments])

                    await until(all_marked, "abort marks on every payment")
                    # The charges blocked by the lock land only now, after their phases were told to stop.
                    lock.release()
                    checkout = await client.wait_for_task(checkout_id)
                ended = {payment_id: await client.task(payment_id) for payment_id in payments}
                await log.wait_terminal(checkout_id)
                nursery.cancel_scope.cancel(reason="the checkout ended")
            await stop(up)

    assert checkout.outcome == outcome("aborted", {"payments": dict.fromkeys(payments, "aborted")}), checkout.outcome
    for payment_id, record in ended.items():
        card = payments[payment_id]
        assert record.outcome == outcome("aborted", {"card": card, "refunded": card in in_bank})
    # Bottom-up: each payment's abort handler committed its end before the checkout's handler was even leased.
    last_payment_seq = max(record.seq for record in ended.values())
    assert last_payment_seq < checkout.seq
    handler_leased = [
        record for record in log.of(checkout_id) if record.status == "running" and record.abort == "abort"
    ]
    assert handler_leased, log.of(checkout_id)
    assert handler_leased[0].seq > last_payment_seq
    for payment_id in payments:
        payment_handler = [r for r in log.of(payment_id) if r.status == "running" and r.abort == "abort"]
        assert payment_handler, f"payment {payment_id}: its abort handler was never leased: {log.of(payment_id)}"

    bank_ledger = ledger(bank)
    assert sorted(bank_ledger.cards("charge")) == sorted(in_bank)
    assert sorted(bank_ledger.cards("refund")) == sorted(in_bank)
    assert bank_ledger.cards("charge_repeat") == []


async def test_a_worker_sigkilled_while_payments_run_is_restarted_and_its_payments_charge_once(
    db_path: str, tmp_path: Path, bank: Bank
) -> None:
    with trio.fail_after(60):
        async with tether_up(db_path, tmp_path, "--workers", "2") as up:
            before = await up.wait_status(all_up(2), "owner and two attached workers")
            async with actors.connect(db=db_path) as client, trio.open_nursery() as nursery:
                log = TaskLog()
                await nursery.start(log.run, client)
                with LedgerLock(bank) as lock:
                    checkout_id = await client.create_task("shop.checkout", {"cards": list(CARDS), "amount": 120})

                    async def all_in_bank() -> bool:
                        nodes = await task_graph_payments(client)
                        running = [node for node in nodes.values() if node.task.status == "running"]
                        return len(running) == 4 and sum(lock.waiters().values()) == 4

                    await until(all_in_bank, "four payments waiting in the bank")
                    nodes = await task_graph_payments(client)
                    leased_to = collections.Counter(str(node.leased_to) for node in nodes.values())
                    victim_name = max(sorted(leased_to), key=lambda name: leased_to[name])
                    victim = worker_named(before, victim_name)
                    rerun = {task_id for task_id, node in nodes.items() if node.leased_to == victim_name}
                    assert lock.waiters()[victim["pid"]] == len(rerun)

                    os.kill(victim["pid"], signal.SIGKILL)

                    async def rerun_in_bank() -> bool:
                        records = [await client.task(task_id) for task_id in rerun]
                        again = all(r.status == "running" and r.epoch == 2 and r.restarts == 1 for r in records)
                        return again and sum(lock.waiters().values()) == 4

                    await until(rerun_in_bank, "the killed worker's payments running again, in the bank")
                    lock.release()
                    checkout = await client.wait_for_task(checkout_id)
                payments = await payments_of(client, checkout_id)
                ended = {payment_id: await client.task(payment_id) for payment_id in payments}
                await log.wait_terminal(checkout_id)
                nursery.cancel_scope.cancel(reason="the checkout ended")
            after = await up.wait_status(
                lambda status: (
                    worker_named(status, victim_name)["restarts"] == 1
                    and worker_named(status, victim_name)["pid"] != victim["pid"]
                    and all_up(2)(status)
                ),
                "the killed worker restarted and attached",
            )
            await stop(up)

    assert pid_gone(victim["pid"])
    others = [worker for worker in supervised(after) if worker["name"] != victim_name]
    assert [worker["restarts"] for worker in others] == [0]
    assert checkout.outcome is not None and checkout.outcome.status == "completed", checkout.outcome
    assert isinstance(checkout.outcome.result, dict)
    receipts = checkout.outcome.result["receipts"]
    assert sorted(receipt["card"] for receipt in receipts) == sorted(CARDS)
    for payment_id, record in ended.items():
        assert record.outcome is not None and record.outcome.status == "completed", record
        history = log.of(payment_id)
        if payment_id in rerun:
            # Cut off once (restarts 1), leased again (epoch 2), then done; the completing commit resets restarts.
            # (The cut-off and the new grant are one settling commit: its record is the new lease's.)
            assert [(r.status, r.restarts, r.epoch) for r in history if r.restarts] == [("running", 1, 2)], history
            assert record.epoch == 2
        else:
            assert all(r.restarts == 0 for r in history), history
            assert record.epoch == 1

    bank_ledger = ledger(bank)
    # One charge per card, whatever ran twice ("charge_repeat" lines would be the idempotency key at work).
    assert sorted(bank_ledger.cards("charge")) == sorted(CARDS)
    assert bank_ledger.cards("refund") == []
    assert bank_ledger.cards("declined") == []


# -------------------------------------------------------------------------------------------- restart limits


async def test_a_phase_that_kills_its_worker_every_time_faults_at_the_restart_limit_and_others_complete(
    db_path: str, tmp_path: Path, work_dir: Path
) -> None:
    with trio.fail_after(60):
        async with tether_up(
            db_path, tmp_path, "--workers", "2", "--app", TASK_APP, "--max-restarts", "50", "--restart-window", "60"
        ) as up:
            await up.wait_status(all_up(2), "owner and two attached workers")
            async with actors.connect(db=db_path) as client, trio.open_nursery() as nursery:
                log = TaskLog()
                await nursery.start(log.run, client)
                # Granted in turn to the less busy worker: the crashing task shares its first worker with one of these.
                steady = [
                    await client.create_task(
                        _task_apps.STEADY, {"dir": str(work_dir), "steps": STEADY_STEPS, "step_s": 0.05}
                    )
                    for _ in range(3)
                ]
                crash_id = await client.create_task(_task_apps.CRASH, {"dir": str(work_dir), "delay_s": 0.2})
                crashed = await client.wait_for_task(crash_id)
                steady_ended = [await client.wait_for_task(task_id) for task_id in steady]
                nursery.cancel_scope.cancel(reason="every task ended")
            after = await up.wait_status(all_up(2), "both workers back after the crash loop")
            assert up.process.poll() is None, "the supervisor gave up"
            await stop(up)

    assert crashed.outcome is not None
    assert crashed.outcome.status == "faulted" and crashed.outcome.reason == "restart_limit", crashed.outcome
    assert crashed.restarts == 5 and crashed.restart_limit == 5
    runs = read_runs(work_dir, crash_id)
    assert [run["restarts"] for run in runs] == [0, 1, 2, 3, 4], runs
    assert [run["epoch"] for run in runs] == [1, 2, 3, 4, 5], runs
    assert crashed.epoch == 5
    # Each run killed the worker it ran on: five worker restarts, all absorbed by the supervisor.
    assert sum(worker["restarts"] for worker in supervised(after)) == 5
    assert after["supervisor"] == {"pid": up.pid}
    for record in steady_ended:
        assert record.outcome == outcome("completed", {"steps": STEADY_STEPS}), record
    # They did run next to the crashes: at least one was cut off by a dying worker, and carried on.
    cut_off = [task_id for task_id in steady if any(record.restarts for record in log.of(task_id))]
    assert cut_off, [log.of(task_id) for task_id in steady]


async def test_a_task_that_commits_progress_between_crashes_is_not_restart_limited(
    db_path: str, tmp_path: Path, work_dir: Path
) -> None:
    checkpoints = 7
    with trio.fail_after(60):
        async with tether_up(
            db_path, tmp_path, "--workers", "2", "--app", TASK_APP, "--max-restarts", "50", "--restart-window", "60"
        ) as up:
            await up.wait_status(all_up(2), "owner and two attached workers")
            async with actors.connect(db=db_path) as client, trio.open_nursery() as nursery:
                log = TaskLog()
                await nursery.start(log.run, client)
                task_id = await client.create_task(
                    _task_apps.PROGRESS, {"dir": str(work_dir), "checkpoints": checkpoints, "delay_s": 0.05}
                )
                ended = await client.wait_for_task(task_id)
                await log.wait_terminal(task_id)
                nursery.cancel_scope.cancel(reason="the task ended")
            after = await up.wait_status(all_up(2), "both workers back after the crashes")
            await stop(up)

    assert ended.outcome == outcome("completed", {"checkpoints": checkpoints}), ended.outcome
    runs = read_runs(work_dir, task_id)
    # Every checkpoint ran twice: the run that crashed, then the re-run (restarts 1) that advanced.
    assert [(run["n"], run["restarts"]) for run in runs] == [(n, r) for n in range(checkpoints) for r in (0, 1)]
    assert max(record.restarts for record in log.of(task_id)) == 1
    assert ended.epoch == 2 * checkpoints
    assert sum(worker["restarts"] for worker in supervised(after)) == checkpoints
    assert after["supervisor"] == {"pid": up.pid}


# ---------------------------------------------------------------------------------------------- lost leases


async def test_a_sigstopped_worker_loses_its_lease_and_its_late_commit_is_refused(
    db_path: str, tmp_path: Path, work_dir: Path
) -> None:
    with trio.fail_after(60):
        async with tether_up(db_path, tmp_path, "--workers", "2", "--app", TASK_APP, "--heartbeat-timeout", "1") as up:
            before = await up.wait_status(all_up(2), "owner and two attached workers")
            workers = {worker["pid"]: worker["name"] for worker in supervised(before)}
            async with actors.connect(db=db_path) as client:
                task_id = await client.create_task(_task_apps.STALL, {"dir": str(work_dir)})
                started = task_file(work_dir, task_id, "started")

                async def has_started() -> bool:
                    return started.exists() and started.read_text(encoding="utf-8") != ""

                await until(has_started, "the first run of the stalling phase")
                stopped_pid = int(started.read_text(encoding="utf-8"))
                assert stopped_pid in workers
                [other_pid] = set(workers) - {stopped_pid}
                os.kill(stopped_pid, signal.SIGSTOP)
                try:
                    ended = await client.wait_for_task(task_id)
                    # The stopped phase may now commit: it does so the moment it runs again.
                    task_file(work_dir, task_id, "go").touch()
                finally:
                    os.kill(stopped_pid, signal.SIGCONT)
                stale = task_file(work_dir, task_id, "stale")
                landed = task_file(work_dir, task_id, "landed")

                async def late_commit_answered() -> bool:
                    return (stale.exists() and stale.read_text(encoding="utf-8") != "") or landed.exists()

                await until(late_commit_answered, "an answer to the stopped worker's late commit")
                after_late = await client.task(task_id)
                entries = await client.entries(after_late.conversation_id)
            back = await up.wait_status(
                lambda status: all_up(2)(status) and {w["pid"] for w in supervised(status)} == set(workers),
                "the stopped worker attached again",
            )
            await stop(up)

    assert not landed.exists(), "the late commit under the lost lease was accepted"
    refusal = json.loads(stale.read_text(encoding="utf-8"))
    assert refusal["code"] == actors.ErrorCode.STALE_LEASE, refusal
    # Completed by the other worker, under the second lease, on a re-run after one cut-off.
    assert ended.outcome == outcome("completed", {"pid": other_pid, "restarts": 1, "epoch": 2, "late": False}), ended
    assert ended.epoch == 2
    # The refused commit changed nothing: neither the task nor its conversation (its entry was not written).
    assert after_late == ended
    written = [entry.data for entry in entries if entry.kind == _task_apps.STALL_ENTRY]
    assert written == [JsonValue({"pid": other_pid, "late": False})], entries
    assert [worker["restarts"] for worker in supervised(back)] == [0, 0]


async def test_a_payment_paused_past_its_lease_does_not_charge_after_the_checkout_was_aborted(
    db_path: str, tmp_path: Path, bank: Bank
) -> None:
    """The demo's promise under a paused worker: a payment whose worker is stopped while it waits out its delay is
    aborted (its lease is cut off by the heartbeat, its abort handler refunds nothing on the other worker), and the
    checkout ends aborted. When the stopped worker runs again, its phase's delay is over: it must not leave a charge
    nobody refunds."""
    cards: list[Any] = [{"card": card, "delay_s": PAUSED_DELAY_S} for card in CARDS[:2]]
    with trio.fail_after(60):
        async with tether_up(db_path, tmp_path, "--workers", "2", "--heartbeat-timeout", "1") as up:
            before = await up.wait_status(all_up(2), "owner and two attached workers")
            async with actors.connect(db=db_path) as client:
                checkout_id = await client.create_task("shop.checkout", {"cards": cards})
                created_s = trio.current_time()

                async def both_running() -> bool:
                    nodes = await task_graph_payments(client)
                    return sum(node.task.status == "running" for node in nodes.values()) == 2

                await until(both_running, "two running payments")
                nodes = await task_graph_payments(client)
                stopped_name = min(str(node.leased_to) for node in nodes.values())
                stopped_pid = worker_named(before, stopped_name)["pid"]
                os.kill(stopped_pid, signal.SIGSTOP)
                try:
                    assert await client.abort_task(checkout_id) is True
                    checkout = await client.wait_for_task(checkout_id)
                    # Keep it stopped until its payments' delay is over.
                    await trio.sleep_until(created_s + PAUSED_DELAY_S + 0.3)
                finally:
                    os.kill(stopped_pid, signal.SIGCONT)
                # Its phases woke (their delay was over) in the first scheduling round after SIGCONT: each has
                # been cancelled since (the lost connection cancels every phase of the worker) or is in the bank
                # call, long before the worker reconnected and announced itself again.
                await up.wait_status(lambda status: worker_named(status, stopped_name)["attached"], "it is back")
                payments = await payments_of(client, checkout_id)
                ended = {payment_id: await client.task(payment_id) for payment_id in payments}
            # The event that bounds the resumed phases: their worker exits, and it exits only once every phase of
            # its nursery ended (a bank call in a thread is waited for). After that, nothing can charge any more.
            await stop(up)

    assert checkout.outcome == outcome("aborted", {"payments": dict.fromkeys(payments, "aborted")})
    for payment_id, record in ended.items():
        assert record.outcome == outcome("aborted", {"card": payments[payment_id], "refunded": False})
    bank_ledger = ledger(bank)
    unrefunded = sorted(set(bank_ledger.cards("charge")) - set(bank_ledger.cards("refund")))
    assert unrefunded == [], f"charged after their payment was aborted, never refunded: {bank_ledger.lines}"

"""The built-in demo app, the default of ``tether up --app``: a checkout that charges several cards.

``shop.checkout`` creates one ``shop.payment`` per card, owned by the checkout, and waits on them with
``fail_fast``: the first declined card aborts the other payments, bottom-up (each payment's abort handler refunds
what it charged before the checkout's own handler runs). Payments charge a fake bank (:class:`Bank`), a ledger
file shared by every worker process, which deduplicates by idempotency key the way a real payment API does; the
key is ``rt.operation_id("charge")``, stable across re-runs of the phase, so a payment re-run after its worker was
killed charges at most once.

Environment: ``TETHER_DEMO_BANK`` names the ledger file (default ``tether-demo-bank.jsonl`` in the working
directory).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, TextIO

import trio

import actors

DECLINED_CARDS: Final = frozenset({"4000-0000-0000-0002"})
"""Cards the fake bank declines (a real test card number with that meaning)."""
BANK_ENV: Final = "TETHER_DEMO_BANK"


class Declined(Exception):
    pass


class Bank:
    """A fake payment service: a JSON-lines ledger under an exclusive file lock, idempotent by key.

    Every call is recorded, so a test or the demo can check that each idempotency key was charged at most once
    however often a payment ran.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @classmethod
    def from_environment(cls) -> Bank:
        return cls(os.environ.get(BANK_ENV, "tether-demo-bank.jsonl"))

    def charge(self, card: str, amount: int, key: str) -> dict[str, Any]:
        """Charge once per ``key``: a repeated key returns the first receipt. Raises :class:`Declined` for a
        declined card, or a key that was voided (refunded before anything was charged under it)."""
        with self._open() as (ledger, file):
            for line in ledger:
                if line["op"] == "charge" and line["key"] == key:
                    _record(file, {"op": "charge_repeat", "key": key, "card": card})
                    return {"receipt": line["receipt"], "repeat": True}
                if line["op"] == "void" and line["key"] == key:
                    _record(file, {"op": "charge_voided", "key": key, "card": card})
                    raise Declined(f"the charge of card {card} was voided by a refund")
            if card in DECLINED_CARDS:
                _record(file, {"op": "declined", "key": key, "card": card})
                raise Declined(f"card {card} was declined")
            receipt = f"r-{key[-12:]}"
            _record(file, {"op": "charge", "key": key, "card": card, "amount": amount, "receipt": receipt})
            return {"receipt": receipt, "repeat": False}

    def refund(self, key: str) -> bool:
        """Refund the charge made under ``key``, once; ``False`` if there was none (or it was refunded already).

        A key refunded before anything was charged under it is voided: a charge that arrives later (from a phase
        that kept running on a worker cut off from the owner) is declined, as payment APIs do with a cancelled
        idempotency key, so nothing stays charged after its payment was aborted.
        """
        with self._open() as (ledger, file):
            charged = any(line["op"] == "charge" and line["key"] == key for line in ledger)
            settled = any(line["op"] in ("refund", "void") and line["key"] == key for line in ledger)
            if settled:
                return False
            _record(file, {"op": "refund" if charged else "void", "key": key})
            return charged

    def ledger(self) -> list[dict[str, Any]]:
        """Every call recorded so far, oldest first."""
        with self._open() as (ledger, _):
            return ledger

    @contextlib.contextmanager
    def _open(self) -> Iterator[tuple[list[dict[str, Any]], TextIO]]:
        with open(self.path, "a+", encoding="utf-8") as file:
            fcntl.flock(file, fcntl.LOCK_EX)
            try:
                file.seek(0)
                yield [json.loads(line) for line in file if line.strip()], file
                file.flush()
                os.fsync(file.fileno())
            finally:
                fcntl.flock(file, fcntl.LOCK_UN)


def _record(file: TextIO, line: dict[str, Any]) -> None:
    file.write(json.dumps(line, sort_keys=True) + "\n")


async def charge(rt: actors.Phase) -> None:
    """Charge the card once (idempotency key: this phase's operation id). ``delay_s`` before the charge and
    ``confirm_s`` after it (before the phase commits) let the demo abort a checkout or kill a worker mid-payment."""
    await trio.sleep(float(rt.input.get("delay_s", 0)))
    bank = Bank.from_environment()
    key = rt.operation_id("charge")
    try:
        receipt = await trio.to_thread.run_sync(bank.charge, rt.input["card"], rt.input["amount"], key)
    except Declined as exc:
        await rt.fail(str(exc))
        return
    await trio.sleep(float(rt.input.get("confirm_s", 0)))
    await rt.complete({"card": rt.input["card"], **receipt})


async def refund(rt: actors.Phase) -> None:
    """The payment's abort handler: refund what the interrupted charge phase may have charged."""
    bank = Bank.from_environment()
    refunded = await trio.to_thread.run_sync(bank.refund, rt.operation_id("charge"))
    await rt.aborted({"card": rt.input["card"], "refunded": refunded})


async def pay(rt: actors.Phase) -> None:
    async with rt.commit() as tx:
        payments = [tx.create_task("shop.payment", _payment_input(rt.input, card)) for card in rt.input["cards"]]
        tx.wait(on=payments, policy="fail_fast", checkpoint={"phase": "decide", "payments": payments})


def _payment_input(checkout: dict[str, Any], card: str | dict[str, Any]) -> dict[str, Any]:
    """A card is a number, or ``{"card": number, "delay_s": s, "confirm_s": s}`` to slow that payment down."""
    payment = {
        "card": card,
        "amount": checkout.get("amount", 100),
        "delay_s": checkout.get("delay_s", 0),
        "confirm_s": checkout.get("confirm_s", 0),
    }
    if isinstance(card, dict):
        payment |= card
    return payment


async def decide(rt: actors.Phase) -> None:
    payments = rt.checkpoint["payments"]
    outcomes = await rt.outcomes(payments)
    failed = [outcome for outcome in outcomes.values() if outcome is not None and outcome.status != "completed"]
    declined = [outcome.error for outcome in failed if outcome.status == "failed"]
    if declined:
        await rt.fail("; ".join(str(error) for error in declined))
    elif failed:
        await rt.fail(f"{len(failed)} payment(s) did not complete")
    else:
        await rt.complete({"receipts": [outcome.result for outcome in outcomes.values() if outcome is not None]})


async def cancel_checkout(rt: actors.Phase) -> None:
    """The checkout's abort handler: runs after every payment is terminal, so it sees their final outcomes."""
    payments = rt.checkpoint.get("payments", []) if isinstance(rt.checkpoint, dict) else []
    outcomes = await rt.outcomes(payments) if payments else {}
    await rt.aborted({"payments": {task_id: None if o is None else o.status for task_id, o in outcomes.items()}})


app = actors.App("demo")
app.define_task(
    "shop.payment", version=1, initial=lambda _input: {"phase": "charge"}, phases={"charge": charge}, abort=refund
)
app.define_task(
    "shop.checkout",
    version=1,
    initial=lambda _input: {"phase": "pay"},
    phases={"pay": pay, "decide": decide},
    abort=cancel_checkout,
)

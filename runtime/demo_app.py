"""The built-in demo app, the default of ``tether up --app``: a checkout that charges several cards.

``shop.checkout`` creates one ``shop.payment`` per card, owned by the checkout, and waits on them with
``fail_fast``: the first declined card aborts the other payments, bottom-up (each payment's abort handler refunds
what it charged before the checkout's own handler runs). Payments charge a fake bank (:class:`Bank`), a ledger
file shared by every worker process, which deduplicates by idempotency key the way a real payment API does; the
key is ``rt.operation_id("charge")``, stable across re-runs of the phase, so a payment re-run after its worker was
killed charges at most once.

The agent ``support`` (version 1, on an :class:`actors.ScriptedModel`) answers a customer whose order never
arrived: its first turn calls three tools in parallel, each with a different recovery policy, against a fake support
desk (:class:`Desk`, a ledger file like the bank's): ``look_up_order`` (``safe``: a read, run again after a crash),
``refund_order`` (``idempotent``, behind ``needs_approval``: the desk deduplicates refunds by idempotency key, the
call's ``operation_id``, and answers a repeat from its key) and ``ship_replacement`` (``manual``: not safe to repeat,
a person settles an interrupted call); its second turn is the answer. The desk's ledger records every effect and
every repeat answered from a key, so ``tether demo --part agents`` can check that no effect was done twice.

The agent ``analyst`` (version 1) answers the same customer by asking the agent ``researcher`` (a subagent:
``research`` is an ``actors.subagent_tool``), which looks the order up, then settles a refund with ``settle_refund``,
which asks a person how much (``call.ask``) and pays it out through ``pay_refund`` (a nested call,
``call.execute_tool``, idempotent against the desk), so ``tether demo --part research`` can kill a worker while the
question is open and check that nothing was asked or paid twice.

The agent ``tracker`` (version 1) answers the same customer with one safe tool, ``look_up_order``, and streams its
answer slowly (a scripted model, a few characters every 40 ms), so ``tether demo --part agent`` can show the text
arriving in ``tether watch``'s lines. ``TETHER_DEMO_MODEL=NAME`` in the worker's environment (``tether demo --part
agent --model NAME`` sets it) puts it on a real model instead: :class:`actors.OpenAIChat` ``NAME``, found through
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``.

Environment: ``TETHER_DEMO_BANK`` names the bank's ledger file (default ``tether-demo-bank.jsonl`` in the working
directory), ``TETHER_DEMO_DESK`` the desk's (default ``tether-demo-desk.jsonl``). While the file named by
``TETHER_DEMO_HOLD`` exists, every support tool holds after its effect, before it returns (the demo kills a worker
there).
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
DESK_ENV: Final = "TETHER_DEMO_DESK"
HOLD_ENV: Final = "TETHER_DEMO_HOLD"
MODEL_ENV: Final = "TETHER_DEMO_MODEL"


class Declined(Exception):
    pass


class _Ledger:
    """A JSON-lines ledger under an exclusive file lock, shared by every process that opens the same file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

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


class Bank(_Ledger):
    """A fake payment service: a JSON-lines ledger under an exclusive file lock, idempotent by key.

    Every call is recorded, so a test or the demo can check that each idempotency key was charged at most once
    however often a payment ran.
    """

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


class Desk(_Ledger):
    """A fake support desk: order look-ups, refunds (idempotent by key, as a payment API's) and shipments (not).

    Every call is recorded with the tool call's operation id and attempt, so the demo can count what each call did.
    """

    @classmethod
    def from_environment(cls) -> Desk:
        return cls(os.environ.get(DESK_ENV, "tether-demo-desk.jsonl"))

    def look_up(self, order: str, operation_id: str, attempt: int) -> dict[str, Any]:
        with self._open() as (_, file):
            _record(file, {"op": "lookup", "order": order, "operation_id": operation_id, "attempt": attempt})
        return {"order": order, "status": "lost in transit", "paid": 25}

    def refund(self, order: str, amount: int, key: str, attempt: int) -> dict[str, Any]:
        """Refund once per ``key``: a repeated key is answered with the first refund (and recorded as a repeat)."""
        with self._open() as (ledger, file):
            for line in ledger:
                if line["op"] == "refund" and line["key"] == key:
                    _record(file, {"op": "refund_repeat", "order": order, "key": key, "attempt": attempt})
                    return {"refund": line["refund"], "amount": line["amount"], "repeat": True}
            refund = f"rf-{key[-8:]}"
            line = {"op": "refund", "order": order, "amount": amount, "key": key, "attempt": attempt, "refund": refund}
            _record(file, line)
            return {"refund": refund, "amount": amount, "repeat": False}

    def ship(self, order: str, operation_id: str, attempt: int) -> dict[str, Any]:
        """Ship a replacement: every call ships one more parcel (no idempotency key)."""
        shipment = f"sh-{operation_id[-8:]}-{attempt}"
        with self._open() as (_, file):
            line = {"op": "shipment", "order": order, "operation_id": operation_id, "attempt": attempt}
            _record(file, line | {"shipment": shipment})
        return {"order": order, "shipment": shipment}


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


async def _hold() -> None:
    """Hold while the file named by ``TETHER_DEMO_HOLD`` exists (the demo kills the worker meanwhile)."""
    hold = os.environ.get(HOLD_ENV)
    while hold and await trio.Path(hold).exists():  # noqa: ASYNC110 (another process removes the file)
        await trio.sleep(0.02)


async def look_up_order(call: actors.ToolCall, args: dict[str, Any]) -> Any:
    desk = Desk.from_environment()
    found = await trio.to_thread.run_sync(desk.look_up, args["order_id"], call.operation_id, call.attempt)
    await _hold()
    return found


async def refund_order(call: actors.ToolCall, args: dict[str, Any]) -> Any:
    desk = Desk.from_environment()
    refund = await trio.to_thread.run_sync(
        desk.refund, args["order_id"], args["amount"], call.operation_id, call.attempt
    )
    await _hold()
    return refund


async def ship_replacement(call: actors.ToolCall, args: dict[str, Any]) -> Any:
    desk = Desk.from_environment()
    shipment = await trio.to_thread.run_sync(desk.ship, args["order_id"], call.operation_id, call.attempt)
    await _hold()
    return shipment


def _order(**extra: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"order_id": {"type": "string"}, **extra},
        "required": ["order_id", *extra],
        "additionalProperties": False,
    }


SUPPORT_TURNS: Final = [
    actors.ScriptedTurn(
        tool_calls=[
            ("look_up_order", {"order_id": "A1"}),
            ("refund_order", {"order_id": "A1", "amount": 25}),
            ("ship_replacement", {"order_id": "A1"}),
        ]
    ),
    actors.ScriptedTurn(
        text="Sorry about order A1: it was lost in transit. I refunded the 25 you paid and shipped a replacement."
    ),
]
"""The support agent's script: three tool calls in parallel, then the answer."""

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
app.define_tool("look_up_order", look_up_order, description="Look an order up.", parameters=_order(), recovery="safe")
app.define_tool(
    "refund_order",
    refund_order,
    description="Refund an order (a person approves it).",
    parameters=_order(amount={"type": "integer", "minimum": 1}),
    recovery="idempotent",
    needs_approval=lambda _args: True,
)
app.define_tool(
    "ship_replacement",
    ship_replacement,
    description="Ship a replacement (not safe to repeat).",
    parameters=_order(),
    recovery="manual",
)
app.define_agent(
    "support",
    version=1,
    model=actors.ScriptedModel(SUPPORT_TURNS),
    instructions="Help customers with their orders.",
    tools=["look_up_order", "refund_order", "ship_replacement"],
)


async def settle_refund(call: actors.ToolCall, args: dict[str, Any]) -> actors.ToolResult:
    """Ask a person how much to refund (a durable question), then refund it through ``pay_refund`` (a nested call,
    found again by its key if this call runs again)."""
    order, paid = args["order_id"], args["amount"]
    await call.output(f"asking a person about order {order}...\n")
    full = await call.ask(
        f"Order {order} was lost in transit. Refund the {paid} paid in full? (false: half)", schema={"type": "boolean"}
    )
    amount = paid if full else paid // 2
    refund = await call.execute_tool("pay_refund", {"order_id": order, "amount": amount}, key="refund")
    return actors.ToolResult(output=f"refunded {amount} for order {order} ({refund['refund']})", structured=refund)


async def pay_refund(call: actors.ToolCall, args: dict[str, Any]) -> Any:
    desk = Desk.from_environment()
    return await trio.to_thread.run_sync(desk.refund, args["order_id"], args["amount"], call.operation_id, call.attempt)


RESEARCHER_TURNS: Final = [
    actors.ScriptedTurn(text="Let me check the order.", tool_calls=[("look_up_order", {"order_id": "A1"})]),
    actors.ScriptedTurn(text="Order A1 was lost in transit; the customer paid 25 for it."),
]
"""The researcher's script: it looks the order up, then reports what happened."""
ANALYST_TURNS: Final = [
    actors.ScriptedTurn(tool_calls=[("research", {"task": "Find out what happened to order A1."})]),
    actors.ScriptedTurn(tool_calls=[("settle_refund", {"order_id": "A1", "amount": 25})]),
    actors.ScriptedTurn(text="Order A1 was lost in transit, so I refunded the 25 you paid in full. Sorry for that."),
]
"""The analyst's script: it asks the researcher (a subagent), then settles the refund (a person decides), then
answers."""

app.define_agent(
    "researcher",
    version=1,
    model=actors.ScriptedModel(RESEARCHER_TURNS),
    instructions="Find out what happened to an order; report it in one sentence.",
    tools=["look_up_order"],
)
app.define_tool(
    "research",
    actors.subagent_tool(agent="researcher"),
    description="Ask the researcher to find something out; returns its report.",
    recovery="safe",
)
app.define_tool(
    "settle_refund",
    settle_refund,
    description="Refund an order, as much as a person decides.",
    parameters=_order(amount={"type": "integer", "minimum": 1}),
    recovery="safe",
)
app.define_tool(
    "pay_refund",
    pay_refund,
    description="Pay a refund out (called by settle_refund only).",
    parameters=_order(amount={"type": "integer", "minimum": 1}),
    recovery="idempotent",
    callers=["settle_refund"],
)
app.define_agent(
    "analyst",
    version=1,
    model=actors.ScriptedModel(ANALYST_TURNS),
    instructions="Find out what happened to a customer's order, then settle it.",
    tools=["research", "settle_refund"],
)


TRACKER_ANSWER: Final = (
    "Order A1 was lost in transit, and I am sorry for the wait. You paid 25 for it: reply here and I will refund "
    "it or ship a replacement, whichever you prefer."
)
TRACKER_TURNS: Final = [
    actors.ScriptedTurn(
        text="Let me look order A1 up.",
        tool_calls=[("look_up_order", {"order_id": "A1"})],
        chunk_chars=4,
        delay_s=0.04,
    ),
    actors.ScriptedTurn(text=TRACKER_ANSWER, chunk_chars=6, delay_s=0.04),
]
"""The tracker's script: a short streamed sentence and a look-up, then the answer streamed a few characters at a
time (about 1 s, so a watch shows it arrive in pieces)."""


def tracker_model() -> actors.Model:
    """The scripted model, or the real one named by ``TETHER_DEMO_MODEL``."""
    name = os.environ.get(MODEL_ENV, "").strip()
    return actors.OpenAIChat(name) if name else actors.ScriptedModel(TRACKER_TURNS)


app.define_agent(
    "tracker",
    version=1,
    model=tracker_model(),
    instructions=(
        "You help customers of a web shop with their orders. Look the order up with look_up_order before you "
        "answer, then answer in two or three short sentences."
    ),
    tools=["look_up_order"],
)

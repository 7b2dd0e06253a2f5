"""``tether journal``: a run's operation journal (its model requests and tool calls, each with its attempt, status,
recovery policy, times and error), read from the running owner a page at a time (``client.operations``)."""

from __future__ import annotations

import time

from protocol import OperationRecord

from ._connect import connect
from ._table import columns


async def read_journal(db: str, run_id: str) -> list[OperationRecord]:
    """The run's operations, oldest first; :class:`~protocol.NotFound` ("run ... does not exist") for no such run."""
    async with connect(db, "tether-journal") as client:
        await client.run(run_id)  # a run that does not exist is not one with an empty journal
        return await client.operations(run_id)


def moment(ms: int) -> str:
    """A time of the owner's clock (milliseconds since the epoch), in UTC to the millisecond."""
    seconds, millis = divmod(ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def ended(op: OperationRecord) -> str:
    """When the operation ended (its result committed, or it was cut off), or ``-`` while it runs."""
    return "-" if op.status == "started" else moment(op.updated_at_ms)


def format_journal(run_id: str, operations: list[OperationRecord]) -> str:
    """One line per operation, oldest first: its turn, kind and name (a nested call under its caller's id), attempt,
    status, policy, start and end, who resolved it, and its error (code and text) last."""
    if not operations:
        return f"run {run_id}: no operations yet"
    header = ("OPERATION", "TURN", "KIND", "NAME", "ATTEMPT", "STATUS", "POLICY", "STARTED", "ENDED", "BY", "ERROR")
    rows = [
        (
            op.operation_id,
            str(op.turn),
            op.kind if op.parent_operation_id is None else f"{op.kind} in {op.parent_operation_id}",
            f"{op.name}@{op.version}",
            str(op.attempt),
            op.status,
            op.policy or "-",
            moment(op.created_at_ms),
            ended(op),
            op.resolved_by or "-",
            _error(op),
        )
        for op in operations
    ]
    return "\n".join(columns(header, rows))


def _error(op: OperationRecord) -> str:
    if op.error is None and op.code is None:
        return ""
    text = " ".join((op.error or "").split())
    return f"{op.code}: {text}" if op.code else text

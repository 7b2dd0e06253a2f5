"""``tether demo --part agents`` end to end (``tether up``, a worker SIGKILLed mid-tool), and its ledger check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import pytest

from protocol import OperationRecord
from runtime._demo_agents import _check
from runtime.demo_app import Desk
from tests.integration._up_helpers import describe, nonblank_lines, run_tether, wait_gone

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

"""``tether ui``'s fan-out of the owner's watch to open pages (``runtime._ui.Hub``): bounded in pages and in what
waits for a slow one, which is told to read everything again instead of growing; a commit becomes the events a page
needs (the pieces of partial output, then what it touched)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from protocol import Change, PartialRecord, RunRecord
from runtime import _ui


def test_open_pages_are_bounded_and_a_slow_one_is_told_to_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_ui, "MAX_STREAMS", 2)
    monkeypatch.setattr(_ui, "MAX_QUEUED_EVENTS", 3)
    hub = _ui.Hub()
    first, second = hub.open(), hub.open()
    assert first is not None and second is not None
    assert hub.open() is None and hub.open_streams == 2  # one page more is refused (503)
    for n in range(10):
        hub.publish({"type": "change", "seq": n})
    assert first.overflowed and second.overflowed  # at most 3 queued each; the rest dropped, the page told
    queued = []
    while True:
        try:
            queued.append(first.receive.receive_nowait())
        except trio.WouldBlock:
            break
    assert [event["seq"] for event in queued] == [0, 1, 2]
    hub.close(first)
    assert hub.open_streams == 1 and hub.open() is not None  # a closed page frees its place


def test_a_commit_becomes_its_partial_pieces_then_what_it_touched() -> None:
    partial = PartialRecord(
        operation_id="op",
        run_id="run",
        conversation_id="c",
        attempt=1,
        offset=4,
        text="more",
        status="streaming",
        seq=7,
        created_at_ms=0,
    )
    run = RunRecord(
        run_id="run",
        conversation_id="c",
        agent="a",
        version=1,
        status="running",
        submission_id="s",
        seq=7,
        created_at_ms=0,
        updated_at_ms=0,
    )
    events: list[dict[str, Any]] = _ui.events_of(Change(watch_id=1, seq=7, committed_at_ms=0, records=(partial, run)))
    assert events[0] == {
        "type": "partial",
        "operation_id": "op",
        "conversation_id": "c",
        "run_id": "run",
        "attempt": 1,
        "offset": 4,
        "text": "more",
        "status": "streaming",
    }
    assert events[1] == {"type": "change", "seq": 7, "conversations": ["c"], "runs": ["run"]}


def test_the_overview_keeps_the_newest_runs_each_in_its_latest_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_ui, "MAX_LISTED", 3)
    hub = _ui.Hub()

    def run(n: int, status: str, seq: int) -> RunRecord:
        return RunRecord(
            run_id=f"run-{n}",
            conversation_id="c",
            agent="a",
            version=1,
            status=status,  # type: ignore[arg-type]
            submission_id="s",
            seq=seq,
            created_at_ms=0,
            updated_at_ms=0,
        )

    for n in range(5):
        hub.remember(run(n, "queued", n))
    hub.remember(run(4, "completed", 9))
    hub.remember(run(4, "running", 5))  # an older state, seen late: it does not replace the newer one
    assert [(one.run_id, one.status) for one in hub.newest_runs] == [
        ("run-4", "completed"),
        ("run-3", "queued"),
        ("run-2", "queued"),
    ]  # at most MAX_LISTED: the oldest dropped


def test_the_overview_orders_runs_by_when_they_were_created_not_by_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_ui, "MAX_LISTED", 3)
    hub = _ui.Hub()

    def run(run_id: str, created_at_ms: int) -> RunRecord:
        return RunRecord(
            run_id=run_id,
            conversation_id="c",
            agent="a",
            version=1,
            status="queued",
            submission_id="s",
            seq=created_at_ms,
            created_at_ms=created_at_ms,
            updated_at_ms=created_at_ms,
        )

    # A subagent's run id is derived (uuid5): it sorts before its parent's by id, but was created after it.
    for run_id, created_at_ms in (("b-parent", 1), ("a-subagent", 2), ("c-same-ms", 2), ("0-newest", 3)):
        hub.remember(run(run_id, created_at_ms))
    assert [one.run_id for one in hub.newest_runs] == ["0-newest", "c-same-ms", "a-subagent"]  # b-parent dropped

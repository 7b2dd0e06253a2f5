"""What ``tether watch`` costs its own process, against what receiving the same commits costs anyway.

A synthetic stream of ``--runs`` runs, each in its own conversation, streaming their answers at once: each commit
carries one partial piece of every run (as the partial-output batches do), and every ``--pieces``-th commit ends each
run's turn with its model operation's result and the assistant entry. Measured in the same run:

- baseline: decoding those commits from the wire (``decode_frame`` of each ``change``), which a watch pays anyway;
- fold: :meth:`WatchView.apply` of the same commits (the streamed texts assembled, the transcript kept);
- render: drawing the whole screen (120x40) of one conversation, and of every conversation, as the live view does
  at most every 0.1 s.

    python bench/watch_view.py [--json] [--runs 16] [--commits 2000] [--pieces 40]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time
from typing import Any

from rich.console import Console

from protocol import Change, EntryRecord, JsonValue, OperationRecord, PartialRecord, decode_frame, encode_frame
from runtime._watch_render import render
from runtime._watch_view import WatchView


def commits(runs: int, count: int, pieces: int) -> list[Change]:
    """``count`` commits of ``runs`` streaming runs (``pieces`` pieces of 24 characters to a turn)."""
    changes: list[Change] = []
    offsets = [0] * runs
    turns = [1] * runs
    positions = [0] * runs
    for seq in range(1, count + 1):
        records: list[Any] = []
        for run in range(runs):
            conversation_id = f"conversation-{run}"
            operation_id = f"op-{run}-{turns[run]}"
            if seq % pieces == 0:
                records.append(_finished(operation_id, run, conversation_id, seq))
                records.append(
                    EntryRecord(
                        entry_id=f"entry-{run}-{positions[run]}",
                        conversation_id=conversation_id,
                        position=positions[run],
                        seq=seq,
                        kind="tether.assistant",
                        data=JsonValue({"run_id": f"run-{run}", "turn": turns[run], "text": "x" * offsets[run]}),
                        created_at_ms=seq,
                    )
                )
                positions[run] += 1
                turns[run] += 1
                offsets[run] = 0
                continue
            text = f"piece {seq:>8} of run {run:>3}. "[:24]
            records.append(
                PartialRecord(
                    operation_id=operation_id,
                    run_id=f"run-{run}",
                    conversation_id=conversation_id,
                    attempt=1,
                    offset=offsets[run],
                    text=text,
                    status="streaming",
                    seq=seq,
                    created_at_ms=seq,
                )
            )
            offsets[run] += len(text)
        changes.append(Change(watch_id=1, seq=seq, committed_at_ms=seq, records=tuple(records)))
    return changes


def _finished(operation_id: str, run: int, conversation_id: str, seq: int) -> OperationRecord:
    return OperationRecord(
        operation_id=operation_id,
        run_id=f"run-{run}",
        conversation_id=conversation_id,
        task_id=f"task-{run}",
        kind="model",
        name="scripted",
        version=1,
        turn=1,
        attempt=1,
        digest="d",
        status="completed",
        seq=seq,
        created_at_ms=seq,
        updated_at_ms=seq,
    )


def measure(runs: int, count: int, pieces: int) -> dict[str, Any]:
    changes = commits(runs, count, pieces)
    wire = [encode_frame(change) for change in changes]
    records = sum(len(change.records) for change in changes)

    started = time.perf_counter()
    for data in wire:
        decode_frame(data)
    decode_s = time.perf_counter() - started

    view = WatchView("tether.db")
    started = time.perf_counter()
    for change in changes:
        view.apply(change.seq, change.records)
    fold_s = time.perf_counter() - started

    # Mid-stream, so that the screen has streamed texts as well as a transcript.
    half = WatchView("tether.db", conversation_id="conversation-0")
    every = WatchView("tether.db")
    for change in changes[: count - pieces // 2]:
        half.apply(change.seq, change.records)
        every.apply(change.seq, change.records)
    console = Console(file=io.StringIO(), width=120, height=40, color_system="truecolor", force_terminal=True)
    one_ms = _render_ms(half, console)
    all_ms = _render_ms(every, console)
    return {
        "runs": runs,
        "commits": count,
        "records": records,
        "decode_us_per_commit": round(decode_s / count * 1e6, 1),
        "fold_us_per_commit": round(fold_s / count * 1e6, 1),
        "fold_over_decode": round(fold_s / decode_s, 2),
        "fold_records_per_s": round(records / fold_s),
        "render_ms_one_conversation": round(one_ms, 2),
        "render_ms_every_conversation": round(all_ms, 2),
        "repaint_share_of_a_core_at_10_per_s": round(max(one_ms, all_ms) / 100, 3),
    }


def _render_ms(view: WatchView, console: Console) -> float:
    times = []
    for _ in range(20):
        started = time.perf_counter()
        console.print(render(view, console))
        times.append(time.perf_counter() - started)
        console.file = io.StringIO()
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--runs", type=int, default=16, help="runs streaming at once (default 16)")
    parser.add_argument("--commits", type=int, default=2000, help="commits to fold (default 2000)")
    parser.add_argument("--pieces", type=int, default=40, help="pieces to a model turn (default 40)")
    args = parser.parse_args()
    result = measure(args.runs, args.commits, args.pieces)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()

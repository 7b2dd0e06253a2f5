"""``tether demo``, part 2: the commit path surviving a SIGKILL of the owner.

An owner, two writer processes appending entries, the owner killed with SIGKILL mid-stream and started again,
and proof that every acknowledged entry is stored exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Final

import trio

import actors
from protocol import ConnectionLost, Duplicate, OwnerUnavailable
from storage_owner.store import check_database

from ._process import kill_and_reap, start_owner, stop_gracefully

WRITERS: Final = 2
KILL_AT_FRACTION: Final = 0.4
DEMO_TIMEOUT_S: Final = 120.0


def _say(label: str, text: str) -> None:
    print(f"  {label:<13}{text}", flush=True)


async def run_commits_demo(db: str, entries_per_writer: int) -> int:
    db = os.path.abspath(db)
    work = Path(db + ".demo")
    work.mkdir(exist_ok=True)
    print(f"Tether demo: the commit path on {db}\n", flush=True)
    owner, info = await start_owner(db, stdout=subprocess.DEVNULL)
    writers: list[trio.Process] = []
    try:
        with trio.fail_after(DEMO_TIMEOUT_S):
            _say("owner", f"pid {owner.pid} listening on {info.url}")
            async with actors.connect(db=db) as client:
                conversation_id = await client.create_conversation()
            _say("conversation", conversation_id)
            ack_files = [work / f"writer-{index}.acks" for index in range(WRITERS)]
            for path in ack_files:
                path.write_text("")
            for path in ack_files:
                command = [
                    sys.executable,
                    "-m",
                    "runtime._demo_commits",
                    db,
                    conversation_id,
                    str(entries_per_writer),
                    str(path),
                ]
                writers.append(await trio.lowlevel.open_process(command))
            _say(
                "writers",
                f"{WRITERS} processes x {entries_per_writer} entries (pids {', '.join(str(w.pid) for w in writers)})",
            )

            total = WRITERS * entries_per_writer
            # The writers are other processes: their acknowledgements can only be polled from their files. The kill
            # waits until both are writing, so that it really lands mid-stream for each of them.
            while (
                (acked := _count_acks(ack_files)) < total * KILL_AT_FRACTION
                or min(_count_acks([path]) for path in ack_files) == 0
            ) and any(writer.poll() is None for writer in writers):
                await trio.sleep(0.005)
            await kill_and_reap(owner, signal.SIGKILL)
            _say("SIGKILL", f"owner pid {owner.pid}, mid-stream, with {acked} entries acknowledged")
            owner, info = await start_owner(db, stdout=subprocess.DEVNULL)
            _say("owner", f"restarted: pid {owner.pid} listening on {info.url}")

            statuses = [await writer.wait() for writer in writers]
            if any(statuses):
                _say("FAILED", f"a writer exited with status {statuses}")
                return 1
            acks = [line for path in ack_files for line in path.read_text().split()]
            retried = sum(1 for line in acks if line.startswith("+"))
            acked_ids = [line.lstrip("+") for line in acks]
            _say(
                "writers",
                f"reconnected by themselves; {retried} in-flight appends confirmed by retrying their entry id",
            )

            async with actors.connect(db=db) as client:
                entries = await client.entries(conversation_id)
            stored = [entry.entry_id for entry in entries]
            seqs = [entry.seq for entry in entries]
            facts = check_database(db)
            missing = set(acked_ids) - set(stored)
            doubled = len(stored) - len(set(stored))
            ok = not missing and not doubled and len(set(seqs)) == len(seqs) and facts["integrity"] == "ok"
            _say(
                "check",
                f"{len(acked_ids)} acknowledged, {len(stored)} stored, {len(missing)} missing, {doubled} doubled, "
                f"seq {'unique' if len(set(seqs)) == len(seqs) else 'REPEATED'}, integrity {facts['integrity']}",
            )
            print(
                "\n" + ("Every acknowledged entry survived the SIGKILL, exactly once." if ok else "FAILED: see above."),
                flush=True,
            )
            return 0 if ok else 1
    finally:
        for writer in writers:
            await kill_and_reap(writer)
        await stop_gracefully(owner)


def _count_acks(paths: list[Path]) -> int:
    return sum(path.read_bytes().count(b"\n") for path in paths)


async def _write(db: str, conversation_id: str, count: int, ack_path: str) -> None:
    """One writer process: append ``count`` entries, logging each acknowledged entry id (``+`` if confirmed by a
    retry after the connection was lost)."""
    with open(ack_path, "a", buffering=1, encoding="utf-8") as acks:
        # The owner may be restarting (its runtime file may still name the killed one): wait for it.
        async with actors.connect(db=db, name=f"demo-writer-{os.getpid()}", wait_for_owner_s=30) as client:
            for number in range(count):
                entry_id = actors.new_id()
                retried = False
                while True:
                    try:
                        await client.append(conversation_id, kind="demo.note", data={"n": number}, entry_id=entry_id)
                        break
                    except (ConnectionLost, OwnerUnavailable):
                        retried = True  # unknown outcome: retry with the same id; the owner refuses a duplicate
                    except Duplicate:
                        break  # the lost attempt had landed
                acks.write(("+" if retried else "") + entry_id + "\n")


if __name__ == "__main__":
    _db, _conversation_id, _count, _ack_path = sys.argv[1:5]
    trio.run(_write, _db, _conversation_id, int(_count), _ack_path)

"""A writer process for fault tests: many actors (trio tasks) appending through a few clients while the owner is
killed under them.

Usage: python _writer.py DB LOG STOP_FILE ACTORS CLIENTS CONVERSATION_ID,...

Each actor loops until STOP_FILE exists, finishing its current operation first. Every operation is logged to
LOG before it is first sent and again once acknowledged (one line each, flushed per line):

    a ENTRY_ID                                  a single append is about to be sent
    A ENTRY_ID SEQ RETRIED                      ... acknowledged (SEQ 0: confirmed by Duplicate on a retry)
    t ACTOR N ENTRY_ID_1 ENTRY_ID_2             a commit (two appends + a document write) is about to be sent
    T ACTOR N ENTRY_ID_1 ENTRY_ID_2 SEQ RETRIED ... acknowledged
    C CLIENT                                    a client died (see below) and was replaced

On ConnectionLost or OwnerUnavailable the same operation is retried with the same entry ids; Duplicate after a
retry means the lost attempt had landed. Any other error ends the process with a traceback (non-zero status).

A client that gives up for good (it could not reconnect within its timeout: OwnerUnavailable) is replaced by a new
one, and each actor retries its pending operation with the same ids. A raw transport error escaping the client is a
bug and ends the process.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

import attrs
import trio

import actors

TX_EVERY = 4
"""Actors whose index is a multiple of this alternate single appends with multi-write commits."""
MAX_RUN_S = 150.0
RECONNECT_PAUSE_S = 0.05


def progress_document(actor: int) -> str:
    return f"progress-{actor}"


@attrs.define
class Operation:
    n: int
    entry_ids: tuple[str, ...]
    retried: bool = False


@attrs.define
class Actor:
    index: int
    home: str
    away: str
    stop_file: str
    log: TextIO
    n: int = 0
    pending: Operation | None = None
    done: bool = False

    async def run(self, client: actors.Client) -> None:
        while True:
            if self.pending is None:
                if os.path.exists(self.stop_file):
                    self.done = True
                    return
                self.pending = self.next_operation()
            seq = await self.perform(client, self.pending)
            op = self.pending
            if len(op.entry_ids) == 1:
                self.log.write(f"A {op.entry_ids[0]} {seq} {int(op.retried)}\n")
            else:
                self.log.write(f"T {self.index} {op.n} {' '.join(op.entry_ids)} {seq} {int(op.retried)}\n")
            self.pending = None

    def next_operation(self) -> Operation:
        self.n += 1
        if self.index % TX_EVERY == 0 and self.n % 2 == 0:
            op = Operation(self.n, (actors.new_id(), actors.new_id()))
            self.log.write(f"t {self.index} {op.n} {' '.join(op.entry_ids)}\n")
        else:
            op = Operation(self.n, (actors.new_id(),))
            self.log.write(f"a {op.entry_ids[0]}\n")
        return op

    async def perform(self, client: actors.Client, op: Operation) -> int:
        """Apply ``op`` and return its seq (0 if a retry found it had landed)."""
        while True:
            try:
                if len(op.entry_ids) == 1:
                    return await client.append(
                        self.home, kind="fault.single", data=[self.index, op.n], entry_id=op.entry_ids[0]
                    )
                first, second = op.entry_ids
                async with client.commit() as tx:
                    tx.append(self.home, kind="fault.tx", data=[self.index, op.n, 1], entry_id=first)
                    tx.append(self.away, kind="fault.tx", data=[self.index, op.n, 2], entry_id=second)
                    tx.put_document(progress_document(self.index), op.n, conversation_id=self.home)
                assert tx.seq is not None
                return tx.seq
            except (actors.ConnectionLost, actors.OwnerUnavailable):
                op.retried = True  # unknown outcome: retry with the same ids
            except actors.Duplicate:
                if not op.retried:
                    raise
                return 0  # the lost attempt had landed


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _client_died(exc: BaseException) -> bool:
    lost = (actors.OwnerUnavailable, actors.ConnectionLost)
    return all(isinstance(leaf, lost) for leaf in _leaves(exc))


async def serve_client(db: str, index: int, team: list[Actor], log: TextIO) -> None:
    while not all(actor.done for actor in team):
        try:
            async with actors.connect(db=db, name=f"fault-writer-{index}") as client, trio.open_nursery() as nursery:
                for actor in team:
                    if not actor.done:
                        nursery.start_soon(actor.run, client)
        except BaseException as exc:
            if not _client_died(exc):
                raise
            for actor in team:
                if actor.pending is not None:
                    actor.pending.retried = True
            log.write(f"C {index}\n")
            await trio.sleep(RECONNECT_PAUSE_S)


async def main(
    db: str, log_path: str, stop_file: str, actor_count: int, client_count: int, conversations: list[str]
) -> None:
    with trio.fail_after(MAX_RUN_S), open(log_path, "a", buffering=1, encoding="utf-8") as log:
        team = [
            Actor(
                index=index,
                home=conversations[index % len(conversations)],
                away=conversations[(index + 1) % len(conversations)],
                stop_file=stop_file,
                log=log,
            )
            for index in range(actor_count)
        ]
        async with trio.open_nursery() as nursery:
            for index in range(client_count):
                nursery.start_soon(serve_client, db, index, team[index::client_count], log)


if __name__ == "__main__":
    _db, _log, _stop, _actors, _clients, _conversations = sys.argv[1:7]
    trio.run(main, _db, _log, _stop, int(_actors), int(_clients), _conversations.split(","))

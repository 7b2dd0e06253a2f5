"""SIGKILL the owner at random moments under 16 concurrent writers in another process, restart it each time,
and check that nothing acknowledged was lost or doubled and nothing unacknowledged was half-applied."""

from __future__ import annotations

import random
import signal
import sys
from collections import Counter, defaultdict
from pathlib import Path

import apsw
import attrs
import pytest
import trio

import actors
from runtime import kill_and_reap
from storage_owner.store import check_database
from tests.conftest import OwnerProcess
from tests.faults import _writer

WRITER = Path(_writer.__file__)
ACTORS = 16
CLIENTS = 8
CONVERSATIONS = 4
KILLS = 20


@attrs.define
class WriterLog:
    attempted: set[str] = attrs.Factory(set)
    acked: dict[str, int] = attrs.Factory(dict)
    """Acknowledged entry id -> the seq the owner acknowledged (0: confirmed by a Duplicate on retry)."""
    tx_attempted: dict[tuple[int, int], tuple[str, str]] = attrs.Factory(dict)
    tx_acked: dict[tuple[int, int], int] = attrs.Factory(dict)
    retried: int = 0
    client_deaths: int = 0

    @classmethod
    def parse(cls, text: str) -> WriterLog:
        log = cls()
        lines = text.split("\n")[:-1]  # a last line without its newline was being written: ignore it
        for line in lines:
            tag, *fields = line.split()
            if tag == "a":
                log.attempted.add(fields[0])
            elif tag == "A":
                log.acked[fields[0]] = int(fields[1])
                log.retried += int(fields[2])
            elif tag == "t":
                actor, n, first, second = int(fields[0]), int(fields[1]), fields[2], fields[3]
                log.tx_attempted[(actor, n)] = (first, second)
                log.attempted.update((first, second))
            elif tag == "T":
                actor, n, first, second = int(fields[0]), int(fields[1]), fields[2], fields[3]
                log.tx_acked[(actor, n)] = int(fields[4])
                log.acked[first] = log.acked[second] = int(fields[4])
                log.retried += int(fields[5])
            elif tag == "C":
                log.client_deaths += 1
            else:
                raise AssertionError(f"unexpected writer log line {line!r}")
        return log


def count_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n")


async def wait_for_more_lines(path: Path, than: int, writer: trio.Process, stderr: Path) -> None:
    # The writer is another process: its progress can only be polled from its log.
    while count_lines(path) <= than:
        if writer.poll() is not None:
            raise AssertionError(f"the writer exited early with status {writer.returncode}:\n{stderr.read_text()}")
        await trio.sleep(0.005)


def read_commit_seqs(db: str) -> list[int]:
    connection = apsw.Connection(db, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return [row[0] for row in connection.execute("SELECT seq FROM commits ORDER BY rowid")]
    finally:
        connection.close()


@pytest.mark.slow
async def test_random_sigkills_lose_nothing_acknowledged(db_path: str, tmp_path: Path) -> None:
    rng = random.Random()
    log_path = tmp_path / "writer.log"
    log_path.write_text("")
    stop_file = tmp_path / "stop"
    writer_stderr = tmp_path / "writer.stderr"
    owner = OwnerProcess(db_path)
    writer: trio.Process | None = None
    statuses: list[int] = []
    try:
        with trio.fail_after(90):
            await owner.start()
            async with actors.connect(db=db_path) as client:
                conversations = [await client.create_conversation() for _ in range(CONVERSATIONS)]
            with open(writer_stderr, "wb") as stderr:
                writer = await trio.lowlevel.open_process(
                    [
                        sys.executable,
                        str(WRITER),
                        db_path,
                        str(log_path),
                        str(stop_file),
                        str(ACTORS),
                        str(CLIENTS),
                        ",".join(conversations),
                    ],
                    stderr=stderr,
                )
            await wait_for_more_lines(log_path, 100, writer, writer_stderr)
            for _ in range(KILLS):
                # Kill at a random moment while the writers are busy with this owner.
                await wait_for_more_lines(log_path, count_lines(log_path) + 10, writer, writer_stderr)
                await trio.sleep(rng.uniform(0.05, 0.3))
                statuses.append(await owner.kill())
                await owner.start()
            await wait_for_more_lines(log_path, count_lines(log_path) + 50, writer, writer_stderr)
            stop_file.touch()
            with trio.fail_after(30):
                writer_status = await writer.wait()
            assert writer_status == 0, writer_stderr.read_text()

            async with actors.connect(db=db_path) as client:
                stored = {cid: await client.entries(cid) for cid in conversations}
                documents = {
                    actor: await client.document(
                        _writer.progress_document(actor), conversation_id=conversations[actor % CONVERSATIONS]
                    )
                    for actor in range(0, ACTORS, _writer.TX_EVERY)
                }
            assert await owner.stop() == 0
    finally:
        if writer is not None:
            stop_file.touch()
            await kill_and_reap(writer)
        await owner.close()

    log = WriterLog.parse(log_path.read_text())
    entries = [entry for page in stored.values() for entry in page]
    by_id = {entry.entry_id: entry for entry in entries}
    commit_seqs = read_commit_seqs(db_path)
    facts = check_database(db_path)

    print(f"acked {len(log.acked)}, {log.retried} retried, {len(log.tx_acked)} commits of several writes")
    print(f"{len(commit_seqs)} commits; {log.client_deaths} writer clients died (see _writer.py)")
    assert statuses == [-signal.SIGKILL] * KILLS
    assert len(log.acked) > 300, "the writers barely wrote: the test proves little"
    assert log.retried > 0, "no kill hit an operation in flight: the test proves little"

    # Every acknowledged entry is stored exactly once, in the commit that acknowledged it.
    assert len(by_id) == len(entries), "an entry id is stored twice"
    assert not set(log.acked) - set(by_id), "acknowledged entries were lost"
    assert not set(by_id) - log.attempted, "entries nobody wrote were stored"
    for entry_id, seq in log.acked.items():
        assert seq in (0, by_id[entry_id].seq)
    acked_seqs = [seq for seq in log.tx_acked.values() if seq] + [
        seq for entry_id, seq in log.acked.items() if seq and by_id[entry_id].kind == "fault.single"
    ]
    assert len(acked_seqs) == len(set(acked_seqs)), "two acknowledged commits share a seq"

    # Every multi-write commit is all or nothing, acknowledged or not.
    landed: dict[int, list[int]] = defaultdict(list)
    for (actor, n), (first, second) in log.tx_attempted.items():
        assert (first in by_id) == (second in by_id), f"commit {actor}/{n} was half applied"
        if (actor, n) in log.tx_acked:
            assert first in by_id
        if first in by_id:
            assert by_id[first].seq == by_id[second].seq
            landed[actor].append(n)
    for actor, document in documents.items():
        if not landed[actor]:
            assert document is None
            continue
        assert document is not None
        assert (document.version, document.value) == (len(landed[actor]), max(landed[actor]))

    # Seqs: entries of one commit share it, nothing else does; the commit log never repeats or skips one.
    sharing = Counter(entry.seq for entry in entries)
    tx_seqs = {by_id[first].seq for first, _ in log.tx_attempted.values() if first in by_id}
    assert all(count == 1 or (count == 2 and seq in tx_seqs) for seq, count in sharing.items())
    assert commit_seqs == list(range(1, len(commit_seqs) + 1))
    assert set(sharing) <= set(commit_seqs)
    for page in stored.values():
        assert [entry.position for entry in page] == list(range(len(page)))
    assert facts["integrity"] == "ok"
    assert facts["head_seq"] == commit_seqs[-1]

"""The client against a real owner: reads, writes, documents, submissions, transactions, typed errors, roles,
tokens, the manual clock and many tasks sharing one connection."""

from __future__ import annotations

import time

import pytest
import trio

import actors
from protocol import MAX_MESSAGE_BYTES, ErrorCode, read_runtime
from tests.conftest import OwnerProcess


async def test_create_append_and_read_oldest_first(owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        async with actors.connect(db=owner.db) as client:
            conversation_id = await client.create_conversation()
            seqs = [await client.append(conversation_id, kind="app.note", data={"n": n}) for n in range(5)]
            entries = await client.entries(conversation_id)
            newest_first = await client.entries(conversation_id, order="desc")
            record = await client.conversation(conversation_id)
    assert seqs == sorted(seqs) and len(set(seqs)) == 5
    assert [(e.position, e.seq, e.data) for e in entries] == [(n, seqs[n], {"n": n}) for n in range(5)]
    assert all(e.conversation_id == conversation_id and e.kind == "app.note" for e in entries)
    assert newest_first == entries[::-1]
    assert record.entry_count == 5 and record.conversation_id == conversation_id


async def test_read_entries_pages_in_both_orders(owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        async with actors.connect(db=owner.db) as client:
            conversation_id = await client.create_conversation()
            async with client.commit() as tx:
                for n in range(23):
                    tx.append(conversation_id, kind="app.note", data=n)
            pages: dict[str, list[list[int]]] = {"asc": [], "desc": []}
            for order in ("asc", "desc"):
                cursor = None
                while True:
                    page = await client.read_entries(conversation_id, order=order, cursor=cursor, limit=5)
                    pages[order].append([entry.position for entry in page.entries])
                    if page.next_cursor is None:
                        break
                    cursor = page.next_cursor
            exact = await client.read_entries(conversation_id, limit=23)
            middle = await client.read_entries(conversation_id, order="desc", cursor=10, limit=3)
    assert pages["asc"] == [list(range(start, min(start + 5, 23))) for start in range(0, 23, 5)]
    assert pages["desc"] == [list(range(start, max(start - 5, -1), -1)) for start in range(22, -1, -5)]
    assert len(exact.entries) == 23 and exact.next_cursor is None
    assert [entry.position for entry in middle.entries] == [9, 8, 7] and middle.next_cursor == 7


async def test_documents_per_conversation_and_global_with_expected_version(owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        async with actors.connect(db=owner.db) as client:
            conversation_id = await client.create_conversation()
            assert await client.document("plan", conversation_id=conversation_id) is None
            assert await client.document("plan") is None
            assert await client.put_document("plan", {"step": 1}, conversation_id=conversation_id) == 1
            assert await client.put_document("plan", ["global"], expected_version=0) == 1
            assert await client.put_document("plan", {"step": 2}, conversation_id=conversation_id, expected_version=1)
            head = (await client.ping()).head_seq
            with pytest.raises(actors.Conflict) as stale:
                await client.put_document("plan", {"step": 3}, conversation_id=conversation_id, expected_version=1)
            with pytest.raises(actors.Conflict):
                await client.put_document("plan", "again", expected_version=0)
            local = await client.document("plan", conversation_id=conversation_id)
            shared = await client.document("plan")
            assert (await client.ping()).head_seq == head
    assert stale.value.code == ErrorCode.CONFLICT
    assert local is not None and (local.version, local.value, local.conversation_id) == (
        2,
        {"step": 2},
        conversation_id,
    )
    assert shared is not None and (shared.version, shared.value, shared.conversation_id) == (1, ["global"], None)


async def test_submissions_are_deduplicated_also_after_a_restart(owner: OwnerProcess) -> None:
    with trio.fail_after(30):
        async with actors.connect(db=owner.db) as client:
            conversation_id = await client.create_conversation()
            first = await client.submit(conversation_id, kind="app.task", payload={"q": 1}, request_id="req-1")
            again = await client.submit(conversation_id, kind="app.task", payload={"q": 1}, request_id="req-1")
            head = (await client.ping()).head_seq
            with pytest.raises(actors.Conflict):
                await client.submit(conversation_id, kind="app.task", payload={"q": 2}, request_id="req-1")
            other = await client.submit(conversation_id, kind="app.task", payload={"q": 1}, request_id="req-2")
        assert await owner.stop() == 0
        await owner.start()
        async with actors.connect(db=owner.db) as client:
            after_restart = await client.submit(conversation_id, kind="app.task", payload={"q": 1}, request_id="req-1")
            looked_up = await client.submission(conversation_id, "req-1")
            missing = await client.submission(conversation_id, "req-never")
            final_head = (await client.ping()).head_seq
    assert again == first and after_restart == first and looked_up == first
    assert first.seq == head and other.seq == head + 1
    assert other.submission_id != first.submission_id
    assert missing is None
    assert final_head == head + 1, "a repeated submission must not take a seq"


async def test_commit_is_atomic(owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        async with actors.connect(db=owner.db) as client:
            conversation_id = await client.create_conversation()
            head = (await client.ping()).head_seq
            with pytest.raises(actors.NotFound):
                async with client.commit() as tx:
                    kept_out = tx.append(conversation_id, kind="app.note", data="first")
                    tx.put_document("doc", 1, conversation_id=conversation_id)
                    tx.append(actors.new_id(), kind="app.note", data="to nowhere")
            assert (await client.ping()).head_seq == head
            assert await client.entries(conversation_id) == []
            assert await client.document("doc", conversation_id=conversation_id) is None
            # The same writes without the bad one go through, as one commit with one seq.
            async with client.commit() as tx:
                tx.append(conversation_id, kind="app.note", data="first", entry_id=kept_out)
                tx.put_document("doc", 1, conversation_id=conversation_id)
                tx.append(conversation_id, kind="app.note", data="second")
            entries = await client.entries(conversation_id)
            document = await client.document("doc", conversation_id=conversation_id)
    assert tx.seq == head + 1 and tx.results == (0, 1, 1)
    assert [(e.entry_id == kept_out, e.data, e.seq) for e in entries] == [
        (True, "first", head + 1),
        (False, "second", head + 1),
    ]
    assert document is not None and document.seq == head + 1


async def test_errors_map_to_typed_exceptions(owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        async with actors.connect(db=owner.db) as client:
            conversation_id = await client.create_conversation()
            entry_id = actors.new_id()
            await client.append(conversation_id, kind="app.note", entry_id=entry_id)
            head = (await client.ping()).head_seq
            cases = {
                "unknown conversation (append)": (
                    actors.NotFound,
                    lambda: client.append(actors.new_id(), kind="app.note"),
                ),
                "unknown conversation (read)": (actors.NotFound, lambda: client.entries(actors.new_id())),
                "unknown conversation (record)": (actors.NotFound, lambda: client.conversation(actors.new_id())),
                "duplicate entry id": (
                    actors.Duplicate,
                    lambda: client.append(conversation_id, kind="app.note", entry_id=entry_id),
                ),
                "duplicate conversation": (actors.Duplicate, lambda: client.create_conversation(conversation_id)),
                "stale document version": (actors.Conflict, lambda: client.put_document("d", 1, expected_version=4)),
                "not a uuid": (actors.InvalidRequest, lambda: client.append("not-a-uuid", kind="app.note")),
                "empty kind": (actors.InvalidRequest, lambda: client.append(conversation_id, kind="")),
                "limit zero": (actors.InvalidRequest, lambda: client.read_entries(conversation_id, limit=0)),
                "negative cursor": (actors.InvalidRequest, lambda: client.read_entries(conversation_id, cursor=-2)),
                "watch from the future": (
                    actors.InvalidRequest,
                    lambda: client.watch(from_seq=head + 5).__anext__(),
                ),
            }
            codes = {}
            for name, (expected, call) in cases.items():
                with pytest.raises(expected) as raised:
                    await call()
                codes[name] = getattr(raised.value, "code", None)
            still = await client.entries(conversation_id)
            final_head = (await client.ping()).head_seq
    assert codes == {
        "unknown conversation (append)": ErrorCode.NOT_FOUND,
        "unknown conversation (read)": ErrorCode.NOT_FOUND,
        "unknown conversation (record)": ErrorCode.NOT_FOUND,
        "duplicate entry id": ErrorCode.DUPLICATE,
        "duplicate conversation": ErrorCode.DUPLICATE,
        "stale document version": ErrorCode.CONFLICT,
        "not a uuid": ErrorCode.INVALID,
        "empty kind": ErrorCode.INVALID,
        "limit zero": ErrorCode.INVALID,
        "negative cursor": ErrorCode.INVALID,
        "watch from the future": ErrorCode.INVALID,
    }
    assert [entry.entry_id for entry in still] == [entry_id]
    assert final_head == head


async def test_reader_reads_and_watches_but_cannot_write(owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        async with actors.connect(db=owner.db) as writer, actors.connect(db=owner.db, role="reader") as reader:
            conversation_id = await writer.create_conversation()
            first = await writer.append(conversation_id, kind="app.note", data=1)
            head = (await reader.ping()).head_seq
            refused = []
            for attempt in (
                reader.append(conversation_id, kind="app.note", data=2),
                reader.create_conversation(),
                reader.put_document("doc", 1),
                reader.submit(conversation_id, kind="app.task", request_id="r"),
                reader.advance_clock(10),
            ):
                with pytest.raises(actors.NotAllowed) as raised:
                    await attempt
                refused.append(raised.value.code)
            assert (await reader.ping()).head_seq == head
            seen = [entry.seq for entry in await reader.entries(conversation_id)]
            created = (await reader.conversation(conversation_id)).seq
            async with reader.watch(conversation_id=conversation_id) as stream:
                second = await writer.append(conversation_id, kind="app.note", data=3)
                changes = [await stream.__anext__() for _ in range(3)]
            final = await writer.entries(conversation_id)
            document = await writer.document("doc")
    assert refused == [ErrorCode.READ_ONLY] * 5
    assert seen == [first]
    assert [change.seq for change in changes] == [created, first, second]
    assert [entry.data for entry in final] == [1, 3]
    assert document is None


async def test_wrong_token_is_refused(owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        info = read_runtime(owner.db)
        with pytest.raises(actors.HandshakeRefused) as refused:
            async with actors.connect(url=info.url, token="not-the-token"):
                pass
        async with actors.connect(url=info.url, token=info.token) as client:
            await client.ping()
    assert refused.value.code == ErrorCode.BAD_TOKEN


async def test_no_owner_is_unavailable_quickly(db_path: str) -> None:
    process = OwnerProcess(db_path)
    try:
        with trio.fail_after(20):
            started = time.monotonic()
            with pytest.raises(actors.OwnerUnavailable):
                async with actors.connect(db=db_path):
                    pass
            never_started = time.monotonic() - started
            # A runtime file left by a killed owner names a dead port: still unavailable, still quick.
            await process.start()
            await process.kill()
            started = time.monotonic()
            with pytest.raises(actors.OwnerUnavailable):
                async with actors.connect(db=db_path):
                    pass
            killed = time.monotonic() - started
    finally:
        await process.close()
    assert never_started < 2 and killed < 2


async def test_advance_clock_moves_a_manual_owner(manual_owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        async with actors.connect(db=manual_owner.db) as client:
            start = (await client.ping()).now_ms
            conversation_id = await client.create_conversation()
            assert await client.advance_clock(1500) == start + 1500
            await client.append(conversation_id, kind="app.note")
            assert await client.advance_clock(0) == start + 1500
            with pytest.raises(actors.InvalidRequest):
                await client.advance_clock(-1)
            entries = await client.entries(conversation_id)
            record = await client.conversation(conversation_id)
        await manual_owner.stop()
        await manual_owner.start()
        async with actors.connect(db=manual_owner.db) as client:
            after_restart = (await client.ping()).now_ms
    assert record.created_at_ms == start
    assert [entry.created_at_ms for entry in entries] == [start + 1500]
    assert after_restart == start + 1500, "the manual clock is durable"


async def test_advance_clock_is_not_allowed_on_a_wall_owner(owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        async with actors.connect(db=owner.db) as client:
            with pytest.raises(actors.NotAllowed) as raised:
                await client.advance_clock(1000)
    assert raised.value.code == ErrorCode.NOT_ALLOWED


async def test_many_tasks_share_one_client(owner: OwnerProcess) -> None:
    tasks, per_task = 50, 4
    acknowledged: dict[str, int] = {}

    async def worker(client: actors.Client, conversation_id: str, index: int) -> None:
        for n in range(per_task):
            entry_id = actors.new_id()
            acknowledged[entry_id] = await client.append(
                conversation_id, kind="app.note", data=[index, n], entry_id=entry_id
            )

    with trio.fail_after(30):
        async with actors.connect(db=owner.db) as client:
            conversation_id = await client.create_conversation()
            async with trio.open_nursery() as nursery:
                for index in range(tasks):
                    nursery.start_soon(worker, client, conversation_id, index)
            entries = await client.entries(conversation_id)
    assert len(acknowledged) == tasks * per_task
    assert len(set(acknowledged.values())) == tasks * per_task
    assert {entry.entry_id: entry.seq for entry in entries} == acknowledged
    assert [entry.position for entry in entries] == list(range(tasks * per_task))
    for index in range(tasks):  # each task's entries are in the order it appended them
        assert [e.data[1] for e in entries if e.data[0] == index] == list(range(per_task))


async def test_request_over_the_message_limit_is_refused_before_sending(owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        async with actors.connect(db=owner.db) as client:
            conversation_id = await client.create_conversation()
            head = (await client.ping()).head_seq
            with pytest.raises(actors.ProtocolError):
                await client.append(conversation_id, kind="app.note", data="z" * (MAX_MESSAGE_BYTES + 1))
            # Just under the limit is fine.
            seq = await client.append(conversation_id, kind="app.note", data="z" * (MAX_MESSAGE_BYTES - 4096))
            entries = await client.entries(conversation_id)
    assert seq == head + 1
    assert [entry.seq for entry in entries] == [seq]


async def test_entries_of_a_conversation_of_large_entries_can_be_read(owner: OwnerProcess) -> None:
    blob = "y" * 20_000
    with trio.fail_after(30):
        async with actors.connect(db=owner.db, reconnect_timeout_s=5) as client:
            conversation_id = await client.create_conversation()
            for _ in range(25):
                async with client.commit() as tx:
                    for _ in range(20):
                        tx.append(conversation_id, kind="app.blob", data=blob)
            entries = await client.entries(conversation_id)
    assert len(entries) == 500
    assert all(entry.data == blob for entry in entries)


async def test_wait_for_task_ends_once_the_client_cannot_reconnect(owner: OwnerProcess) -> None:
    # The wait is asked again after a lost connection only while the client can reconnect; with reconnect=False
    # it used to retry at once, forever, without a checkpoint (no deadline could stop it).
    with trio.fail_after(20):
        async with actors.connect(db=owner.db, reconnect=False) as client:
            task_id = await client.create_task("no.worker.runs.this")  # stays blocked: it never ends by itself
            async with trio.open_nursery() as nursery:
                nursery.start_soon(owner.kill)
                with pytest.raises(actors.ConnectionLost):
                    await client.wait_for_task(task_id)
            with trio.CancelScope() as scope:
                scope.cancel(reason="a failed client's calls are still checkpoints")
                await client.wait_for_task(task_id)
            assert scope.cancelled_caught


async def test_a_closed_client_fails_calls_at_a_checkpoint(owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        async with actors.connect(db=owner.db) as client:
            task_id = await client.create_task("no.worker.runs.this")
        with pytest.raises(actors.ConnectionLost):
            await client.wait_for_task(task_id)
        with pytest.raises(actors.ConnectionLost):
            await client.ping()
        with trio.CancelScope() as scope:
            scope.cancel(reason="a closed client's calls are still checkpoints")
            await client.ping()
        assert scope.cancelled_caught

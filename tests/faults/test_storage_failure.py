"""A storage error fails the owner closed: nothing of the failed batch is acknowledged or stored, the owner exits
non-zero, and a restarted owner recovers from the committed state."""

from __future__ import annotations

import contextlib

import apsw
import pytest
import trio
import trio_websocket

import actors
import protocol
from protocol import TetherError, collapse_group
from storage_owner.io import OwnerConfig, OwnerFailed, OwnerServer
from storage_owner.io import _server as server_module
from storage_owner.store import Checkpointer, SqliteStore, check_database
from tests.conftest import OwnerProcess
from tests.integration._wire import hello, raw_connection, receive_frames


async def test_storage_error_fails_the_owner_closed(db_path: str) -> None:
    owner = OwnerProcess(db_path)
    try:
        with trio.fail_after(30):
            # Writing commits: 1 creates the conversation, 2 is the first append, 3 fails.
            await owner.start("--fault-storage-error-at-commit", "3")
            async with actors.connect(db=db_path, reconnect=False) as client:
                conversation_id = await client.create_conversation()
                acknowledged = await client.append(conversation_id, kind="app.note", data="kept")
                with pytest.raises(actors.StorageError, match="injected storage failure"):
                    await client.append(conversation_id, kind="app.note", data="lost")
            assert await owner.wait() == 1

            await owner.start()
            async with actors.connect(db=db_path) as client:
                entries = await client.entries(conversation_id)
                pong = await client.ping()
            assert [(entry.seq, entry.data) for entry in entries] == [(acknowledged, "kept")]
            assert pong.head_seq == acknowledged
    finally:
        await owner.close()


async def test_requests_pending_behind_a_failed_batch_get_storage_failed(db_path: str) -> None:
    owner = OwnerProcess(db_path)
    try:
        with trio.fail_after(30):
            await owner.start("--fault-storage-error-at-commit", "2")
            outcomes: list[str] = []
            async with actors.connect(db=db_path, reconnect=False) as client:
                conversation_id = await client.create_conversation()

                async def append(number: int) -> None:
                    try:
                        await client.append(conversation_id, kind="app.note", data=number)
                        outcomes.append("acknowledged")
                    except actors.StorageError:
                        outcomes.append("storage_failed")
                    except actors.ConnectionLost:
                        outcomes.append("lost")

                async with trio.open_nursery() as nursery:
                    for number in range(50):
                        nursery.start_soon(append, number)
            assert await owner.wait() == 1
            assert "acknowledged" not in outcomes
            assert outcomes.count("storage_failed") >= 1

            await owner.start()
            async with actors.connect(db=db_path) as client:
                assert await client.entries(conversation_id) == []
    finally:
        await owner.close()


# ----------------------------------------------------------------------------------------------------------------
# One fail-closed path: an apsw error wherever the owner meets it (a request's savepoint, a watch's catch-up, the
# checkpoint thread) answers with ``storage_failed``, says goodbye with ``storage_failed`` and stops the owner with
# ``OwnerFailed``. These run the owner's shell in this process, so the store can be made to fail at a chosen call.

INJECTED = apsw.IOError("disk I/O error (injected by the test)")


async def _serve_and_talk(
    db_path: str, requests: list[protocol.Frame], *, expect_frames: int
) -> tuple[list[protocol.Received], BaseException | None]:
    """Run an owner in this process, send ``requests`` one at a time (each after the previous one's frames) under
    call ids 1, 2, ..., and collect every frame it sends until it closes the connection; the owner's failure, if
    it failed."""
    server = OwnerServer(OwnerConfig(db=db_path, clock="manual"), log=lambda line: None)
    received: list[protocol.Received] = []
    failure: BaseException | None = None
    with trio.fail_after(20):
        try:
            async with trio.open_nursery() as nursery:
                url = await nursery.start(server.run)
                async with raw_connection(url) as ws:
                    await ws.send_message(hello(server.token))
                    welcome = protocol.decode_frame(await ws.get_message())
                    assert isinstance(welcome, protocol.Welcome), welcome
                    for call_id, request in enumerate(requests, start=1):
                        await ws.send_message(protocol.encode_frame(request, call_id=call_id))
                        while len(received) < expect_frames and not any(frame.call_id == call_id for frame in received):
                            received.extend(await receive_frames(ws, 1))
                    with contextlib.suppress(trio_websocket.ConnectionClosed):
                        while True:
                            received.extend(await receive_frames(ws, 1))
                nursery.cancel_scope.cancel(reason="the test is over")
        except BaseExceptionGroup as group:
            failure = collapse_group(group)
    return received, failure


def _assert_failed_closed(frames: list[protocol.Received], failure: BaseException | None) -> None:
    assert isinstance(failure, OwnerFailed), failure
    assert isinstance(failure, TetherError)
    goodbyes = [received.frame for received in frames if isinstance(received.frame, protocol.Goodbye)]
    assert [goodbye.code for goodbye in goodbyes] == [protocol.ErrorCode.STORAGE_FAILED], frames


def _create(conversation_id: str) -> protocol.Commit:
    return protocol.Commit(writes=(protocol.CreateConversation(conversation_id=conversation_id),))


def _append(conversation_id: str, data: str) -> protocol.AppendEntry:
    return protocol.AppendEntry(conversation_id=conversation_id, entry_id=protocol.new_id(), kind="app.note", data=data)


async def test_an_apsw_error_inside_a_requests_savepoint_fails_the_owner_closed(
    db_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    insert_entry = SqliteStore.insert_entry

    def failing_insert_entry(self: SqliteStore, record: protocol.EntryRecord) -> None:
        if record.data == "fails":
            raise INJECTED
        insert_entry(self, record)

    monkeypatch.setattr(SqliteStore, "insert_entry", failing_insert_entry)
    conversation_id = protocol.new_id()
    writes = (_append(conversation_id, "lost"), _append(conversation_id, "fails"))
    two_writes = protocol.Commit(writes=writes)
    frames, failure = await _serve_and_talk(db_path, [_create(conversation_id), two_writes], expect_frames=2)

    _assert_failed_closed(frames, failure)
    replies = {received.call_id: received.frame for received in frames}
    assert isinstance(replies[1], protocol.Committed)
    assert isinstance(replies[2], protocol.Error) and replies[2].code == protocol.ErrorCode.STORAGE_FAILED
    assert check_database(db_path)["head_seq"] == 1  # the conversation only: nothing of the failed request


async def test_an_apsw_error_during_a_watch_catch_up_fails_the_owner_closed(
    db_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_read_log(self: SqliteStore, *args: object, **kwargs: object) -> list[object]:
        raise INJECTED

    monkeypatch.setattr(SqliteStore, "read_log", failing_read_log)
    watch = protocol.Watch(watch_id=1, conversation_id=None, from_seq=0)
    frames, failure = await _serve_and_talk(db_path, [_create(protocol.new_id()), watch], expect_frames=2)

    _assert_failed_closed(frames, failure)
    assert [type(received.frame) for received in frames] == [protocol.Committed, protocol.Watching, protocol.Goodbye]


class _FailingCheckpoints:
    """Stands for the checkpointer's APSW connection: every checkpoint fails."""

    def __init__(self, real: apsw.Connection) -> None:
        self._real = real

    def wal_checkpoint(self, **kwargs: object) -> tuple[int, int]:
        raise INJECTED

    def close(self) -> None:
        self._real.close()


async def test_an_apsw_error_on_the_checkpoint_thread_fails_the_owner_closed(
    db_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    init = Checkpointer.__init__

    def failing_init(self: Checkpointer, path: str) -> None:
        init(self, path)
        self._db = _FailingCheckpoints(self._db)  # type: ignore[assignment]

    monkeypatch.setattr(Checkpointer, "__init__", failing_init)
    monkeypatch.setattr(server_module, "CHECKPOINT_START_PAGES", 1)  # checkpoint after the first commit
    frames, failure = await _serve_and_talk(db_path, [_create(protocol.new_id())], expect_frames=1)

    _assert_failed_closed(frames, failure)
    assert [type(received.frame) for received in frames] == [protocol.Committed, protocol.Goodbye]

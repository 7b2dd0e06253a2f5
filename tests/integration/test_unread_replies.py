"""A peer that keeps sending requests but never reads the replies costs the owner a bounded amount of memory: its
output is budgeted while it is produced (past the budget its requests are refused ``overloaded``, nothing
handled), and a peer that still leaves too much unread is dropped; everyone else keeps being served."""

from __future__ import annotations

import contextlib

import trio
import trio_websocket

import actors
import protocol
from tests.conftest import OwnerProcess
from tests.integration._wire import hello, raw_connection

ENTRY_BYTES = 50_000
ENTRIES = 20  # a page of them is about 500 kB of replies (the read budget)
PAGES_ASKED = 1024  # one message of 1,024 reads: about 500 MB of replies without a budget
PEAK_GROWTH_BOUND = 200 << 20
"""The owner's peak resident memory may grow by this much at most (before the output budget: about 800 MB)."""


def memory_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


async def test_a_peer_that_never_reads_its_replies_costs_a_bounded_amount(owner: OwnerProcess) -> None:
    assert owner.info is not None
    with trio.fail_after(120):
        async with actors.connect(db=owner.db) as client:
            conversation_id = await client.create_conversation()
            async with client.commit() as tx:
                for _ in range(ENTRIES):
                    tx.append(conversation_id, kind="app.blob", data="z" * ENTRY_BYTES)
            await client.entries(conversation_id)
            rss_before = memory_kib(owner.pid, "VmRSS") * 1024

            async with raw_connection(owner.info.url) as ws:
                await ws.send_message(hello(owner.info.token))
                protocol.decode_frame(await ws.get_message())  # the Welcome; nothing more is read for now
                requests = [
                    protocol.encode_frame(
                        protocol.ReadEntries(conversation_id=conversation_id, order="asc", cursor=None, limit=1000),
                        call_id=call_id,
                    )
                    for call_id in range(1, PAGES_ASKED + 1)
                ]
                await ws.send_message(protocol.join_frames(requests))
                marker = protocol.encode_frame(protocol.Ping(), call_id=PAGES_ASKED + 1)
                await ws.send_message(marker)

                # The owner keeps serving the others meanwhile: a write and a read.
                seq = await client.append(conversation_id, kind="app.note", data="after")
                entries = await client.entries(conversation_id)
                assert entries[-1].seq == seq

                # Now read: every request was answered, a reply or a refusal (nothing lost, nothing doubled).
                answers: dict[int, protocol.Frame] = {}
                while PAGES_ASKED + 1 not in answers:
                    for received in protocol.decode_message(
                        await ws.get_message(), max_bytes=protocol.WEBSOCKET_HARD_LIMIT_BYTES
                    ):
                        assert received.call_id is not None and received.call_id not in answers, received
                        answers[received.call_id] = received.frame
            peak = memory_kib(owner.pid, "VmHWM") * 1024

    assert sorted(answers) == list(range(1, PAGES_ASKED + 2))
    reads = [answers[call_id] for call_id in range(1, PAGES_ASKED + 1)]
    replies = [frame for frame in reads if isinstance(frame, protocol.EntriesReply)]
    refused = [frame for frame in reads if isinstance(frame, protocol.Error)]
    assert replies and refused
    assert {frame.code for frame in refused} == {protocol.ErrorCode.OVERLOADED}
    assert len(replies) + len(refused) == PAGES_ASKED
    assert peak - rss_before < PEAK_GROWTH_BOUND, (rss_before, peak)


async def test_the_client_retries_an_overloaded_request_until_it_is_served(owner: OwnerProcess) -> None:
    """Many big reads at once from one client: some are refused ``overloaded`` on the wire, every call returns."""
    with trio.fail_after(120):
        async with actors.connect(db=owner.db) as client:
            conversation_id = await client.create_conversation()
            async with client.commit() as tx:
                for _ in range(ENTRIES):
                    tx.append(conversation_id, kind="app.blob", data="z" * ENTRY_BYTES)
            pages: list[int] = []

            async def read_one() -> None:
                page = await client.connection.call(
                    protocol.ReadEntries(conversation_id=conversation_id, order="asc", cursor=None, limit=1000),
                    protocol.EntriesReply,
                )
                pages.append(len(page.entries))

            async with trio.open_nursery() as nursery:
                for _ in range(80):  # about 40 MB of replies asked at once, past the 16 MiB budget
                    nursery.start_soon(read_one)
    assert len(pages) == 80 and len(set(pages)) == 1


async def test_max_peer_output_sets_the_budget(db_path: str) -> None:
    """``--max-peer-output 1`` (MiB): ten reads of ~500 kB in one message, some are refused (how many
    depends on what the socket took meanwhile), each naming the 1 MiB budget."""
    process = OwnerProcess(db_path, "--max-peer-output", "1")
    info = await process.start()
    try:
        with trio.fail_after(60):
            async with actors.connect(db=db_path) as client:
                conversation_id = await client.create_conversation()
                async with client.commit() as tx:
                    for _ in range(ENTRIES):
                        tx.append(conversation_id, kind="app.blob", data="z" * ENTRY_BYTES)
            async with raw_connection(info.url) as ws:
                await ws.send_message(hello(info.token))
                protocol.decode_frame(await ws.get_message())
                read = protocol.ReadEntries(conversation_id=conversation_id, order="asc", cursor=None, limit=1000)
                await ws.send_message(
                    protocol.join_frames([protocol.encode_frame(read, call_id=call_id) for call_id in range(1, 11)])
                )
                answers: dict[int, protocol.Frame] = {}
                while len(answers) < 10:
                    for received in protocol.decode_message(
                        await ws.get_message(), max_bytes=protocol.WEBSOCKET_HARD_LIMIT_BYTES
                    ):
                        assert received.call_id is not None
                        answers[received.call_id] = received.frame
    finally:
        await process.close()
    refused = [frame for frame in answers.values() if isinstance(frame, protocol.Error)]
    assert isinstance(answers[1], protocol.EntriesReply)
    assert refused and all(error.code == protocol.ErrorCode.OVERLOADED for error in refused)
    assert all(str(1 << 20) in error.message for error in refused)


async def test_past_the_total_budget_the_largest_reader_is_dropped(db_path: str) -> None:
    """Two peers that never read, each within its own budget (16 MiB), together past the owner's (20 MiB): the one
    holding the most is dropped, the other refused ``overloaded``, and a peer that reads is served throughout."""
    process = OwnerProcess(db_path, "--max-peer-output", "16", "--max-queued-output", "20")
    info = await process.start()
    try:
        with trio.fail_after(90):
            async with actors.connect(db=db_path) as client:
                conversation_id = await client.create_conversation()
                async with client.commit() as tx:
                    for _ in range(ENTRIES):
                        tx.append(conversation_id, kind="app.blob", data="z" * ENTRY_BYTES)
                read = protocol.ReadEntries(conversation_id=conversation_id, order="asc", cursor=None, limit=1000)
                burst = protocol.join_frames([protocol.encode_frame(read, call_id=n) for n in range(1, 101)])
                async with raw_connection(info.url) as first, raw_connection(info.url) as second:
                    for ws in (first, second):
                        await ws.send_message(hello(info.token))
                        protocol.decode_frame(await ws.get_message())
                    await first.send_message(burst)  # ~16 MiB held for it (its budget)
                    await client.entries(conversation_id)  # the burst was handled before this read
                    await second.send_message(burst)  # ~4 MiB more fit the total, then the total is passed
                    with trio.fail_after(10):
                        while sum(peer.peer_name == "raw" for peer in await client.peers()) > 1:  # noqa: ASYNC110
                            await trio.sleep(0.05)
                    # The second is still attached and was answered: replies, then refusals for the total.
                    answers: list[protocol.Frame] = []
                    while len(answers) < 100:
                        answers += [
                            received.frame
                            for received in protocol.decode_message(
                                await second.get_message(), max_bytes=protocol.WEBSOCKET_HARD_LIMIT_BYTES
                            )
                        ]
                    # The first was dropped: its connection ends once what was in flight is read.
                    with trio.fail_after(10):
                        with contextlib.suppress(trio_websocket.ConnectionClosed):
                            while True:
                                await first.get_message()
                assert await client.entries(conversation_id)
    finally:
        await process.close()
    refused = [frame for frame in answers if isinstance(frame, protocol.Error)]
    assert refused and all(error.code == protocol.ErrorCode.OVERLOADED for error in refused)
    assert any("across its peers" in error.message for error in refused)

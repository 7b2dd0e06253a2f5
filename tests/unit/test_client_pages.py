"""The client's keyset-paged reads (runs, operations, interactions, peers, the task graph, entries): pages are
joined in order, and a cursor that does not move forward is the owner's error (a ``ProtocolError``), never a read
repeated forever."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
import trio

from actors._client._client import Client
from actors._client._connection import Connection
from protocol import (
    EntriesReply,
    Frame,
    InteractionsReply,
    OperationsReply,
    PeersReply,
    ProtocolError,
    ReadEntries,
    ReadInteractions,
    ReadOperations,
    ReadPeers,
    ReadRuns,
    ReadTaskGraph,
    RunsReply,
    TaskGraphReply,
)

MAX_CALLS = 50
"""A fake owner answers at most this many pages: a client still asking after that loops."""


class PagedOwner:
    """Stands in for the connection: answers each read from ``answer(request)`` and records the requests."""

    def __init__(self, answer: Callable[[Any], Frame]) -> None:
        self.answer = answer
        self.requests: list[Any] = []

    async def call(self, request: Any, expected: type[Any]) -> Any:
        await trio.lowlevel.checkpoint()
        self.requests.append(request)
        assert len(self.requests) <= MAX_CALLS, f"the client asked {len(self.requests)} pages: it loops"
        reply = self.answer(request)
        assert isinstance(reply, expected)
        return reply


def client_of(owner: PagedOwner) -> Client:
    return Client(cast(Connection, owner))


async def test_pages_are_joined_in_order_from_each_cursor() -> None:
    # Three pages of sentinel records: the client passes each page's cursor back and joins what it got.
    pages: dict[Any, tuple[tuple[str, ...], Any]] = {None: (("a", "b"), "b"), "b": (("c",), "c"), "c": (("d",), None)}

    def runs(request: ReadRuns) -> RunsReply:
        records, after = pages[request.after_run_id]
        return RunsReply(runs=cast(Any, records), next_after_run_id=after)

    owner = PagedOwner(runs)
    assert cast(list[str], await client_of(owner).runs(status="running")) == ["a", "b", "c", "d"]
    assert [request.after_run_id for request in owner.requests] == [None, "b", "c"]
    assert {request.status for request in owner.requests} == {"running"}

    def operations(request: ReadOperations) -> OperationsReply:
        next_cursor = None if request.cursor == 4 else request.cursor + 2
        return OperationsReply(operations=cast(Any, (request.cursor, request.cursor + 1)), next_cursor=next_cursor)

    owner = PagedOwner(operations)
    assert cast(list[int], await client_of(owner).operations("run-1")) == [0, 1, 2, 3, 4, 5]
    assert [request.cursor for request in owner.requests] == [0, 2, 4]


def stuck_runs(request: ReadRuns) -> RunsReply:
    return RunsReply(runs=cast(Any, ("r",)), next_after_run_id="r-5")


def stuck_operations(request: ReadOperations) -> OperationsReply:
    return OperationsReply(operations=cast(Any, ("o",)), next_cursor=3)


def backward_interactions(request: ReadInteractions) -> InteractionsReply:
    after = "i-9" if request.after_interaction_id is None else "i-1"
    return InteractionsReply(interactions=cast(Any, ("i",)), next_after_interaction_id=after)


def stuck_peers(request: ReadPeers) -> PeersReply:
    return PeersReply(peers=cast(Any, ("p",)), next_after_peer_id=7)


def stuck_task_graph(request: ReadTaskGraph) -> TaskGraphReply:
    return TaskGraphReply(seq=1, nodes=(), next_after_task_id="t-3")


def entries_going_back(request: ReadEntries) -> EntriesReply:
    # An ascending read whose second page ends before the first: a cursor that does not move forward.
    return EntriesReply(entries=(), next_cursor=5 if request.cursor is None else 4)


def desc_entries_stuck(request: ReadEntries) -> EntriesReply:
    return EntriesReply(entries=(), next_cursor=9)


@pytest.mark.parametrize(
    ("answer", "read", "what"),
    [
        (stuck_runs, lambda client: client.runs(), "read_runs"),
        (stuck_operations, lambda client: client.operations("run-1"), "read_operations"),
        (backward_interactions, lambda client: client.interactions(), "read_interactions"),
        (stuck_peers, lambda client: client.peers(), "read_peers"),
        (stuck_task_graph, lambda client: client.task_graph(), "read_task_graph"),
        (entries_going_back, lambda client: client.entries("c-1"), "read_entries"),
        (desc_entries_stuck, lambda client: client.entries("c-1", order="desc"), "read_entries"),
    ],
)
async def test_a_cursor_that_does_not_move_forward_is_a_protocol_error(
    answer: Callable[[Any], Frame], read: Callable[[Client], Any], what: str
) -> None:
    owner = PagedOwner(answer)
    with trio.fail_after(10):
        with pytest.raises(ProtocolError, match=what):
            await read(client_of(owner))
    assert len(owner.requests) == 2  # the second page showed the cursor stuck (or gone back): no third read


async def test_the_task_graph_joins_its_pages_with_the_first_page_s_seq() -> None:
    pages: dict[Any, tuple[int, Any]] = {None: (4, "t-2"), "t-2": (6, None)}

    def graph(request: ReadTaskGraph) -> TaskGraphReply:
        seq, after = pages[request.after_task_id]
        return TaskGraphReply(seq=seq, nodes=(), next_after_task_id=after)

    owner = PagedOwner(graph)
    assert (await client_of(owner).task_graph()).seq == 4
    assert [request.after_task_id for request in owner.requests] == [None, "t-2"]


async def test_entries_read_backwards_follow_a_decreasing_cursor() -> None:
    def entries(request: ReadEntries) -> EntriesReply:
        cursor = 10 if request.cursor is None else request.cursor
        return EntriesReply(entries=cast(Any, (cursor,)), next_cursor=None if cursor <= 2 else cursor - 4)

    owner = PagedOwner(entries)
    assert cast(list[int], await client_of(owner).entries("c-1", order="desc")) == [10, 6, 2]


async def test_iter_runs_reads_a_page_only_when_the_loop_reaches_it() -> None:
    # Its memory is one page however many runs there are: the next page is asked for once the last one is taken.
    pages: dict[Any, tuple[tuple[str, ...], Any]] = {None: (("a", "b"), "b"), "b": (("c",), None)}

    def runs(request: ReadRuns) -> RunsReply:
        records, after = pages[request.after_run_id]
        return RunsReply(runs=cast(Any, records), next_after_run_id=after)

    owner = PagedOwner(runs)
    seen: list[tuple[str, int]] = []
    async for run in client_of(owner).iter_runs(conversation_id="c-1"):
        seen.append((cast(str, run), len(owner.requests)))
    assert seen == [("a", 1), ("b", 1), ("c", 2)]
    assert [(request.conversation_id, request.after_run_id) for request in owner.requests] == [
        ("c-1", None),
        ("c-1", "b"),
    ]

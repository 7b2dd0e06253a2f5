"""The client's keyset-paged reads (runs, operations, interactions, peers): pages are joined in order, and a cursor
that does not move forward is the owner's error (a ``ProtocolError``), never a read repeated forever."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
import trio

from actors._client import Client
from actors._connection import Connection
from protocol import (
    Frame,
    InteractionsReply,
    OperationsReply,
    PeersReply,
    ProtocolError,
    ReadInteractions,
    ReadOperations,
    ReadPeers,
    ReadRuns,
    RunsReply,
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


@pytest.mark.parametrize(
    ("answer", "read", "what"),
    [
        (stuck_runs, lambda client: client.runs(), "read_runs"),
        (stuck_operations, lambda client: client.operations("run-1"), "read_operations"),
        (backward_interactions, lambda client: client.interactions(), "read_interactions"),
        (stuck_peers, lambda client: client.peers(), "read_peers"),
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

"""What the owner's output costs, counted while it is produced.

The core encodes every frame it produces (the shell sends those bytes, never encodes again) and counts them per
peer, on top of what the shell says it still holds unsent for that peer (:meth:`OutputLedger.set_queued`). So,
inside one batch, a request of a peer past its budget is refused ``overloaded`` before its reply is read, and a
watch of such a peer falls back to reading the log instead of being fed: the memory is never allocated, rather
than dropped after. A budget across every peer bounds the owner's total the same way.

A change that several watches receive encodes its records once (:meth:`OutputLedger.change`): the watches share
those bytes, only their ``watch_id`` differs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

import msgpack

from protocol import Change, Frame, Record, encode_frame, unstructure_frame

PeerId = int
T = TypeVar("T")
Output = tuple[PeerId, int | None, Frame]
"""A frame for a peer with its envelope's call id: the request's for a reply, ``None`` for an event."""

DEFAULT_PEER_OUTPUT_BYTES: Final = 16 << 20
"""Unsent output (replies and events) one peer may have in the owner before its requests are refused
``overloaded`` and its watches read the log instead (16 MiB; ``--max-peer-output``)."""
DEFAULT_TOTAL_OUTPUT_BYTES: Final = 256 << 20
"""Unsent output across every peer before requests are refused ``overloaded`` (256 MiB; ``--max-queued-output``)."""
READ_BUDGET_BYTES: Final = 512 << 10
"""A reply page ends early rather than carry more than this (a page of entries, more stored data than this), so a
reply stays far below the WebSocket layer's hard limit however large the records are."""


class OutputLedger:
    """Encoded output of the batch (or catch-up turn) being produced, and what each peer has unsent."""

    def __init__(self, *, peer_budget: int, total_budget: int) -> None:
        if peer_budget < 1 or total_budget < 1:
            raise ValueError(f"output budgets must be 1 byte or more, not {peer_budget} and {total_budget}")
        self.peer_budget = peer_budget
        self.total_budget = total_budget
        self._queued: dict[PeerId, int] = {}
        """Per peer: what the shell holds unsent plus what the core produced since the shell last said."""
        self._total = 0
        self.encoded: list[bytes] = []
        """One entry per output produced since the last :meth:`take`, in order."""
        self._records: dict[tuple[int, str | None], tuple[int, bytes]] = {}
        """Records of one commit already encoded, by (seq, conversation filter): their count and bytes."""

    # ------------------------------------------------------------------------------------------ accounting

    def set_queued(self, peer: PeerId, queued: int) -> bool:
        """The shell holds ``queued`` bytes unsent for ``peer`` (everything it produced was handed over). Whether
        that brought the peer, or the total, back under its budget (lagging watches may resume)."""
        was_over = self.is_over(peer)
        previous = self._queued.get(peer, 0)
        self._total += queued - previous
        if queued:
            self._queued[peer] = queued
        else:
            self._queued.pop(peer, None)
        return was_over and not self.is_over(peer)

    def forget(self, peer: PeerId) -> None:
        self._total -= self._queued.pop(peer, 0)

    def queued(self, peer: PeerId) -> int:
        return self._queued.get(peer, 0)

    @property
    def total(self) -> int:
        return self._total

    def is_over(self, peer: PeerId) -> bool:
        """Whether ``peer`` (or the owner as a whole) is at or past its budget: produce nothing more for it."""
        return self._queued.get(peer, 0) >= self.peer_budget or self._total >= self.total_budget

    def overload(self, peer: PeerId) -> str | None:
        """Why a request of ``peer`` is refused now (``None``: it may be answered)."""
        queued = self._queued.get(peer, 0)
        if queued >= self.peer_budget:
            return (
                f"this connection has {queued} bytes of replies and events unread, at or past its budget of "
                f"{self.peer_budget}; the request was not handled (nothing changed): read what was sent, then retry"
            )
        if self._total >= self.total_budget:
            return (
                f"the owner holds {self._total} bytes of unread output across its peers, at or past its budget of "
                f"{self.total_budget}; the request was not handled (nothing changed): retry shortly"
            )
        return None

    # -------------------------------------------------------------------------------------------- encoding

    def add(self, peer: PeerId, call_id: int | None, frame: Frame) -> None:
        """Encode ``frame`` for ``peer`` and count it."""
        self._count(peer, encode_frame(frame, call_id=call_id))

    def change(self, peer: PeerId, change: Change, conversation_id: str | None, packed: bytes | None = None) -> None:
        """Encode a watch's ``change`` for ``peer``, sharing the records' bytes with every other watch fed the same
        commit with the same filter (``conversation_id``); ``packed``: those bytes already (the commit log's)."""
        key = (change.seq, conversation_id)
        cached = self._records.get(key)
        if cached is None:
            if len(self._records) > 64:
                self._records.clear()
            cached = (len(change.records), _pack_records(change.records) if packed is None else packed)
            self._records[key] = cached
        count, packed = cached
        assert count == len(change.records)
        self._count(peer, _change_bytes(change, packed))

    def _count(self, peer: PeerId, encoded: bytes) -> None:
        self.encoded.append(encoded)
        size = len(encoded)
        self._queued[peer] = self._queued.get(peer, 0) + size
        self._total += size

    def take(self) -> list[bytes]:
        """The encoded output since the last call, in order (the core hands it to the shell with its frames)."""
        encoded, self.encoded = self.encoded, []
        self._records.clear()
        return encoded


class Outbox:
    """Everything the core produced for its peers since the shell last took it, in order: replies, events and watch
    changes, each encoded and counted by the :class:`OutputLedger` as it is added."""

    def __init__(self, ledger: OutputLedger) -> None:
        self.ledger = ledger
        self._out: list[Output] = []

    def reply(self, peer: PeerId, call_id: int | None, frame: Frame) -> None:
        """Answer the request ``call_id`` of ``peer`` (``None``: an ``Error`` for a frame too broken to name one)."""
        self._out.append((peer, call_id, frame))
        self.ledger.add(peer, call_id, frame)

    def push(self, peer: PeerId, frame: Frame) -> None:
        """Send ``peer`` an event (no call id): a worker's ``Lease`` or ``CancelLease``."""
        self._out.append((peer, None, frame))
        self.ledger.add(peer, None, frame)

    def change(self, peer: PeerId, change: Change, conversation_id: str | None, packed: bytes | None = None) -> None:
        """Send a watch its ``change`` (its records' bytes shared with the other watches of the same filter, or
        ``packed`` already by the commit log)."""
        self._out.append((peer, None, change))
        self.ledger.change(peer, change, conversation_id, packed)

    def take(self) -> tuple[list[Output], list[bytes]]:
        """What was produced since the last call, and its encoded frames (one per output, in order)."""
        out, self._out = self._out, []
        return out, self.ledger.take()


def fitting(items: Sequence[T], alone: Callable[[T], Frame], budget: int) -> int:
    """How many of ``items``, from the first, fit ``budget`` bytes once encoded (at least one, so a reply always
    makes progress; one item alone is bounded by the message that stored it). ``alone`` wraps one item in its reply,
    whose encoded size counts it (the envelope's few bytes included: an overestimate)."""
    total = 0
    for index, item in enumerate(items):
        total += len(encode_frame(alone(item), call_id=0))
        if total > budget and index > 0:
            return index
    return len(items)


def fit_page(items: list[T], more: bool, alone: Callable[[T], Frame]) -> tuple[list[T], bool]:
    """A page cut to the items that fit :data:`READ_BUDGET_BYTES` once encoded (one at least); ``more`` if any was
    cut."""
    count = fitting(items, alone, READ_BUDGET_BYTES)
    if count == len(items):
        return items, more
    return items[:count], True


def _pack_records(records: tuple[Record, ...]) -> bytes:
    body = unstructure_frame(Change(watch_id=0, seq=0, committed_at_ms=0, records=records))
    return msgpack.packb(body["records"], use_bin_type=True)  # type: ignore[no-any-return]


def _change_bytes(change: Change, packed_records: bytes) -> bytes:
    """``encode_frame(change)``, with the records already packed: a map of five keys, ``records`` last."""
    head: dict[str, Any] = unstructure_frame(
        Change(watch_id=change.watch_id, seq=change.seq, committed_at_ms=change.committed_at_ms, records=())
    )
    del head["records"]
    pack = msgpack.Packer(use_bin_type=True)
    parts = [pack.pack_map_header(len(head) + 1)]
    for key, value in head.items():
        parts.append(pack.pack(key))
        parts.append(pack.pack(value))
    parts.append(pack.pack("records"))
    parts.append(packed_records)
    return b"".join(parts)

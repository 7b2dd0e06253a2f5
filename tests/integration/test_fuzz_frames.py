"""A frame fuzzer against one real owner: at least 20,000 frames (seeded: valid requests with mutated fields, wrong
types, huge and deeply nested values, unknown types, extra and missing keys, truncated msgpack, garbage messages,
hellos in batches, batches mixing good and bad), sent over real connections, reconnecting whenever the owner closes
one. Meanwhile a good client appends and reads. The owner must never crash or hang; every frame that carries a usable
call id gets exactly one reply with it; a message that is unusable as a whole gets one error; a connection is only
ever closed with a documented code; the good client's entries are all there, in order; and at the end the database
passes ``integrity_check`` and holds exactly the good client's entries plus the fuzzed appends the owner
acknowledged (plus, at most, those whose answer a closed connection lost).

``TETHER_FUZZ_FRAMES`` raises the count for a long local run; ``TETHER_FUZZ_SEED`` replays a run (the seed is
printed, and named in any failure).
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import attrs
import msgpack
import trio
import trio_websocket

import actors
import protocol
from protocol import ErrorCode
from tests.conftest import OwnerProcess
from tests.integration._wire import hello, raw_connection

FRAMES: Final = int(os.environ.get("TETHER_FUZZ_FRAMES", "20000"))
ROUND_TIMEOUT_S: Final = 15.0
SENTINEL_BASE: Final = 1 << 40
"""Call ids of the sentinel pings (one after each fuzzed message): above any call id the generator draws."""
CLOSE_CODES: Final = {1000, 1009}
"""Close codes the owner may use (docs/protocol.md): a normal close, and the WebSocket layer's for a message over
``WEBSOCKET_HARD_LIMIT_BYTES``."""
ROLES: Final = ("client", "client", "reader", "worker")
"""Each connection of the fuzzer takes one of these roles (a reader and a worker are refused what a client may do,
and a worker may announce)."""
OVERSIZE_EVERY: Final = 300
FUZZ_KIND: Final = "fuzz.note"
GOOD_KIND: Final = "good.note"


def pack(value: object) -> bytes:
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


@attrs.define
class Fuzzer:
    rng: random.Random
    conversation_id: str
    next_call_id: int = 1
    messages: int = 0

    def call_id(self) -> int:
        self.next_call_id += 1
        return self.next_call_id

    # ----------------------------------------------------------------------------------------------- values

    def value(self, depth: int = 0) -> Any:
        rng = self.rng
        choice = rng.randrange(14 if depth < 4 else 9)
        if choice == 0:
            return rng.randint(-(2**63), 2**63 - 1)
        if choice == 1:
            return rng.choice([0, -1, 1, 2**64 - 1, 2**53 + 1, -(2**63)])
        if choice == 2:
            return rng.choice([0.5, float("nan"), float("inf"), -0.0, 1e308])
        if choice == 3:
            return "".join(chr(rng.randrange(0x20, 0x2FFF)) for _ in range(rng.randrange(0, 40)))
        if choice == 4:
            return rng.randbytes(rng.randrange(0, 64))
        if choice == 5:
            return rng.choice([True, False, None])
        if choice == 6:
            return "x" * rng.choice([1000, 70_000, 300_000])
        if choice == 7:
            return protocol.new_id()
        if choice == 8:
            return rng.choice(["", "asc", "desc", "terminal", "client", "\x00", "🦀"])
        if choice == 9:
            return [self.value(depth + 1) for _ in range(rng.randrange(0, 5))]
        if choice == 10:
            return {f"k{n}": self.value(depth + 1) for n in range(rng.randrange(0, 5))}
        if choice == 11:
            nested: Any = "bottom"
            for _ in range(rng.choice([10, 63, 65, 200])):
                nested = [nested] if rng.random() < 0.5 else {"n": nested}
            return nested
        if choice == 12:
            return list(range(rng.choice([100, 5000])))
        return {rng.randrange(10): "non-string key"}  # the whole message fails to decode

    # ----------------------------------------------------------------------------------------------- frames

    def append(self) -> dict[str, Any]:
        return {
            "op": "append_entry",
            "conversation_id": self.conversation_id if self.rng.random() < 0.7 else protocol.new_id(),
            "entry_id": protocol.new_id(),
            "kind": FUZZ_KIND,
            "data": {"n": self.rng.randrange(1000)},
        }

    def valid(self) -> dict[str, Any]:
        """A well-formed request (or a frame a client must not send) with a fresh call id."""
        rng, cid, some_id = self.rng, self.conversation_id, protocol.new_id()
        templates: list[dict[str, Any]] = [
            {"type": "ping"},
            {"type": "commit", "writes": [self.append() for _ in range(rng.randrange(1, 4))]},
            {"type": "commit", "writes": [{"op": "create_conversation", "conversation_id": some_id}]},
            {"type": "read_conversation", "conversation_id": cid},
            {"type": "read_entries", "conversation_id": cid, "order": "desc", "cursor": None, "limit": 5},
            {"type": "read_document", "conversation_id": cid, "name": "doc"},
            {"type": "read_submission", "conversation_id": cid, "request_id": "r"},
            {"type": "submit", "conversation_id": some_id, "submission_id": protocol.new_id(), "request_id": "r",
             "kind": "input", "payload": "hi", "when_busy": "follow_up"},
            {"type": "watch", "watch_id": rng.randrange(1, 1000), "conversation_id": cid, "from_seq": 0},
            {"type": "unwatch", "watch_id": rng.randrange(1, 1000)},
            {"type": "read_task", "task_id": some_id},
            {"type": "read_outcomes", "task_ids": [some_id, protocol.new_id()]},
            {"type": "wait_task", "task_id": some_id},
            {"type": "read_task_graph", "after_task_id": None, "limit": 10},
            {"type": "release", "lease": {"task_id": some_id, "epoch": 1}, "migration_error": None},
            {"type": "read_peers"},
            {"type": "advance_clock", "by_ms": 1000},
            {"type": "read_run", "run_id": some_id},
            {"type": "read_runs", "conversation_id": None, "status": None, "after_run_id": None, "limit": 10},
            {"type": "wait_run", "run_id": some_id},
            {"type": "cancel_run", "run_id": some_id},
            {"type": "retry_run", "run_id": some_id},
            {"type": "read_operations", "run_id": some_id, "cursor": 0, "limit": 10},
            {"type": "read_operation", "operation_id": some_id},
            {"type": "read_usage", "conversation_id": None},
            {"type": "read_usage_totals", "scope": "model", "key": None, "after_key": None, "limit": 10},
            {"type": "read_prices"},
            {"type": "resolve", "operation_id": some_id, "output": {"ok": 1}, "resolved_by": None},
            {"type": "respond", "interaction_id": some_id, "approve": True, "note": None, "responded_by": None},
            {"type": "read_interactions", "status": None, "run_id": None, "after_interaction_id": None, "limit": 10},
            {"type": "read_partials", "run_id": some_id, "operation_id": None},
            {"type": "announce", "pid": 1, "host": "h", "app": "a", "capabilities": [], "max_leases": 1, "leases": []},
            {"type": "announce", "pid": 2, "host": "h", "app": "a", "max_leases": 4, "leases": [],
             "capabilities": [{"kind": "task", "name": "fuzz.kind", "version": 1}]},
            {"type": "pong", "now_ms": 0, "head_seq": 0},
            {"type": "hello", "protocol_version": protocol.PROTOCOL_VERSION, "token": "t", "role": "client",
             "peer_name": "x"},
        ]  # fmt: skip
        frame = dict(rng.choice(templates))
        if frame["type"] != "hello":
            frame["call_id"] = self.call_id()
        return frame

    def mutated(self) -> dict[str, Any] | Any:
        rng = self.rng
        frame = self.valid()
        for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
            keys = list(frame)
            mutation = rng.randrange(8)
            if mutation == 0 and keys:
                frame.pop(rng.choice(keys))
            elif mutation in (1, 2) and keys:
                frame[rng.choice(keys)] = self.value()
            elif mutation == 3:
                frame[rng.choice(["extra", "sneaky", "", "call_id", "type"])] = self.value()
            elif mutation == 4:
                frame["type"] = rng.choice(["drop_tables", "", "Ping", "commit ", "error", "goodbye", "lease"])
            elif mutation == 5:
                frame["call_id"] = rng.choice([True, -1, 0, 2**64 - 1, "7", None, 1.5])
            elif mutation == 6 and isinstance(frame.get("writes"), list):
                write = self.append()
                write[rng.choice(list(write))] = self.value()
                frame["writes"] = [*frame["writes"], write]
            elif mutation == 7:
                return self.value()  # not a map at all
        return frame

    def message(self) -> tuple[bytes | str, int]:
        """The next message to send and how many frames it counts for."""
        rng = self.rng
        self.messages += 1
        if self.messages % OVERSIZE_EVERY == 0:
            # Past the WebSocket layer's hard limit: the connection is closed (1009) and the fuzzer reconnects.
            return pack({"type": "ping", "call_id": self.call_id(), "pad": rng.randbytes(128) * (1 << 16)}), 1
        kind = rng.randrange(100)
        if kind < 5:
            valid = pack(self.valid())
            return valid[: rng.randrange(1, len(valid))], 1  # truncated msgpack
        if kind < 7:
            return rng.randbytes(rng.randrange(1, 200)), 1
        if kind < 8:
            return rng.choice(["text", "", "{}"]), 1
        if kind < 9:
            return pack(rng.choice([[], 42, None, "ping", [1, 2], {"type": "ping", "call_id": {"a": 1}}])), 1
        if kind < 10:
            return pack({"type": "ping", "call_id": self.call_id(), "pad": "x" * protocol.MAX_MESSAGE_BYTES}), 1
        if kind < 40:
            return pack(self.mutated()), 1
        frames = [self.mutated() if rng.random() < 0.5 else self.valid() for _ in range(rng.randrange(2, 80))]
        return pack(frames), len(frames)


@attrs.define
class Tally:
    frames: int = 0
    messages: int = 0
    replies: Counter[str] = attrs.Factory(Counter)
    closes: Counter[int] = attrs.Factory(Counter)
    reconnects: int = 0
    roles: Counter[str] = attrs.Factory(Counter)
    handshakes: int = 0
    acked_appends: set[str] = attrs.Factory(set)
    unknown_appends: set[str] = attrs.Factory(set)
    """Appends of commits whose answer was lost with a closed connection: they may or may not have landed."""


def expected_calls(message: bytes | str) -> tuple[list[protocol.Received], bool]:
    """The frames of ``message`` the owner must answer, one reply each, with their call ids; and whether the message
    as a whole is unusable (then one error without a call id answers it)."""
    try:
        received = protocol.decode_message(message, max_bytes=protocol.MAX_MESSAGE_BYTES)
    except protocol.ProtocolError:
        return [], True
    return [item for item in received if item.call_id is not None], False


async def fuzz_round(ws: trio_websocket.WebSocketConnection, fuzzer: Fuzzer, tally: Tally, sentinel: int) -> None:
    message, count = fuzzer.message()
    frames, whole_bad = expected_calls(message)
    calls = Counter(item.call_id for item in frames)
    pending_commits: dict[int | None, list[str]] = {}
    for item in frames:
        if isinstance(item.frame, protocol.Commit):
            entry_ids = [w.entry_id for w in item.frame.writes if isinstance(w, protocol.AppendEntry)]
            if calls[item.call_id] > 1:
                tally.unknown_appends.update(entry_ids)  # a reply cannot say which of the frames it answers
            else:
                pending_commits[item.call_id] = entry_ids
    tally.frames += count
    tally.messages += 1
    answered: Counter[int | None] = Counter()
    try:
        await ws.send_message(message)
        await ws.send_message(protocol.encode_frame(protocol.Ping(), call_id=sentinel))
        with trio.fail_after(ROUND_TIMEOUT_S):
            while True:
                for received in protocol.decode_message(
                    await ws.get_message(), max_bytes=protocol.WEBSOCKET_HARD_LIMIT_BYTES
                ):
                    frame = received.frame
                    assert not isinstance(frame, protocol.BadFrame), f"the owner sent a bad frame: {received}"
                    tally.replies[getattr(frame, "code", None) or type(frame).TYPE] += 1
                    if received.call_id is None and not isinstance(frame, protocol.Error):
                        continue  # an event: a watch's change, a lease, a cancel
                    if received.call_id == sentinel:
                        assert isinstance(frame, protocol.Pong), received
                        break
                    answered[received.call_id] += 1
                    if received.call_id in pending_commits:
                        entry_ids = pending_commits.pop(received.call_id)
                        if isinstance(frame, protocol.Committed):
                            tally.acked_appends.update(entry_ids)
                else:
                    continue
                break
    except trio_websocket.ConnectionClosed as exc:
        for entry_ids in pending_commits.values():
            tally.unknown_appends.update(entry_ids)
        assert exc.reason is not None and exc.reason.code in CLOSE_CODES, f"closed with an undocumented code: {exc}"
        tally.closes[exc.reason.code] += 1
        raise
    missing = [call_id for call_id in calls if answered[call_id] != calls[call_id]]
    assert not missing, f"call ids answered other than once each: {[(c, answered[c], calls[c]) for c in missing][:3]}"
    unexpected = set(answered) - set(calls) - {None}
    assert not unexpected, f"replies to call ids never sent: {sorted(map(str, unexpected))[:5]}"
    if whole_bad:
        assert answered[None] == 1, f"a message unusable as a whole got {answered[None]} errors"


async def fuzz_handshake(info: protocol.RuntimeInfo, fuzzer: Fuzzer, tally: Tally) -> None:
    """A fresh connection whose first message is a fuzzed hello (or a good one inside a batch): answered by a
    welcome or a refusal, or closed with a documented code; never a hang."""
    rng = fuzzer.rng
    frame: Any = msgpack.unpackb(hello(info.token))
    if rng.random() < 0.3:
        message = pack([frame])  # a hello in a batch: a protocol violation
    else:
        frame[rng.choice(list(frame))] = fuzzer.value()
        message = pack(frame)
    tally.handshakes += 1
    tally.frames += 1
    with trio.fail_after(ROUND_TIMEOUT_S):
        try:
            async with raw_connection(info.url) as ws:
                await ws.send_message(message)
                [answer] = protocol.decode_message(await ws.get_message())
                assert isinstance(answer.frame, protocol.Welcome | protocol.Refused), answer
                if isinstance(frame, dict) and message[0] & 0xF0 == 0x90:
                    assert isinstance(answer.frame, protocol.Refused), "a hello in a batch was welcomed"
                    assert answer.frame.code == ErrorCode.PROTOCOL_VIOLATION
        except trio_websocket.ConnectionClosed as exc:
            assert exc.reason is not None and exc.reason.code in CLOSE_CODES, exc.reason


@contextlib.asynccontextmanager
async def attached_as(info: protocol.RuntimeInfo, role: str) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    """A WebSocket to the owner past a valid Hello in ``role`` (the Welcome has been read)."""
    async with raw_connection(info.url) as ws:
        await ws.send_message(hello(info.token, role=role))
        message = await ws.get_message()
        assert isinstance(message, bytes), message
        welcome = protocol.decode_frame(message)
        assert isinstance(welcome, protocol.Welcome), welcome
        yield ws


async def good_client(db: str, conversation_id: str, done: trio.Event, appended: list[str]) -> None:
    async with actors.connect(db=db) as client:
        while not done.is_set():
            for _ in range(5):
                entry_id = actors.new_id()
                await client.append(conversation_id, kind=GOOD_KIND, data={"n": len(appended)}, entry_id=entry_id)
                appended.append(entry_id)
            mine = [entry.entry_id for entry in await client.entries(conversation_id) if entry.kind == GOOD_KIND]
            assert mine == appended, "the good client's entries are not what it appended, in order"
            await trio.sleep(0.01)


async def test_fuzzed_frames_neither_crash_nor_hang_the_owner_nor_change_what_they_should_not(
    db_path: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get("TETHER_FUZZ_SEED", random.SystemRandom().randrange(2**32)))
    print(f"fuzz seed {seed} (TETHER_FUZZ_SEED={seed} replays it), {FRAMES} frames")
    try:
        await _fuzz(db_path, random.Random(seed))
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n(fuzz seed {seed}: TETHER_FUZZ_SEED={seed} replays it)") from exc


async def _fuzz(db_path: str, rng: random.Random) -> None:
    owner = OwnerProcess(db_path)
    tally = Tally()
    appended: list[str] = []
    try:
        with trio.fail_after(60 + FRAMES / 100):
            info = await owner.start()
            async with actors.connect(db=db_path) as client:
                conversation_id = await client.create_conversation()
            fuzzer = Fuzzer(rng, conversation_id)
            done = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(good_client, db_path, conversation_id, done, appended)
                sentinel = SENTINEL_BASE
                while tally.frames < FRAMES:
                    role = rng.choice(ROLES)
                    tally.roles[role] += 1
                    try:
                        async with attached_as(info, role) as ws:
                            for _ in range(rng.randrange(50, 400)):
                                if tally.frames >= FRAMES:
                                    break
                                sentinel += 1
                                await fuzz_round(ws, fuzzer, tally, sentinel)
                                if rng.random() < 0.01:
                                    await fuzz_handshake(info, fuzzer, tally)
                    except trio_websocket.ConnectionClosed:
                        tally.reconnects += 1
                    assert owner.process is not None and owner.process.poll() is None, "the owner died"
                done.set()
            async with actors.connect(db=db_path) as client:
                final = [entry.entry_id for entry in await client.entries(conversation_id) if entry.kind == GOOD_KIND]
            assert await owner.stop() == 0
    finally:
        await owner.close()

    print(
        f"{tally.frames} frames in {tally.messages} messages and {tally.handshakes} handshakes; "
        f"connections {dict(tally.roles)}, {tally.reconnects} closed by the owner, closes {dict(tally.closes)}; "
        f"good client {len(appended)} appends; "
        f"fuzzed appends acknowledged {len(tally.acked_appends)}, unknown {len(tally.unknown_appends)}"
    )
    print(f"replies: {dict(tally.replies.most_common())}")
    assert final == appended
    assert len(appended) > 50, "the good client barely ran: the fuzz proves little"
    assert tally.replies["committed"] > 0 and tally.replies[ErrorCode.BAD_FRAME] > 0
    assert tally.closes[1009] == tally.reconnects == tally.messages // OVERSIZE_EVERY, "oversize messages not closed"

    connection = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        stored = Counter(
            entry_id for (entry_id,) in connection.execute("SELECT entry_id FROM entries WHERE kind != ?", (GOOD_KIND,))
        )
        good = [
            entry_id
            for (entry_id,) in connection.execute(
                "SELECT entry_id FROM entries WHERE kind = ? ORDER BY position", (GOOD_KIND,)
            )
        ]
    finally:
        connection.close()
    assert good == appended
    assert all(count == 1 for count in stored.values())
    assert tally.acked_appends <= set(stored), "an acknowledged fuzzed append is missing"
    assert set(stored) <= tally.acked_appends | tally.unknown_appends, "a fuzzed append landed unacknowledged"

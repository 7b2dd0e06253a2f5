"""Peers, sans-IO: the hello that makes a connection a peer, what each peer said it is, and the calls it waits on.

1. A connection's first frame is a hello, answered ``Welcome`` or ``Refused`` saying why, checked in this order: a
   valid frame, a hello, a supported protocol version, its strings within their bounds (the first one past names
   the field: a hello is read from a connection that has not proved anything yet, and ``peer_name`` is kept for as
   long as the peer stays attached), the token, the role.
2. A peer's role decides what it may do: a ``reader`` reads and watches, never writes; only a ``worker`` announces
   capabilities, commits under a lease and releases one.
3. A worker's announcement is checked whole before anything is taken (the previous one, if any, stands): its lease
   bound, at most :data:`MAX_CAPABILITIES` capabilities, its size without its leases, each capability named and
   versioned. What a worker announced is shown by ``read_peers`` (a page ends at the read budget).
4. Long-poll calls (``wait_task``, ``wait_run``) are answered later, by their room, through :class:`Waits`: at most
   :data:`MAX_WAITS_PER_PEER` per connection, forgotten when the connection ends.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Final, Literal, get_args

import attrs

from protocol import (
    DEFAULT_HEARTBEAT_TIMEOUT_S,
    HEARTBEATS_PER_SILENCE,
    MAX_ANNOUNCE_BYTES,
    MAX_LEASES_PER_WORKER,
    MAX_MESSAGE_BYTES,
    MAX_PEER_NAME_CHARS,
    MAX_RESTART_LIMIT,
    MAX_ROLE_CHARS,
    MAX_TOKEN_CHARS,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    Announce,
    BadFrame,
    Capability,
    ErrorCode,
    Frame,
    Hello,
    Ok,
    PeerInfo,
    PeersReply,
    Ping,
    Pong,
    ReadPeers,
    Refused,
    Role,
    Welcome,
    encode_frame,
)

from ._checks import MAX_NAME_CHARS, Refusal
from ._output import READ_BUDGET_BYTES, PeerId, fitting
from ._unit import Head

ROLES: Final[tuple[Role, ...]] = get_args(Role)
WRITER_ROLES: Final = frozenset({"client", "worker"})
MAX_CAPABILITIES: Final = 10_000
MAX_WAITS_PER_PEER: Final = 10_000
"""Long-poll calls (``wait_task``, ``wait_run``) one connection may have open at once; one more is refused
``invalid``."""
DEFAULT_HEARTBEAT_MS: Final = int(DEFAULT_HEARTBEAT_TIMEOUT_S * 1000 / HEARTBEATS_PER_SILENCE)
"""How often a peer is told to send something when the shell does not say (a quarter of the default timeout: 5 s)."""
HELLO_STRING_BOUNDS: Final = (
    ("token", MAX_TOKEN_CHARS, False),
    ("role", MAX_ROLE_CHARS, True),
    ("peer_name", MAX_PEER_NAME_CHARS, True),
)
"""Each of the hello's string fields: its name, its most characters, whether it must be printable."""
WaitTable = Literal["task", "run", "submission"]


@attrs.define(eq=False)
class Peer:
    role: str
    peer_name: str = ""
    attached_at_ms: int = 0
    announced: Announce | None = None


class Waits:
    """Calls answered later, by table and id: ``wait_task`` by task id (answered when the task ends), ``wait_run``
    by run id (when the run is terminal or needs attention) and ``wait_submission`` by submission id (when it is done
    or unanswered); bounded per connection (rule 4)."""

    def __init__(self) -> None:
        self._waits: dict[str, dict[str, list[tuple[PeerId, int]]]] = {"task": {}, "run": {}, "submission": {}}
        self._keys: dict[PeerId, set[tuple[str, str]]] = {}
        """The ``(table, id)`` of each wait a peer has open, so that its end forgets exactly those."""
        self._counts: dict[PeerId, int] = {}
        """Calls each peer has waiting (several may wait on one id)."""

    def add(self, table: WaitTable, key: str, peer: PeerId, call_id: int) -> None:
        """Answer this call once ``key`` of ``table`` settles; refused past the connection's bound."""
        count = self._counts.get(peer, 0)
        if count >= MAX_WAITS_PER_PEER:
            message = (
                f"a connection may have at most {MAX_WAITS_PER_PEER} waits open at once (wait_task, wait_run, "
                "wait_submission); this "
                "one was not registered: wait for fewer at a time"
            )
            raise Refusal(ErrorCode.INVALID, message)
        self._waits[table].setdefault(key, []).append((peer, call_id))
        self._keys.setdefault(peer, set()).add((table, key))
        self._counts[peer] = count + 1

    def take(self, table: WaitTable, key: str) -> list[tuple[PeerId, int]]:
        """The calls waiting on ``key`` of ``table``, forgotten here and by their peers."""
        waits = self._waits[table].pop(key, [])
        for peer, _ in waits:
            keys = self._keys.get(peer)
            if keys is not None:
                keys.discard((table, key))
                self._counts[peer] -= 1
        return waits

    def forget(self, peer: PeerId) -> None:
        """A connection ended: its waits are forgotten (nobody can receive their answers)."""
        self._counts.pop(peer, None)
        for table, key in self._keys.pop(peer, ()):
            waits = self._waits[table][key]
            waits[:] = [(waiter, call_id) for waiter, call_id in waits if waiter != peer]
            if not waits:
                del self._waits[table][key]


class Peers:
    """The attached peers of one owner. See the module docstring."""

    def __init__(
        self,
        head: Head,
        *,
        token: str,
        instance: str,
        clock: Literal["wall", "manual"],
        heartbeat_ms: int,
        announced: Callable[[PeerId, str, Announce], None],
    ) -> None:
        self._head = head
        self._token = token
        self._instance = instance
        self._clock = clock
        self._heartbeat_ms = heartbeat_ms
        self._announced = announced
        """Told of a worker's announcement once it is taken (the task engine places work, the runs derive again)."""
        self.attached: dict[PeerId, Peer] = {}
        """Every attached peer by its id (read in place on the hot path)."""

    # ----------------------------------------------------------------------------------------- connections

    def hello(self, frame: Frame | BadFrame) -> Welcome | Refused:
        """Answer a connection's first frame (rule 1)."""
        if isinstance(frame, BadFrame):
            return _refused(frame.code, f"the first frame must be a valid hello: {frame.message}")
        if not isinstance(frame, Hello):
            return _refused(ErrorCode.PROTOCOL_VIOLATION, f"the first frame must be hello, not {frame.TYPE}")
        if frame.protocol_version not in SUPPORTED_VERSIONS:
            supported = ", ".join(str(version) for version in SUPPORTED_VERSIONS)
            return _refused(
                ErrorCode.UNSUPPORTED_VERSION,
                f"protocol version {frame.protocol_version} is not supported; this owner speaks {supported}",
            )
        problem = hello_problem(frame)
        if problem is not None:
            return _refused(ErrorCode.INVALID, f"{problem}; the connection was not attached")
        if not hmac.compare_digest(frame.token.encode(), self._token.encode()):
            return _refused(
                ErrorCode.BAD_TOKEN,
                "the access token does not match this owner's (connect with db=PATH to read it from the "
                "runtime file next to the database)",
            )
        if frame.role not in ROLES:
            return _refused(
                ErrorCode.ROLE_NOT_ALLOWED,
                f"role {frame.role!r} is not allowed; use one of {', '.join(ROLES)}",
            )
        return Welcome(
            protocol_version=PROTOCOL_VERSION,
            owner_instance=self._instance,
            head_seq=self._head.seq,
            clock=self._clock,
            max_message_bytes=MAX_MESSAGE_BYTES,
            heartbeat_ms=self._heartbeat_ms,
        )

    def attach(self, peer: PeerId, role: str, *, peer_name: str = "", now_ms: int = 0) -> None:
        assert peer not in self.attached, f"peer {peer} attached twice"
        self.attached[peer] = Peer(role=role, peer_name=peer_name, attached_at_ms=now_ms)

    def detach(self, peer: PeerId) -> Peer | None:
        """Forget a peer; what it was (``None`` if it never attached)."""
        return self.attached.pop(peer, None)

    def __contains__(self, peer: PeerId) -> bool:
        return peer in self.attached

    def announcements(self) -> list[tuple[Capability, ...]]:
        """What each attached worker announced (its capabilities), for the checks of ``configure``."""
        return [state.announced.capabilities for state in self.attached.values() if state.announced is not None]

    def require_worker(self, peer: PeerId, message: str) -> None:
        """Refuse ``not_allowed`` with ``message`` unless ``peer`` is a worker (rule 2)."""
        if self.attached[peer].role != "worker":
            raise Refusal(ErrorCode.NOT_ALLOWED, message)

    # --------------------------------------------------------------------------------------------- requests

    def on_announce(self, peer: PeerId, call_id: int, request: Announce, now_ms: int) -> Frame:
        """Take a worker's announcement, checked whole first (rule 3)."""
        state = self.attached[peer]
        if state.role != "worker":
            message = f"only workers announce capabilities; this connection is a {state.role}"
            raise Refusal(ErrorCode.NOT_ALLOWED, message)
        if not 0 <= request.max_leases <= MAX_LEASES_PER_WORKER:
            # 0: a worker that drains before it stops (it finishes its phases and takes no new lease).
            raise Refusal(ErrorCode.INVALID, f"max_leases must be between 0 and {MAX_LEASES_PER_WORKER}")
        if len(request.capabilities) > MAX_CAPABILITIES:
            message = (
                f"a worker may announce at most {MAX_CAPABILITIES} capabilities, not {len(request.capabilities)}; "
                "the announcement was not taken (the previous one, if any, stands)"
            )
            raise Refusal(ErrorCode.INVALID, message)
        # What read_peers shows of it (its leases are not kept: a worker reattaching with many phases is not held).
        size = len(encode_frame(attrs.evolve(request, leases=()), call_id=call_id))
        if size > MAX_ANNOUNCE_BYTES:
            message = (
                f"an announce holds at most {MAX_ANNOUNCE_BYTES} bytes encoded without its leases (capabilities, "
                f"host, app), "
                f"not {size}; the announcement was not taken (the previous one, if any, stands)"
            )
            raise Refusal(ErrorCode.INVALID, message)
        for index, capability in enumerate(request.capabilities):
            named = 1 <= len(capability.name) <= MAX_NAME_CHARS
            limit = capability.restart_limit
            if not named or capability.version < 1 or (limit is not None and not 1 <= limit <= MAX_RESTART_LIMIT):
                raise Refusal(
                    ErrorCode.INVALID,
                    f"capabilities[{index}]: a name of 1 to {MAX_NAME_CHARS} characters, a version of 1 or more and "
                    f"a restart_limit of 1 to {MAX_RESTART_LIMIT} (or null: no limit) are required, not "
                    f"{capability.name!r} version {capability.version} restart_limit {limit}",
                )
        state.announced = request
        self._announced(peer, state.peer_name or f"peer {peer}", request)
        return Ok()

    def on_read_peers(self, peer: PeerId, call_id: int, request: ReadPeers, now_ms: int) -> Frame:
        after = request.after_peer_id
        ids = sorted(peer_id for peer_id in self.attached if after is None or peer_id > after)
        # A page ends at the read budget (one peer at least: an announce is bounded well below it).
        infos = [self._info(peer_id) for peer_id in ids]
        count = fitting(infos, lambda info: PeersReply(peers=(info,)), READ_BUDGET_BYTES)
        next_after = ids[count - 1] if count < len(ids) else None
        return PeersReply(peers=tuple(infos[:count]), next_after_peer_id=next_after)

    def on_ping(self, peer: PeerId, call_id: int, request: Ping, now_ms: int) -> Frame:
        return Pong(now_ms=now_ms, head_seq=self._head.seq)

    def _info(self, peer_id: PeerId) -> PeerInfo:
        state = self.attached[peer_id]
        announced = state.announced
        return PeerInfo(
            peer_id=peer_id,
            role=state.role,
            peer_name=state.peer_name,
            attached_at_ms=state.attached_at_ms,
            announced=announced is not None,
            pid=None if announced is None else announced.pid,
            host=None if announced is None else announced.host,
            app=None if announced is None else announced.app,
            capabilities=() if announced is None else announced.capabilities,
        )


def hello_problem(hello: Hello) -> str | None:
    """What is wrong with ``hello``'s strings, naming the field, or ``None`` when every one is within its bound."""
    for field, most, printable in HELLO_STRING_BOUNDS:
        value: str = getattr(hello, field)
        if len(value) > most:
            return f"the hello's {field} is {len(value)} characters long, over the limit of {most}"
        if printable and not value.isprintable():
            return f"the hello's {field} holds a character that is not printable (a control or format character)"
    return None


def _refused(code: ErrorCode, message: str) -> Refused:
    return Refused(code=code, message=message, supported_versions=SUPPORTED_VERSIONS)

"""The listener's pieces without sockets: the handshake gate, the counted log, exposure and reachable addresses."""

from __future__ import annotations

import errno
import inspect

import pytest
import trio
import trio.testing
import trio_websocket

from storage_owner.io._listener import (
    LOG_INTERVAL_S,
    CountedLog,
    ExposureRefused,
    HandshakeGate,
    HandshakeSlot,
    check_exposure,
    is_loopback,
    reachable_host,
    serve_listeners,
)


def test_the_gate_gives_at_most_its_bound_of_slots_and_takes_each_back_once() -> None:
    gate = HandshakeGate(2)
    first, second = gate.enter(), gate.enter()
    assert first is not None and second is not None
    assert gate.enter() is None
    first.leave()
    first.leave()  # a second leave gives nothing back twice
    assert gate.open == 1
    third = gate.enter()
    assert third is not None and gate.enter() is None


def test_the_counted_log_writes_the_first_then_one_summary_per_interval() -> None:
    lines: list[str] = []
    log = CountedLog(lines.append, "could not accept")
    now_s = 100.0
    for _ in range(10_000):  # 10,000 failures over 25 s: three lines, not 10,000
        log.record("EMFILE", now_s)
        now_s += 0.0025
    assert len(lines) == 1 + int(25 // LOG_INTERVAL_S)  # at once, then at 10 s and 20 s
    assert log.total == 10_000


def test_the_counted_log_reports_a_pending_count_when_flushed_due_or_forced() -> None:
    lines: list[str] = []
    log = CountedLog(lines.append, "could not accept")
    log.record("EMFILE", 100.0)
    log.record("EMFILE", 101.0)
    log.record("EMFILE", 102.0)  # then the trouble stops: nothing more to trigger a line
    assert (len(lines), log.pending, log.reported) == (1, 2, 1)
    assert log.next_due_s() == 100.0 + LOG_INTERVAL_S
    log.flush(105.0)  # not due yet
    assert (len(lines), log.pending) == (1, 2)
    log.flush(100.0 + LOG_INTERVAL_S)
    assert (len(lines), log.pending, log.reported, log.total) == (2, 0, 3, 3)
    log.flush(200.0, force=True)  # nothing pending: no line
    assert len(lines) == 2 and log.next_due_s() is None
    log.record("EMFILE", 111.0)
    log.flush(112.0, force=True)  # the listener stops: said at once
    assert (len(lines), log.pending, log.reported) == (3, 0, 4)


class _Exhausted:
    """A listener whose ``accept`` fails with EMFILE ``failures`` times, then waits for a connection that never
    comes."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    async def accept(self) -> trio.SocketStream:
        await trio.lowlevel.checkpoint()
        if self.failures:
            self.failures -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        await trio.sleep_forever()
        raise AssertionError("unreachable")


async def _serve_exhausted(failures: int, stop_at_s: float) -> list[float]:
    """Serve one exhausted listener until ``stop_at_s`` (durable clock: the autojump clock); when each line was
    logged."""
    start = trio.current_time()
    logged: list[float] = []

    async def handle(stream: trio.SocketStream, slot: HandshakeSlot) -> None:
        raise AssertionError("no connection is accepted")

    with trio.move_on_at(start + stop_at_s):
        async with trio.open_nursery() as handlers:
            await serve_listeners(
                [_Exhausted(failures)],  # type: ignore[list-item]
                handle,
                gate=HandshakeGate(4),
                log=lambda line: logged.append(trio.current_time() - start),
                handler_nursery=handlers,
            )
    return logged


async def test_failures_after_the_first_are_reported_on_the_timer_when_the_trouble_stops(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Three failures within 30 ms, then none: the first at once, the other two at the interval (not never).
    logged = await _serve_exhausted(3, stop_at_s=5 * LOG_INTERVAL_S)
    assert logged == [0.0, pytest.approx(LOG_INTERVAL_S)]


async def test_a_count_pending_when_the_listener_stops_is_reported_then(autojump_clock: trio.testing.MockClock) -> None:
    logged = await _serve_exhausted(3, stop_at_s=LOG_INTERVAL_S / 2)
    assert logged == [0.0, pytest.approx(LOG_INTERVAL_S / 2)]


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.10", False),
        ("example.com", False),
    ],
)
def test_loopback_is_recognised(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_wider_address_needs_tls_or_consent() -> None:
    check_exposure("127.0.0.1", tls=False, insecure_listen=False)
    check_exposure("0.0.0.0", tls=True, insecure_listen=False)
    check_exposure("0.0.0.0", tls=False, insecure_listen=True)
    with pytest.raises(ExposureRefused) as refused:
        check_exposure("0.0.0.0", tls=False, insecure_listen=False)
    assert "--tls-cert" in str(refused.value) and "--insecure-listen" in str(refused.value)


@pytest.mark.parametrize(
    ("host", "reachable"),
    [("0.0.0.0", "127.0.0.1"), ("::", "[::1]"), ("127.0.0.1", "127.0.0.1"), ("::1", "[::1]"), ("h.lan", "h.lan")],
)
def test_the_runtime_file_names_a_reachable_address(host: str, reachable: str) -> None:
    assert reachable_host(host) == reachable


@pytest.mark.parametrize("name", ["_reader_task", "_get_request"])
def test_the_private_trio_websocket_methods_the_listener_uses_still_exist(name: str) -> None:
    """``websocket_request`` calls two private methods of ``trio_websocket.WebSocketConnection`` (pyproject pins
    trio-websocket below its next minor version for that). An upgrade that renames or removes them fails here,
    not in a connection at run time."""
    method = getattr(trio_websocket.WebSocketConnection, name, None)
    assert method is not None and inspect.iscoroutinefunction(method), (
        f"trio_websocket.WebSocketConnection.{name} is gone or no longer a coroutine function in this "
        "trio-websocket version: storage_owner/io/_listener.py (websocket_request) uses it to read the upgrade "
        "request; adapt websocket_request to the new version before raising the pin in pyproject.toml"
    )

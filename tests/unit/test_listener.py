"""The listener's pieces without sockets: the handshake gate, the counted log, exposure and reachable addresses."""

from __future__ import annotations

import inspect

import pytest
import trio_websocket

from storage_owner.io._listener import (
    LOG_INTERVAL_S,
    CountedLog,
    ExposureRefused,
    HandshakeGate,
    check_exposure,
    is_loopback,
    reachable_host,
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

"""The hello's strings are bounded, and a lease is only a worker's to give back: the core's answers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from protocol import (
    MAX_PEER_NAME_CHARS,
    MAX_ROLE_CHARS,
    MAX_TOKEN_CHARS,
    SUPPORTED_VERSIONS,
    Error,
    ErrorCode,
    Hello,
    LeaseRef,
    Ok,
    Refused,
    Release,
    Welcome,
    new_id,
)
from tests.unit.test_core import TOKEN, Harness


@pytest.fixture
def harness() -> Iterator[Harness]:
    opened = Harness()
    yield opened
    opened.close()


def hello(*, token: str = TOKEN, role: str = "client", peer_name: str = "") -> Hello:
    return Hello(protocol_version=SUPPORTED_VERSIONS[-1], token=token, role=role, peer_name=peer_name)


@pytest.mark.parametrize(
    ("frame", "field", "words"),
    [
        (hello(peer_name="w" * (MAX_PEER_NAME_CHARS + 1)), "peer_name", (str(MAX_PEER_NAME_CHARS + 1), "128")),
        (hello(peer_name="worker\n1"), "peer_name", ("printable",)),
        (hello(peer_name="worker\x1b[2J"), "peer_name", ("printable",)),
        (hello(token="t" * (MAX_TOKEN_CHARS + 1)), "token", (str(MAX_TOKEN_CHARS),)),
        (hello(role="r" * (MAX_ROLE_CHARS + 1)), "role", (str(MAX_ROLE_CHARS),)),
    ],
)
def test_a_hello_string_past_its_bound_is_refused_naming_the_field(
    harness: Harness, frame: Hello, field: str, words: tuple[str, ...]
) -> None:
    answer = harness.core.hello(frame)
    assert isinstance(answer, Refused), answer
    assert answer.code == ErrorCode.INVALID
    assert f"hello's {field}" in answer.message
    for word in words:
        assert word in answer.message
    assert len(answer.message) < 200  # the refusal never echoes what was too long


def test_a_hello_within_every_bound_is_welcomed(harness: Harness) -> None:
    name = "worker-é-" + "x" * (MAX_PEER_NAME_CHARS - 9)
    assert len(name) == MAX_PEER_NAME_CHARS
    assert isinstance(harness.core.hello(hello(peer_name=name)), Welcome)


def test_an_unknown_role_within_its_bound_is_still_role_not_allowed(harness: Harness) -> None:
    answer = harness.core.hello(hello(role="r" * MAX_ROLE_CHARS))
    assert isinstance(answer, Refused) and answer.code == ErrorCode.ROLE_NOT_ALLOWED


@pytest.mark.parametrize("role", ["client", "reader"])
def test_release_from_a_peer_that_is_not_a_worker_is_not_allowed(harness: Harness, role: str) -> None:
    peer = harness.connect(role)
    reply = harness.request(peer, Release(lease=LeaseRef(task_id=new_id(), epoch=1)))
    assert isinstance(reply, Error)
    assert reply.code == (ErrorCode.NOT_ALLOWED if role == "client" else ErrorCode.READ_ONLY)


def test_release_of_a_lease_a_worker_does_not_hold_is_still_a_stale_lease(harness: Harness) -> None:
    worker = harness.connect("worker")
    reply = harness.request(worker, Release(lease=LeaseRef(task_id=new_id(), epoch=1)))
    assert isinstance(reply, Error) and reply.code == ErrorCode.STALE_LEASE
    assert not isinstance(reply, Ok)

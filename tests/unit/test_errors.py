"""Exception groups collapsed at public boundaries (``protocol.raise_collapsed``): a single leaf arrives as itself,
with its own cause, context and traceback; several leaves stay the group, so no ``Cancelled`` is swallowed."""

from __future__ import annotations

import traceback
from typing import Any, NoReturn

import pytest
import trio

import actors
from actors._client import _handshake
from protocol import OwnerUnavailable, raise_collapsed


def _fail_with_context_and_cause() -> NoReturn:
    try:
        raise KeyError("what was being handled")
    except KeyError:
        raise OwnerUnavailable("no owner") from OSError(111, "Connection refused")


async def test_a_single_leaf_keeps_its_cause_context_and_traceback() -> None:
    async def fail() -> None:
        await trio.lowlevel.checkpoint()
        _fail_with_context_and_cause()

    with pytest.raises(OwnerUnavailable) as caught:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(fail)
        except BaseExceptionGroup as group:
            raise_collapsed(group)
    error = caught.value
    assert isinstance(error.__cause__, OSError) and error.__cause__.strerror == "Connection refused"
    assert isinstance(error.__context__, KeyError)
    assert error.__suppress_context__  # raised `from` its cause: printed with the cause, as where it was raised
    frames = [frame.name for frame in traceback.extract_tb(error.__traceback__)]
    assert "_fail_with_context_and_cause" in frames


async def test_a_leaf_raised_without_a_cause_gets_no_context_from_the_group() -> None:
    async def fail() -> None:
        await trio.lowlevel.checkpoint()
        raise OwnerUnavailable("no owner")

    with pytest.raises(OwnerUnavailable) as caught:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(fail)
        except BaseExceptionGroup as group:
            raise_collapsed(group)
    assert caught.value.__cause__ is None and caught.value.__context__ is None


async def test_several_leaves_stay_the_group() -> None:
    async def fail(message: str) -> None:
        raise ValueError(message)  # before a checkpoint: the first to fail cannot cancel the other

    with pytest.raises(BaseExceptionGroup) as caught:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(fail, "a")
                nursery.start_soon(fail, "b")
        except BaseExceptionGroup as group:
            raise_collapsed(group)
    assert sorted(str(leaf) for leaf in caught.value.exceptions) == ["a", "b"]


async def test_a_lone_cancelled_reaches_its_cancel_scope() -> None:
    with trio.CancelScope() as scope:
        try:
            async with trio.open_nursery():
                scope.cancel(reason="the test")
                await trio.sleep_forever()
        except BaseExceptionGroup as group:
            raise_collapsed(group)
    assert scope.cancelled_caught


async def test_connect_raises_owner_unavailable_with_the_os_error_as_its_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    refused = OSError(111, "Connection refused")

    async def open_tcp_stream(*args: Any, **kwargs: Any) -> NoReturn:
        await trio.lowlevel.checkpoint()
        raise refused

    monkeypatch.setattr(trio, "open_tcp_stream", open_tcp_stream)  # the first step of every connection
    assert _handshake.trio is trio
    with trio.fail_after(5), pytest.raises(OwnerUnavailable, match="cannot reach the owner") as caught:
        async with actors.connect(url="ws://127.0.0.1:9/", token="t"):
            pass
    assert caught.value.__cause__ is refused

"""What the command groups' handlers share: how a command says it failed, how it runs trio, and how a serving
command (``tether owner``, ``tether ui``) serves until it is told to stop.

A handler is ``Callable[[argparse.Namespace], int]`` (its exit status); each command's parser names its own with
``set_defaults(handler=...)`` and ``runtime._cli.main`` calls it, mapping the errors every command shares to exit
statuses."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeAlias

import trio

from protocol import raise_collapsed

from ._parent import watch_parent
from ._signals import replay_early_signals

Handler: TypeAlias = Callable[[argparse.Namespace], int]


def fail(exc: BaseException | str, status: int) -> int:
    """Say ``exc`` on stderr as ``tether: ...`` and return ``status``."""
    print(f"tether: {exc}", file=sys.stderr, flush=True)
    return status


def run_trio(function: Callable[[], Awaitable[object]]) -> None:
    """``trio.run`` with the single-exception groups of the public boundary collapsed."""
    try:
        trio.run(function)
    except BaseExceptionGroup as group:
        raise_collapsed(group)


async def serve_until_stopped(
    serve: Callable[..., Awaitable[object]], *, supervised: bool, started: Callable[[Any], str]
) -> None:
    """Start ``serve`` (a function for ``nursery.start``), print ``started(its value)``, and serve until SIGINT or
    SIGTERM, or, for a ``--supervised`` child, until the supervisor is gone (see ``runtime._parent``)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        replay_early_signals()  # one that came while Python imported what the command needs stops it now
        async with trio.open_nursery() as nursery:
            if supervised:
                nursery.start_soon(watch_parent, partial(nursery.cancel_scope.cancel, reason="the supervisor is gone"))
            # Listening from the start: a worker still waiting for its owner stops on SIGTERM too.
            nursery.start_soon(_cancel_on_signal, signals, nursery.cancel_scope)
            value = await nursery.start(serve)
            print(started(value), flush=True)


async def _cancel_on_signal(signals: Any, cancel: trio.CancelScope) -> None:
    async for _ in signals:
        cancel.cancel(reason="SIGINT or SIGTERM")
        return

"""Tether's test kit: check that your own agents and tasks survive crashes (docs/testing.md).

A scratch owner on a manual clock (:class:`ScratchOwner`), your app served in the test's process (:func:`serving`,
:func:`served`) or in a worker process (:class:`WorkerProcess`), each process killable at a chosen commit
(:class:`OwnerKill`, :class:`~actors.WorkerKill`) and always reaped; the scripted model; a loopback
OpenAI-compatible server replaying recorded streams (:func:`openai_server`); assertions on a run's journal and
transcript (:func:`assert_ran_once`, ...). The pytest plugin ``actors.testing.plugin`` gives the fixtures
``tether_db``, ``tether_owner`` and ``tether_client``.

Importing this module is cheap: each name is loaded on first use, so ``import actors`` (which never imports this
module) and a pytest session that loads the plugin pay nothing for what a test does not use.

This module sits above ``runtime`` (it starts ``tether owner`` and ``tether worker`` processes with its helpers);
nothing else in ``actors`` imports it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._models._scripted import ScriptedModel, ScriptedTurn
    from .._worker._faults import KillPoint, WorkerKill
    from ._journal import (
        Step,
        assert_nothing_open,
        assert_ran_once,
        assert_transcript_whole,
        journal,
        start_run,
        wait_for_status,
    )
    from ._openai import (
        TRANSCRIPTS,
        OpenAIServer,
        RecordedRequest,
        Reply,
        error_reply,
        openai_server,
        recorded_transcript,
        sse_body,
        stream_reply,
    )
    from ._processes import OwnerKill, OwnerKillPoint, ScratchOwner, WorkerProcess, served, serving

__all__ = [
    "TRANSCRIPTS",
    "KillPoint",
    "OpenAIServer",
    "OwnerKill",
    "OwnerKillPoint",
    "RecordedRequest",
    "Reply",
    "ScratchOwner",
    "ScriptedModel",
    "ScriptedTurn",
    "Step",
    "WorkerKill",
    "WorkerProcess",
    "assert_nothing_open",
    "assert_ran_once",
    "assert_transcript_whole",
    "error_reply",
    "journal",
    "openai_server",
    "recorded_transcript",
    "served",
    "serving",
    "sse_body",
    "start_run",
    "stream_reply",
    "wait_for_status",
]

_LAZY = {
    "ScriptedModel": "actors._models._scripted",
    "ScriptedTurn": "actors._models._scripted",
    "KillPoint": "actors._worker._faults",
    "WorkerKill": "actors._worker._faults",
    **dict.fromkeys(
        [
            "Step",
            "assert_nothing_open",
            "assert_ran_once",
            "assert_transcript_whole",
            "journal",
            "start_run",
            "wait_for_status",
        ],
        "actors.testing._journal",
    ),
    **dict.fromkeys(
        [
            "TRANSCRIPTS",
            "OpenAIServer",
            "RecordedRequest",
            "Reply",
            "error_reply",
            "openai_server",
            "recorded_transcript",
            "sse_body",
            "stream_reply",
        ],
        "actors.testing._openai",
    ),
    **dict.fromkeys(
        ["OwnerKill", "OwnerKillPoint", "ScratchOwner", "WorkerProcess", "served", "serving"],
        "actors.testing._processes",
    ),
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)

"""The worker and the phase against a fake connection (no process, no socket): what they send for a lease."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import actors
from actors._worker import Worker
from protocol import Commit, Committed, Lease, LeaseRef, Ok, Release, Request, SetTaskState


class FakeClient:
    """A client whose connection answers every commit and release, and records what was sent."""

    welcome = None

    def __init__(self) -> None:
        self.connection = self
        self.sent: list[Request] = []

    async def call(self, request: Request, expected: type[Any]) -> Any:
        await trio.lowlevel.checkpoint()
        self.sent.append(request)
        if isinstance(request, Commit):
            return Committed(seq=len(self.sent), committed_at_ms=0, results=(0,) * len(request.writes))
        return Ok()


def lease(*, version: int = 1, checkpoint: Any = None, mode: str = "phase", epoch: int = 1) -> Lease:
    return Lease(
        lease=LeaseRef(task_id="task-1", epoch=epoch),
        mode=mode,  # type: ignore[arg-type]
        kind="job",
        version=version,
        input={"amount": 5},
        checkpoint=checkpoint,
        conversation_id="conversation-1",
        owner_task_id=None,
        restarts=0,
        abort=None,
        now_ms=0,
    )


async def run_lease(app: actors.App, frame: Lease) -> list[Request]:
    connection = FakeClient()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            worker = Worker(app, connection, nursery, lambda line: None)  # type: ignore[arg-type]
            worker.on_lease(frame)
    return connection.sent


def task_states(sent: list[Request]) -> list[SetTaskState]:
    return [write for request in sent if isinstance(request, Commit) for write in request.writes]  # type: ignore[misc]


async def test_a_stale_lease_raised_in_a_phase_nursery_is_not_a_phase_crash() -> None:
    async def work(rt: actors.Phase) -> None:
        async def commit_late() -> None:
            raise actors.StaleLease("stale_lease", "the task was given to another worker")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(commit_late)

    app = actors.App("test")
    app.define_task("job", version=1, initial=lambda _: {"phase": "work"}, phases={"work": work})
    sent = await run_lease(app, lease())
    assert task_states(sent) == [], "a stale lease ends the run: nothing is committed (no fault)"
    assert not any(isinstance(request, Release) for request in sent)


async def test_a_phase_raising_an_exception_group_faults_its_task() -> None:
    async def work(rt: actors.Phase) -> None:
        raise ExceptionGroup("two failures", [ValueError("one"), KeyError("two")])

    app = actors.App("test")
    app.define_task("job", version=1, initial=lambda _: {"phase": "work"}, phases={"work": work})
    (state,) = task_states(await run_lease(app, lease()))
    assert state.outcome is not None and (state.outcome.status, state.outcome.reason) == ("faulted", "phase_error")


async def test_operation_ids_hash_the_checkpoint_as_stored_before_migration() -> None:
    keys: dict[int, str] = {}

    async def charge(rt: actors.Phase) -> None:
        keys[rt.version] = rt.operation_id("charge")
        await rt.complete()

    stored = {"phase": "charge", "n": 1}
    v1 = actors.App("test")
    v1.define_task("job", version=1, initial=lambda _: stored, phases={"charge": charge})
    v2 = actors.App("test")
    v2.define_task(
        "job",
        version=2,
        initial=lambda _: stored,
        phases={"charge": charge},
        migrate=lambda version, checkpoint: {**checkpoint, "currency": "EUR"},
    )
    await run_lease(v1, lease(version=1, checkpoint=stored))
    await run_lease(v2, lease(version=1, checkpoint=stored, epoch=2))  # the re-run after a crash, migrated
    assert keys[1] == keys[2], "version 2 re-running version 1's phase derives version 1's key"


def test_phase_usage_errors_are_in_the_tree() -> None:
    assert issubclass(actors.PhaseEnded, actors.TetherError)
    assert issubclass(actors.UsageError, actors.TetherError) and issubclass(actors.UsageError, ValueError)


async def test_advance_to_the_same_checkpoint_is_a_usage_error() -> None:
    errors: list[BaseException] = []

    async def work(rt: actors.Phase) -> None:
        try:
            await rt.advance(rt.checkpoint)
        except actors.TetherError as exc:
            errors.append(exc)
        await rt.complete()
        with pytest.raises(actors.PhaseEnded):
            await rt.complete()

    app = actors.App("test")
    app.define_task("job", version=1, initial=lambda _: {"phase": "work"}, phases={"work": work})
    (state,) = task_states(await run_lease(app, lease()))
    assert state.outcome is not None and state.outcome.status == "completed"
    assert len(errors) == 1 and isinstance(errors[0], actors.UsageError) and isinstance(errors[0], ValueError)

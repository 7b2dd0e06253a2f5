"""The worker and the phase against a fake connection (no process, no socket): what they send for a lease."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

import actors
from actors._worker._worker import Worker, _Stop
from protocol import Announce, Commit, Committed, Lease, LeaseRef, Ok, Release, Request, SetTaskState


class FakeConnection:
    """A connection that answers every commit and release, and records what was sent."""

    welcome = None

    def __init__(self) -> None:
        self.sent: list[Request] = []

    def live_since(self, since_s: float) -> bool:
        return True  # no pause, no silence: what the owner said still holds

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
    connection = FakeConnection()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            worker = Worker(app, actors.Client(connection), nursery, lambda line: None)  # type: ignore[arg-type]
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
    # Given back all the same: a lease refused because its task is marked for abort is still this worker's, and the
    # abort handler waits for it (one that ended is refused again, quietly).
    assert [request for request in sent if isinstance(request, Release)] == [Release(lease=lease().lease)]


async def test_a_phase_raising_an_exception_group_faults_its_task() -> None:
    async def work(rt: actors.Phase) -> None:
        raise ExceptionGroup("two failures", [ValueError("one"), KeyError("two")])

    app = actors.App("test")
    app.define_task("job", version=1, initial=lambda _: {"phase": "work"}, phases={"work": work})
    (state,) = task_states(await run_lease(app, lease()))
    assert state.outcome is not None and (state.outcome.status, state.outcome.reason) == ("faulted", "phase_error")


async def test_a_fault_the_worker_commits_is_reported_to_on_report_after_its_commit() -> None:
    reports: list[tuple[actors.Report, int]] = []
    connection = FakeConnection()

    async def work(rt: actors.Phase) -> None:
        raise RuntimeError("the card service is down")

    async def on_report(report: actors.Report) -> None:  # an async callback, awaited
        await trio.lowlevel.checkpoint()
        reports.append((report, len(connection.sent)))

    app = actors.App("test", on_report=on_report)
    app.define_task("job", version=1, initial=lambda _: {"phase": "work"}, phases={"work": work})
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            Worker(app, actors.Client(connection), nursery, lambda line: None).on_lease(lease())  # type: ignore[arg-type]
    [(report, sent_before)] = reports
    assert sent_before == 1  # the fault's commit was acknowledged first
    assert (report.kind, report.reason, report.task_id, report.task_kind) == (
        "task_faulted",
        "phase_error",
        "task-1",
        "job",
    )
    assert report.error == "RuntimeError: the card service is down" and report.tool is None


async def test_an_on_report_callback_that_raises_or_hangs_is_logged_and_fails_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from actors._worker import _reports

    monkeypatch.setattr(_reports, "REPORT_TIMEOUT_S", 0.01)
    lines: list[str] = []
    report = actors.Report(kind="dropped_output", error="why", task_id="t")

    def raising(found: actors.Report) -> None:
        raise ValueError("a bug in the callback")

    async def hanging(found: actors.Report) -> None:
        await trio.sleep_forever()

    app = actors.App("test")
    for callback, said in ((raising, "on_report raised ValueError: a bug in the callback"), (hanging, "longer than")):
        app.on_report(callback)
        with trio.fail_after(5):
            await _reports.Reporter(app, lines.append)(report)
        assert said in lines[-1] and "dropped_output of task t" in lines[-1]
    assert app.on_report(None) is None and app.report_callback is None
    await _reports.Reporter(app, lines.append)(report)  # none set: nothing happens
    with pytest.raises(actors.UsageError, match="on_report takes a function"):
        actors.App("test", on_report="not a function")  # type: ignore[arg-type]


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


async def test_a_draining_worker_gives_a_new_lease_back_unrun_and_tells_the_owner_it_takes_none() -> None:
    """The announcement that a worker drains (``max_leases=0``) and a grant can cross on the wire: the phase leased
    after the stop was asked never runs; its lease is released at once (the task is pending again, no restart)."""
    ran: list[str] = []

    async def work(rt: actors.Phase) -> None:
        ran.append(rt.task_id)
        await rt.complete()

    app = actors.App("test")
    app.define_task("job", version=1, initial=lambda _: {"phase": "work"}, phases={"work": work})
    connection = FakeConnection()
    stop = _Stop()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            worker = Worker(app, actors.Client(connection), nursery, lambda line: None, stop, max_leases=8)  # type: ignore[arg-type]
            stop.worker = worker
            assert worker.announcement().max_leases == 8
            stop.ask()
            worker.on_lease(lease())
    assert ran == []
    [announce] = [request for request in connection.sent if isinstance(request, Announce)]
    [release] = [request for request in connection.sent if isinstance(request, Release)]
    assert len(connection.sent) == 2
    assert isinstance(announce, Announce) and announce.max_leases == 0 and announce.leases == ()
    assert isinstance(release, Release) and release.lease == lease().lease and release.migration_error is None
    assert stop.drained.is_set()


async def test_a_phase_sees_that_its_worker_stops_and_the_drain_ends_when_it_commits() -> None:
    seen: list[bool] = []
    proceed = trio.Event()

    async def work(rt: actors.Phase) -> None:
        seen.append(rt.stopping)
        await proceed.wait()
        seen.append(rt.stopping)
        await rt.complete()

    app = actors.App("test")
    app.define_task("job", version=1, initial=lambda _: {"phase": "work"}, phases={"work": work})
    connection = FakeConnection()
    stop = _Stop()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            worker = Worker(app, actors.Client(connection), nursery, lambda line: None, stop)  # type: ignore[arg-type]
            stop.worker = worker
            worker.on_lease(lease())
            await trio.testing.wait_all_tasks_blocked()
            stop.ask()
            await trio.testing.wait_all_tasks_blocked()
            assert not stop.drained.is_set()  # the phase still runs
            assert worker.running_kinds() == ["job (task task-1)"]
            proceed.set()
            await stop.drained.wait()
    assert seen == [False, True]
    assert [write.status for write in task_states(connection.sent)] == ["terminal"]


@pytest.mark.parametrize(
    ("where", "said"),
    [
        ({"url": "ws://127.0.0.1:9", "token": None}, "needs its access token"),
        ({"url": "ws://127.0.0.1:9", "token": ""}, "needs its access token"),
        ({"url": "127.0.0.1:9", "token": "t"}, "ws:// or wss://"),
        ({"url": "wss://127.0.0.1:9", "token": "t", "ca": "/no/such/ca.pem"}, "/no/such/ca.pem"),
        ({"db": "tether.db", "url": "ws://127.0.0.1:9", "token": "t"}, "exactly one of"),
    ],
)
async def test_what_no_retry_can_mend_is_a_usage_error_before_anything_is_tried(
    where: dict[str, Any], said: str
) -> None:
    """Before, ``serve`` retried these forever (``connect`` raised them as ``OwnerUnavailable`` at each attempt)."""
    app = actors.App("test")
    with trio.fail_after(5):
        with pytest.raises(actors.UsageError, match=said):
            await actors.serve(app, **where)
        with pytest.raises(actors.UsageError, match=said):
            async with actors.connect(**where):
                pass

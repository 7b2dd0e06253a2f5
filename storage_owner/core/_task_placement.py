"""The task engine's placement, sans-IO: the attached workers and what they can run, the leases they hold, the
queues of tasks ready to be leased and of tasks no attached worker can run, and why (the blocked reasons).

Placement never changes a task's record: granting a lease is a transition (:mod:`._tasks`), which asks placement
whom to grant it to and then records the lease here. Whether a task is blocked is derived from the attached
workers, never stored.

A task may also need something of its worker beyond its kind and version (:attr:`Placement.requires`): a run's task
in a conversation configured to use a model needs a worker whose app names that model (a capability of kind
``model``). None able to run the kind has it: the task is blocked ``missing_model``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Final, Literal

import attrs

from protocol import BlockedReason, Capability, ErrorCode, LeaseRef, TaskRecord

from ._checks import Refusal
from ._task_records import EXTERNAL_PREFIX, TaskRecords, describe_state

PeerId = int
Mode = Literal["phase", "abort"]

READY_LOOKAHEAD: Final = 64
"""How far past tasks whose workers are busy the owner looks for one another (idle) worker could run: a task of a
version only a busy worker has does not hold up the rest of its kind, without the whole queue being scanned."""
READY_CHUNK: Final = 256


def task_kind(capability: Capability) -> str:
    """The task kind a capability runs: a task kind by its name, an agent's runs as ``agent:<name>``, a tool's calls
    as ``tool:<name>`` (so an agent's task is leased only to a worker announcing that agent)."""
    if capability.kind == "task":
        return capability.name
    return f"{capability.kind}:{capability.name}"


@attrs.define(eq=False)
class HeldLease:
    peer: PeerId
    epoch: int
    mode: Mode
    version: int
    """The definition version the worker runs (the task's version once it commits)."""
    cancelling: bool = False


@attrs.define(eq=False)
class Worker:
    name: str
    capabilities: dict[str, Capability]
    max_leases: int
    leases: set[str] = attrs.Factory(set)


@attrs.frozen
class Blocked:
    reason: BlockedReason
    detail: str


class Placement:
    """Workers, leases, and the ready and blocked queues of one engine."""

    def __init__(self, records: TaskRecords) -> None:
        self._records = records
        self.ready: dict[str, dict[str, None]] = {}
        """Tasks that may be leased now, by kind, in the order they became runnable."""
        self.blocked: dict[str, dict[str, None]] = {}
        """Runnable tasks that no attached worker can run, by kind (their reason is derived when shown)."""
        self.leases: dict[str, HeldLease] = {}
        self.workers: dict[PeerId, Worker] = {}
        self.migration_failed: dict[tuple[str, int], str] = {}
        self.place = True
        """Whether settling should try to grant leases (something became ready, or a worker has room)."""
        self.requires: Callable[[TaskRecord], str | None] = lambda record: None
        """What else a task needs of its worker: a capability key (``model:<name>``) it must have announced."""

    # ---------------------------------------------------------------------------------------------- workers

    def announce(self, peer: PeerId, name: str, capabilities: Iterable[Capability], max_leases: int) -> None:
        """A worker (re)announced the task kinds it runs (see :func:`task_kind`): what was blocked on them is ready
        again. Kinds under ``tether.`` are the owner's external tasks: no worker runs them."""
        worker = self.workers.get(peer)
        tasks = {task_kind(capability): capability for capability in capabilities}
        tasks = {kind: capability for kind, capability in tasks.items() if not kind.startswith(EXTERNAL_PREFIX)}
        if worker is None:
            self.workers[peer] = Worker(name=name, capabilities=tasks, max_leases=max_leases)
        else:
            worker.capabilities = tasks
            worker.max_leases = max_leases
        for key in list(self.migration_failed):
            failed = self._records.get(key[0])
            if failed is None or failed.kind in tasks:
                del self.migration_failed[key]  # a worker that announces again may migrate them now
        for kind in tasks:
            queue = self.blocked.pop(kind, None)
            if queue:
                self.ready.setdefault(kind, {}).update(queue)
        self.place = True

    def is_current(self, peer: PeerId, lease: LeaseRef) -> bool:
        current = self.leases.get(lease.task_id)
        return current is not None and current.peer == peer and current.epoch == lease.epoch

    def remove_worker(self, peer: PeerId) -> tuple[Worker, list[tuple[str, HeldLease]]] | None:
        """A worker's connection ended: it and the leases it held (in task id order), which end with it."""
        worker = self.workers.pop(peer, None)
        if worker is None:
            return None
        ended = [(task_id, self.leases.pop(task_id)) for task_id in sorted(worker.leases)]
        self.place = True
        return worker, ended

    def current_lease(self, peer: PeerId, lease: LeaseRef) -> HeldLease:
        """The grant ``lease`` names, if it is current and ``peer``'s; refused as stale otherwise."""
        current = self.leases.get(lease.task_id)
        if current is None or current.epoch != lease.epoch or current.peer != peer:
            record = self._records.record(lease.task_id)
            now = "" if record is None else f" (the task is {describe_state(record)}, at epoch {record.epoch})"
            raise Refusal(
                ErrorCode.STALE_LEASE,
                f"the lease on task {lease.task_id} at epoch {lease.epoch} is no longer valid{now}; "
                "nothing was written",
            )
        return current

    def add_lease(self, task_id: str, peer: PeerId, lease: HeldLease) -> None:
        self.workers[peer].leases.add(task_id)
        self.leases[task_id] = lease

    def end_lease(self, task_id: str) -> None:
        """A lease ended (journaled: a refused request puts it back)."""
        lease = self.leases.pop(task_id)
        worker = self.workers.get(lease.peer)
        if worker is not None:
            worker.leases.discard(task_id)
        self.place = True

        def undo() -> None:
            self.leases[task_id] = lease
            if worker is not None:
                worker.leases.add(task_id)

        self._records.journal.undo(undo)

    def leased_to(self, task_id: str) -> str | None:
        """The name of the worker holding a lease on the task, if any."""
        lease = self.leases.get(task_id)
        worker = None if lease is None else self.workers.get(lease.peer)
        return None if worker is None else worker.name

    # ------------------------------------------------------------------------------------------ granting

    def grant_leases(
        self,
        full: Callable[[], bool],
        grant: Callable[[TaskRecord, PeerId, Capability], None],
        blocked: Callable[[TaskRecord, Blocked], None],
    ) -> None:
        """Lease ready tasks, oldest first per kind, to the least busy worker able to run each (``grant`` makes the
        transition and calls :meth:`add_lease`), until ``full()`` says the settling commit holds enough; move those no
        attached worker can run to the blocked tasks (``blocked`` is told of each that workers of its kind could run
        but for why it is blocked)."""
        self.place = False
        for kind in list(self.ready):
            queue = self.ready[kind]
            if not any(kind in worker.capabilities for worker in self.workers.values()):
                del self.ready[kind]  # nobody runs this kind: the whole queue is blocked at once
                self.blocked.setdefault(kind, {}).update(queue)
                for task_id in queue:
                    if self._records.tasks.abort_mark(task_id) is not None:
                        self._records.dirty[task_id] = None  # orphaned (or left waiting) by the reconcile after
                continue
            if not self.has_capacity():
                return  # every worker is busy: a lease that ends brings us back
            self._grant_from(queue, kind, full, grant, blocked)
            if not queue:
                self.ready.pop(kind, None)

    def _grant_from(
        self,
        queue: dict[str, None],
        kind: str,
        full: Callable[[], bool],
        grant: Callable[[TaskRecord, PeerId, Capability], None],
        blocked: Callable[[TaskRecord, Blocked], None],
    ) -> None:
        """Grant what can be granted from one kind's queue, in order. Tasks whose able workers are busy keep their
        place; past ``READY_LOOKAHEAD`` of them the rest waits too (a queue is never scanned whole for nothing)."""
        waiting = 0
        while waiting <= READY_LOOKAHEAD:
            chunk = list(itertools.islice(queue, waiting + READY_CHUNK))[waiting:]
            if not chunk:
                return
            for task_id in chunk:
                if full():
                    self.place = True  # the next batch grants the rest
                    return
                record = self._records.get(task_id)
                if record is None or not self.runnable(record):
                    del queue[task_id]
                    continue
                choice = self._choose_worker(record)
                if choice is None:
                    waiting += 1
                    if waiting > READY_LOOKAHEAD:
                        return
                    continue
                del queue[task_id]
                if isinstance(choice, Blocked):
                    self.blocked.setdefault(kind, {})[task_id] = None
                    blocked(record, choice)
                    continue
                peer, capability = choice
                grant(record, peer, capability)

    def runnable(self, record: TaskRecord) -> bool:
        if record.abort is None:
            return record.status == "pending"
        return record.status in ("pending", "waiting", "sleeping") and not self._records.owns_live_work(record.task_id)

    def _choose_worker(self, record: TaskRecord) -> tuple[PeerId, Capability] | Blocked | None:
        """The least busy worker that can run ``record`` now; ``None`` if all such are busy; why it is blocked."""
        best: tuple[PeerId, Capability] | None = None
        best_load = 0
        able = False
        required: str | bool | None = False  # asked once a worker that runs the kind is found
        for peer, worker in self.workers.items():
            capability = worker.capabilities.get(record.kind)
            if capability is None or not self._can_run(record, capability):
                continue
            if required is False:
                required = self.requires(record)
            if isinstance(required, str) and required not in worker.capabilities:
                continue
            able = True
            load = len(worker.leases)
            if load < worker.max_leases and (best is None or load < best_load):
                best, best_load = (peer, capability), load
        if best is not None:
            return best
        if able:
            return None
        blocked = self.blocked_reason(record)
        assert blocked is not None
        return blocked

    def _can_run(self, record: TaskRecord, capability: Capability) -> bool:
        stored = record.version
        if stored == 0 or capability.version == stored:
            return True
        if capability.version < stored or not capability.migrates:
            return False
        return (record.task_id, capability.version) not in self.migration_failed

    def blocked_reason(self, record: TaskRecord) -> Blocked | None:
        """Why no attached worker can run ``record`` (busy workers do not count as blocking), or ``None``."""
        versions = []
        required: str | bool | None = False  # asked once a worker that can run it is found
        for worker in self.workers.values():
            capability = worker.capabilities.get(record.kind)
            if capability is not None:
                if self._can_run(record, capability):
                    if required is False:
                        required = self.requires(record)
                    if not isinstance(required, str) or required in worker.capabilities:
                        return None
                versions.append(capability)
        if isinstance(required, str):  # workers can run it, none names what it requires
            what = required.partition(":")[2]
            return Blocked(
                "missing_model",
                f"no attached worker that runs {record.kind} names the model {what!r} its conversation is "
                "configured to use (define it with app.define_model, or configure another)",
            )
        stored = record.version
        if not versions:
            return Blocked("missing_task", f"no attached worker has task kind {record.kind}")
        newer = [capability for capability in versions if capability.version > stored]
        if newer:
            failure = next(
                (self.migration_failed.get((record.task_id, c.version)) for c in newer if c.migrates),
                None,
            )
            newest = max(capability.version for capability in newer)
            if failure is not None:
                return Blocked("migration_failed", f"migrating from version {stored} to {newest} failed: {failure}")
            return Blocked(
                "migration_failed", f"version {newest} has no migrate() for tasks stored at version {stored}"
            )
        newest = max(capability.version for capability in versions)
        return Blocked(
            "task_too_old",
            f"stored at version {stored}; the attached workers' definitions are older (version {newest} at most)",
        )

    def has_capacity(self) -> bool:
        return any(len(worker.leases) < worker.max_leases for worker in self.workers.values())

    # -------------------------------------------------------------------------------------------- queues

    def make_ready(self, record: TaskRecord) -> None:
        discard_id(self.blocked, record.kind, record.task_id)
        queue = self.ready.setdefault(record.kind, {})
        if record.task_id not in queue:
            queue[record.task_id] = None
            self.place = True

    def unready(self, record: TaskRecord) -> None:
        discard_id(self.ready, record.kind, record.task_id)

    def block(self, record: TaskRecord) -> None:
        self.unready(record)
        self.blocked.setdefault(record.kind, {})[record.task_id] = None

    def is_blocked(self, record: TaskRecord) -> bool:
        queue = self.blocked.get(record.kind)
        return queue is not None and record.task_id in queue

    def forget(self, record: TaskRecord) -> None:
        """A task ended: it is in neither queue any more."""
        self.unready(record)
        discard_id(self.blocked, record.kind, record.task_id)


def discard_id(queues: dict[str, dict[str, None]], kind: str, task_id: str) -> None:
    queue = queues.get(kind)
    if queue is not None:
        queue.pop(task_id, None)
        if not queue:
            del queues[kind]

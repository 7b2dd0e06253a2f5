"""The task engine's settling, sans-IO: once per batch, after its requests, every task that changed (or depends on
one that did) is reconciled until nothing changes, as one more commit (rules of :mod:`._task_records`).

:meth:`Settling.settle` cascades abort marks down the ownership graph, ends ``completing`` tasks whose owned work is
terminal, resumes waiters and due sleepers, counts restarts of cut-off phases (rule 3; a family's cut-off hook
decides instead, rule 9), orphans what nobody can run past its grace and fails what no worker of its kind can serve
a model for past the model grace (rule 6), and grants leases on runnable tasks
to workers that can run them (rule 1), only once everything else is settled. Everything it changes is one commit,
within a :class:`ChangeBudget`: what is left is settled by the next batch, at once.

The requests (:mod:`._tasks`) hand it what only settling acts on: phases cut off when their worker left, leases
released, ``fail_fast`` waits begun, the kinds of workers that left (whose grace starts now).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, TypeVar

import attrs

from protocol import CancelLease, Capability, CreateTask, Frame, Lease, LeaseRef, Record, TaskOutcome, TaskRecord

from ._ports import TaskStore
from ._task_placement import Blocked, HeldLease, Mode, PeerId, Placement
from ._task_records import ABORT, EXTERNAL_PREFIX, RESTART, TaskEvent, TaskRecords, decided

MAX_SETTLE_CHANGES: Final = 1000
"""Task records one settling commit changes at most; what is left is settled by the next batch, at once."""
ORPHAN_GRACE_MS: Final = 2_000
"""How long, on the owner's clock, a task marked for abort that no attached worker can run waits for one before it
ends ``orphaned``: after the owner starts (its workers are still reconnecting), and after the last worker that ran
its kind left (a supervisor restarts a crashed worker within a second or two), so a restart does not skip the
abort handler, the compensation."""
MODEL_GRACE_MS: Final = 10_000
"""How long, on the owner's clock, a task blocked ``missing_model`` (workers of its kind attached, none naming the
model its conversation is configured to use) waits for one before it ends ``failed``, reason ``no_model``: long
enough for a worker's restart or a deploy that brings the model (rule 6)."""


@attrs.frozen
class CutOffRule:
    """What a cut-off phase becomes (rule 9): ``restart`` (rule 3), ``backoff`` (sleep until ``until_ms``), ``fail``
    (end with ``outcome``) or ``attention`` (wait on the task ``attention`` creates). ``abandon``: the phase's code
    never runs again as it was (a tool call that is not replay-safe), so the live ordinary work the task owns is
    abandoned first (rule 11), in the same commit."""

    action: Literal["restart", "backoff", "fail", "attention"]
    until_ms: int | None = None
    outcome: TaskOutcome | None = None
    attention: CreateTask | None = None
    abandon: bool = False


CutOff = TypeVar("CutOff", str, tuple[str, int, bool])
"""A cut-off phase as settling lists it: its task id (an owner's start), or with its epoch and whether it counts."""

CutOffHook = Callable[[TaskRecord, int, int, list[Record], bool], CutOffRule | None]
"""Called with a task whose phase was cut off (counting a restart), the settling commit's ``seq`` and ``now_ms``, the
list where it adds the records of its family it changed (logged in the settling commit), and whether the phase was
given back by a close rather than cut off (its worker stopped it at its drain's deadline: no restart is counted, and
the hook may only ask for ``attention`` or nothing); ``None`` keeps rule 3."""


@attrs.define
class ChangeBudget:
    """The settling commit being built: its ``seq`` and time, the task records it changed so far, and whether it
    holds as many as one commit should (the rest waits for the next batch, at once: no commit grows past about a
    megabyte, and no batch holds up the commit loop for long)."""

    seq: int = 0
    now_ms: int = 0
    limit: int = MAX_SETTLE_CHANGES
    changed: dict[str, TaskRecord] = attrs.Factory(dict)

    def full(self) -> bool:
        return len(self.changed) >= self.limit

    def add(self, record: TaskRecord) -> None:
        self.changed[record.task_id] = record


@attrs.frozen
class SettleResult:
    records: list[TaskRecord]
    ended: list[TaskRecord]
    """Tasks that became terminal in this batch (requests included), for ``wait_task`` replies."""
    cut_off: list[Record]
    """What the families' cut-off hooks changed (rule 9: interrupted operations), logged before the task records."""


class Settling:
    """What settling keeps between batches (what only it acts on, the orphan graces) and the settle itself."""

    def __init__(
        self,
        store: TaskStore,
        records: TaskRecords,
        placement: Placement,
        emit: Callable[[PeerId, Frame], None],
        create_task: Callable[[CreateTask, int, int, str], TaskRecord],
        *,
        orphan_grace_ms: int,
        model_grace_ms: int = MODEL_GRACE_MS,
        cut_off_hooks: Mapping[str, CutOffHook],
    ) -> None:
        self._store = store
        self._records = records
        self._tasks = records.tasks
        self._placement = placement
        self._emit = emit
        self._create_task = create_task
        """The engine's ``create_task`` (a cut-off manual tool call's attention task, rule 9)."""
        self._cut_off_hooks = dict(cut_off_hooks)
        """Rule 9: each family's hook, by the kind prefix that names the family (``agent:``, ``tool:``)."""
        self._cut_off_records: list[Record] = []
        self.orphan_grace_ms = orphan_grace_ms
        self._started_grace_until_ms: int | None = None
        """The end of the grace after this owner started (set by the first call that tells the time)."""
        self._kind_grace_until_ms: dict[str, int] = {}
        """The end of the grace after a worker that ran the kind left."""
        self.kinds_left: set[str] = set()
        """Task kinds of workers that left since the last settle (their grace starts at its ``now_ms``)."""
        self._orphans_due: dict[str, int] = {}
        """Tasks marked for abort that no attached worker can run, by the end of the grace they wait out."""
        self.model_grace_ms = model_grace_ms
        self._models_due: dict[str, int] = {}
        """Tasks blocked ``missing_model``, by the end of the model grace they wait out (rule 6): at most the live
        tasks; one leased, or whose requirement changed, starts a new grace when it is blocked again."""
        self._budget = ChangeBudget()
        """The settling commit being built (a new one per :meth:`settle`)."""
        self.was_running: list[str] = []
        """Tasks stored ``running`` when this owner started: their phases were cut off."""
        self.abandoned: list[str] = []
        """Live ``abandon_on_restart`` tasks found when this owner started."""
        self.cut_off: list[tuple[str, int, bool]] = []
        """Leases of workers that left: (task id, epoch, whether the cut-off counts as a restart)."""
        self.released: list[tuple[str, bool]] = []
        """Leases given back (a cancelled phase stopped, a migration failed, a worker closing): their tasks are pending
        again; with whether a close stopped the phase (its family's hook then decides about its open operations)."""
        self.fail_fast_checks: dict[str, None] = {}
        """Tasks that began a ``fail_fast`` wait: settling checks the outcomes that were already decided."""

    # ---------------------------------------------------------------------------------------------- timing
    def _clock_seen(self, now_ms: int) -> None:
        """The first time the engine learns the time, the owner's start grace begins."""
        if self._started_grace_until_ms is None:
            self._started_grace_until_ms = now_ms + self.orphan_grace_ms

    def _orphan_grace_until_ms(self, kind: str) -> int:
        """When a task of ``kind`` marked for abort that no attached worker can run may end ``orphaned``."""
        started = self._started_grace_until_ms
        return max(started if started is not None else 0, self._kind_grace_until_ms.get(kind, 0))

    def needs_settle(self, now_ms: int) -> bool:
        """Whether :meth:`settle` has anything to do at ``now_ms`` (the shell then runs a batch)."""
        self._clock_seen(now_ms)
        records = self._records
        if self._recovering or records.dirty or records.finalize or self.cut_off or self.released:
            return True
        if self.kinds_left or self.fail_fast_checks:
            return True
        if self._placement.place and self._placement.ready and self._placement.has_capacity():
            return True
        deadline = self.next_deadline_ms()
        return deadline is not None and deadline <= now_ms

    def next_deadline_ms(self) -> int | None:
        """The earliest stored sleep deadline, end of an orphan grace or of a model grace, for the shell's timer."""
        deadlines = [
            deadline
            for deadline in (
                self._records.next_sleep_ms(),
                min(self._orphans_due.values(), default=None),
                min(self._models_due.values(), default=None),
            )
            if deadline is not None
        ]
        return min(deadlines, default=None)

    def forget_model_grace(self, task_id: str) -> None:
        """What the task needs of its worker changed (its conversation's model): a grace starts again if it is
        blocked again."""
        self._models_due.pop(task_id, None)

    # -------------------------------------------------------------------------------------------- settling
    def settle(self, seq: int, now_ms: int) -> SettleResult:
        """Reconcile everything that changed; see the module docstring. Every record it changes carries ``seq``."""
        self._budget = ChangeBudget(seq=seq, now_ms=now_ms)
        self._clock_seen(now_ms)
        for kind in self.kinds_left:
            self._kind_grace_until_ms[kind] = now_ms + self.orphan_grace_ms
        self.kinds_left.clear()
        self._end_orphan_graces(now_ms)
        self._end_model_graces(now_ms)
        if self._recovering:
            self._recover()
        for task_id, epoch, counts in self.owners_first(self.cut_off):  # at most the leases of workers that left
            self._phase_cut_off(task_id, epoch, counts=counts)
        self.cut_off.clear()
        for task_id, closing in self.released:
            record = self._tasks.get(task_id)
            if record is not None and record.status == "running":
                if closing:
                    self._phase_closed(record)
                else:
                    self._change(record, "stop", status="pending")
        self.released.clear()
        self._wake_sleepers(now_ms)
        checks, self.fail_fast_checks = self.fail_fast_checks, {}
        for task_id in checks:
            self._check_fail_fast(task_id)  # one a full commit cuts short is listed again
        self._reconcile_all()
        if self._placement.place and not self._settling_left():
            # Only once everything is settled: a cascade cut short must reach a task before it may start a phase.
            self._placement.grant_leases(self._budget.full, self._grant, self._blocked)
            self._reconcile_all()  # an orphaned abort may have ended something
        ended = list(self._records.ended.values())
        self._records.ended.clear()
        changed = list(self._budget.changed.values())
        self._budget = ChangeBudget()
        cut_off, self._cut_off_records = self._cut_off_records, []
        return SettleResult(records=changed, ended=ended, cut_off=cut_off)

    @property
    def _recovering(self) -> bool:
        """Whether the first settling commits after a start still have cut-off phases or abandoned tasks to write."""
        return bool(self.was_running or self.abandoned)

    def _settling_left(self) -> bool:
        return self._recovering or bool(self._records.dirty or self._records.finalize)

    def _recover(self) -> None:
        """After an owner start: running phases were cut off; abandon_on_restart work is marked for abort. Written
        over as many settling commits as it takes; nothing is leased before it is done."""
        while self.was_running and not self._budget.full():
            task_id = self.was_running.pop()
            self._phase_cut_off(task_id, self._tasks[task_id].epoch, counts=True)
        while self.abandoned and not self._budget.full():
            abandoned = self._tasks.get(self.abandoned.pop())
            if abandoned is not None and abandoned.abort is None:
                self._change(abandoned, "mark", abort=RESTART)

    def owners_first(self, cut_off: list[CutOff]) -> list[CutOff]:
        """Cut-off phases (task ids, or tuples that start with one), owners before the tasks they own: a caller that
        abandons its nested calls (rule 11) marks them before their own cut-off is settled, so their family's hook
        does not decide for a call nobody will read (a nested manual call would wait for a person)."""

        def depth(item: CutOff) -> int:
            return len(self._records.owner_chain(item if isinstance(item, str) else item[0]))

        return sorted(cut_off, key=depth)

    def _phase_cut_off(self, task_id: str, epoch: int, *, counts: bool) -> None:
        """A phase stopped without committing; it counts a restart unless it had been cancelled for an abort."""
        record = self._tasks.get(task_id)
        if record is None or record.status != "running" or record.epoch != epoch:
            return
        if not counts:
            self._change(record, "stop", status="pending")
            return
        hook = None if record.abort is not None else self._cut_off_hook(record.kind)
        budget = self._budget
        rule = None if hook is None else hook(record, budget.seq, budget.now_ms, self._cut_off_records, False)
        if rule is not None and rule.abandon:
            self._abandon_owned(record)
        if rule is not None and rule.action != "restart":
            self._apply_cut_off_rule(record, rule)
            return
        restarts = record.restarts + 1
        if record.restart_limit is not None and restarts >= record.restart_limit:
            outcome = TaskOutcome(
                status="faulted",
                reason="restart_limit",
                error=f"cut off {restarts} times (the restart limit is {record.restart_limit})",
            )
            self._finish(record, outcome, restarts=restarts)
        else:
            self._change(record, "stop", status="pending", restarts=restarts)

    def _phase_closed(self, record: TaskRecord) -> None:
        """A phase its worker gave back as it closed (rule 3): a close is not a crash, so no restart is counted; its
        family's hook settles the operations it left open, and may keep it waiting for a person (``attention``: a
        manual tool call still running when the close cut it off)."""
        hook = None if record.abort is not None else self._cut_off_hook(record.kind)
        budget = self._budget
        rule = None if hook is None else hook(record, budget.seq, budget.now_ms, self._cut_off_records, True)
        if rule is not None and rule.abandon:
            self._abandon_owned(record)
        if rule is not None and rule.action == "attention":
            self._apply_cut_off_rule(record, rule)
            return
        assert rule is None or rule.action == "restart", f"a close asks for no {rule.action}"
        self._change(record, "stop", status="pending")

    def _abandon_owned(self, record: TaskRecord) -> None:
        """Rule 11: the live ordinary work ``record`` owns (directly, or through conversations it owns) is marked for
        abort with the reason ``restart`` (abandoned, as ``abandon_on_restart`` work is after an owner's restart),
        unless marked already, in this commit, whatever the budget: a caller has at most a bounded number of nested
        calls. What they own is reached by the cascade, bottom-up, as any abort."""
        for owned_id in list(self._records.owned_ordinary(record.task_id)):
            owned = self._tasks[owned_id]
            if owned.abort is None:
                self._change(owned, "mark", abort=RESTART)

    def _cut_off_hook(self, kind: str) -> CutOffHook | None:
        """The cut-off hook of the family ``kind`` belongs to, if it has one (rule 9)."""
        for prefix, hook in self._cut_off_hooks.items():
            if kind.startswith(prefix):
                return hook
        return None

    def _apply_cut_off_rule(self, record: TaskRecord, rule: CutOffRule) -> None:
        """Rule 9: a cut-off phase ends as its family's hook decided."""
        if rule.action == "backoff":
            assert rule.until_ms is not None
            self._change(record, "backoff", status="sleeping", until_ms=rule.until_ms, on=(), policy=None)
        elif rule.action == "fail":
            assert rule.outcome is not None
            self._finish(record, rule.outcome)
        else:
            assert rule.attention is not None
            attention = self._create_task(rule.attention, self._budget.seq, self._budget.now_ms, "cut-off")
            self._budget.add(attention)
            on = (attention.task_id,)
            self._change(record, "interrupt", status="waiting", on=on, policy="all_settled", until_ms=None)

    def _end_orphan_graces(self, now_ms: int) -> None:
        """Tasks whose orphan grace is over are reconciled again: orphaned if still nobody can run them."""
        due = [task_id for task_id, until_ms in self._orphans_due.items() if until_ms <= now_ms]
        for task_id in due:
            del self._orphans_due[task_id]
            if task_id in self._tasks:
                self._records.dirty[task_id] = None
        for kind in [kind for kind, until_ms in self._kind_grace_until_ms.items() if until_ms <= now_ms]:
            del self._kind_grace_until_ms[kind]

    def _blocked(self, record: TaskRecord, blocked: Blocked) -> None:
        """Placement found ``record`` blocked while workers of its kind are attached. A marked one is reconciled again
        (orphaned, or left waiting, rule 6); an unmarked one blocked ``missing_model`` starts its model grace."""
        if record.abort is not None:
            self._records.dirty[record.task_id] = None
        elif blocked.reason == "missing_model":
            self._models_due.setdefault(record.task_id, self._budget.now_ms + self.model_grace_ms)

    def _end_model_graces(self, now_ms: int) -> None:
        """Rule 6: a task still blocked ``missing_model`` once its model grace is over ends ``failed``, reason
        ``no_model``, its error naming the model (a run's task: the run fails ``no_model``)."""
        due = [task_id for task_id, until_ms in self._models_due.items() if until_ms <= now_ms]
        for task_id in due:
            if self._budget.full():
                return  # the next batch, at once
            del self._models_due[task_id]
            record = self._tasks.get(task_id)
            if record is None or record.status != "pending" or record.abort is not None:
                continue
            if self._records.owns_live_work(task_id):
                continue
            blocked = self._placement.blocked_reason(record)
            if blocked is None or blocked.reason != "missing_model":
                continue  # a worker naming it came (busy now), or none of its kind is attached: it waits
            error = f"{blocked.detail}; none did for {self.model_grace_ms / 1000:g} s (the model grace)"
            self._finish(record, TaskOutcome(status="failed", reason="no_model", error=error))

    def _wake_sleepers(self, now_ms: int) -> None:
        while not self._budget.full():
            record = self._records.pop_due_sleeper(now_ms)
            if record is None:
                return
            self._change(record, "wake", status="pending", until_ms=None)

    def _reconcile_all(self) -> None:
        while (self._records.dirty or self._records.finalize) and not self._budget.full():
            while self._records.finalize:
                task_id = next(iter(self._records.finalize))
                self._after_end(self._records.finalize.pop(task_id))
            if self._records.dirty:
                task_id = next(iter(self._records.dirty))
                del self._records.dirty[task_id]
                record = self._tasks.get(task_id)
                if record is not None:
                    self._reconcile(record)

    def _check_fail_fast(self, task_id: str) -> None:
        waiter = self._tasks.get(task_id)
        if waiter is None or waiter.status != "waiting" or waiter.policy != "fail_fast":
            return
        for other in waiter.on:
            other_record = self._records.record(other)
            outcome = None if other_record is None else decided(other_record)
            if outcome is not None and outcome.status != "completed":
                self._fail_fast(waiter)
                return

    def _reconcile(self, record: TaskRecord) -> None:
        task_id = record.task_id
        status = record.status
        if record.kind.startswith(EXTERNAL_PREFIX):  # rule 10: nobody runs it; an abort ends it at once
            if record.abort is not None:
                self._finish(record, TaskOutcome(status="aborted"))
            return
        if record.abort is not None:
            self._cascade(record, record.abort)
        if status == "completing":
            assert record.held is not None
            if not self._records.owns_live_work(task_id):
                self._finish(record, record.held)
            elif record.held.status != "completed":
                self._cascade(record, ABORT)
                self._signal_fail_fast(record)
            return
        if status == "running":
            lease = self._placement.leases.get(task_id)
            if record.abort is not None and lease is not None and lease.mode == "phase" and not lease.cancelling:
                lease.cancelling = True
                reason = "the task was aborted" if record.abort == ABORT else "the task is abandoned: nobody awaits it"
                self._emit(lease.peer, CancelLease(lease=LeaseRef(task_id=task_id, epoch=lease.epoch), reason=reason))
            return
        if status == "waiting" and not any(other in self._tasks for other in record.on):
            record = self._change(record, "resume", status="pending", on=(), policy=None)
            status = "pending"
        if record.abort is not None:
            if self._records.owns_live_work(task_id):
                self._placement.unready(record)
                return
            blocked = self._placement.blocked_reason(record)
            if blocked is None:
                self._placement.make_ready(record)
            elif record.abort != ABORT:
                self._placement.block(record)  # a restart mark waits for a worker, so its abort handler can clean up
            else:
                grace_until_ms = self._orphan_grace_until_ms(record.kind)
                if self._budget.now_ms >= grace_until_ms:
                    self._orphans_due.pop(task_id, None)
                    outcome = TaskOutcome(status="orphaned", reason=blocked.reason, error=blocked.detail)
                    self._finish(record, outcome)
                else:  # a worker that can run it may still (re)attach: the grace's end settles it again
                    self._placement.block(record)
                    self._orphans_due[task_id] = grace_until_ms
            return
        if status == "pending" and not self._placement.is_blocked(record):
            self._placement.make_ready(record)

    def _cascade(self, record: TaskRecord, reason: str) -> None:
        """Mark the ordinary work ``record`` owns for abort with ``reason`` (an explicit abort replaces a restart
        mark; a restart mark reaches only unmarked work)."""
        for owned_id in list(self._records.owned_ordinary(record.task_id)):  # marking changes the sets walked
            owned = self._tasks[owned_id]
            if owned.abort is None or (reason == ABORT and owned.abort == RESTART):
                if self._budget.full():
                    self._records.dirty[record.task_id] = None  # the next settling commit marks the rest
                    return
                self._change(owned, "mark", abort=reason)

    def _grant(self, record: TaskRecord, peer: PeerId, capability: Capability) -> None:
        """Lease ``record`` to ``peer`` (its phase, or its abort handler once marked): a transition, then the
        ``Lease`` event (sent once the settling commit has committed)."""
        task_id = record.task_id
        self._models_due.pop(task_id, None)
        mode: Mode = "phase" if record.abort is None else "abort"
        epoch = record.epoch + 1
        version = record.version or capability.version
        record = self._change(
            record,
            "grant",
            status="running",
            epoch=epoch,
            version=version,
            restart_limit=capability.restart_limit,
            on=(),
            policy=None,
            until_ms=None,
        )
        self._placement.add_lease(
            task_id, peer, HeldLease(peer=peer, epoch=epoch, mode=mode, version=capability.version)
        )
        input_value, checkpoint = self._records.data.task_data(task_id)
        self._emit(
            peer,
            Lease(
                lease=LeaseRef(task_id=task_id, epoch=epoch),
                mode=mode,
                kind=record.kind,
                version=version,
                input=input_value,
                checkpoint=checkpoint,
                conversation_id=record.conversation_id,
                owner_task_id=record.owner_task_id,
                restarts=record.restarts,
                abort=record.abort,
                now_ms=self._budget.now_ms,
            ),
        )

    # ------------------------------------------------------------------------------------------ transitions
    def _finish(self, record: TaskRecord, outcome: TaskOutcome, **changes: Any) -> None:
        """End a task with ``outcome``, or hold it (``completing``) while it owns live ordinary work."""
        changes |= {"on": (), "policy": None, "until_ms": None}
        if self._records.owns_live_work(record.task_id):
            self._change(record, "hold", status="completing", held=outcome, **changes)
        else:
            self._change(record, "end", status="terminal", outcome=outcome, held=None, **changes)

    def _change(self, record: TaskRecord, event: TaskEvent, **changes: Any) -> TaskRecord:
        """A change made while settling: saved, logged with the settling commit, and reconciled again."""
        changed = attrs.evolve(record, seq=self._budget.seq, updated_at_ms=self._budget.now_ms, **changes)
        self._records.save(record, changed, event)
        self._budget.add(changed)
        return changed

    def _after_end(self, record: TaskRecord) -> None:
        """A task became terminal: its owner, waiters and owned conversations are reconsidered."""
        task_id = record.task_id
        self._records.touch_owner(record)
        self._placement.forget(record)
        for waiter in self._records.waiters.get(task_id, ()):
            self._records.dirty[waiter] = None
        self._signal_fail_fast(record)
        self._records.forget_owned_conversations(task_id)

    def _signal_fail_fast(self, record: TaskRecord) -> None:
        """``record`` decided an outcome (it is terminal or ``completing``): one other than ``completed`` makes its
        ``fail_fast`` waiters mark the others they wait on, at once (not when its own work has ended)."""
        outcome = decided(record)
        if outcome is None or outcome.status == "completed":
            return
        for waiter in self._records.waiters.get(record.task_id, ()):
            waiting = self._tasks.get(waiter)
            if waiting is not None and waiting.policy == "fail_fast":
                self._fail_fast(waiting)

    def _fail_fast(self, waiter: TaskRecord) -> None:
        """One of the tasks a ``fail_fast`` waiter waits on did not complete: the others still live are marked for
        abort (those a full settling commit could not take, by the next one)."""
        for other in waiter.on:
            record = self._tasks.get(other)
            if record is not None and record.abort != ABORT and record.status != "completing":
                if self._budget.full():
                    self.fail_fast_checks[waiter.task_id] = None
                    return
                self._change(record, "mark", abort=ABORT)

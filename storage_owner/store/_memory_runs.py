"""The memory store's runs (the :class:`~storage_owner.core.RunStore` port) over its tables: a mixin of
:class:`~storage_owner.store.MemoryStore`, the twin of ``_runs``'s SQL."""

from __future__ import annotations

from typing import Any, Final

from protocol import RUN_TERMINAL, RunRecord
from storage_owner.core import StoreConflict

from ._blobs import pack, unpack
from ._memory_tables import Journaled, _Run

_RUN_ENDED: Final = frozenset(RUN_TERMINAL)
"""The run statuses ``live_runs`` leaves out (the SQLite store's ``runs_live`` index)."""


class RunsMemory(Journaled):
    """Runs, with their inputs and the seq that created each."""

    def insert_run(self, record: RunRecord, input: object) -> None:
        t = self._t
        if record.run_id in t.runs:
            raise StoreConflict("run", record.run_id)
        self._put(t.runs, record.run_id, _Run(record, pack(input), record.seq))

    def update_run(self, record: RunRecord) -> None:
        t = self._t
        stored = t.runs.get(record.run_id)
        if stored is not None:
            self._put(t.runs, record.run_id, _Run(record, stored.input, stored.created_seq))

    def run(self, run_id: str) -> RunRecord | None:
        stored = self._t.runs.get(run_id)
        return None if stored is None else stored.record

    def run_input(self, run_id: str) -> Any:
        stored = self._t.runs.get(run_id)
        assert stored is not None, f"run {run_id} is not stored"
        return unpack(stored.input)

    def live_runs(self) -> list[RunRecord]:
        live = [run for run in self._t.runs.values() if run.record.status not in _RUN_ENDED]
        live.sort(key=lambda run: (run.created_seq, run.record.run_id))
        return [run.record for run in live]

    def later_run_started(self, run_id: str) -> bool:
        t = self._t
        this = t.runs.get(run_id)
        if this is None:
            return False
        return any(
            later.record.conversation_id == this.record.conversation_id
            and later.created_seq > this.created_seq
            and later.record.task_id is not None
            for later in t.runs.values()
        )

    def run_page(
        self, conversation_id: str | None, status: str | None, after_run_id: str | None, limit: int
    ) -> tuple[list[RunRecord], bool]:
        runs = self._t.runs
        after = None if after_run_id is None else runs.get(after_run_id)
        start = (-1, "") if after is None else (after.created_seq, after.record.run_id)
        ordered = sorted(runs.values(), key=lambda run: (run.created_seq, run.record.run_id))
        found = [
            run.record
            for run in ordered
            if (run.created_seq, run.record.run_id) > start
            and (conversation_id is None or run.record.conversation_id == conversation_id)
            and (status is None or run.record.status == status)
        ]
        return found[:limit], len(found) > limit

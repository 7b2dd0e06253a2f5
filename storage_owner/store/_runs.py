"""The SQL of runs (the :class:`~storage_owner.core.RunStore` port of ``storage_owner.core._runs``): a mixin of
:class:`~storage_owner.store.SqliteStore`."""

from __future__ import annotations

from typing import Any, Final

import apsw
import attrs

from protocol import RunAnswer, RunRecord, RunUsage
from storage_owner.core import StoreConflict

from ._blobs import pack, unpack

# A run's columns: RunRecord's fields in its order; answer and usage are stored as msgpack maps.
_RUN_FIELDS: Final = tuple(field.name for field in attrs.fields(RunRecord))
_RUN_COLUMNS: Final = ", ".join(_RUN_FIELDS)
_UPDATE_RUN: Final = f"UPDATE runs SET {', '.join(f'{name} = ?' for name in _RUN_FIELDS[1:])} WHERE run_id = ?"


def _run_row(record: RunRecord) -> tuple[object, ...]:
    values = []
    for name in _RUN_FIELDS:
        value = getattr(record, name)
        if name == "answer":
            value = None if value is None else pack(attrs.asdict(value))
        elif name == "usage":
            value = pack(attrs.asdict(value))
        values.append(value)
    return tuple(values)


def _run_record(row: Any) -> RunRecord:
    values = dict(zip(_RUN_FIELDS, row, strict=True))
    answer = values["answer"]
    values["answer"] = None if answer is None else RunAnswer(**unpack(answer))
    values["usage"] = RunUsage(**unpack(values["usage"]))
    return RunRecord(**values)


class RunsSql:
    """The ``runs`` table."""

    _db: apsw.Connection

    def insert_run(self, record: RunRecord, input: object) -> None:
        """Store a new run and its input (the submitted text, read back when the run is admitted)."""
        try:
            self._db.execute(
                f"INSERT INTO runs ({_RUN_COLUMNS}, input, created_seq) "
                f"VALUES ({', '.join('?' * (len(_RUN_FIELDS) + 2))})",
                (*_run_row(record), pack(input), record.seq),
            )
        except apsw.ConstraintError as exc:
            raise StoreConflict("run", record.run_id) from exc

    def update_run(self, record: RunRecord) -> None:
        row = _run_row(record)
        self._db.execute(_UPDATE_RUN, (*row[1:], row[0]))

    def run(self, run_id: str) -> RunRecord | None:
        row = self._db.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else _run_record(row)

    def run_input(self, run_id: str) -> Any:
        row = self._db.execute("SELECT input FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        assert row is not None, f"run {run_id} is not stored"
        return unpack(row[0])

    def live_runs(self) -> list[RunRecord]:
        """Every run that is not terminal, in the order they were created."""
        rows = self._db.execute(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE status NOT IN ('completed', 'failed', 'cancelled') "
            "ORDER BY created_seq, run_id"
        )
        return [_run_record(row) for row in rows]

    def later_run_started(self, run_id: str) -> bool:
        """Whether a run created after ``run_id`` in its conversation has been admitted (or ended after it was)."""
        row = self._db.execute(
            "SELECT EXISTS (SELECT 1 FROM runs AS later JOIN runs AS this ON this.run_id = ? "
            "WHERE later.conversation_id = this.conversation_id AND later.created_seq > this.created_seq "
            "AND later.task_id IS NOT NULL)",
            (run_id,),
        ).fetchone()
        return bool(row[0])  # type: ignore[index]

    def run_page(
        self, conversation_id: str | None, status: str | None, after_run_id: str | None, limit: int
    ) -> tuple[list[RunRecord], bool]:
        """Up to ``limit`` runs in creation order (``created_seq``, then ``run_id``) after the run ``after_run_id``,
        filtered, and whether more follow: a keyset page, read from the index range of ``runs_by_creation`` (or of
        ``runs_by_conversation``, for one conversation)."""
        where = []
        args: list[object] = []
        if after_run_id is not None:
            where.append("(created_seq, run_id) > (SELECT created_seq, run_id FROM runs WHERE run_id = ?)")
            args.append(after_run_id)
        if conversation_id is not None:
            where.append("conversation_id = ?")
            args.append(conversation_id)
        if status is not None:
            where.append("status = ?")
            args.append(status)
        condition = f"WHERE {' AND '.join(where)} " if where else ""
        rows = self._db.execute(
            f"SELECT {_RUN_COLUMNS} FROM runs {condition}ORDER BY created_seq, run_id LIMIT ?",
            (*args, limit + 1),
        ).fetchall()
        page = [_run_record(row) for row in rows[:limit]]
        return page, len(rows) > limit

"""The memory store's commit log and meta (the :class:`~storage_owner.core.LogStore` port) over its tables: a mixin of
:class:`~storage_owner.store.MemoryStore`, the twin of ``_log``'s SQL."""

from __future__ import annotations

import bisect

from protocol import StorageError
from storage_owner.core import LoggedCommit

from ._blobs import RECORDS, pack, structure_records, unpack, unstructure_records
from ._memory_tables import _BEYOND, Journaled


class LogMemory(Journaled):
    """The commit log (:attr:`_Tables.log`, :attr:`_Tables.seqs`) and meta; the savepoints are the store's own."""

    # ----------------------------------------------------------------------------------------- commit log

    def head_seq(self) -> int:
        seqs = self._t.seqs
        return seqs[-1] if seqs else 0

    def log_commit(self, commit: LoggedCommit, conversation_ids: frozenset[str]) -> bytes:
        t = self._t
        if commit.seq in t.log:
            raise StorageError(f"storage failed: commit {commit.seq} is already logged")
        only = next(iter(conversation_ids)) if len(conversation_ids) == 1 else None
        blob = pack(unstructure_records(commit.records))
        self._put(t.log, commit.seq, (only, commit.committed_at_ms, blob))
        self._insert_sorted(t.seqs, commit.seq)
        return blob

    def read_log(
        self, after_seq: int, conversation_id: str | None, limit: int, *, until_seq: int | None = None
    ) -> list[LoggedCommit]:
        t = self._t
        until = _BEYOND if until_seq is None else until_seq
        found: list[LoggedCommit] = []
        seqs = t.seqs
        for index in range(bisect.bisect_right(seqs, after_seq), len(seqs)):  # no copy of the log's tail
            seq = seqs[index]
            if seq > until or len(found) >= limit:
                break
            only, at_ms, blob = t.log[seq]
            if conversation_id is None or only is None or only == conversation_id:
                found.append(
                    LoggedCommit(seq=seq, committed_at_ms=at_ms, records=structure_records(unpack(blob), RECORDS))
                )
        return found

    # ----------------------------------------------------------------------------------------------- meta

    def get_meta(self, key: str) -> int | None:
        return self._t.meta.get(key)

    def set_meta(self, key: str, value: int) -> None:
        self._put(self._t.meta, key, int(value))

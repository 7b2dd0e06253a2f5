"""The schema, as an ordered list of migrations. ``PRAGMA user_version`` is the number of migrations applied.

Append a migration to change the schema; never edit a published one.

Every table that grows with traffic grows at its end or within one conversation's range, and the commit log is
append-only: ``commits.conversation_id`` names the one conversation a commit touched (``NULL`` for none or
several) and is deliberately not indexed. An index there costs one random B-tree page per commit, which halves
commit throughput; a watch of one conversation instead scans the log in bounded windows (see
``OwnerCore.catch_up``), starting no earlier than the conversation's creation.
"""

from __future__ import annotations

from typing import Final

MIGRATIONS: Final[tuple[str, ...]] = (
    # 1: the commit path: commit log, conversations, entries, documents, submissions, owner row, meta.
    """
    CREATE TABLE owner (
        singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
        pid INTEGER NOT NULL,
        host TEXT NOT NULL,
        started_at_ms INTEGER NOT NULL,
        instance TEXT NOT NULL,
        engine TEXT NOT NULL
    );
    CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE commits (
        seq INTEGER PRIMARY KEY,
        conversation_id TEXT,
        committed_at_ms INTEGER NOT NULL,
        records BLOB NOT NULL
    );
    CREATE TABLE conversations (
        conversation_id TEXT PRIMARY KEY,
        created_at_ms INTEGER NOT NULL,
        seq INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE entries (
        conversation_id TEXT NOT NULL,
        position INTEGER NOT NULL,
        entry_id TEXT NOT NULL UNIQUE,
        seq INTEGER NOT NULL,
        kind TEXT NOT NULL,
        data BLOB NOT NULL,
        created_at_ms INTEGER NOT NULL,
        PRIMARY KEY (conversation_id, position)
    ) WITHOUT ROWID;
    CREATE TABLE documents (
        scope TEXT NOT NULL,
        name TEXT NOT NULL,
        version INTEGER NOT NULL,
        value BLOB NOT NULL,
        seq INTEGER NOT NULL,
        updated_at_ms INTEGER NOT NULL,
        PRIMARY KEY (scope, name)
    ) WITHOUT ROWID;
    CREATE TABLE submissions (
        submission_id TEXT PRIMARY KEY,
        conversation_id TEXT NOT NULL,
        request_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        payload BLOB NOT NULL,
        status TEXT NOT NULL,
        seq INTEGER NOT NULL,
        created_at_ms INTEGER NOT NULL,
        UNIQUE (conversation_id, request_id)
    ) WITHOUT ROWID;
    """,
    # 2: tasks, and conversations owned by a task. A task's scheduling facts are columns, and the live tasks' index
    # covers what an owner reads of each at start (`live_task_rows`), so that read scans the index alone; input and
    # checkpoint are read only to grant a lease.
    """
    ALTER TABLE conversations ADD COLUMN owner_task_id TEXT;
    CREATE TABLE tasks (
        task_id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        version INTEGER NOT NULL,
        conversation_id TEXT NOT NULL,
        owner_task_id TEXT,
        background INTEGER NOT NULL,
        abandon_on_restart INTEGER NOT NULL,
        status TEXT NOT NULL,
        phase TEXT,
        on_ids BLOB,
        policy TEXT,
        until_ms INTEGER,
        abort TEXT,
        restarts INTEGER NOT NULL,
        restart_limit INTEGER NOT NULL,
        epoch INTEGER NOT NULL,
        held BLOB,
        outcome BLOB,
        seq INTEGER NOT NULL,
        created_at_ms INTEGER NOT NULL,
        updated_at_ms INTEGER NOT NULL,
        input BLOB NOT NULL,
        checkpoint BLOB NOT NULL
    );
    CREATE INDEX tasks_live ON tasks (task_id, kind, conversation_id, owner_task_id, status, abort, abandon_on_restart)
        WHERE status != 'terminal';
    """,
    # 3: agents. A conversation's agent, a submission's run, and the runs (a run's answer and usage are msgpack
    # maps; its input text is kept beside the record, read only when the run is admitted). The live runs' index is
    # what an owner reads at start; runs are read by conversation in run id order. `created_seq` (the creating
    # commit; a record's `seq` is its last change) orders a conversation's runs. The operation journal keeps each
    # record whole (msgpack) with the columns it is looked up by: a run's journal in order (`ordinal`), the open
    # operation of a task (cut off, the owner decides what it becomes). Interactions likewise, one per operation.
    # Usage totals per conversation and per model.
    """
    ALTER TABLE conversations ADD COLUMN agent TEXT;
    ALTER TABLE submissions ADD COLUMN run_id TEXT;
    CREATE TABLE runs (
        run_id TEXT PRIMARY KEY,
        conversation_id TEXT NOT NULL,
        agent TEXT NOT NULL,
        version INTEGER NOT NULL,
        status TEXT NOT NULL,
        reason TEXT,
        operation_id TEXT,
        answer BLOB,
        usage BLOB NOT NULL,
        submission_id TEXT NOT NULL,
        task_id TEXT,
        seq INTEGER NOT NULL,
        created_at_ms INTEGER NOT NULL,
        updated_at_ms INTEGER NOT NULL,
        input BLOB NOT NULL,
        created_seq INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX runs_live ON runs (created_seq) WHERE status NOT IN ('completed', 'failed', 'cancelled');
    CREATE INDEX runs_by_conversation ON runs (conversation_id, run_id);
    CREATE TABLE operations (
        operation_id TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        ordinal INTEGER NOT NULL,
        task_id TEXT NOT NULL,
        status TEXT NOT NULL,
        record BLOB NOT NULL,
        UNIQUE (run_id, ordinal)
    ) WITHOUT ROWID;
    CREATE INDEX operations_open ON operations (task_id) WHERE status = 'started';
    CREATE TABLE interactions (
        interaction_id TEXT PRIMARY KEY,
        operation_id TEXT NOT NULL UNIQUE,
        run_id TEXT NOT NULL,
        status TEXT NOT NULL,
        record BLOB NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE usage (
        scope TEXT NOT NULL,
        key TEXT NOT NULL,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cached_tokens INTEGER NOT NULL,
        reasoning_tokens INTEGER NOT NULL,
        cost REAL,
        PRIMARY KEY (scope, key)
    ) WITHOUT ROWID;
    """,
    # 4: usage and cost. The price table (per model, per million tokens; read whole by the owner at start), and the
    # budgets per conversation or task tree (`scope`, `key`). Usage totals of task trees are rows of `usage` with
    # scope 'tree' keyed by the root task id; a total's unpriced_tokens are its input + output tokens of unknown cost
    # (its cost is then a lower bound).
    """
    ALTER TABLE usage ADD COLUMN unpriced_tokens INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE prices (
        model TEXT PRIMARY KEY,
        input_per_mtok REAL NOT NULL,
        output_per_mtok REAL NOT NULL,
        cached_input_per_mtok REAL,
        reasoning_per_mtok REAL
    ) WITHOUT ROWID;
    CREATE TABLE budgets (
        scope TEXT NOT NULL,
        key TEXT NOT NULL,
        max_tokens INTEGER,
        max_cost REAL,
        PRIMARY KEY (scope, key)
    ) WITHOUT ROWID;
    """,
    # 5: partial output of model requests (docs/runs.md, "Partial output"): one row per operation (its current
    # attempt, status and size), its pieces as rows, so that storing a piece writes the piece alone, never the text
    # so far again. Pieces are deleted once the operation's result commits.
    """
    CREATE TABLE partials (
        operation_id TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        conversation_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        intent_seq INTEGER NOT NULL,
        status TEXT NOT NULL,
        chars INTEGER NOT NULL,
        size_bytes INTEGER NOT NULL,
        pieces INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        created_at_ms INTEGER NOT NULL,
        updated_at_ms INTEGER NOT NULL
    );
    CREATE INDEX partials_by_run ON partials (run_id);
    CREATE INDEX partials_held ON partials (operation_id) WHERE pieces > 0 OR status = 'streaming';
    CREATE TABLE partial_pieces (
        operation_id TEXT NOT NULL,
        char_offset INTEGER NOT NULL,
        text TEXT NOT NULL,
        PRIMARY KEY (operation_id, char_offset)
    );
    """,
    # 6: why a run failed, in words (`runs.error`, NULL for the runs of older engines, which said it only on their
    # tasks' outcomes). An interaction names its tool inside its record; one stored before says it through its
    # approval task's owner, which the store reads it from (`_sqlite`), so no row is rewritten here.
    """
    ALTER TABLE runs ADD COLUMN error TEXT;
    """,
    # 7: the inbox (docs/runs.md, "The inbox"). A submission has a status that changes (queued, placed, done,
    # unanswered), why it went unanswered, the answer it got (msgpack, as a run's), how it was admitted while busy,
    # and the commit that created it (`created_seq`: `seq` is its last change), which orders the open ones an owner
    # reads at start. Submissions stored before took no status but `queued`: they get the one their run says.
    """
    ALTER TABLE submissions ADD COLUMN reason TEXT;
    ALTER TABLE submissions ADD COLUMN answer BLOB;
    ALTER TABLE submissions ADD COLUMN when_busy TEXT NOT NULL DEFAULT 'follow_up';
    ALTER TABLE submissions ADD COLUMN created_seq INTEGER;
    UPDATE submissions SET
        created_seq = seq,
        status = COALESCE((
            SELECT CASE r.status WHEN 'completed' THEN 'done' WHEN 'failed' THEN 'unanswered'
                WHEN 'cancelled' THEN 'unanswered' WHEN 'queued' THEN 'queued' ELSE 'placed' END
            FROM runs r WHERE r.run_id = submissions.run_id), 'done'),
        reason = (
            SELECT CASE r.status WHEN 'failed' THEN COALESCE(r.reason, 'faulted') WHEN 'cancelled' THEN 'aborted' END
            FROM runs r WHERE r.run_id = submissions.run_id),
        answer = (SELECT r.answer FROM runs r WHERE r.run_id = submissions.run_id AND r.status = 'completed');
    CREATE INDEX submissions_open ON submissions (created_seq) WHERE status IN ('queued', 'placed');
    CREATE INDEX submissions_by_conversation ON submissions (conversation_id, created_seq, submission_id);
    """,
    # 8: what a model sees of an entry of the application's kind (`entries.model`, msgpack messages; NULL: nothing)
    # and the entry its context starts at from it on (`entries.head`, an entry id; set by a write naming a head), and
    # an input's own entry (`submissions.entry`, msgpack `{kind, data}`). NULL for every row stored before.
    """
    ALTER TABLE entries ADD COLUMN model BLOB;
    ALTER TABLE entries ADD COLUMN head TEXT;
    ALTER TABLE submissions ADD COLUMN entry BLOB;
    """,
    # 9: questions (`call.ask`): an operation may ask several, so `interactions.operation_id` is unique only among
    # approvals (one per tool call); `kind` says which. The table is rebuilt to drop the old constraint; every row
    # stored before is an approval.
    """
    CREATE TABLE interactions_9 (
        interaction_id TEXT PRIMARY KEY,
        operation_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        run_id TEXT NOT NULL,
        status TEXT NOT NULL,
        record BLOB NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO interactions_9 (interaction_id, operation_id, kind, run_id, status, record)
        SELECT interaction_id, operation_id, 'approval', run_id, status, record FROM interactions;
    DROP TABLE interactions;
    ALTER TABLE interactions_9 RENAME TO interactions;
    CREATE UNIQUE INDEX interactions_approval ON interactions (operation_id) WHERE kind = 'approval';
    """,
    # 10: runs are listed in creation order (`created_seq`, then `run_id`), not by id: a subagent's run id is derived
    # (uuid5) and sorted out of place. A page of every run, or of one conversation's, reads its index range alone;
    # the conversation's index also answers whether a later run of it started (a retry's check).
    """
    DROP INDEX runs_by_conversation;
    CREATE INDEX runs_by_conversation ON runs (conversation_id, created_seq, run_id);
    CREATE INDEX runs_by_creation ON runs (created_seq, run_id);
    """,
)

SCHEMA_VERSION: Final = len(MIGRATIONS)
"""The schema version this engine writes."""

GLOBAL_SCOPE: Final = ""
"""The ``documents.scope`` of global documents (a conversation id otherwise)."""

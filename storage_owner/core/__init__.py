"""The owner's durable logic, sans-IO: no trio, no sockets, no apsw (a unit test enforces it)."""

from ._checks import MAX_READ_LIMIT, same_json
from ._commits import MAX_WRITES_PER_COMMIT
from ._output import DEFAULT_PEER_OUTPUT_BYTES, DEFAULT_TOTAL_OUTPUT_BYTES, Output, PeerId
from ._owner import BatchEffects, BatchOrderError, CoreGauges, OwnerCore
from ._ports import (
    NO_CHANGE,
    TASK_ROW_FIELDS,
    ConversationReads,
    ConversationStore,
    LoggedCommit,
    LogStore,
    OperationReads,
    OperationStore,
    PartialHead,
    PartialStore,
    RunReads,
    RunStore,
    Store,
    StoreConflict,
    TaskReads,
    TaskRow,
    TaskStore,
    UsageStore,
)
from ._run_rules import DEFAULT_MAX_CONCURRENT_RUNS, run_task_id
from ._run_status import run_status
from ._task_settle import MODEL_GRACE_MS, ORPHAN_GRACE_MS
from ._tasks import TaskEngine
from ._watches import CATCH_UP_PAGE

__all__ = [
    "CATCH_UP_PAGE",
    "DEFAULT_MAX_CONCURRENT_RUNS",
    "DEFAULT_PEER_OUTPUT_BYTES",
    "DEFAULT_TOTAL_OUTPUT_BYTES",
    "MAX_READ_LIMIT",
    "MAX_WRITES_PER_COMMIT",
    "MODEL_GRACE_MS",
    "NO_CHANGE",
    "ORPHAN_GRACE_MS",
    "TASK_ROW_FIELDS",
    "BatchEffects",
    "BatchOrderError",
    "ConversationReads",
    "ConversationStore",
    "CoreGauges",
    "LogStore",
    "LoggedCommit",
    "OperationReads",
    "OperationStore",
    "Output",
    "OwnerCore",
    "PartialHead",
    "PartialStore",
    "PeerId",
    "RunReads",
    "RunStore",
    "Store",
    "StoreConflict",
    "TaskEngine",
    "TaskReads",
    "TaskRow",
    "TaskStore",
    "UsageStore",
    "run_status",
    "run_task_id",
    "same_json",
]

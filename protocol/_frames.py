"""Every frame of the wire protocol, as frozen attrs classes.

A frame travels as a msgpack map whose ``type`` key holds the class's ``TYPE`` tag, never its Python name.
Fields are msgpack-native: ``int``, ``str``, ``bool``, ``None``, tuples, nested frozen classes, and opaque
JSON-like application values (:data:`JsonValue`). Times are integer milliseconds on the owner's clock.

Requests and replies carry a ``call_id`` in their envelope, not as a field of their class: the sender chooses it, the
owner's reply carries the same one (see :func:`~protocol.encode_frame` and :class:`~protocol.Received`). Events are
pushed by the owner without one: ``Change`` (a watch's commit), ``Lease`` and ``CancelLease`` (to a worker) and
``Goodbye`` (the connection ends). The handshake's ``Hello``, ``Welcome`` and ``Refused`` carry none either.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final, Literal, NewType, TypeAlias, get_args

import attrs

from ._limits import DEFAULT_MAX_LEASES

JsonValue = NewType("JsonValue", object)
"""An application value: ``None``, ``bool``, ``int``, ``float``, ``str``, lists and str-keyed maps of them."""

Role: TypeAlias = Literal["client", "worker", "reader"]
Order: TypeAlias = Literal["asc", "desc"]


# --------------------------------------------------------------------------------------------------- records


@attrs.frozen(kw_only=True)
class ConversationRecord:
    """A conversation: a transcript of immutable entries."""

    RECORD: ClassVar[str] = "conversation"
    conversation_id: str
    created_at_ms: int
    seq: int
    """The commit that created it."""
    entry_count: int
    owner_task_id: str | None = None
    """The task that owns it (a subagent's transcript), if any: aborting that task aborts its tasks."""
    agent: str | None = None
    """The agent its ``input`` submissions start runs of (bound at creation, never changed)."""


@attrs.frozen(kw_only=True)
class EntryRecord:
    """One immutable transcript entry. ``position`` counts from 0 within its conversation."""

    RECORD: ClassVar[str] = "entry"
    entry_id: str
    conversation_id: str
    position: int
    seq: int
    kind: str
    data: JsonValue
    created_at_ms: int
    model: JsonValue = JsonValue(None)
    """What a model sees of an entry of the application's kind, in its place: messages ``[{"role": "user" |
    "assistant", "text": ...}]`` (an input placed as its own ``entry``, a write the model sees); null: nothing."""
    head: str | None = None
    """The entry the model's context starts at from this one on (a summary's first kept entry): its ``model``
    messages first, then the entries from the head on; set only by a write naming a head."""


@attrs.frozen(kw_only=True)
class DocumentRecord:
    """A named JSON-like value, per conversation or global (``conversation_id`` is ``None``), versioned from 1."""

    RECORD: ClassVar[str] = "document"
    conversation_id: str | None
    name: str
    version: int
    value: JsonValue
    seq: int
    updated_at_ms: int


@attrs.frozen(kw_only=True)
class SubmissionRecord:
    """Something handed to a conversation, deduplicated by ``(conversation_id, request_id)``."""

    RECORD: ClassVar[str] = "submission"
    submission_id: str
    conversation_id: str
    request_id: str
    kind: str
    payload: JsonValue
    status: str
    seq: int
    created_at_ms: int
    run_id: str | None = None
    """The run that answers it: the run an ``input`` started or is queued to start, the run a steer joined (or, while
    queued, the run it will join)."""
    reason: str | None = None
    """Why an ``unanswered`` submission was not answered (``withdrawn``, ``aborted``, ``model_error``, ...)."""
    answer: RunAnswer | None = None
    """A ``done`` input's answer: the run's final assistant entry (``seq``, ``text``)."""
    when_busy: str = "follow_up"
    """How an ``input`` was admitted while its conversation was busy: ``follow_up`` (a run of its own after the
    active one) or ``steer`` (placed in the active run at its next boundary)."""
    entry: JsonValue = JsonValue(None)
    """An ``input``'s own entry (``{"kind", "data"}``), placed instead of ``tether.user``; null otherwise."""


RunStatus: TypeAlias = Literal[
    "queued", "retry_wait", "pending", "running", "waiting", "needs_attention", "completed", "failed", "cancelled"
]
"""A run's status, derived by the owner from its task and the tasks it owns (see docs/runs.md)."""
RUN_ACTIVE: tuple[str, ...] = ("retry_wait", "pending", "running", "waiting", "needs_attention")
"""Statuses of a conversation's active run (at most one; its successors are ``queued``)."""
RUN_TERMINAL: tuple[str, ...] = ("completed", "failed", "cancelled")


@attrs.frozen(kw_only=True)
class RunUsage:
    """Tokens and cost accounted to a run (or an operation, a conversation, a model); ``cost`` ``None``: unknown.
    ``unpriced_tokens``: the input + output tokens whose cost is unknown (set by the owner, never by a worker): a
    total with some has a cost of at least ``cost`` (``None``: none known), not exactly."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cost: float | None = None
    unpriced_tokens: int = 0


@attrs.frozen(kw_only=True)
class RunAnswer:
    """A completed run's answer: the final assistant entry's ``seq`` and its text; ``value``, the text parsed as the
    JSON its agent's ``output_schema`` asked for (null for an agent without one)."""

    seq: int
    text: str
    value: JsonValue = JsonValue(None)


@attrs.frozen(kw_only=True)
class RunRecord:
    """A run of an agent in a conversation: admitted by an ``input`` submission, run by its task (kind
    ``agent:<agent>``, ``task_id`` ``None`` while queued). ``status`` is derived, never set independently."""

    RECORD: ClassVar[str] = "run"
    run_id: str
    conversation_id: str
    agent: str
    version: int
    """The agent version its task is bound to (0 until a worker first runs it)."""
    status: RunStatus
    reason: str | None = None
    error: str | None = None
    """Why a ``failed`` run failed, in words (its task's error: the model's error, the turn limit, the budget it
    would pass...), at most ``MAX_RUN_ERROR_CHARS`` characters; set by the owner, ``None`` otherwise."""
    operation_id: str | None = None
    """The operation the run is blocked on (``needs_attention`` / ``waiting``), if any."""
    answer: RunAnswer | None = None
    usage: RunUsage = RunUsage()
    submission_id: str
    task_id: str | None = None
    seq: int
    created_at_ms: int
    updated_at_ms: int


@attrs.frozen(kw_only=True)
class Retry:
    """A model request's retry policy: at most ``attempts`` attempts, the n-th retry after
    :func:`retry_delay_ms` (``first_delay_ms * multiplier ** (n - 1)``, at most ``max_delay_ms``; no jitter, so a
    restarted owner computes the same deadline)."""

    attempts: int = 4
    first_delay_ms: int = 500
    max_delay_ms: int = 30_000
    multiplier: float = 2.0


def retry_delay_ms(retry: Retry, attempt: int) -> int:
    """How long to wait after failed attempt ``attempt`` (from 1) before the next: shared by workers (a retryable
    model error they commit) and the owner (a model request cut off)."""
    delay = retry.first_delay_ms * retry.multiplier ** max(attempt - 1, 0)
    return int(min(delay, retry.max_delay_ms))


OperationKind: TypeAlias = Literal["model", "tool"]
RecoveryPolicy: TypeAlias = Literal["manual", "safe", "idempotent", "report"]
RERUN_POLICIES: Final[frozenset[str]] = frozenset({"safe", "idempotent"})
"""The recovery policies under which a call cut off runs again: only such a call's intent may be committed with its
tool task, in the model result's commit (``StartOperation.task_id``), since a cut-off there may precede the handler."""
OperationStatus: TypeAlias = Literal["started", "completed", "failed", "interrupted", "resolved"]
ToolErrorCode: TypeAlias = Literal[
    "tool_error",
    "invalid_arguments",
    "unknown_tool",
    "not_allowed",
    "denied",
    "interrupted",
    "restart_limit",
    "invalid_structured_output",
    "cancelled",
    "aborted",
    "orphaned",
    "faulted",
    "cut_off",
]
"""What an error result of a tool call is, for programs (on its ``tether.tool_result`` entry and its operation record;
docs/agents.md, "Tool results"): ``tool_error`` its handler raised; ``invalid_arguments`` its arguments are not a JSON
object or break the tool's schema; ``unknown_tool`` the agent has no such tool; ``not_allowed`` a tool not in its
``callers`` called it; ``denied`` a person denied its approval; ``interrupted`` it was cut off and not run again;
``restart_limit`` it was cut off its restart limit's times; ``invalid_structured_output`` (a nested call) its
``structured`` value broke its ``output_schema`` or was missing; ``cancelled`` its run was cancelled first;
``aborted``, ``orphaned`` its task ended so; ``faulted`` its task faulted (a durable step of it refused, its phase
raised): its run fails; ``cut_off`` the model's answer was cut off at its output limit (finish reason ``length``)
before the call was complete: it never ran (no task, no intent; on its entry only)."""
TOOL_ERROR_CODES: Final[frozenset[str]] = frozenset(get_args(ToolErrorCode))


@attrs.frozen(kw_only=True)
class OperationRecord:
    """One model request or tool call of a run, in the operation journal: its intent (``started``) and then its
    result. ``tool_call_id`` is the model's id of the tool call (named so to keep clear of the requests'
    ``call_id``; a nested call's key); ``conversation_id`` is the run's, so a watch of the conversation sees the
    journal."""

    RECORD: ClassVar[str] = "operation"
    operation_id: str
    run_id: str
    conversation_id: str
    task_id: str
    """The task whose lease wrote the intent."""
    kind: OperationKind
    name: str
    version: int
    tool_call_id: str | None = None
    """A nested call's (``call.execute_tool``): its key in its caller."""
    parent_operation_id: str | None = None
    """A nested call's caller: the tool call whose handler called it (``None`` for a call the model made)."""
    turn: int
    attempt: int
    policy: RecoveryPolicy | None = None
    retry: Retry | None = None
    arguments: JsonValue = JsonValue(None)
    digest: str
    status: OperationStatus
    result: JsonValue = JsonValue(None)
    """A tool call's output (what the model reads, or what a person resolved it with); a model request's answer."""
    is_error: bool = False
    error: str | None = None
    code: ToolErrorCode | None = None
    """An error result's :data:`ToolErrorCode` (a tool call's)."""
    structured: JsonValue = JsonValue(None)
    """A tool call's ``structured`` value (``ToolResult.structured``, checked by its ``output_schema``): programs read
    it here, not in the transcript."""
    dropped: str | None = None
    """Why a call the model made had its ``structured`` value dropped (it broke the tool's ``output_schema``, or was
    missing): the call's result stands, without it."""
    usage: RunUsage | None = None
    resolved_by: str | None = None
    resolved_at_ms: int | None = None
    seq: int
    created_at_ms: int
    updated_at_ms: int


def has_result(op: OperationRecord) -> bool:
    """Whether an operation's result is committed, so that no new intent may start it again: ``completed`` and
    ``resolved`` always; ``failed`` for a tool (the error is its result, which the model sees) and for a model
    request past its last attempt (a failed model attempt with attempts left is retried under the same id). The
    owner refuses a new intent of such an operation; a worker replays its result instead of running it again."""
    if op.status in ("completed", "resolved"):
        return True
    if op.status == "failed":
        return op.kind == "tool" or op.attempt >= (op.retry or Retry()).attempts
    return False


@attrs.frozen(kw_only=True)
class InteractionAnswer:
    """How an interaction was answered: an approval's ``approve`` (and ``note``), a question's ``value`` (a JSON value
    checked against the question's schema; ``approve`` is then ``None``); who answered, and when (owner's clock)."""

    approve: bool | None
    note: str | None
    responded_by: str | None
    at_ms: int
    value: JsonValue = JsonValue(None)


@attrs.frozen(kw_only=True)
class InteractionRecord:
    """Something a tool call asks a person, bound to the call's operation: an ``approval`` of its exact arguments
    (``args``: the call's arguments), or a ``question`` its handler asked (``call.ask``; ``args``: ``{"text",
    "schema"}``, the schema ``null`` when any JSON answer will do). ``task_id`` is the ``tether.approval`` or
    ``tether.question`` task the call waits on; ``answer`` is set once, by ``respond``. ``status`` is ``open`` until
    answered (``answered``), or ``cancelled`` once its run no longer awaits it (the run was cancelled or ended
    otherwise while it was open)."""

    RECORD: ClassVar[str] = "interaction"
    interaction_id: str
    run_id: str
    conversation_id: str
    operation_id: str
    tool: str = ""
    """The name of the tool whose call asks (what a person approves). Empty only in a record an engine before
    protocol 5 logged (a replay of an older commit log); the interactions it stored are read with their tool."""
    task_id: str
    kind: Literal["approval", "question"]
    status: Literal["open", "answered", "cancelled"]
    args: JsonValue
    digest: str
    answer: InteractionAnswer | None = None
    seq: int
    created_at_ms: int
    updated_at_ms: int


PartialStatus: TypeAlias = Literal["streaming", "done", "aborted"]


@attrs.frozen(kw_only=True)
class PartialRecord:
    """A piece of a model request's output while it streams, stored in batches and pushed to watches: ``text`` is
    what the attempt streamed after its first ``offset`` characters. Keyed by (``operation_id``, ``attempt``): a
    reader keeps one text per operation, drops it when a later attempt of the operation starts (a retried attempt
    replaces the earlier one's output) and skips a piece whose characters it already holds, so it never shows text
    twice. ``status`` is ``done`` once the operation's result is committed (the answer is then the assistant entry,
    not this), ``aborted`` when the attempt was cut off: never an answer."""

    RECORD: ClassVar[str] = "partial"
    operation_id: str
    run_id: str
    conversation_id: str
    attempt: int
    offset: int
    text: str
    status: PartialStatus
    seq: int
    created_at_ms: int


TaskStatus: TypeAlias = Literal["pending", "running", "waiting", "sleeping", "completing", "terminal"]
OutcomeStatus: TypeAlias = Literal["completed", "failed", "aborted", "faulted", "orphaned"]
WaitPolicy: TypeAlias = Literal["all_settled", "fail_fast"]
BlockedReason: TypeAlias = Literal["missing_task", "task_too_old", "migration_failed", "missing_model"]
"""Why no attached worker can run a task (derived from the attached workers, never stored)."""
FaultReason: TypeAlias = Literal["restart_limit", "phase_error", "no_progress", "unknown_phase"]
"""Why a task ended ``faulted``."""
OutcomeReason: TypeAlias = Literal[
    FaultReason,
    BlockedReason,
    "restart",
    "model_retries_exhausted",
    "max_turns",
    "model_error",
    "budget_exceeded",
    "nothing_to_answer",
    "reset",
    "invalid_output",
    "no_model",
]
"""Why a task ended as it did, where one applies: a fault, the blocked reason of an ``orphaned`` task, or
``restart`` for ``abandon_on_restart`` work aborted after a restart, ``model_retries_exhausted`` for a run's task whose
model request was cut off past its last attempt; ``max_turns`` and ``model_error`` for a run that its worker failed
(the agent's turn limit reached, a final model error or the last attempt's); ``budget_exceeded`` for a run's task
that the owner ended instead of starting a model request past its conversation's or task tree's budget;
``nothing_to_answer`` for a run a ``continue`` started on a context with nothing to answer (empty, or ending in an
answer); ``reset`` for a run that a reset placed at the end of its tool round ended there; ``invalid_output`` for a
run whose agent has an ``output_schema`` and whose final answer is not JSON that matches it; ``no_model`` for a run's
task the owner ended ``failed`` once it had been blocked ``missing_model`` (no attached worker of its agent naming its
conversation's model) for longer than the model grace."""


def phase_of(checkpoint: object) -> str | None:
    """The phase a task's checkpoint names (``checkpoint["phase"]``), or ``None`` if it names none."""
    if isinstance(checkpoint, dict):
        phase = checkpoint.get("phase")
        if isinstance(phase, str):
            return phase
    return None


@attrs.frozen(kw_only=True)
class TaskOutcome:
    """How a task ended (or, held by a ``completing`` task, how it will end).

    ``reason`` says why where one applies (``restart_limit``, ``phase_error``, ``no_progress``, ``unknown_phase``,
    ``missing_task``, ``task_too_old``, ``migration_failed``, ``restart``); ``result`` is the value of a completed
    or aborted task, ``error`` the text of a failure.
    """

    status: OutcomeStatus
    reason: OutcomeReason | None = None
    result: JsonValue = JsonValue(None)
    error: str | None = None


def ended_code(outcome: TaskOutcome) -> ToolErrorCode:
    """The code of the error result of a tool call whose task ended ``outcome`` (not ``completed``) before it committed
    a result of its own: ``restart_limit``, ``aborted``, ``orphaned``, ``faulted``, else ``tool_error``. The owner
    settles such a call's operation with it, and a caller of a nested call reads it when the journal has none."""
    if outcome.reason == "restart_limit":
        return "restart_limit"
    if outcome.status == "aborted" or outcome.status == "orphaned" or outcome.status == "faulted":
        return outcome.status
    return "tool_error"


@attrs.frozen(kw_only=True)
class TaskRecord:
    """A task as it is stored, without its input and checkpoint (``ReadTask`` returns those).

    Every task is owned by a conversation (``owner_task_id`` is ``None``) or by another task; ``conversation_id``
    is the conversation it belongs to either way. ``abort`` is the reason of a committed abort mark (``abort``, or
    ``restart`` for ``abandon_on_restart`` work), ``None`` when unmarked. ``version`` 0 means no worker has run it
    yet: the first worker binds its own version.
    """

    RECORD: ClassVar[str] = "task"
    task_id: str
    kind: str
    version: int
    conversation_id: str
    owner_task_id: str | None
    background: bool
    abandon_on_restart: bool
    status: TaskStatus
    phase: str | None
    on: tuple[str, ...] = ()
    policy: WaitPolicy | None = None
    until_ms: int | None = None
    abort: str | None = None
    restarts: int = 0
    """Phases cut off (by a dead worker, a lost lease or an owner restart) since the last committed state."""
    restart_limit: int | None = 5
    """At this many restarts the task ends ``faulted`` with reason ``restart_limit`` (``None``: never)."""
    epoch: int = 0
    """How many leases this task has been granted; a commit must carry the current one."""
    held: TaskOutcome | None = None
    """The outcome a ``completing`` task decided, released once its owned work is terminal."""
    outcome: TaskOutcome | None = None
    seq: int
    created_at_ms: int
    updated_at_ms: int

    @property
    def owner(self) -> dict[str, str]:
        """``{"task": id}`` or ``{"conversation": id}``: who owns this task."""
        if self.owner_task_id is not None:
            return {"task": self.owner_task_id}
        return {"conversation": self.conversation_id}


Record: TypeAlias = (
    ConversationRecord
    | EntryRecord
    | DocumentRecord
    | SubmissionRecord
    | TaskRecord
    | RunRecord
    | OperationRecord
    | InteractionRecord
    | PartialRecord
)
"""A record a commit created or changed; tagged by ``record`` on the wire."""


@attrs.frozen(kw_only=True)
class Capability:
    """Something a worker can run: a task kind, a tool or an agent, at one version; or a model its app names (kind
    ``model``, version 1), which a conversation configured to use it needs of the worker that runs its runs.

    ``migrates`` says the definition upgrades tasks stored under older versions; ``restart_limit`` is how many
    cut-off phases in a row end a task of this kind (1 to ``MAX_RESTART_LIMIT``; ``None``: no limit).
    """

    kind: Literal["task", "tool", "agent", "model"]
    name: str
    version: int
    migrates: bool = False
    restart_limit: int | None = 5


@attrs.frozen(kw_only=True)
class PeerInfo:
    """An attached connection, as the owner sees it. Workers fill in the rest with ``Announce``."""

    peer_id: int
    role: str
    peer_name: str
    attached_at_ms: int
    announced: bool
    pid: int | None
    host: str | None
    app: str | None
    capabilities: tuple[Capability, ...]


# ---------------------------------------------------------------------------------------------------- writes


@attrs.frozen(kw_only=True)
class CreateConversation:
    """Create a conversation, owned by nobody or by a live task (a subagent's transcript)."""

    OP: ClassVar[str] = "create_conversation"
    conversation_id: str
    owner_task_id: str | None = None
    agent: str | None = None
    """Bind the conversation to an agent: its ``input`` submissions start runs of it."""


@attrs.frozen(kw_only=True)
class AppendEntry:
    OP: ClassVar[str] = "append_entry"
    conversation_id: str
    entry_id: str
    kind: str
    data: JsonValue


@attrs.frozen(kw_only=True)
class PutDocument:
    """Write a document. ``expected_version`` (0 for "must not exist yet") makes the write conditional."""

    OP: ClassVar[str] = "put_document"
    conversation_id: str | None
    name: str
    value: JsonValue
    expected_version: int | None = None


@attrs.frozen(kw_only=True)
class CreateTask:
    """Create a task owned by ``owner_task_id`` or, when that is ``None``, by ``conversation_id``.

    ``version`` 0 lets the first worker that runs it bind its own version.
    """

    OP: ClassVar[str] = "create_task"
    task_id: str
    kind: str
    version: int = 0
    input: JsonValue = JsonValue(None)
    conversation_id: str | None = None
    owner_task_id: str | None = None
    background: bool = False
    abandon_on_restart: bool = False


@attrs.frozen(kw_only=True)
class AbortTask:
    """Mark a task for abort. Its owned work is aborted first; its abort handler runs last."""

    OP: ClassVar[str] = "abort_task"
    task_id: str


@attrs.frozen(kw_only=True)
class SetTaskState:
    """End a phase by committing the task's next state; only under the task's own lease (``Commit.lease``).

    ``status`` ``running`` continues at ``checkpoint``; ``waiting`` resumes at it once ``on`` are terminal;
    ``sleeping`` resumes at it at ``until_ms`` on the owner's clock; ``terminal`` ends with ``outcome``.
    """

    OP: ClassVar[str] = "set_task_state"
    task_id: str
    status: Literal["running", "waiting", "sleeping", "terminal"]
    checkpoint: JsonValue = JsonValue(None)
    on: tuple[str, ...] = ()
    policy: WaitPolicy = "all_settled"
    until_ms: int | None = None
    outcome: TaskOutcome | None = None
    steer_checkpoint: JsonValue = JsonValue(None)
    """A run's task completing (``terminal``, ``completed``): if its conversation's inbox holds steers (they came
    after the last tool round), the owner places them after the answer and the task goes on ``running`` at this
    checkpoint instead, so the same run answers them. ``None``: it completes whatever is queued."""


@attrs.frozen(kw_only=True)
class SubmitWrite:
    """A ``submit`` inside a commit (``tx.submit``): admitted by the same rules as the ``submit`` request, atomically
    with the commit's other writes (a refusal refuses the whole commit). Its result is 1 if it was admitted now, 0 if
    its ``request_id`` had been (the original stands)."""

    OP: ClassVar[str] = "submit"
    conversation_id: str
    submission_id: str
    request_id: str
    kind: str
    payload: JsonValue = JsonValue(None)
    when_busy: Literal["follow_up", "steer", "reject"] = "follow_up"
    when_idle: Literal["start", "reject"] = "start"
    entry: JsonValue = JsonValue(None)


@attrs.frozen(kw_only=True)
class StartOperation:
    """Commit an operation's intent (attempt ``attempt``), under the lease of the run's task (a model request) or of
    a tool task of the run (a tool call). The policy and retry of the first intent are kept."""

    OP: ClassVar[str] = "start_operation"
    operation_id: str
    run_id: str
    kind: OperationKind
    name: str
    version: int
    turn: int
    attempt: int
    digest: str
    tool_call_id: str | None = None
    policy: RecoveryPolicy | None = None
    retry: Retry | None = None
    arguments: JsonValue = JsonValue(None)
    parent_operation_id: str | None = None
    """A nested tool call's caller (``call.execute_tool``): a tool call of the same run."""
    task_id: str | None = None
    """A tool call's task created earlier in this same commit (the model's result, under the run task's lease), never
    leased yet: the intent is that task's attempt 1, committed with it, and its lease runs the call."""


@attrs.frozen(kw_only=True)
class FinishOperation:
    """Commit an operation's result (``completed``) or error (``failed``), once, under the lease that started it;
    ``usage`` is added to the run's, its conversation's and its model's usage."""

    OP: ClassVar[str] = "finish_operation"
    operation_id: str
    status: Literal["completed", "failed"]
    result: JsonValue = JsonValue(None)
    is_error: bool = False
    error: str | None = None
    usage: RunUsage | None = None
    code: ToolErrorCode | None = None
    """A tool call's error result: what it is (only with ``is_error``)."""
    structured: JsonValue = JsonValue(None)
    """A tool call's ``structured`` value, checked by its ``output_schema`` (not with ``is_error``)."""
    dropped: str | None = None
    """A call the model made whose ``structured`` value was dropped: why (at most ``MAX_TOOL_DIAGNOSTIC_CHARS``)."""


@attrs.frozen(kw_only=True)
class CreateInteraction:
    """Ask a person, under the tool task's lease. An ``approval`` of the call's exact arguments: the owner creates
    the ``tether.approval`` task :func:`approval_task_id` names (owned by the tool task), which the same commit's wait
    names; again for the same operation, the first is kept (result 0). A ``question`` (``args``: ``{"text",
    "schema"}``): the owner creates the ``tether.question`` task :func:`question_task_id` names, which the handler
    waits for while it runs; again with the same ``interaction_id`` (derived from the operation and the question's
    place in the call), the first is kept (result 0). So a replay never asks twice."""

    OP: ClassVar[str] = "create_interaction"
    interaction_id: str
    operation_id: str
    run_id: str
    args: JsonValue
    digest: str
    kind: Literal["approval", "question"] = "approval"


@attrs.frozen(kw_only=True)
class AppendPartial:
    """Store a piece of a model request's streamed output, under the lease of the run's task that started attempt
    ``attempt`` of operation ``operation_id`` (open: no result yet). ``text`` is what the attempt streamed after its
    first ``offset`` characters (Unicode code points); ``offset`` may not pass what is stored (no gap), and may
    overlap it (a piece resent after a lost reply): only the characters past what is stored are new. The owner pushes
    a ``PartialRecord`` of the new characters to the conversation's watches in the same commit."""

    OP: ClassVar[str] = "append_partial"
    operation_id: str
    attempt: int
    offset: int
    text: str


Write: TypeAlias = (
    CreateConversation
    | AppendEntry
    | PutDocument
    | CreateTask
    | AbortTask
    | SetTaskState
    | StartOperation
    | FinishOperation
    | CreateInteraction
    | AppendPartial
    | SubmitWrite
)
"""One write of a ``Commit``; tagged by ``op`` on the wire."""

# ------------------------------------------------------------------------------------------------ handshake


@attrs.frozen(kw_only=True)
class Hello:
    TYPE: ClassVar[str] = "hello"
    protocol_version: int
    token: str
    role: str
    """One of :data:`Role`; checked by the owner so an unknown role gets a ``role_not_allowed`` refusal."""
    peer_name: str = ""


@attrs.frozen(kw_only=True)
class Welcome:
    TYPE: ClassVar[str] = "welcome"
    protocol_version: int
    owner_instance: str
    """Changes every time an owner starts, so a peer can tell a restart from a reconnect."""
    head_seq: int
    clock: Literal["wall", "manual"]
    max_message_bytes: int
    heartbeat_ms: int
    """Send something (a ``ping`` will do) at least this often: the owner drops a peer silent for 4 times as long."""


@attrs.frozen(kw_only=True)
class Refused:
    TYPE: ClassVar[str] = "refused"
    code: str
    message: str
    supported_versions: tuple[int, ...]


# ------------------------------------------------------------------------------------------------- requests


@attrs.frozen(kw_only=True)
class Commit:
    """Apply ``writes`` atomically as one commit with one ``seq``.

    A commit made by a running phase carries its ``lease``; if the lease is no longer valid (the task was given
    to someone else) the whole commit is refused with ``stale_lease`` and nothing of it lands.
    """

    TYPE: ClassVar[str] = "commit"
    writes: tuple[Write, ...]
    lease: LeaseRef | None = None


@attrs.frozen(kw_only=True)
class LeaseRef:
    """One grant of a task to a worker; ``epoch`` grows with every grant of that task."""

    task_id: str
    epoch: int


@attrs.frozen(kw_only=True)
class Submit:
    """Admit a submission; a repeated ``request_id`` returns the original instead."""

    TYPE: ClassVar[str] = "submit"
    conversation_id: str
    submission_id: str
    request_id: str
    kind: str
    payload: JsonValue
    when_busy: Literal["follow_up", "steer", "reject"] = "follow_up"
    """For an ``input`` to an agent's conversation with a live run: queue a run after it (``follow_up``), join it at
    its next boundary (``steer``), or refuse (``reject``)."""
    when_idle: Literal["start", "reject"] = "start"
    """For an ``input`` to a conversation with no live run: start a run (``start``), or refuse (``reject``: the input
    may only join or follow a run already going)."""
    entry: JsonValue = JsonValue(None)
    """For an ``input``: ``{"kind", "data"}``, the entry it is placed as instead of ``tether.user`` (the model still
    sees its text as the user message)."""


@attrs.frozen(kw_only=True)
class ReadConversation:
    TYPE: ClassVar[str] = "read_conversation"
    conversation_id: str


@attrs.frozen(kw_only=True)
class ReadEntries:
    """Read a page of entries. ``cursor`` is exclusive: positions after it (``asc``) or before it (``desc``)."""

    TYPE: ClassVar[str] = "read_entries"
    conversation_id: str
    order: Order
    cursor: int | None
    limit: int


@attrs.frozen(kw_only=True)
class ReadDocument:
    TYPE: ClassVar[str] = "read_document"
    conversation_id: str | None
    name: str


@attrs.frozen(kw_only=True)
class ReadSubmission:
    TYPE: ClassVar[str] = "read_submission"
    conversation_id: str
    request_id: str


@attrs.frozen(kw_only=True)
class AbortConversation:
    """Withdraw the conversation's queued inputs and abort its active run (bottom-up, as ``cancel_run``); with
    ``background``, also abort the tasks the conversation owns outside its runs. Answered with
    ``ConversationAborted``."""

    TYPE: ClassVar[str] = "abort_conversation"
    conversation_id: str
    background: bool = False


@attrs.frozen(kw_only=True)
class Configure:
    """Change a conversation's configuration (its ``tether.config`` document): each key of ``changes`` is set, each
    name in ``clear`` goes back to the agent's default; answered with the document as it is now (a ``document``).
    A ``model`` or ``tools`` name no attached worker announces is refused, unless ``force`` (a deploy that brings it
    later)."""

    TYPE: ClassVar[str] = "configure"
    conversation_id: str
    changes: JsonValue = JsonValue(None)
    clear: tuple[str, ...] = ()
    force: bool = False


@attrs.frozen(kw_only=True)
class ReadSubmissions:
    """A page of a conversation's submissions in the order they were admitted, after ``after_submission_id``."""

    TYPE: ClassVar[str] = "read_submissions"
    conversation_id: str
    after_submission_id: str | None = None
    limit: int = 1000


@attrs.frozen(kw_only=True)
class WaitSubmission:
    """Answered with a ``SubmissionReply`` once the submission is ``done`` or ``unanswered``."""

    TYPE: ClassVar[str] = "wait_submission"
    submission_id: str


@attrs.frozen(kw_only=True)
class Withdraw:
    """Take a queued submission back (answered with ``Withdrawn``)."""

    TYPE: ClassVar[str] = "withdraw"
    submission_id: str


@attrs.frozen(kw_only=True)
class Watch:
    """Subscribe to every commit after ``from_seq`` touching ``conversation_id`` (``None``: every commit)."""

    TYPE: ClassVar[str] = "watch"
    watch_id: int
    conversation_id: str | None
    from_seq: int


@attrs.frozen(kw_only=True)
class Unwatch:
    TYPE: ClassVar[str] = "unwatch"
    watch_id: int


@attrs.frozen(kw_only=True)
class Ping:
    TYPE: ClassVar[str] = "ping"


@attrs.frozen(kw_only=True)
class Announce:
    """A worker says who it is and what it can run. Sent after every (re)connection; a later one replaces it."""

    TYPE: ClassVar[str] = "announce"
    pid: int
    host: str
    app: str
    capabilities: tuple[Capability, ...]
    max_leases: int = DEFAULT_MAX_LEASES
    """How many phases this worker runs at once; 0 while it drains before stopping: the phases it runs finish, and
    the owner grants it nothing new."""
    leases: tuple[LeaseRef, ...] = ()
    """Leases whose phases still run here (after a reconnection): those no longer valid are cancelled."""


@attrs.frozen(kw_only=True)
class ReadTask:
    TYPE: ClassVar[str] = "read_task"
    task_id: str


@attrs.frozen(kw_only=True)
class ReadOutcomes:
    """The outcomes of tasks (``None`` for a task that is not terminal yet)."""

    TYPE: ClassVar[str] = "read_outcomes"
    task_ids: tuple[str, ...]


@attrs.frozen(kw_only=True)
class WaitTask:
    """Answered with a ``TaskReply`` once the task is terminal (at once if it already is)."""

    TYPE: ClassVar[str] = "wait_task"
    task_id: str


@attrs.frozen(kw_only=True)
class ReadTaskGraph:
    """A page of the live tasks (by id, after ``after_task_id``), with the reason a pending one is blocked."""

    TYPE: ClassVar[str] = "read_task_graph"
    after_task_id: str | None = None
    limit: int = 1000


@attrs.frozen(kw_only=True)
class Release:
    """A worker gives a lease back without a new state: its phase was cancelled and has stopped, or the worker
    could not migrate the stored task (``migration_error``), or it stopped the phase because it is closing
    (``closing``: its drain's deadline passed): a close is not a crash, so no restart is counted, and a model request
    the phase left open is withdrawn (the next attempt takes its number)."""

    TYPE: ClassVar[str] = "release"
    lease: LeaseRef
    migration_error: str | None = None
    closing: bool = False


@attrs.frozen(kw_only=True)
class ConfirmLease:
    """A worker asks whether it still holds ``lease`` (answered ``ok``; ``stale_lease`` when the owner gave the task to
    someone else, or it is being cancelled): what it asks before a step it cannot take back, when it cannot be sure
    its lease is still live (a manual tool call's handler, anything after a pause)."""

    TYPE: ClassVar[str] = "confirm_lease"
    lease: LeaseRef


@attrs.frozen(kw_only=True)
class ReadPeers:
    """A page of the attached connections (for ``tether status``), by peer id after ``after_peer_id``."""

    TYPE: ClassVar[str] = "read_peers"
    after_peer_id: int | None = None


@attrs.frozen(kw_only=True)
class AdvanceClock:
    """Move a manual clock forward (owners started with ``--clock manual`` only)."""

    TYPE: ClassVar[str] = "advance_clock"
    by_ms: int


@attrs.frozen(kw_only=True)
class ReadRun:
    TYPE: ClassVar[str] = "read_run"
    run_id: str


@attrs.frozen(kw_only=True)
class ReadRuns:
    """A page of runs in creation order after the run ``after_run_id`` (the last of the page before; ``not_found`` if
    it names no run), of one conversation and/or one status."""

    TYPE: ClassVar[str] = "read_runs"
    conversation_id: str | None = None
    status: str | None = None
    after_run_id: str | None = None
    limit: int = 1000


@attrs.frozen(kw_only=True)
class WaitRun:
    """Answered with a ``RunReply`` once the run is completed, failed, cancelled or needs_attention."""

    TYPE: ClassVar[str] = "wait_run"
    run_id: str


@attrs.frozen(kw_only=True)
class CancelRun:
    """End a queued run ``cancelled`` at once; abort an active run's task (it ends ``cancelled`` once terminal)."""

    TYPE: ClassVar[str] = "cancel_run"
    run_id: str


@attrs.frozen(kw_only=True)
class ReadOperations:
    """A run's operation journal, oldest first; ``cursor`` is how many were read already (the journal only grows)."""

    TYPE: ClassVar[str] = "read_operations"
    run_id: str
    cursor: int = 0
    limit: int = 1000


@attrs.frozen(kw_only=True)
class ReadOperation:
    """One operation of the journal by its id (a worker's phase reads the one it is about, not the whole run's)."""

    TYPE: ClassVar[str] = "read_operation"
    operation_id: str


@attrs.frozen(kw_only=True)
class ReadUsage:
    """Usage per conversation (``conversation_id``) or, when ``None``, of every model."""

    TYPE: ClassVar[str] = "read_usage"
    conversation_id: str | None = None


@attrs.frozen(kw_only=True)
class ModelPrice:
    """A model's price per million tokens. ``cached_input_per_mtok`` prices the cached part of the input (the input
    price when ``None``); ``reasoning_per_mtok`` the reasoning part of the output (the output price when ``None``)."""

    model: str
    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None
    reasoning_per_mtok: float | None = None


BudgetScope: TypeAlias = Literal["conversation", "tree"]


@attrs.frozen(kw_only=True)
class Budget:
    """A limit on the usage of one conversation or one task tree (``key``: the conversation id, or the tree's root
    task id): no model request starts once the usage has reached ``max_tokens`` (input + output) or ``max_cost``."""

    scope: BudgetScope
    key: str
    max_tokens: int | None = None
    max_cost: float | None = None


@attrs.frozen(kw_only=True)
class ReadUsageTotals:
    """A page of usage totals of one scope in key order: every model's, tool's, conversation's or task tree's, or the
    one ``key`` names (for ``tree``, any task id: the total is its tree's, keyed by the root task id)."""

    TYPE: ClassVar[str] = "read_usage_totals"
    scope: Literal["model", "tool", "conversation", "tree"]
    key: str | None = None
    after_key: str | None = None
    limit: int = 1000


@attrs.frozen(kw_only=True)
class SetPrices:
    """Set (or replace) the price of each model in ``prices`` and drop the prices of the models in ``remove``, all
    at once or not at all; writers only. Prices apply to results committed from then on."""

    TYPE: ClassVar[str] = "set_prices"
    prices: tuple[ModelPrice, ...] = ()
    remove: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class ReadPrices:
    """The price table."""

    TYPE: ClassVar[str] = "read_prices"


@attrs.frozen(kw_only=True)
class SetBudget:
    """Set the budget of a conversation or task tree (``key``: a conversation id, or any task of the tree: the
    budget is kept under its root); ``max_tokens`` and ``max_cost`` both ``None`` remove it. Writers only."""

    TYPE: ClassVar[str] = "set_budget"
    scope: BudgetScope
    key: str
    max_tokens: int | None = None
    max_cost: float | None = None


@attrs.frozen(kw_only=True)
class Resolve:
    """Settle an interrupted manual tool call with ``output`` (its result the model sees); writers only."""

    TYPE: ClassVar[str] = "resolve"
    operation_id: str
    output: JsonValue
    resolved_by: str | None = None


@attrs.frozen(kw_only=True)
class Respond:
    """Answer an interaction, once (the same answer again is a no-op); writers only. An approval takes ``approve``
    (and a ``note``); a question takes ``answer``, a JSON value other than ``null`` that its schema accepts."""

    TYPE: ClassVar[str] = "respond"
    interaction_id: str
    approve: bool | None = None
    note: str | None = None
    responded_by: str | None = None
    answer: JsonValue = JsonValue(None)


@attrs.frozen(kw_only=True)
class RetryRun:
    """Re-attempt a ``failed`` run (a new task, same run) or a ``needs_attention`` one (a no-op: it resumes once
    its cause is settled); writers only."""

    TYPE: ClassVar[str] = "retry_run"
    run_id: str


@attrs.frozen(kw_only=True)
class ReadInteractions:
    """A page of interactions in id order, of one status and/or one run."""

    TYPE: ClassVar[str] = "read_interactions"
    status: str | None = None
    run_id: str | None = None
    after_interaction_id: str | None = None
    limit: int = 1000


@attrs.frozen(kw_only=True)
class ReadPartials:
    """The stored partial output of one operation (``operation_id``) or of every model request of a run
    (``run_id``): exactly one of the two. A page starts at ``from_operation_id`` (from its character
    ``from_offset``), or at the first operation."""

    TYPE: ClassVar[str] = "read_partials"
    run_id: str | None = None
    operation_id: str | None = None
    from_operation_id: str | None = None
    from_offset: int = 0


# -------------------------------------------------------------------------------------------------- replies


@attrs.frozen(kw_only=True)
class Committed:
    """A ``Commit`` is durable. ``results`` has one int per write: the entry's position, the document's new
    version, 1 for an abort that marked its task (0 if it was already marked or terminal), 0 otherwise."""

    TYPE: ClassVar[str] = "committed"
    seq: int
    committed_at_ms: int
    results: tuple[int, ...]


@attrs.frozen(kw_only=True)
class Submitted:
    """``created`` is false when ``request_id`` was already used and ``submission`` is the original."""

    TYPE: ClassVar[str] = "submitted"
    submission: SubmissionRecord
    created: bool


@attrs.frozen(kw_only=True)
class ConversationReply:
    TYPE: ClassVar[str] = "conversation"
    conversation: ConversationRecord


@attrs.frozen(kw_only=True)
class EntriesReply:
    """``next_cursor`` continues the read in the same order; ``None`` when there is nothing further."""

    TYPE: ClassVar[str] = "entries"
    entries: tuple[EntryRecord, ...]
    next_cursor: int | None


@attrs.frozen(kw_only=True)
class DocumentReply:
    TYPE: ClassVar[str] = "document"
    document: DocumentRecord | None


@attrs.frozen(kw_only=True)
class SubmissionReply:
    TYPE: ClassVar[str] = "submission"
    submission: SubmissionRecord | None


@attrs.frozen(kw_only=True)
class ConversationAborted:
    """What ``abort_conversation`` did: the submissions it withdrew, the run it is aborting (as the mark left it;
    ``None``: none was going), and the background tasks it marked."""

    TYPE: ClassVar[str] = "conversation_aborted"
    withdrawn: tuple[str, ...]
    run: RunRecord | None
    tasks: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class SubmissionsReply:
    TYPE: ClassVar[str] = "submissions"
    submissions: tuple[SubmissionRecord, ...]
    next_after_submission_id: str | None = None


@attrs.frozen(kw_only=True)
class Withdrawn:
    """What ``withdraw`` did: ``withdrawn`` (it was queued; now ``unanswered``, reason ``withdrawn``),
    ``already_placed`` (a run has it: nothing changed), ``settled`` (done or unanswered already) or ``not_found``."""

    TYPE: ClassVar[str] = "withdrawn"
    outcome: Literal["withdrawn", "already_placed", "settled", "not_found"]
    submission: SubmissionRecord | None


@attrs.frozen(kw_only=True)
class Watching:
    """The watch is registered; every commit after ``from_seq`` will follow as ``Change`` events."""

    TYPE: ClassVar[str] = "watching"
    watch_id: int
    head_seq: int


@attrs.frozen(kw_only=True)
class PeersReply:
    TYPE: ClassVar[str] = "peers"
    peers: tuple[PeerInfo, ...]
    next_after_peer_id: int | None = None
    """Pass it back as ``after_peer_id`` for the next page; ``None`` when this was the last."""


@attrs.frozen(kw_only=True)
class TaskReply:
    TYPE: ClassVar[str] = "task"
    task: TaskRecord
    input: JsonValue
    checkpoint: JsonValue


@attrs.frozen(kw_only=True)
class OutcomesReply:
    TYPE: ClassVar[str] = "outcomes"
    outcomes: tuple[TaskOutcome | None, ...]


@attrs.frozen(kw_only=True)
class TaskNode:
    """A live task in the task graph; ``blocked`` says why a pending one cannot run (``missing_task``,
    ``task_too_old``, ``migration_failed``), with ``blocked_detail`` in words."""

    task: TaskRecord
    blocked: BlockedReason | None = None
    blocked_detail: str | None = None
    leased_to: str | None = None
    """The name of the worker running it."""
    conversation_owner_task_id: str | None = None
    """For a task its conversation owns (``owner_task_id`` ``None``): the live task that owns that conversation, if
    any (a subagent's run, under the tool call that runs it)."""


@attrs.frozen(kw_only=True)
class TaskGraphReply:
    TYPE: ClassVar[str] = "task_graph"
    seq: int
    """The page as of this commit; a watch from the first page's continues without gap."""
    nodes: tuple[TaskNode, ...]
    next_after_task_id: str | None = None
    """Pass it back as ``after_task_id`` for the next page; ``None`` when this was the last."""


@attrs.frozen(kw_only=True)
class RunReply:
    TYPE: ClassVar[str] = "run"
    run: RunRecord


@attrs.frozen(kw_only=True)
class RunsReply:
    TYPE: ClassVar[str] = "runs"
    runs: tuple[RunRecord, ...]
    next_after_run_id: str | None = None


@attrs.frozen(kw_only=True)
class OperationsReply:
    TYPE: ClassVar[str] = "operations"
    operations: tuple[OperationRecord, ...]
    next_cursor: int | None = None


@attrs.frozen(kw_only=True)
class OperationReply:
    TYPE: ClassVar[str] = "operation"
    operation: OperationRecord


@attrs.frozen(kw_only=True)
class InteractionReply:
    TYPE: ClassVar[str] = "interaction"
    interaction: InteractionRecord


@attrs.frozen(kw_only=True)
class InteractionsReply:
    TYPE: ClassVar[str] = "interactions"
    interactions: tuple[InteractionRecord, ...]
    next_after_interaction_id: str | None = None


@attrs.frozen(kw_only=True)
class PartialsReply:
    """Each operation's stored partial output as one record from offset 0 (``done``: no text, the answer is the
    assistant entry), oldest operation first; ``seq`` is the head as of the read: a watch from it continues
    exactly."""

    TYPE: ClassVar[str] = "partials"
    partials: tuple[PartialRecord, ...]
    seq: int
    next_operation_id: str | None = None
    """The page ended early (at the read budget): pass it back as ``from_operation_id``, with ``next_offset`` as
    ``from_offset``, for the rest (a text cut there continues in the next page's first record); ``None``: done."""
    next_offset: int = 0


@attrs.frozen(kw_only=True)
class UsageTotal:
    """Usage accounted to one conversation, one model, one tool (the usage its results reported) or one task tree
    (``key``: its root task)."""

    scope: Literal["conversation", "model", "tool", "tree"]
    key: str
    usage: RunUsage


@attrs.frozen(kw_only=True)
class UsageReply:
    TYPE: ClassVar[str] = "usage"
    totals: tuple[UsageTotal, ...]


@attrs.frozen(kw_only=True)
class UsageTotalsReply:
    """A page of totals with the budgets set on their keys; ``next_after_key`` continues it (``None``: the last).
    ``count``: on a listing's first page (no ``key`` nor ``after_key``), how many totals the scope has."""

    TYPE: ClassVar[str] = "usage_totals"
    totals: tuple[UsageTotal, ...]
    budgets: tuple[Budget, ...] = ()
    next_after_key: str | None = None
    count: int | None = None


@attrs.frozen(kw_only=True)
class PricesReply:
    """The whole price table, by model."""

    TYPE: ClassVar[str] = "prices"
    prices: tuple[ModelPrice, ...]


@attrs.frozen(kw_only=True)
class BudgetReply:
    """The budget as stored now (``None``: none is set)."""

    TYPE: ClassVar[str] = "budget"
    scope: BudgetScope
    key: str
    budget: Budget | None = None


@attrs.frozen(kw_only=True)
class Ok:
    TYPE: ClassVar[str] = "ok"


@attrs.frozen(kw_only=True)
class Pong:
    TYPE: ClassVar[str] = "pong"
    now_ms: int
    head_seq: int


@attrs.frozen(kw_only=True)
class ClockReply:
    TYPE: ClassVar[str] = "clock"
    now_ms: int


@attrs.frozen(kw_only=True)
class Error:
    """A request failed and changed nothing. Its envelope's ``call_id`` is ``None`` when the frame was too broken to
    read one."""

    TYPE: ClassVar[str] = "error"
    code: str
    message: str


# --------------------------------------------------------------------------------------------------- events


@attrs.frozen(kw_only=True)
class Change:
    """One commit, pushed to a watch. ``seq`` strictly increases along a watch, without gaps in what it matches.

    A watch of one conversation receives the records of that conversation only; a watch of everything receives
    every record of the commit.
    """

    TYPE: ClassVar[str] = "change"
    watch_id: int
    seq: int
    committed_at_ms: int
    records: tuple[Record, ...]


@attrs.frozen(kw_only=True)
class Lease:
    """The owner grants a worker one run of a task: a phase (``mode`` ``phase``) or its abort handler
    (``abort``). ``checkpoint`` is ``None`` before the first phase (the worker computes ``initial(input)``)."""

    TYPE: ClassVar[str] = "lease"
    lease: LeaseRef
    mode: Literal["phase", "abort"]
    kind: str
    version: int
    input: JsonValue
    checkpoint: JsonValue
    conversation_id: str
    owner_task_id: str | None
    restarts: int
    abort: str | None
    now_ms: int


@attrs.frozen(kw_only=True)
class CancelLease:
    """Stop the phase running under ``lease`` and ``release`` it once it has stopped."""

    TYPE: ClassVar[str] = "cancel_lease"
    lease: LeaseRef
    reason: str


@attrs.frozen(kw_only=True)
class Goodbye:
    """The owner is closing this connection (shutting down, or failing closed after a storage error)."""

    TYPE: ClassVar[str] = "goodbye"
    code: str
    message: str


Request: TypeAlias = (
    Commit
    | Submit
    | ReadConversation
    | ReadEntries
    | ReadDocument
    | ReadSubmission
    | Watch
    | Unwatch
    | Ping
    | AdvanceClock
    | Announce
    | ReadPeers
    | ReadTask
    | ReadOutcomes
    | WaitTask
    | ReadTaskGraph
    | Release
    | ConfirmLease
    | ReadRun
    | ReadRuns
    | WaitRun
    | AbortConversation
    | Configure
    | ReadSubmissions
    | WaitSubmission
    | Withdraw
    | CancelRun
    | ReadOperations
    | ReadOperation
    | ReadUsage
    | ReadUsageTotals
    | SetPrices
    | ReadPrices
    | SetBudget
    | Resolve
    | Respond
    | RetryRun
    | ReadInteractions
    | ReadPartials
)
Reply: TypeAlias = (
    Committed
    | Submitted
    | ConversationReply
    | EntriesReply
    | DocumentReply
    | SubmissionReply
    | Watching
    | PeersReply
    | Ok
    | Pong
    | ClockReply
    | TaskReply
    | OutcomesReply
    | TaskGraphReply
    | RunReply
    | ConversationAborted
    | SubmissionsReply
    | Withdrawn
    | RunsReply
    | OperationsReply
    | UsageReply
    | UsageTotalsReply
    | PricesReply
    | BudgetReply
    | OperationReply
    | InteractionReply
    | InteractionsReply
    | PartialsReply
    | Error
)
Event: TypeAlias = Change | Goodbye | Lease | CancelLease
Frame: TypeAlias = Hello | Welcome | Refused | Request | Reply | Event

REQUEST_TYPES: tuple[type[Any], ...] = (
    Commit,
    Submit,
    ReadConversation,
    ReadEntries,
    ReadDocument,
    ReadSubmission,
    Watch,
    Unwatch,
    Ping,
    AdvanceClock,
    Announce,
    ReadPeers,
    ReadTask,
    ReadOutcomes,
    WaitTask,
    ReadTaskGraph,
    Release,
    ConfirmLease,
    ReadRun,
    ReadRuns,
    WaitRun,
    AbortConversation,
    Configure,
    ReadSubmissions,
    WaitSubmission,
    Withdraw,
    CancelRun,
    ReadOperations,
    ReadOperation,
    ReadUsage,
    ReadUsageTotals,
    SetPrices,
    ReadPrices,
    SetBudget,
    Resolve,
    Respond,
    RetryRun,
    ReadInteractions,
    ReadPartials,
)
REPLY_TYPES: tuple[type[Any], ...] = (
    Committed,
    Submitted,
    ConversationReply,
    EntriesReply,
    DocumentReply,
    SubmissionReply,
    Watching,
    PeersReply,
    Ok,
    Pong,
    ClockReply,
    TaskReply,
    OutcomesReply,
    TaskGraphReply,
    RunReply,
    ConversationAborted,
    SubmissionsReply,
    Withdrawn,
    RunsReply,
    OperationsReply,
    UsageReply,
    UsageTotalsReply,
    PricesReply,
    BudgetReply,
    OperationReply,
    InteractionReply,
    InteractionsReply,
    PartialsReply,
    Error,
)
EVENT_TYPES: tuple[type[Any], ...] = (Change, Goodbye, Lease, CancelLease)
FRAME_TYPES: tuple[type[Any], ...] = (Hello, Welcome, Refused, *REQUEST_TYPES, *REPLY_TYPES, *EVENT_TYPES)
WRITE_TYPES: tuple[type[Any], ...] = (
    CreateConversation,
    AppendEntry,
    PutDocument,
    CreateTask,
    AbortTask,
    SetTaskState,
    StartOperation,
    FinishOperation,
    CreateInteraction,
    AppendPartial,
    SubmitWrite,
)
RECORD_TYPES: tuple[type[Any], ...] = (
    ConversationRecord,
    EntryRecord,
    DocumentRecord,
    SubmissionRecord,
    TaskRecord,
    RunRecord,
    OperationRecord,
    InteractionRecord,
    PartialRecord,
)

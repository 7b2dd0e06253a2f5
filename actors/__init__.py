"""Tether's client side: connect to an owner to submit, read and watch work; serve an app's tasks, tools and agents.

Every public name is re-exported here; the modules behind it are private, in four rooms, each importing only the ones
before it: ``_models`` (the model interface and the models), ``_app`` (what an app defines), ``_client`` (the
connection and the typed calls; the only room that sends frames) and ``_worker`` (``serve``, phases, the run loop).
``actors`` never imports ``storage_owner``; both speak only through ``protocol``.
"""

from typing import TYPE_CHECKING, Any

from protocol import (
    CONFIG_DOCUMENT,
    Budget,
    BudgetExceeded,
    Change,
    Conflict,
    ConnectionLost,
    ConversationRecord,
    DocumentRecord,
    Duplicate,
    EntryRecord,
    ErrorCode,
    HandshakeRefused,
    InteractionAnswer,
    InteractionRecord,
    InvalidRequest,
    ModelPrice,
    NotAllowed,
    NotFound,
    OperationRecord,
    Overloaded,
    OwnerUnavailable,
    PartialRecord,
    PeerInfo,
    ProtocolError,
    RequestFailed,
    RunAnswer,
    RunRecord,
    RunStatus,
    RunUsage,
    StaleLease,
    StorageError,
    SubmissionRecord,
    TaskNode,
    TaskOutcome,
    TaskRecord,
    TetherError,
    ToolErrorCode,
    UsageError,
    UsageTotal,
    new_id,
)

from ._app._agents import AgentDefinition
from ._app._app import App, AppLoadError, TaskDefinition
from ._app._load import load_app
from ._app._reports import Report, ReportCallback, ReportKind
from ._app._tools import (
    DurableStepFailed,
    QuestionUnanswered,
    Recovery,
    SubagentTool,
    ToolCall,
    ToolCallFailed,
    ToolDefinition,
    ToolResult,
    subagent_tool,
)
from ._client._client import Client, check_target, connect
from ._client._conversations import EntryPage, WhenBusy, WhenIdle, WithdrawOutcome
from ._client._partials import PartialOutput, PartialText
from ._client._tasks import TaskGraph
from ._client._transaction import Transaction
from ._client._watch import WatchStream
from ._models._model import (
    AssistantMessage,
    AssistantTurn,
    Finish,
    FinishReason,
    Message,
    Model,
    ModelError,
    ModelRequest,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallRequest,
    ToolCallStart,
    ToolMessage,
    ToolSpec,
    TurnBuilder,
    Usage,
    UsageReport,
    UserMessage,
    assemble,
)
from ._models._retry import Retry
from ._models._scripted import ScriptedModel, ScriptedTurn
from ._worker._faults import KillPoint, WorkerKill
from ._worker._journal import tool_operation_id
from ._worker._phase import Phase, PhaseEnded, PhaseTransaction
from ._worker._serve import serve

if TYPE_CHECKING:
    from ._models._openai import OpenAIChat


def __getattr__(name: str) -> Any:
    """``OpenAIChat`` is imported on first use: it loads httpx, which every process importing ``actors`` (each
    ``tether`` command, every worker) would otherwise pay for at start, whether it talks to a model server or not."""
    if name == "OpenAIChat":
        from ._models._openai import OpenAIChat

        return OpenAIChat
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CONFIG_DOCUMENT",
    "AgentDefinition",
    "App",
    "AppLoadError",
    "AssistantMessage",
    "AssistantTurn",
    "Budget",
    "BudgetExceeded",
    "Change",
    "Client",
    "Conflict",
    "ConnectionLost",
    "ConversationRecord",
    "DocumentRecord",
    "Duplicate",
    "DurableStepFailed",
    "EntryPage",
    "EntryRecord",
    "ErrorCode",
    "Finish",
    "FinishReason",
    "HandshakeRefused",
    "InteractionAnswer",
    "InteractionRecord",
    "InvalidRequest",
    "KillPoint",
    "Message",
    "Model",
    "ModelError",
    "ModelPrice",
    "ModelRequest",
    "NotAllowed",
    "NotFound",
    "OpenAIChat",
    "OperationRecord",
    "Overloaded",
    "OwnerUnavailable",
    "PartialOutput",
    "PartialRecord",
    "PartialText",
    "PeerInfo",
    "Phase",
    "PhaseEnded",
    "PhaseTransaction",
    "ProtocolError",
    "QuestionUnanswered",
    "Recovery",
    "Report",
    "ReportCallback",
    "ReportKind",
    "RequestFailed",
    "Retry",
    "RunAnswer",
    "RunRecord",
    "RunStatus",
    "RunUsage",
    "ScriptedModel",
    "ScriptedTurn",
    "StaleLease",
    "StorageError",
    "StreamEvent",
    "SubagentTool",
    "SubmissionRecord",
    "TaskDefinition",
    "TaskGraph",
    "TaskNode",
    "TaskOutcome",
    "TaskRecord",
    "TetherError",
    "TextDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallEnd",
    "ToolCallFailed",
    "ToolCallRequest",
    "ToolCallStart",
    "ToolDefinition",
    "ToolErrorCode",
    "ToolMessage",
    "ToolResult",
    "ToolSpec",
    "Transaction",
    "TurnBuilder",
    "Usage",
    "UsageError",
    "UsageReport",
    "UsageTotal",
    "UserMessage",
    "WatchStream",
    "WhenBusy",
    "WhenIdle",
    "WithdrawOutcome",
    "WorkerKill",
    "assemble",
    "check_target",
    "connect",
    "load_app",
    "new_id",
    "serve",
    "subagent_tool",
    "tool_operation_id",
]

"""Tools: what an agent's model may call, defined once per app with a JSON Schema for its arguments.

A tool is a name, an ``async def handler(call, args)``, a description and a JSON Schema (draft 2020-12) for its
arguments, plus how an interrupted call recovers (``recovery``) and whether a call needs a person's approval. The run
loop (next) journals each call; this module only defines, validates and describes tools.
"""

from __future__ import annotations

import copy
import inspect
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Literal, Protocol, TypeAlias, get_args

import attrs
import trio
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from protocol import UsageError, check_json

from .._models._model import ToolSpec, Usage
from ._restarts import FROM_APP, GivenRestartLimit, checked_restart_limit

Recovery: TypeAlias = Literal["manual", "safe", "idempotent", "report"]
"""What happens to a call interrupted before its result committed: ``manual`` stops the run for a person to
reconcile, ``safe`` runs it again, ``idempotent`` runs it again with the same ``operation_id``, ``report`` does not run
it again and gives the model an error result saying it was interrupted (the run goes on)."""

RECOVERIES: Final[tuple[str, ...]] = get_args(Recovery)
MAX_HANDOFF_BYTES: Final = 1 << 20
"""The longest handoff text a :class:`ToolResult` may carry: the owner's limit for a reset's (``client.reset``)."""
AGENT_CALLER: Final = "agent"
"""In a tool's ``callers``: an agent's model may call it (the default)."""
TOOL_NAME_PATTERN: Final = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
"""What every model provider accepts as a function name (OpenAI's rule is the narrowest)."""

ToolHandler: TypeAlias = Callable[["ToolCall", dict[str, Any]], Awaitable[Any]]
"""``async def handler(call: actors.ToolCall, args: dict) -> JSON value``."""

ApprovalPredicate: TypeAlias = Callable[[dict[str, Any]], bool]
"""``needs_approval(args) -> bool``: deterministic and free of side effects (recovery calls it again)."""
MAX_CALL_KEY_CHARS: Final = 128
"""The longest key of a nested call (``call.execute_tool(..., key=...)``)."""


class ToolCallFailed(Exception):
    """A nested call (``call.execute_tool``) ended with an error result: invalid arguments, a denial, a handler's
    exception, a ``structured`` value its ``output_schema`` refuses, a call cut off under ``report`` or at its restart
    limit, its task aborted. ``error`` is what the model would have read, ``code`` what it is
    (:data:`~protocol.ToolErrorCode`: ``invalid_structured_output``, ``restart_limit``, ``tool_error``, ...); uncaught,
    it becomes the calling tool's own error result (``tool_error``)."""

    def __init__(self, tool: str, key: str, error: str, *, code: str = "tool_error") -> None:
        super().__init__(f"the nested call {key!r} of tool {tool!r} failed ({code}): {error}")
        self.tool = tool
        self.key = key
        self.error = error
        self.code = code


class DurableStepFailed(Exception):
    """A durable step of a tool call (``call.ask``, ``call.execute_tool``, a subagent: a commit under the call's lease,
    or the wait for what it committed) failed: the owner refused it (``conflict``, ``invalid``, a storage error, ...),
    or a nested call's task faulted. Not the handler's error: the call's task faults, whatever the handler does with
    this exception (caught or not), and its run fails (``faulted``), naming the call. A stale lease or a lost
    connection is not this: the phase just ends, and the owner decides what the call becomes."""


class QuestionUnanswered(Exception):
    """A question this call asked (``call.ask``) will not be answered: its run is being cancelled."""


class CallHost(Protocol):
    """What runs a tool call for its handler (the worker's tool task): asks its questions and makes its nested
    calls, durably."""

    async def ask(self, text: str, schema: dict[str, Any] | None) -> Any: ...

    async def execute_tool(self, name: str, args: dict[str, Any], key: str) -> Any: ...

    async def subagent(self, agent: str, text: str, background: bool) -> dict[str, Any]: ...


@attrs.frozen(kw_only=True)
class ToolCall:
    """What a tool's handler learns about the call it serves.

    ``operation_id`` is stable across re-runs of the same call: an ``idempotent`` tool passes it to a service that
    deduplicates. ``attempt`` is 1 for the first run of the call and grows with each re-run after an interruption.
    """

    operation_id: str
    run_id: str
    conversation_id: str
    attempt: int
    tool: str
    version: int
    _progress: Callable[[str], None] | None = attrs.field(default=None, repr=False, eq=False, alias="progress")
    _host: CallHost | None = attrs.field(default=None, repr=False, eq=False, alias="host")

    async def output(self, text: str) -> None:
        """Live progress of this call (``"checking the order...\n"``): shown at once (``tether watch``, a watch's
        partial records) and stored in batches per attempt, as a model's streamed text is. If the call is cut off,
        what was stored goes into the result the model (``recovery="report"``) or a person (``manual``) reads."""
        if not isinstance(text, str):
            raise UsageError(f"call.output(text) takes a str, not {type(text).__name__}")
        if self._progress is not None:
            self._progress(text)
        await trio.lowlevel.checkpoint()

    async def ask(self, text: str, schema: Mapping[str, Any] | None = None) -> Any:
        """Ask a person ``text`` and return their answer: a JSON value, checked against ``schema`` (a JSON Schema,
        draft 2020-12) when one is given. Durable: the question is an interaction of kind ``question`` (``tether
        interactions``; ``client.respond(interaction_id, answer=...)``, ``tether respond --answer JSON``), the run
        shows ``waiting`` until it is answered, and a re-run of this call after a crash (a ``safe`` or ``idempotent``
        tool) gets the committed answer and never asks again. Questions are told apart by their order in the call: a
        re-run must ask the same questions in the same order. The call holds its worker's lease while it waits.
        Raises :class:`QuestionUnanswered` if the run is cancelled first."""
        if not isinstance(text, str) or not text.strip():
            raise UsageError("call.ask(text, schema=None): text is the question, a str that is not empty")
        checked = None if schema is None else checked_output_schema(self.tool, schema, "call.ask in tool", "schema")
        return await self._require_host("ask").ask(text, checked)

    async def execute_tool(self, name: str, args: Mapping[str, Any], *, key: str) -> Any:
        """Call the tool ``name`` with ``args`` from this call, durably: a nested call with its own intent, result,
        recovery policy and approval, owned by this call (aborting it aborts the nested call first). ``key`` names
        the call within this one (unique per call; a reuse raises :class:`UsageError`): a re-run of this call after
        a crash finds the nested call by it and waits for it, or reads its committed result, instead of running it
        again. Returns the nested call's ``structured`` value if it returned one, else its ``output``; raises
        :class:`ToolCallFailed` with the error if it ended with an error. The tool must name this one in its
        ``callers`` (``define_tool(callers=[...])``)."""
        if not isinstance(name, str) or not TOOL_NAME_PATTERN.fullmatch(name):
            raise UsageError(f"call.execute_tool: {name!r} is not a tool name")
        if not isinstance(args, Mapping):
            raise UsageError(f"call.execute_tool({name!r}, args): args is a dict of the tool's arguments")
        if not isinstance(key, str) or not key or len(key) > MAX_CALL_KEY_CHARS:
            raise UsageError(
                f"call.execute_tool({name!r}, ..., key=...): the key is a str of 1 to {MAX_CALL_KEY_CHARS} "
                "characters naming the call within this one"
            )
        try:
            check_json(dict(args), "$")
        except ValueError as exc:
            raise UsageError(f"call.execute_tool({name!r}, args): the arguments are not JSON-like: {exc}") from None
        return await self._require_host("execute_tool").execute_tool(name, dict(args), key)

    async def _subagent(self, agent: str, text: str, background: bool) -> dict[str, Any]:
        """Run ``agent`` on ``text`` in a conversation this call owns (:class:`SubagentTool`)."""
        return await self._require_host("subagent").subagent(agent, text, background)

    def _require_host(self, verb: str) -> CallHost:
        if self._host is None:
            raise UsageError(f"call.{verb} works in a call a worker runs (this ToolCall was built by hand)")
        return self._host


@attrs.frozen(kw_only=True)
class ToolResult:
    """What a tool's handler may return instead of a plain JSON value (which is its ``output``).

    ``output`` is what the model sees (a text as is, anything else as JSON); ``structured`` is a JSON value for
    programs, checked against the tool's ``output_schema`` when it declares one (a violation is an error result naming
    the path); ``details`` are stored for programs and people and never shown to the model (both in the call's
    ``tether.tool_result`` entry); ``usage`` is what the call cost (a service's tokens or money): counted under the
    tool's name and in the run's, the conversation's and the task tree's totals, budgets included; ``terminate=True``
    ends the run without another model request when every call of the round asks for it (its answer is the last
    call's output, in call order). ``handoff="..."`` places a reset whose handoff text the next context starts from
    (a user message; the steers and writes placed when the round ended follow it), and the run goes on there; when
    several calls of a round return one, the last call's in call order wins; with ``terminate`` on every call, the run
    ends after the handoff.
    """

    output: Any = None
    structured: Any = None
    details: Any = None
    usage: Usage | None = None
    terminate: bool = False
    handoff: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.handoff is not None:
            size = len(self.handoff.encode()) if isinstance(self.handoff, str) else None
            if size is None or not 1 <= size <= MAX_HANDOFF_BYTES:
                given = type(self.handoff).__name__ if size is None else f"a str of {size} bytes"
                raise UsageError(
                    "ToolResult(handoff=...) is the text the next context starts from (a str of 1 to "
                    f"{MAX_HANDOFF_BYTES} bytes), or None for no handoff; not {given}"
                )
        if type(self.terminate) is not bool:
            raise UsageError(f"ToolResult(terminate=...) is True or False, not {self.terminate!r}")
        if self.usage is not None and not isinstance(self.usage, Usage):
            raise UsageError(f"ToolResult(usage=...) is an actors.Usage, not {type(self.usage).__name__}")


SUBAGENT_PARAMETERS: Final = {
    "type": "object",
    "properties": {"task": {"type": "string", "description": "what the subagent is asked to do, in full"}},
    "required": ["task"],
}
"""The arguments of a :func:`subagent_tool` unless its definition gives others (``task``: the subagent's input)."""


@attrs.frozen
class SubagentTool:
    """The handler :func:`subagent_tool` builds: a call runs ``agent`` in a conversation its task owns and returns its
    answer, or (``background``) starts it and returns at once. ``parameters`` is what :func:`define_tool` takes when
    it is given none."""

    agent: str
    background: bool = False
    parameters: Mapping[str, Any] = attrs.field(factory=lambda: copy.deepcopy(SUBAGENT_PARAMETERS))

    async def __call__(self, call: ToolCall, args: dict[str, Any]) -> ToolResult:
        text = args.get("task")
        if not isinstance(text, str) or not text.strip():
            raise UsageError(f"a subagent tool's call gives the subagent its task: {{'task': '...'}}, not {args!r}")
        found = await call._subagent(self.agent, text, self.background)
        if self.background:
            output = (
                f"started the {self.agent} subagent in the background, in conversation {found['conversation_id']}: "
                "its answer will be there"
            )
            return ToolResult(output=output, structured=found)
        return ToolResult(output=found["answer"], structured=found)


def subagent_tool(*, agent: str, background: bool = False) -> SubagentTool:
    """A tool handler that hands its call to another agent (``app.define_tool("research",
    actors.subagent_tool(agent="researcher"), description=...)``): each call creates a conversation bound to
    ``agent`` (with what applies of the caller's configuration) and submits the call's ``task`` argument there.

    Foreground (the default): the conversation is owned by the call's task, and the call returns the subagent's
    answer (``output``; ``structured``: ``{conversation_id, run_id, answer}``). Cancelling the caller's run cancels
    the subagent's run first. ``background=True``: the conversation is owned by a background task the call's task
    owns (a boundary: the caller's end or abort does not reach it), which submits the task and waits for the answer;
    the call returns at once (``structured``: ``{conversation_id, submission_id, task_id}``, the last the background
    task's, which ends with the answer). Either way the ids derive from the call's operation, so a re-run after a
    crash finds the same conversation and run (no second of either), and the subagent's usage counts in the caller's
    task tree (budgets included)."""
    if not isinstance(agent, str) or not agent:
        raise UsageError(f"subagent_tool(agent=...): the name of an agent, not {agent!r}")
    if type(background) is not bool:
        raise UsageError(f"subagent_tool(background=...) is True or False, not {background!r}")
    return SubagentTool(agent, background)


def _build_validator(definition: ToolDefinition) -> Draft202012Validator:
    return Draft202012Validator(definition.parameters)


def _build_output_validator(definition: ToolDefinition) -> Draft202012Validator | None:
    return None if definition.output_schema is None else Draft202012Validator(definition.output_schema)


@attrs.frozen(kw_only=True)
class ToolDefinition:
    """A tool at one version. Build it with :meth:`actors.App.define_tool` (or :func:`define_tool`), which checks it.

    The argument validator is built once, here, since every call goes through :meth:`validate`. Formats
    (``"format": "email"``) are annotations only, as draft 2020-12 says by default.
    """

    name: str
    handler: ToolHandler = attrs.field(repr=False)
    description: str
    parameters: Mapping[str, Any] = attrs.field(repr=False)
    recovery: Recovery = "manual"
    version: int = 1
    needs_approval: ApprovalPredicate | None = attrs.field(default=None, repr=False)
    output_schema: Mapping[str, Any] | None = attrs.field(default=None, repr=False)
    """The JSON Schema (draft 2020-12) a :class:`ToolResult`'s ``structured`` value is checked against."""
    callers: tuple[str, ...] = (AGENT_CALLER,)
    """Who may call it: ``"agent"`` (an agent's model) and names of tools. A tool the agent may not call is not
    offered to its model, and a model's call of it anyway is an error result."""
    restart_limit: GivenRestartLimit = FROM_APP
    """How many times in a row a call may be cut off (its worker killed, its lease lost) before it ends with an error
    result (code ``restart_limit``) instead of running again; ``None``: no limit; not given: the app's."""

    @property
    def agent_callable(self) -> bool:
        """Whether an agent's model may call it (``"agent"`` in :attr:`callers`)."""
        return AGENT_CALLER in self.callers

    _validator: Draft202012Validator = attrs.field(
        init=False, repr=False, eq=False, default=attrs.Factory(_build_validator, takes_self=True)
    )
    _output_validator: Draft202012Validator | None = attrs.field(
        init=False, repr=False, eq=False, default=attrs.Factory(_build_output_validator, takes_self=True)
    )

    def validate(self, args: object) -> tuple[str, ...]:
        """The ways ``args`` breaks the tool's schema, one line each naming the JSON path (``$.order_id: 42 is
        not of type 'string'``), in a stable order; empty when ``args`` is valid."""
        return schema_errors(self._validator, args)

    def validate_output(self, structured: object) -> tuple[str, ...]:
        """The ways a result's ``structured`` value breaks the tool's ``output_schema`` (none without one)."""
        return () if self._output_validator is None else schema_errors(self._output_validator, structured)

    def structured_problem(self, structured: object) -> str | None:
        """Why a result's ``structured`` value does not do for a tool with an ``output_schema`` (it breaks it, or there
        is none), or ``None`` when it does (always, for a tool without one)."""
        if self._output_validator is None:
            return None
        if structured is None:
            return "the tool declares an output_schema and returned no structured value"
        errors = self.validate_output(structured)
        if not errors:
            return None
        return "the tool's structured output does not match its output_schema: " + "; ".join(errors)

    def approval_required(self, args: dict[str, Any]) -> bool:
        """Whether a call with ``args`` waits for a person's approval (never, without a ``needs_approval``)."""
        if self.needs_approval is None:
            return False
        answer = self.needs_approval(args)
        if type(answer) is not bool:
            raise TypeError(f"tool {self.name!r}: needs_approval must return True or False, not {answer!r}")
        return answer

    def spec(self) -> ToolSpec:
        """What a model is told about this tool."""
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)


def define_tool(
    name: str,
    handler: ToolHandler,
    *,
    description: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    recovery: Recovery = "manual",
    version: int = 1,
    needs_approval: ApprovalPredicate | None = None,
    output_schema: Mapping[str, Any] | None = None,
    callers: Sequence[str] = (AGENT_CALLER,),
    restart_limit: GivenRestartLimit = FROM_APP,
) -> ToolDefinition:
    """Check a tool's definition and build it. Raises :class:`UsageError` saying what is wrong; nothing is
    registered anywhere. ``description`` and ``parameters`` are required: their ``None`` defaults exist so that
    leaving one out is that same :class:`UsageError` (a ``ValueError``), not Python's ``TypeError``."""
    if not isinstance(name, str) or not TOOL_NAME_PATTERN.fullmatch(name):
        raise UsageError(
            f"tool name {name!r} must start with a letter and have at most 64 letters, digits, '_' or '-' "
            "(what model providers accept as a function name)"
        )
    if not _is_async_callable(handler):
        raise UsageError(f"tool {name!r}: the handler must be an async function (async def handler(call, args))")
    if not isinstance(description, str) or not description.strip():
        raise UsageError(f"tool {name!r}: give a description; the model chooses tools by what it says")
    if recovery not in RECOVERIES:
        raise UsageError(f"tool {name!r}: recovery must be one of {', '.join(RECOVERIES)}, not {recovery!r}")
    if type(version) is not int or version < 1:
        raise UsageError(f"tool {name!r}: version must be a whole number of 1 or more, not {version!r}")
    if needs_approval is not None and not callable(needs_approval):
        raise UsageError(f"tool {name!r}: needs_approval must be None or a function (args) -> bool")
    if parameters is None and isinstance(handler, SubagentTool):
        parameters = handler.parameters
    schema = _checked_schema(name, parameters)
    output = None if output_schema is None else checked_output_schema(name, output_schema)
    if isinstance(callers, str) or not all(isinstance(one, str) for one in callers):
        raise UsageError(f"tool {name!r}: callers is a list of 'agent' and tool names, such as ['agent']")
    for caller in callers:
        if caller != AGENT_CALLER and not TOOL_NAME_PATTERN.fullmatch(caller):
            raise UsageError(f"tool {name!r}: a caller is 'agent' or a tool's name, not {caller!r}")
    restart_limit = checked_restart_limit(restart_limit, f"tool {name!r}")
    return ToolDefinition(
        name=name,
        handler=handler,
        description=description,
        parameters=schema,
        recovery=recovery,
        version=version,
        needs_approval=needs_approval,
        output_schema=output,
        callers=tuple(dict.fromkeys(callers)),
        restart_limit=restart_limit,
    )


def checked_output_schema(
    name: str, schema: object, what: str = "tool", field: str = "output_schema"
) -> dict[str, Any]:
    """A private copy of an ``output_schema`` (a tool's, or an agent's: ``what``; or another ``field``, such as a
    question's schema) once it is a JSON-like draft 2020-12 schema, of any type."""
    if not isinstance(schema, Mapping):
        raise UsageError(f"{what} {name!r}: {field} must be a JSON Schema object, not {type(schema).__name__}")
    copied = copy.deepcopy(dict(schema))
    try:
        check_json(copied, "$")
        Draft202012Validator.check_schema(copied)
    except ValueError as exc:
        raise UsageError(f"{what} {name!r}: {field} is not JSON-like: {exc}") from None
    except SchemaError as exc:
        raise UsageError(
            f"{what} {name!r}: {field} is not a valid JSON Schema (draft 2020-12) at {exc.json_path}: {exc.message}"
        ) from None
    return copied


def schema_errors(validator: Draft202012Validator, value: object) -> tuple[str, ...]:
    """The ways ``value`` breaks the validator's schema, one line each naming the JSON path, in a stable order."""
    errors = sorted(validator.iter_errors(value), key=lambda error: (error.json_path, error.message))
    return tuple(f"{error.json_path}: {error.message}" for error in errors)


def _checked_schema(name: str, parameters: object) -> dict[str, Any]:
    """A private copy of ``parameters`` once it is a JSON-like draft 2020-12 schema for a JSON object."""
    if parameters is None:
        raise UsageError(
            f"tool {name!r}: give parameters, the JSON Schema of its arguments, such as "
            '{"type": "object", "properties": {"order_id": {"type": "string"}}}; a tool without arguments takes '
            '{"type": "object", "properties": {}}'
        )
    if not isinstance(parameters, Mapping):
        raise UsageError(
            f"tool {name!r}: parameters must be a JSON Schema object such as "
            f'{{"type": "object", "properties": {{...}}}}, not {type(parameters).__name__}'
        )
    schema = copy.deepcopy(dict(parameters))  # the caller's later edits must not change the validator's schema
    try:
        check_json(schema, "$")
    except ValueError as exc:
        raise UsageError(f"tool {name!r}: parameters is not JSON-like: {exc}") from None
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise UsageError(
            f"tool {name!r}: parameters is not a valid JSON Schema (draft 2020-12) at {exc.json_path}: {exc.message}"
        ) from None
    if schema.get("type") != "object":
        raise UsageError(
            f'tool {name!r}: parameters must say "type": "object" at $: a model always sends a tool\'s '
            "arguments as one JSON object"
        )
    return schema


def _is_async_callable(handler: object) -> bool:
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 (an instance whose __call__ is async)
    return call is not None and not inspect.isfunction(handler) and inspect.iscoroutinefunction(call)

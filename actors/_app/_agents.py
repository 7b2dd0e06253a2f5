"""Agents: a named, versioned pairing of a model, instructions and tools (:meth:`actors.App.define_agent` registers
one)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import attrs
from jsonschema import Draft202012Validator

from protocol import UsageError

from .._models._model import Message, Model, ModelRequest, ToolSpec
from .._models._retry import DEFAULT_RETRY, Retry
from ._restarts import FROM_APP, GivenRestartLimit, checked_restart_limit
from ._tools import TOOL_NAME_PATTERN, ToolDefinition, checked_output_schema, schema_errors

DEFAULT_PARTIAL_INTERVAL_MS: Final = 100
MAX_PARTIAL_INTERVAL_MS: Final = 60_000
AGENT_NAME_PATTERN = TOOL_NAME_PATTERN
"""Agent names follow the tool-name rule: a letter, then at most 63 letters, digits, ``_`` or ``-``."""


def _specs(agent: AgentDefinition) -> tuple[ToolSpec, ...]:
    """What the model is offered: the agent's tools that an agent may call (a tool only other tools call is not)."""
    return tuple(tool.spec() for tool in agent.tools if tool.agent_callable)


def _answer_validator(agent: AgentDefinition) -> Draft202012Validator | None:
    return None if agent.output_schema is None else Draft202012Validator(agent.output_schema)


@attrs.frozen(kw_only=True)
class AgentDefinition:
    """An agent at one version: its model, instructions, the tools it may call (resolved when it was defined),
    how many model turns a run may take (``None``: no limit) and how a failed model request is retried."""

    name: str
    version: int
    model: Model = attrs.field(repr=False)
    instructions: str = attrs.field(default="", repr=False)
    tools: tuple[ToolDefinition, ...] = attrs.field(default=(), repr=False)
    max_turns: int | None = None
    model_retry: Retry = DEFAULT_RETRY
    partial_interval_ms: int = DEFAULT_PARTIAL_INTERVAL_MS
    """How often, at most, the text a model streams is sent to the owner while it streams (0: only at the end)."""
    output_schema: Mapping[str, Any] | None = attrs.field(default=None, repr=False)
    """The JSON Schema the final answer follows: its text is that JSON, parsed into ``run.answer.value``."""
    restart_limit: GivenRestartLimit = FROM_APP
    """How many times in a row a run's task may be cut off before the run fails (``restart_limit``); ``None``: no
    limit; not given: the app's."""
    _specs: tuple[ToolSpec, ...] = attrs.field(
        init=False, repr=False, eq=False, default=attrs.Factory(_specs, takes_self=True)
    )
    _answer_validator: Draft202012Validator | None = attrs.field(
        init=False, repr=False, eq=False, default=attrs.Factory(_answer_validator, takes_self=True)
    )

    def parse_answer(self, text: str) -> tuple[Any, str | None]:
        """A final answer's value (``None`` without an ``output_schema``), or why the text is not JSON that matches
        the schema."""
        if self._answer_validator is None:
            return None, None
        try:
            value = json.loads(text)
        except ValueError as exc:
            return None, f"the answer is not JSON ({exc})"
        errors = schema_errors(self._answer_validator, value)
        if errors:
            return None, "the answer does not match the agent's output_schema: " + "; ".join(errors)
        return value, None

    def tool(self, name: str) -> ToolDefinition | None:
        """This agent's tool ``name``, or ``None`` when the agent has none by that name."""
        for tool in self.tools:
            if tool.name == name:
                return tool
        return None

    def request(self, messages: Sequence[Message], attempt: int = 1, turn: int | None = None) -> ModelRequest:
        """The model request for ``messages`` (the normalised transcript) at ``attempt`` (1-based), for model turn
        ``turn`` of its run."""
        return ModelRequest(
            model=self.model.name,
            instructions=self.instructions,
            messages=tuple(messages),
            tools=self._specs,
            attempt=attempt,
            turn=turn,
            output_schema=self.output_schema,
        )


def define_agent(
    name: str,
    *,
    version: int,
    model: Model,
    instructions: str = "",
    tools: Iterable[str | ToolDefinition] = (),
    max_turns: int | None = None,
    model_retry: Retry = DEFAULT_RETRY,
    partial_interval_ms: int = DEFAULT_PARTIAL_INTERVAL_MS,
    output_schema: Mapping[str, Any] | None = None,
    restart_limit: GivenRestartLimit = FROM_APP,
    known_tools: Mapping[str, ToolDefinition],
) -> AgentDefinition:
    """Check an agent's definition against the tools defined so far (``known_tools``) and build it. Raises
    ``UsageError`` saying what is wrong."""
    if not isinstance(name, str) or not AGENT_NAME_PATTERN.fullmatch(name):
        raise UsageError(
            f"agent name {name!r} must start with a letter and have at most 64 letters, digits, '_' or '-'"
        )
    if type(version) is not int or version < 1:
        raise UsageError(f"agent {name!r}: version must be a whole number of 1 or more, not {version!r}")
    if not isinstance(model, Model) or not isinstance(model.name, str) or not model.name:
        raise UsageError(
            f"agent {name!r}: model must have a non-empty name and a stream(request) method, such as "
            f"actors.ScriptedModel([...]); got {type(model).__name__}"
        )
    if not isinstance(instructions, str):
        raise UsageError(f"agent {name!r}: instructions must be a string, not {type(instructions).__name__}")
    if isinstance(tools, str):
        raise UsageError(f"agent {name!r}: tools is a list of tool names, such as [{tools!r}]")
    resolved: list[ToolDefinition] = []
    for entry in tools:
        tool_name = entry.name if isinstance(entry, ToolDefinition) else entry
        known = known_tools.get(tool_name) if isinstance(tool_name, str) else None
        if known is None or (isinstance(entry, ToolDefinition) and known is not entry):
            raise UsageError(
                f"agent {name!r}: tool {tool_name!r} is not defined in this app; define it (app.define_tool) before "
                f"the agent. Defined tools: {sorted(known_tools) or 'none'}"
            )
        if any(tool.name == tool_name for tool in resolved):
            raise UsageError(f"agent {name!r}: tool {tool_name!r} is listed twice")
        resolved.append(known)
    if max_turns is not None and (type(max_turns) is not int or max_turns < 1):
        raise UsageError(f"agent {name!r}: max_turns must be None (no limit) or 1 or more, not {max_turns!r}")
    if not isinstance(model_retry, Retry):
        raise UsageError(f"agent {name!r}: model_retry must be an actors.Retry, not {type(model_retry).__name__}")
    if type(partial_interval_ms) is not int or not 0 <= partial_interval_ms <= MAX_PARTIAL_INTERVAL_MS:
        raise UsageError(
            f"agent {name!r}: partial_interval_ms must be a whole number of milliseconds from 0 (only at the end) to "
            f"{MAX_PARTIAL_INTERVAL_MS}, not {partial_interval_ms!r}"
        )
    return AgentDefinition(
        name=name,
        version=version,
        model=model,
        instructions=instructions,
        tools=tuple(resolved),
        max_turns=max_turns,
        model_retry=model_retry,
        partial_interval_ms=partial_interval_ms,
        output_schema=None if output_schema is None else checked_output_schema(name, output_schema, "agent"),
        restart_limit=checked_restart_limit(restart_limit, f"agent {name!r}"),
    )

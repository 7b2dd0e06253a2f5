"""Applications: what a worker can run (``--app MODULE:ATTR`` finds one: ``_load``)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import attrs

from protocol import Capability, TetherError, UsageError

from .._models._model import Model
from .._models._retry import DEFAULT_RETRY, Retry
from ._agents import DEFAULT_PARTIAL_INTERVAL_MS, AgentDefinition, define_agent
from ._reports import ReportCallback
from ._restarts import (
    DEFAULT_RESTART_LIMIT,
    FROM_APP,
    GivenRestartLimit,
    RestartLimit,
    checked_limit,
    checked_restart_limit,
    resolved,
)
from ._tools import ApprovalPredicate, Recovery, ToolDefinition, ToolHandler, define_tool

KIND_PATTERN: Final = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z][A-Za-z0-9_]*)*")
MAX_MODEL_NAME_CHARS: Final = 128
"""A model's name in :meth:`App.define_model` (the owner's limit on a configured name)."""

PhaseFunction = Callable[[Any], Awaitable[None]]
"""``async def phase(rt: actors.Phase) -> None``."""


class AppLoadError(TetherError):
    """``--app MODULE:ATTR`` does not name an importable :class:`App`."""


@attrs.frozen(kw_only=True)
class TaskDefinition:
    """A task kind at one version: its phases, its abort handler and how it upgrades older stored tasks.

    ``initial(input)`` gives the first checkpoint; ``checkpoint["phase"]`` names the phase that runs.
    ``migrate(stored_version, checkpoint)`` returns the checkpoint of a task stored under an older version.
    """

    kind: str
    version: int
    initial: Callable[[Any], Any]
    phases: Mapping[str, PhaseFunction]
    abort: PhaseFunction | None = None
    migrate: Callable[[int, Any], Any] | None = None
    restart_limit: GivenRestartLimit = FROM_APP
    """Cut-off phases in a row that end a task of this kind ``faulted`` (``restart_limit``); ``None``: no limit;
    :data:`FROM_APP` (not given): the app's."""


class App:
    """A named set of task kinds, tools and agents, each with an explicit version.

    A worker serving the app announces every definition to the owner, which schedules only work whose kind and
    version some attached worker has. ``restart_limit`` is the app-wide restart limit (cut-off phases in a row;
    ``None``: no limit) of every task kind, tool and agent defined without one of its own; ``on_report`` the callback
    that receives the app's :class:`~actors.Report` values (or set it with :meth:`on_report`).
    """

    def __init__(
        self, name: str, *, restart_limit: RestartLimit = DEFAULT_RESTART_LIMIT, on_report: ReportCallback | None = None
    ) -> None:
        if not name:
            raise UsageError("an App needs a name")
        self.name = name
        self._restart_limit = checked_limit(restart_limit, f"App({name!r})")
        self._on_report: ReportCallback | None = None
        self._tasks: dict[str, TaskDefinition] = {}
        self._tools: dict[str, ToolDefinition] = {}
        self._agents: dict[str, AgentDefinition] = {}
        self._models: dict[str, Model] = {}
        if on_report is not None:
            self.on_report(on_report)

    @property
    def restart_limit(self) -> RestartLimit:
        """The app-wide restart limit (``None``: no limit), for definitions that give none."""
        return self._restart_limit

    def on_report(self, callback: ReportCallback | None) -> ReportCallback | None:
        """Set the callback that receives every :class:`~actors.Report` of this app (``None``: none; a later call
        replaces it): ``app.on_report(callback)``, or as a decorator on a function. Called in the worker that saw
        what it reports, after its commit; plain or ``async``; one that raises is logged and fails nothing. Returns
        ``callback``."""
        if callback is not None and not callable(callback):
            raise UsageError(f"app {self.name!r}: on_report takes a function (report) -> None, not {callback!r}")
        self._on_report = callback
        return callback

    @property
    def report_callback(self) -> ReportCallback | None:
        """The callback :meth:`on_report` set, if any."""
        return self._on_report

    def restart_limit_of(self, given: GivenRestartLimit) -> RestartLimit:
        """The restart limit a definition announces: its own (``given``), else the app's."""
        return resolved(given, self._restart_limit)

    def define_task(
        self,
        kind: str,
        *,
        version: int,
        initial: Callable[[Any], Any],
        phases: Mapping[str, PhaseFunction],
        abort: PhaseFunction | None = None,
        migrate: Callable[[int, Any], Any] | None = None,
        restart_limit: GivenRestartLimit = FROM_APP,
    ) -> TaskDefinition:
        """Register a task kind. Raises :class:`~protocol.UsageError` (a ``ValueError``), registering nothing, if
        the definition is unusable."""
        if not KIND_PATTERN.fullmatch(kind):
            raise UsageError(f"task kind {kind!r} must be dotted identifiers, such as 'shop.checkout'")
        if kind in self._tasks:
            raise UsageError(f"task kind {kind!r} is already defined in app {self.name!r}")
        if type(version) is not int or version < 1:
            raise UsageError(f"task kind {kind!r}: version must be a whole number of 1 or more, not {version!r}")
        if not phases:
            raise UsageError(f"task kind {kind!r} needs at least one phase")
        restart_limit = checked_restart_limit(restart_limit, f"task kind {kind!r}")
        definition = TaskDefinition(
            kind=kind,
            version=version,
            initial=initial,
            phases=dict(phases),
            abort=abort,
            migrate=migrate,
            restart_limit=restart_limit,
        )
        self._tasks[kind] = definition
        return definition

    @property
    def tasks(self) -> Mapping[str, TaskDefinition]:
        return dict(self._tasks)

    def capabilities(self) -> tuple[Capability, ...]:
        """What a worker serving this app announces: its task kinds, then its agents (whose runs it runs, tasks of
        kind ``agent:<name>``) and its tools (whose calls it runs, tasks of kind ``tool:<name>``), each at its
        version; then the models it names (:meth:`define_model`), which the owner matches with the conversations
        configured to use one."""
        tasks = tuple(
            Capability(
                kind="task",
                name=definition.kind,
                version=definition.version,
                migrates=definition.migrate is not None,
                restart_limit=self.restart_limit_of(definition.restart_limit),
            )
            for definition in sorted(self._tasks.values(), key=lambda definition: definition.kind)
        )
        agents = tuple(
            Capability(
                kind="agent",
                name=agent.name,
                version=agent.version,
                restart_limit=self.restart_limit_of(agent.restart_limit),
            )
            for agent in sorted(self._agents.values(), key=lambda agent: agent.name)
        )
        tools = tuple(
            Capability(
                kind="tool",
                name=tool.name,
                version=tool.version,
                restart_limit=self.restart_limit_of(tool.restart_limit),
            )
            for tool in sorted(self._tools.values(), key=lambda tool: tool.name)
        )
        models = tuple(Capability(kind="model", name=name, version=1) for name in sorted(self._models))
        return tasks + agents + tools + models

    def __repr__(self) -> str:
        return f"App({self.name!r}, tasks={sorted(self._tasks)})"

    def define_tool(
        self,
        name: str,
        handler: ToolHandler,
        *,
        description: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        recovery: Recovery = "manual",
        version: int = 1,
        needs_approval: ApprovalPredicate | None = None,
        output_schema: Mapping[str, Any] | None = None,
        callers: Sequence[str] = ("agent",),
        restart_limit: GivenRestartLimit = FROM_APP,
    ) -> ToolDefinition:
        """Register a tool (see :class:`~actors.ToolDefinition`). Raises :class:`~protocol.UsageError` (a
        ``ValueError``; and registers nothing) if the definition is unusable, such as a ``parameters`` that is not a
        JSON Schema (draft 2020-12), or a ``description`` or ``parameters`` left out (both are required)."""
        if name in self._tools:
            raise UsageError(f"tool {name!r} is already defined in app {self.name!r}")
        definition = define_tool(
            name,
            handler,
            description=description,
            parameters=parameters,
            recovery=recovery,
            version=version,
            needs_approval=needs_approval,
            output_schema=output_schema,
            callers=callers,
            restart_limit=restart_limit,
        )
        self._tools[name] = definition
        return definition

    def tool(
        self,
        name: str | None = None,
        *,
        description: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        recovery: Recovery = "manual",
        version: int = 1,
        needs_approval: ApprovalPredicate | None = None,
        output_schema: Mapping[str, Any] | None = None,
        callers: Sequence[str] = ("agent",),
        restart_limit: GivenRestartLimit = FROM_APP,
    ) -> Callable[[ToolHandler], ToolHandler]:
        """``@app.tool(description=..., parameters=...)`` on an ``async def``: :meth:`define_tool` with the
        function's name (unless ``name`` is given) and its docstring as the description (unless given). Returns
        the function unchanged."""

        def register(handler: ToolHandler) -> ToolHandler:
            self.define_tool(
                name if name is not None else getattr(handler, "__name__", ""),
                handler,
                description=description if description is not None else inspect.getdoc(handler) or "",
                parameters=parameters,
                recovery=recovery,
                version=version,
                needs_approval=needs_approval,
                output_schema=output_schema,
                callers=callers,
                restart_limit=restart_limit,
            )
            return handler

        return register

    def define_agent(
        self,
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
    ) -> AgentDefinition:
        """Register an agent; its ``tools`` must already be defined in this app. Raises
        :class:`~protocol.UsageError` (and registers nothing) if the definition is unusable."""
        if name in self._agents:
            raise UsageError(f"agent {name!r} is already defined in app {self.name!r}")
        definition = define_agent(
            name,
            version=version,
            model=model,
            instructions=instructions,
            tools=tools,
            max_turns=max_turns,
            model_retry=model_retry,
            partial_interval_ms=partial_interval_ms,
            output_schema=output_schema,
            restart_limit=restart_limit,
            known_tools=self._tools,
        )
        self._agents[name] = definition
        return definition

    def define_model(self, name: str, model: Model) -> Model:
        """Name a model that conversations may be configured to use (``client.configure(cid, model=name)``): from
        their next model request, their runs use it instead of their agent's. Only workers whose app names it run
        such a conversation's runs; with none attached, its run needs attention (``no_model``). Raises
        :class:`~protocol.UsageError` (and registers nothing) for a name used twice, or that is not a name."""
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_MODEL_NAME_CHARS or not name.isprintable():
            raise UsageError(f"a model's name is 1 to {MAX_MODEL_NAME_CHARS} printable characters, not {name!r}")
        if name in self._models:
            raise UsageError(f"model {name!r} is already defined in app {self.name!r}")
        if not callable(getattr(model, "stream", None)):
            raise UsageError(f"model {name!r}: {model!r} is not a model (it has no stream(request) method)")
        self._models[name] = model
        return model

    @property
    def models(self) -> Mapping[str, Model]:
        """The models :meth:`define_model` named, by name."""
        return dict(self._models)

    @property
    def tools(self) -> Mapping[str, ToolDefinition]:
        return dict(self._tools)

    @property
    def agents(self) -> Mapping[str, AgentDefinition]:
        return dict(self._agents)

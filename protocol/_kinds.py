"""The agent layer's names on records, which the owner, the workers and the readers all match: the kind prefixes of a
run's task and of a tool call's task, and the kinds of a run's transcript entries. Defined once, here."""

from __future__ import annotations

from typing import Final

AGENT_TASK_PREFIX: Final = "agent:"
"""A run's task has kind ``agent:<agent name>``."""
TOOL_TASK_PREFIX: Final = "tool:"
"""A tool call's task has kind ``tool:<tool name>``."""
RESERVED_ENTRY_PREFIX: Final = "tether."
"""Entry kinds under this prefix are the runtime's: the owner writes ``tether.user``, and a run's own task (or a tool
task it owns) writes the others in the run's conversation, under its lease. The owner refuses them from anyone else
(``invalid``), so no client can forge what a model reads."""
USER_ENTRY: Final = "tether.user"
"""The entry of a run's input (written by the owner when the run is admitted)."""
ASSISTANT_ENTRY: Final = "tether.assistant"
"""The entry of a model turn: its text and tool calls."""
TOOL_RESULT_ENTRY: Final = "tether.tool_result"
"""The entry of a tool call's result."""
ABORTED_ANSWER_ENTRY: Final = "tether.aborted_answer"
"""What a model had streamed of an attempt that was cut off (its worker killed, its lease lost) or failed, kept when
the next attempt of its request starts (in the commit of that attempt's intent, placed before the answer that replaces
it): ``{run_id, turn, operation_id, attempt, ended, text}``, ``ended`` the attempt's status (``interrupted`` or
``failed``). For people only: never an answer, never sent to the model."""
RESET_ENTRY: Final = "tether.reset"
"""A reset (``client.reset``): the model's context starts again after it, from its ``handoff`` text (a user message)
when it has one. Older entries stay in storage. Written by the owner."""
CONFIG_DOCUMENT: Final = "tether.config"
"""A conversation's configuration (``configure``): a document the owner writes, versioned like any; documents named
under ``tether.`` are the owner's (a ``put_document`` of one is refused ``invalid``)."""
CONFIG_FIELDS: Final = ("model", "tools", "instructions", "max_turns", "steering", "follow_ups", "after_failed_run")
"""What a conversation's configuration may set; an absent field follows the agent's definition (or the default)."""

"""``tether watch`` on a terminal: a :class:`~runtime._watch_view.WatchView` drawn with rich, to fit one screen.

From the top: what waits for a person (each open approval and each run that needs attention, with the commands that
answer it), the runs, the task tree below the latest run, then the transcript, newest at the bottom as in a chat,
cut from the top to the height left. Without a conversation or a run, one line per conversation instead.
"""

from __future__ import annotations

from typing import Final

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from actors import PartialOutput
from protocol import (
    ABORTED_ANSWER_ENTRY,
    ASSISTANT_ENTRY,
    TOOL_RESULT_ENTRY,
    USER_ENTRY,
    EntryRecord,
    RunRecord,
    TaskRecord,
    amount_text,
)

from ._watch_view import (
    ACTIVE_RUN,
    WatchView,
    preview,
    verdict,
    waiting_status,
)

RUNS_SHOWN: Final = 5
TASKS_SHOWN: Final = 12
CONVERSATIONS_SHOWN: Final = 30
MIN_TRANSCRIPT_LINES: Final = 6
STATUS_STYLES: Final = {
    "completed": "green",
    "done": "green",
    "approved": "green",
    "answered": "green",
    "failed": "red",
    "error": "red",
    "denied": "red",
    "cancelled": "red",
    "needs_attention": "bold red",
    "needs attention": "bold red",
    "waiting": "yellow",
    "waiting for approval": "bold yellow",
    "waiting for an answer": "bold yellow",
    "retry_wait": "yellow",
    "running": "cyan",
}


def render(view: WatchView, console: Console, *, connected: bool = True) -> RenderableType:
    """The whole view, fitted to ``console``'s size."""
    height = console.size.height
    top: list[RenderableType] = [_header(view, connected)]
    attention = _attention(view)
    if attention is not None:
        top.append(attention)
    if view.conversation_id is None and view.run_id is None:
        top.append(_conversations(view))
        return Group(*top)
    conversation_id = view.shown_conversation()
    runs = [run for run in view.runs_of(conversation_id) if view.run_id in (None, run.run_id)]
    if runs:
        top.append(_runs(runs[-RUNS_SHOWN:]))
        tree = _task_tree(view, runs[-1])
        if tree is not None:
            top.append(tree)
    used = sum(len(console.render_lines(part, console.options, pad=False)) for part in top)
    budget = max(MIN_TRANSCRIPT_LINES, height - used - 3)  # 2 for the panel's border, 1 spare for the cursor line
    transcript = _transcript(view, conversation_id, console, budget)
    return Group(*top, transcript)


def _header(view: WatchView, connected: bool) -> Text:
    what = (
        f"run {view.run_id}"
        if view.run_id is not None
        else f"conversation {view.conversation_id}"
        if view.conversation_id is not None
        else "every conversation"
    )
    header = Text.assemble(("tether watch ", "bold"), (f"{view.db}", "bold"), f"  {what}  seq {view.seq}")
    if not connected:
        header.append("  (owner unreachable: reconnecting)", style="bold red")
    header.append("   Ctrl-C to quit", style="dim")
    return header


def _attention(view: WatchView) -> Panel | None:
    items = view.attention()
    if not items:
        return None
    lines: list[Text] = []
    for item in items:
        lines.append(Text(item.what, style="bold yellow"))
        lines.extend(Text(f"  {command}") for command in item.commands)
    return Panel(Group(*lines), title="waiting for you", title_align="left", border_style="yellow")


def _status(status: str, reason: str | None = None) -> Text:
    text = Text(status, style=STATUS_STYLES.get(status, STATUS_STYLES.get(status.split(" ", 1)[0], "")))
    if reason:
        text.append(f" ({reason})", style="dim")
    return text


def _runs(runs: list[RunRecord]) -> Table:
    table = Table(title=None, box=None, padding=(0, 2, 0, 0), show_edge=False, header_style="bold")
    for column in ("RUN", "AGENT", "STATUS", "BLOCKED ON", "TOKENS IN/OUT"):
        table.add_column(column, no_wrap=True)
    for run in runs:
        usage = run.usage
        tokens = f"{usage.input_tokens}/{usage.output_tokens}"
        table.add_row(
            run.run_id,
            f"{run.agent}@{run.version}" if run.version else run.agent,
            _status(run.status, run.reason),
            run.operation_id or "-",
            tokens if usage.cost is None else f"{tokens} ${amount_text(usage.cost)}",
        )
    return table


def _task_label(task: TaskRecord) -> Text:
    label = Text(task.kind, style="bold")
    label.append(f"  {task.task_id}  ", style="dim")
    if task.status == "terminal" and task.outcome is not None:
        label.append_text(_status(task.outcome.status, task.outcome.reason or task.outcome.error))
    else:
        label.append_text(_status(task.status))
        if task.phase:
            label.append(f" (phase {task.phase})", style="dim")
    if task.abort is not None:  # a restart mark: abandoned (its caller will not read it), as tether tasks says
        label.append(" marked for abort" if task.abort == "abort" else " abandoned (restart)", style="red")
    if task.restarts:
        limit = "no limit" if task.restart_limit is None else task.restart_limit
        label.append(f" restarts {task.restarts}/{limit}", style="yellow")
    return label


def _task_tree(view: WatchView, run: RunRecord) -> Tree | None:
    tasks = view.task_tree(run)
    if not tasks:
        return None
    root = Tree(Text(f"tasks of run {run.run_id}", style="bold"))
    parents: list[Tree] = [root]
    for index, (depth, task) in enumerate(tasks):
        if index == TASKS_SHOWN:
            root.add(Text(f"… {len(tasks) - TASKS_SHOWN} more", style="dim"))
            break
        del parents[depth + 1 :]
        node = parents[depth].add(_task_label(task))
        parents.append(node)
        for task_id, interaction in view.unseen_waits(task):
            if interaction is None:
                node.add(Text(f"waits on {task_id}", style="dim"))
                continue
            label = Text(f"tether.{interaction.kind}", style="bold")
            label.append(f"  {task_id}  ", style="dim")
            open_ = interaction.status == "open"
            label.append_text(_status(waiting_status(interaction) if open_ else verdict(interaction)))
            node.add(label)
    return root


def _transcript(view: WatchView, conversation_id: str | None, console: Console, budget: int) -> Panel:
    items: list[Text] = []
    if conversation_id is not None:
        for entry in view.entries(conversation_id):
            items.extend(_entry_lines(view, entry))
        for stream in view.streams(conversation_id=conversation_id):
            if view.run_id in (None, stream.run_id):
                items.append(_stream_line(stream, view.stream_label(stream)))
    options = console.options.update(width=max(20, console.width - 4))
    shown: list[Text] = []
    used = 0
    for item in reversed(items):
        lines = len(console.render_lines(item, options, pad=False))
        if used + lines > budget:
            break
        shown.append(item)
        used += lines
    shown.reverse()
    if len(shown) < len(items):
        shown.insert(0, Text(f"… {len(items) - len(shown)} earlier lines", style="dim"))
        if used + 1 > budget and len(shown) > 1:
            shown.pop(1)
    body: RenderableType = Group(*shown) if shown else Text("nothing yet", style="dim")
    return Panel(body, title="transcript", title_align="left", border_style="blue")


def _entry_lines(view: WatchView, entry: EntryRecord) -> list[Text]:
    data = entry.data if isinstance(entry.data, dict) else {}
    if entry.kind == USER_ENTRY:
        return [Text.assemble(("you: ", "bold cyan"), str(data.get("text", "")))]
    if entry.kind == ASSISTANT_ENTRY:
        lines: list[Text] = []
        if data.get("text"):
            lines.append(Text.assemble(("assistant: ", "bold green"), str(data["text"])))
        for call in view.tool_calls(entry):
            line = Text.assemble(("  tool ", "bold"), (call.name, "bold magenta"), " ", preview(call.arguments), "  ")
            line.append_text(_status(call.status))
            lines.append(line)
            if call.result is not None:
                style = "red" if call.is_error else ""
                lines.append(Text.assemble(("    ↳ ", "dim"), (preview(call.result), style)))
        return lines
    if entry.kind == TOOL_RESULT_ENTRY:
        return []  # shown under its call
    if entry.kind == ABORTED_ANSWER_ENTRY:
        line = Text(f"assistant (attempt {data.get('attempt')}, {data.get('ended')}): ", style="dim red")
        line.append(str(data.get("text", "")) + ("…" if data.get("truncated") else ""), style="dim strike")
        line.append("  ✂ interrupted: not an answer, never sent to the model", style="red")
        return [line]
    return [Text(f"{entry.kind}: {preview(entry.data)}", style="dim")]


def _stream_line(stream: PartialOutput, label: str = "assistant") -> Text:
    prefix = "…" if stream.start > 0 else ""
    if stream.status == "aborted":
        line = Text(f"{label} (attempt {stream.attempt}, cut off): ", style="dim red")
        line.append(prefix + stream.text, style="dim strike")
        line.append("  ✂ cut off here: not an answer", style="red")
        return line
    doing = "streaming" if label == "assistant" else "running"
    line = Text(f"{label} ({doing}, attempt {stream.attempt}): ", style="bold green")
    line.append(prefix + stream.text, style="italic")
    line.append("▌", style="blink")
    return line


def _conversations(view: WatchView) -> Table:
    table = Table(box=None, padding=(0, 2, 0, 0), show_edge=False, header_style="bold", expand=False)
    table.add_column("CONVERSATION", no_wrap=True)
    table.add_column("AGENT", no_wrap=True)
    table.add_column("RUN", no_wrap=True)
    table.add_column("LATEST", overflow="ellipsis", no_wrap=True, max_width=60)
    conversation_ids = view.conversation_ids()[-CONVERSATIONS_SHOWN:]
    for conversation_id in reversed(conversation_ids):
        runs = view.runs_of(conversation_id)
        conversation = view.conversations.get(conversation_id)
        agent = (conversation.agent if conversation is not None else None) or (runs[-1].agent if runs else "-")
        run_status = _status(runs[-1].status, runs[-1].reason) if runs else Text("-")
        if runs and runs[-1].status in ACTIVE_RUN:
            run_status.stylize("bold")
        table.add_row(conversation_id, agent, run_status, _latest(view, conversation_id))
    if not conversation_ids:
        table.add_row("nothing yet", "", "", "")
    return table


def _latest(view: WatchView, conversation_id: str) -> Text:
    streams = view.streams(conversation_id=conversation_id)
    if streams:
        stream = streams[-1]
        return Text(("✂ " if stream.status == "aborted" else "▌ ") + stream.text[-200:], style="italic")
    for entry in reversed(view.entries(conversation_id)):
        lines = _entry_lines(view, entry)
        if lines:
            return lines[-1]
    return Text("-", style="dim")

"""The worker: ``actors.serve``, what a phase sees, and the run loop of agents and their tool calls.

- ``_serve.py``: :func:`~actors.serve` (attach, announce, stop by draining, connect afresh); ``_worker.py``: the
  worker on one connection (leases, each phase in its own cancel scope, releases) and the task definitions of an
  app's runs and tool calls;
- ``_phase.py``: :class:`~actors.Phase` and :class:`~actors.PhaseTransaction`, what a task's phase sees and commits;
- the run loop, on top of phases: ``_agent_run.py`` (a run's task: model turns and the tools of each turn),
  ``_tool_run.py`` (a tool call's task), ``_call_host.py`` (its questions, nested calls and subagents),
  ``_journal.py`` (derived ids, digests, intents and results in the operation journal), ``_messages.py`` (a
  transcript as a model's messages), ``_transcript.py`` (the worker's transcript cache), ``_partials.py`` (partial
  output, sent in pieces while a model streams) and ``_reports.py`` (the app's reports, to its ``on_report``).

It reaches the owner only through the client's typed calls (``actors._client``), and registers with the connection
in one call (``Connection.attach_worker``).
"""

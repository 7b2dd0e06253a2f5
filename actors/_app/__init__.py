"""The application: what a worker can run, defined by the app's own code, and checked where it is defined.

- ``_app.py``: :class:`~actors.App` (task kinds, tools and agents by name, each with its version, and the capabilities
  a worker announces) and :class:`~actors.TaskDefinition`; ``_load.py``: ``load_app`` (``--app MODULE:ATTR`` or
  ``FILE.py:ATTR``, an import-time error shown with the frames of the app's own files);
- ``_tools.py``: a tool's definition (its handler, JSON Schema, recovery policy, approval) and
  :class:`~actors.ToolCall`, what its handler learns about a call;
- ``_agents.py``: an agent's definition (its model, instructions, tools, limits, retry policy);
- ``_restarts.py``: restart limits (per definition, app-wide, none); ``_reports.py``: :class:`~actors.Report`, what
  the app's ``on_report`` callback receives.

No I/O but ``load_app``'s import of the app: this room imports only the models' room (an agent names its model
and its retry policy).
"""

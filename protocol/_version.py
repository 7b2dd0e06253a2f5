"""Protocol version and the limits every peer enforces."""

from __future__ import annotations

PROTOCOL_VERSION = 10
"""Bumped with every incompatible change of a frame; checked at ``Hello``. Version 2 added the task engine's frames
and fields (a version 1 peer would refuse the new fields this build always sends); version 3 the agents' runs
(``agent`` on conversations, ``when_busy`` on submissions, ``run_id`` on submission records, run records in
changes, the run requests); version 4 real models' needs (``append_partial`` writes and ``partial`` records,
``read_partials``, usage totals per task tree, prices and budgets, the ``budget_exceeded`` reason and error, pages
of ``read_peers`` (``after_peer_id``, ``next_after_peer_id``) and of ``read_partials`` (``from_operation_id``,
``from_offset``, ``next_operation_id``, ``next_offset``); version 5 saying why: ``error`` on run records (why a
run failed, in words) and ``tool`` on interaction records (the tool whose call asks); version 6 the inbox:
``when_busy="steer"`` and ``when_idle`` on ``submit``, ``reason``, ``answer`` and ``when_busy`` on submission
records, ``read_submissions`` and ``submissions``, ``wait_submission``, ``withdraw`` and ``withdrawn``,
``steer_checkpoint`` on ``set_task_state``, ``configure``, ``abort_conversation`` and
``conversation_aborted``, the ``submit`` write of a commit; version 7 models a conversation may be configured to
use: capabilities of kind ``model``, the blocked reason ``missing_model``; what the model sees of an entry
(``model``, ``head`` on entry records; ``entry`` on ``submit``, the ``submit`` write and submission records), the
``tool`` scope of usage totals, ``value`` on a run's answer and the outcome reason ``invalid_output``; version 8
tools that act: questions (``create_interaction`` of kind ``question``, ``answer`` on ``respond``, ``value`` on an
interaction's answer, whose ``approve`` may be ``null``) and nested tool calls (``parent_operation_id`` on
``start_operation`` and operation records), and ``conversation_owner_task_id`` on task nodes; version 9 a tool
call's intent committed with its task, in the model result's commit (``task_id`` on ``start_operation``); version 10
names checked at ``configure`` (``force`` on ``configure``), the outcome reason ``no_model`` (a run's task failed
past the model grace), leases a worker confirms before a step it cannot take back (``confirm_lease``) and gives
back when it closes (``closing`` on ``release``), and
a tool call's result channels (``code``, ``structured`` and ``dropped`` on ``finish_operation`` and operation
records) and no restart limit (``restart_limit`` ``null`` on capabilities and task records)."""


SUPPORTED_VERSIONS: tuple[int, ...] = (10,)
"""Versions this build can speak. The owner refuses a ``Hello`` naming any other."""

MAX_MESSAGE_BYTES = 1 << 20
"""A WebSocket message (one frame or a batch) may hold at most this many bytes (1 MiB).

A larger message is answered with a ``frame_too_large`` error and otherwise ignored.
"""

WEBSOCKET_HARD_LIMIT_BYTES = 8 << 20
"""Past this size the WebSocket layer itself closes the connection (close code 1009)."""

MAX_BATCH_FRAMES = 4096
"""A batch message may carry at most this many frames."""

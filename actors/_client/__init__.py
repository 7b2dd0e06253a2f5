"""The client: one connection to an owner, and the typed API over it (``actors.connect``, :class:`~actors.Client`).

- ``_connection.py``: the connection, shared by every task that uses the client (requests coalesced, replies matched
  by ``call_id``, heartbeat, reconnection, watches resumed, a worker's hooks); ``_handshake.py``: how one WebSocket
  to the owner is opened (TCP, TLS, the upgrade, the hello), and why an attempt failed;
- ``_client.py``: :class:`~actors.Client`, ``connect`` and ``check_target``. The client's calls are grouped by the
  owner's room they reach, each a part of ``Client``: ``_base.py`` (commits and watches, what every part uses),
  ``_conversations.py``, ``_tasks.py``, ``_runs.py`` (runs, the operation journal, partial output, interactions),
  ``_usage.py``, ``_peers.py`` (peers, and what a worker tells the owner);
- ``_transaction.py``: :class:`~actors.Transaction`, writes collected for one commit; ``_pages.py``: keyset paging;
- ``_watch.py``: :class:`~actors.WatchStream`; ``_partials.py``: :class:`~actors.PartialText`, a reader's assembly of
  partial output.

Only this room sends frames on a connection: the worker and its phases use the client's typed calls. It imports no
other room of ``actors``.
"""

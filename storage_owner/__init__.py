"""The storage owner: the one process that holds a Tether database and serializes every commit.

Its parts are imported on their own, so that the sans-IO core never drags in the I/O shell:
``storage_owner.core`` (the durable logic, no trio, no sockets, no apsw), ``storage_owner.store`` (the SQLite
store) and ``storage_owner.io`` (the trio shell; ``OwnerServer`` runs an owner).
"""

__all__: list[str] = []

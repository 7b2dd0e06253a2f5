"""The storage owner: the one process that holds a Tether database and serializes every commit.

``storage_owner.core`` is the durable logic (sans-IO), ``storage_owner.store`` the SQLite store,
``storage_owner.io`` the trio shell around both. :func:`serve_owner` runs an owner until cancelled.
"""

from .io import OwnerConfig, OwnerFailed, OwnerServer

__all__ = ["OwnerConfig", "OwnerFailed", "OwnerServer"]

"""The runtime file: how a peer finds a running owner from the database path alone.

The owner writes ``<db>.runtime.json`` (mode 0600, since it holds the access token) once it listens, and removes
it when it stops cleanly. A file left by a killed owner is harmless: its pid is dead, and the next owner
replaces it.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import attrs

from ._errors import OwnerUnavailable, TetherError

RUNTIME_SUFFIX = ".runtime.json"


@attrs.frozen(kw_only=True)
class RuntimeInfo:
    """What a running owner publishes next to its database."""

    db: str
    url: str
    token: str
    pid: int
    host: str
    started_at_ms: int
    instance: str
    schema_version: int
    clock: str
    tls_ca: str | None = None
    """With a ``wss://`` URL: the CA certificate file (absolute) that peers on this host verify the owner with."""


def runtime_path(db: str | os.PathLike[str]) -> Path:
    """Where the runtime file of the database at ``db`` lives."""
    return Path(os.fspath(db) + RUNTIME_SUFFIX)


def write_runtime(info: RuntimeInfo) -> Path:
    """Write the runtime file atomically, readable by the owner's user only."""
    path = runtime_path(info.db)
    write_private_json(path, attrs.asdict(info))
    return path


def write_private_json(path: Path, value: object) -> None:
    """Replace ``path`` atomically with ``value`` as JSON, readable and writable by this user only (0600)."""
    temporary = path.with_name(path.name + f".{os.getpid()}.tmp")
    fd = _create_private(temporary)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            json.dump(value, stream, indent=2)
            stream.write("\n")
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _create_private(temporary: Path) -> int:
    """Create ``temporary`` (0600) for writing, never through a symbolic link and never opening a file someone else
    made (``O_EXCL | O_NOFOLLOW``). A regular file left there by a process of the same pid killed mid-write is
    removed and created again; a link, or anything else, is refused with :class:`TetherError`."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(temporary, flags, 0o600)
    except FileExistsError:
        pass
    found = os.lstat(temporary)
    if not stat.S_ISREG(found.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(found.st_mode) else "not a regular file"
        raise TetherError(
            f"refusing to write {temporary}: it is {kind} that this process did not create, and writing through it "
            "would let whoever planted it choose which file gets written; remove it and start again"
        )
    temporary.unlink()
    return os.open(temporary, flags, 0o600)


def read_runtime(db: str | os.PathLike[str]) -> RuntimeInfo:
    """Read the runtime file of ``db``; raise :class:`OwnerUnavailable` saying why it cannot be used."""
    path = runtime_path(db)
    try:
        raw: Any = json.loads(path.read_text(encoding="utf-8"))
        return RuntimeInfo(**raw)
    except FileNotFoundError:
        raise OwnerUnavailable(
            f"no owner is running for {os.fspath(db)} ({path} does not exist); start one with "
            f"`tether owner --db {os.fspath(db)}` or `tether up --db {os.fspath(db)}`"
        ) from None
    except (OSError, ValueError, TypeError) as exc:
        raise OwnerUnavailable(f"cannot read the runtime file {path}: {exc}") from exc


def remove_runtime(db: str | os.PathLike[str], *, instance: str) -> None:
    """Remove the runtime file if it still describes owner ``instance`` (a newer owner's file is kept)."""
    path = runtime_path(db)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(raw, dict) and raw.get("instance") == instance:
        path.unlink(missing_ok=True)

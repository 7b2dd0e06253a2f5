"""The owner's command-line options, declared once (:data:`OWNER_OPTIONS`): ``tether owner``'s parser, the owner
options of ``tether up``'s parser, the ``OwnerConfig`` of ``tether owner`` and the owner arguments ``tether up`` gives
the owners it starts are all derived from the table. A new owner option is one entry of it.

Also the checks ``tether owner``, ``tether up`` and ``tether ui`` make before they start anything: the listener's
exposure (TLS, loopback) and the database's directory."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any, Final, Literal

import attrs

from protocol import DEFAULT_HEARTBEAT_TIMEOUT_S, TetherError

from ._args import listen_address, positive, seconds, seconds_or_zero

DEFAULT_MAX_CONCURRENT_RUNS: Final = 64
"""As ``storage_owner.core.DEFAULT_MAX_CONCURRENT_RUNS`` (not imported: the CLI loads the owner only to run it)."""
DEFAULT_HANDSHAKE_TIMEOUT_S: Final = 10.0
DEFAULT_MAX_UNAUTHENTICATED: Final = 64
"""As ``storage_owner.io``'s (not imported: the CLI loads the owner only to run it)."""
DEFAULT_MODEL_GRACE_S: Final = 10.0
"""As ``storage_owner.core.MODEL_GRACE_MS``, in seconds (not imported, as above)."""
DEFAULT_MAX_PEER_OUTPUT_MIB: Final = 16
DEFAULT_MAX_QUEUED_OUTPUT_MIB: Final = 256
"""As ``storage_owner.core``'s output budgets, in MiB (not imported, as above)."""


def _same(value: Any) -> Any:
    return value


def _text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _address_text(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _mib(value: int) -> int:
    return value << 20


def _ms(value: float) -> int:
    return round(value * 1000)


@attrs.frozen
class OwnerOption:
    """One option of ``tether owner``: how its parser takes it, what it sets in ``OwnerConfig``, and whether (and
    where in its help) ``tether up`` takes it too, to pass on to its owners."""

    flag: str
    help: str
    type: Callable[[str], Any] | None = None
    default: Any = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    switch: bool = False
    """An ``on`` flag (``store_true``): given or not."""
    hidden: bool = False
    """Left out of ``--help`` (an option ``tether up`` gives its children)."""
    config: str | tuple[str, ...] | None = None
    """The ``OwnerConfig`` field it sets (a tuple: the fields its value's items set); ``None``: none."""
    to_config: Callable[[Any], Any] = _same
    up: Literal["first", "last"] | None = None
    """``tether up`` takes it too and passes it to its owners, listed among its first options or its last; ``None``:
    ``tether owner``'s alone."""
    up_help: str | None = None
    """Its help on ``tether up`` if not :attr:`help`."""
    to_argv: Callable[[Any], str] = _text
    """The value as the owner's command line takes it (``tether up`` to its owners)."""

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser, *, up: bool) -> None:
        text = argparse.SUPPRESS if self.hidden else (self.up_help if up and self.up_help else self.help)
        if self.switch:
            parser.add_argument(self.flag, action="store_true", help=text)
            return
        extra: dict[str, Any] = {} if self.choices is None else {"choices": self.choices}
        if self.type is not None:
            extra["type"] = self.type
        parser.add_argument(self.flag, default=self.default, metavar=self.metavar, help=text, **extra)

    def argv(self, value: Any) -> list[str]:
        if self.switch:
            return [self.flag] if value else []
        return [] if value is None else [self.flag, self.to_argv(value)]


OWNER_OPTIONS: Final = (
    OwnerOption(
        "--listen",
        "address to listen on (default 127.0.0.1:0, a free loopback port)",
        type=listen_address,
        default=("127.0.0.1", 0),
        metavar="HOST:PORT",
        config=("host", "port"),
        up="first",
        up_help="the owner's address (default 127.0.0.1:0)",
        to_argv=_address_text,
    ),
    OwnerOption(
        "--sync",
        "normal (default): survives process crashes; full: fsync every commit, survives power loss",
        choices=("normal", "full"),
        default="normal",
        config="sync",
        up="first",
        up_help="as for tether owner",
    ),
    OwnerOption(
        "--clock",
        "wall (default), or manual: time moves only when a client advances it (for tests)",
        choices=("wall", "manual"),
        default="wall",
        config="clock",
        up="first",
        up_help="as for tether owner",
    ),
    OwnerOption(
        "--fault-kill-before-commit",
        "fault injection: SIGKILL this owner right before its K-th writing COMMIT",
        type=positive,
        metavar="K",
        config="kill_before_commit",
    ),
    OwnerOption(
        "--fault-kill-after-commit",
        "fault injection: SIGKILL this owner right after its K-th writing COMMIT",
        type=positive,
        metavar="K",
        config="kill_after_commit",
    ),
    OwnerOption(
        "--fault-kill-before-result",
        "fault injection: SIGKILL this owner right before committing the K-th operation result it receives",
        type=positive,
        metavar="K",
        config="kill_before_result",
    ),
    OwnerOption(
        "--fault-kill-after-result",
        "fault injection: SIGKILL this owner right after committing the K-th operation result it receives",
        type=positive,
        metavar="K",
        config="kill_after_result",
    ),
    OwnerOption(
        "--fault-storage-error-at-commit",
        "fault injection: fail the K-th writing COMMIT with a storage error (the owner fails closed)",
        type=positive,
        metavar="K",
        config="storage_error_at_commit",
    ),
    OwnerOption(
        "--start-check",
        "check an existing database with PRAGMA quick_check for at most S seconds before serving it, and refuse it "
        "if damaged (default 1; a larger database is served and said to be not checked fully; 0 skips the check; "
        "`tether check` runs the full one)",
        type=seconds_or_zero,
        default=1.0,
        metavar="S",
        config="start_check_s",
        up="last",
    ),
    OwnerOption(
        "--group-readable",
        "create a new database (and its -wal, -shm) readable by the owner's group, mode 0640 (default 0600)",
        switch=True,
        config="group_readable",
        up="last",
    ),
    OwnerOption(
        "--max-concurrent-runs",
        f"agent runs busy at once across conversations; later ones wait queued (default {DEFAULT_MAX_CONCURRENT_RUNS})",
        type=positive,
        default=DEFAULT_MAX_CONCURRENT_RUNS,
        metavar="N",
        config="max_concurrent_runs",
        up="last",
    ),
    OwnerOption(  # given to OwnerServer, not OwnerConfig
        "--otel",
        "OpenTelemetry metrics and run spans on the global providers (the tether[otel] extra; same as TETHER_OTEL=1; "
        "see docs/telemetry.md)",
        switch=True,
    ),
    OwnerOption("--standby", "tether up's warm standby", switch=True, hidden=True, config="standby"),
    OwnerOption(
        "--heartbeat-timeout",
        f"drop a peer silent for S seconds; peers send something every quarter of it (default "
        f"{DEFAULT_HEARTBEAT_TIMEOUT_S:g})",
        type=seconds,
        default=DEFAULT_HEARTBEAT_TIMEOUT_S,
        metavar="S",
        config="heartbeat_timeout_s",
        up="first",
        up_help=f"the owner drops a peer silent for S seconds (default {DEFAULT_HEARTBEAT_TIMEOUT_S:g})",
    ),
    OwnerOption(
        "--tls-cert",
        "serve wss:// with this PEM certificate (chain); needs --tls-key. Required (or --insecure-listen) to listen "
        "on an address other than loopback",
        metavar="FILE",
        config="tls_cert",
        up="last",
        to_argv=os.path.abspath,
    ),
    OwnerOption(
        "--tls-key",
        "the certificate's private key (PEM, unencrypted)",
        metavar="FILE",
        config="tls_key",
        up="last",
        to_argv=os.path.abspath,
    ),
    OwnerOption(
        "--tls-ca",
        "the CA certificate peers on this host verify the owner with, named in DB.runtime.json (default --tls-cert "
        "itself, right for a self-signed certificate)",
        metavar="FILE",
        config="tls_ca",
        up="last",
        to_argv=os.path.abspath,
    ),
    OwnerOption(
        "--insecure-listen",
        "allow --listen on an address other than loopback without TLS: the access token and every frame cross the "
        "network in clear",
        switch=True,
        config="insecure_listen",
        up="last",
    ),
    OwnerOption(
        "--handshake-timeout",
        f"close a connection that has not finished TLS, the WebSocket upgrade and its hello within S seconds "
        f"(default {DEFAULT_HANDSHAKE_TIMEOUT_S:g})",
        type=seconds,
        default=DEFAULT_HANDSHAKE_TIMEOUT_S,
        metavar="S",
        config="handshake_timeout_s",
        up="last",
    ),
    OwnerOption(
        "--max-unauthenticated",
        f"connections in their handshake at once; past N a new one is closed at once (default "
        f"{DEFAULT_MAX_UNAUTHENTICATED})",
        type=positive,
        default=DEFAULT_MAX_UNAUTHENTICATED,
        metavar="N",
        config="max_unauthenticated",
        up="last",
    ),
    OwnerOption(
        "--max-peer-output",
        "unread replies and events one peer may have in the owner; past it its requests are refused 'overloaded' "
        f"(retried by the client) and its watches read the log later (default {DEFAULT_MAX_PEER_OUTPUT_MIB})",
        type=positive,
        default=DEFAULT_MAX_PEER_OUTPUT_MIB,
        metavar="MIB",
        config="max_peer_output",
        to_config=_mib,
        up="last",
    ),
    OwnerOption(
        "--max-queued-output",
        "unread output across every peer; past it requests are refused 'overloaded' and the peers holding the most "
        f"are dropped (default {DEFAULT_MAX_QUEUED_OUTPUT_MIB})",
        type=positive,
        default=DEFAULT_MAX_QUEUED_OUTPUT_MIB,
        metavar="MIB",
        config="max_queued_output",
        to_config=_mib,
        up="last",
    ),
    OwnerOption(
        "--model-grace",
        "how long a run waits for an attached worker that names its conversation's configured model (tether "
        "configure --model) before it fails no_model, its inputs unanswered no_model; 0: at once (default "
        f"{DEFAULT_MODEL_GRACE_S:g})",
        type=seconds_or_zero,
        default=DEFAULT_MODEL_GRACE_S,
        metavar="SECONDS",
        config="model_grace_ms",
        to_config=_ms,
        up="last",
    ),
)
"""Every option of ``tether owner`` but ``--db`` (required there, ``./tether.db`` by default on ``tether up``) and
``--supervised`` (a child's, as a worker's), in the order of its ``--help``."""


def add_owner_options(parser: argparse.ArgumentParser, *, up: Literal["first", "last"] | None = None) -> None:
    """Add the owner's options to ``parser``: all of them (``tether owner``), or ``tether up``'s ``first`` or
    ``last`` ones."""
    for option in OWNER_OPTIONS:
        if up is None or option.up == up:
            option.add_to(parser, up=up is not None)


def owner_config(args: argparse.Namespace) -> dict[str, Any]:
    """The ``OwnerConfig`` fields ``tether owner``'s ``args`` set (all but ``db``)."""
    fields: dict[str, Any] = {}
    for option in OWNER_OPTIONS:
        if option.config is None:
            continue
        value = option.to_config(getattr(args, option.dest))
        if isinstance(option.config, tuple):
            fields.update(zip(option.config, value, strict=True))
        else:
            fields[option.config] = value
    return fields


def owner_argv(args: argparse.Namespace) -> tuple[str, ...]:
    """``tether up``'s owner options, as the command line of the owners it starts takes them."""
    return tuple(arg for option in OWNER_OPTIONS if option.up for arg in option.argv(getattr(args, option.dest)))


def exposure_problem(args: argparse.Namespace) -> str | None:
    """Why ``tether owner``, ``tether up`` or ``tether ui`` must not start (exit 2, nothing started): a non-loopback
    --listen without TLS or --insecure-listen, half a TLS pair, TLS files that cannot be used; ``None`` if none."""
    from storage_owner.io import check_exposure, server_ssl_context

    host, _ = args.listen
    if (args.tls_cert is None) != (args.tls_key is None):
        return "--tls-cert and --tls-key go together: give both, or neither; nothing was started"
    if getattr(args, "tls_ca", None) is not None and args.tls_cert is None:
        return "--tls-ca needs --tls-cert and --tls-key; nothing was started"
    try:
        check_exposure(host, tls=args.tls_cert is not None, insecure_listen=args.insecure_listen)
        if args.tls_cert is not None:
            server_ssl_context(args.tls_cert, args.tls_key)
    except TetherError as exc:
        return str(exc)
    return None


def directory_problem(db: str) -> str | None:
    """Why ``tether owner`` or ``tether up`` cannot use ``--db DB`` at all (its directory is missing), or ``None``."""
    directory = os.path.dirname(os.path.abspath(db))
    if os.path.isdir(directory):
        return None
    return (
        f"the directory of the database does not exist: {directory} (--db {db}); create it, or give another --db; "
        "nothing was started"
    )

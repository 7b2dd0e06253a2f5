"""The owner's trio shell: WebSocket server, commit loop, clocks, process lifecycle."""

from ._clock import Clock, ManualClock, WallClock
from ._listener import ExposureRefused, check_exposure, server_ssl_context
from ._server import OwnerConfig, OwnerFailed, OwnerServer

__all__ = [
    "Clock",
    "ExposureRefused",
    "ManualClock",
    "OwnerConfig",
    "OwnerFailed",
    "OwnerServer",
    "WallClock",
    "check_exposure",
    "server_ssl_context",
]

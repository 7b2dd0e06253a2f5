"""The owner's trio shell: WebSocket server, commit loop, clocks, process lifecycle."""

from ._clock import Clock, ManualClock, WallClock
from ._server import OwnerConfig, OwnerFailed, OwnerServer

__all__ = ["Clock", "ManualClock", "OwnerConfig", "OwnerFailed", "OwnerServer", "WallClock"]

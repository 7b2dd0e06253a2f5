"""The built-in demo app, the default of ``tether up --app``.

It defines no task kinds yet: the task engine (phases, leases, abort) comes next, and with it the demo checkout.
Workers serving it attach, announce the app and keep their heartbeat.
"""

from __future__ import annotations

import actors

app = actors.App("demo")

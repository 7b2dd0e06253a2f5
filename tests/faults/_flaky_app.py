"""A test application that loads until the file named by ``TETHER_TEST_BREAK_APP`` exists, and fails at import from
then on: ``--app tests.faults._flaky_app:app``. ``tether up`` checks the app before it starts any worker; a worker
restarted after the file appeared exits with status 2, which stops ``tether up`` at once."""

from __future__ import annotations

import os

import actors

if os.path.exists(os.environ["TETHER_TEST_BREAK_APP"]):
    raise RuntimeError("boom at import: the app was broken after tether up started")

app = actors.App("flaky")

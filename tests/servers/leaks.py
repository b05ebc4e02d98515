"""The session-level check that no tool-server process outlives the tests."""

from __future__ import annotations

import time

import pytest

from tools.procs import kill_owned_processes, owned_processes


@pytest.fixture(scope="session", autouse=True)
def no_leftover_server_processes():
    """After the whole session: no process started by our tool layer is still alive."""
    yield
    deadline = time.monotonic() + 5.0  # servers closed a moment ago may still be exiting
    while owned_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    leftovers = kill_owned_processes()
    assert leftovers == [], f"tool-server processes outlived the tests: {leftovers}"

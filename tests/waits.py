"""Waiting for a condition in tests: no timing assertion, only a generous deadline."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(check: Callable, what: str, timeout: float = 120.0, every: float = 0.3,
             detail: Callable[[], str] = lambda: ""):
    """The first truthy result of ``check()``; AssertionError naming ``what`` (and
    ``detail()``, e.g. a log's tail) when the deadline passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"never: {what} (waited {timeout:g} s){detail()}")

"""Failed logins, counted per user and per source address: after ``max_failures`` in a row
the key is locked for ``lockout_s`` and every attempt is refused unchecked (no token goes to
the hub, no audit entry per attempt), so guessing costs the guesser and nothing else."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable


class Throttle:
    def __init__(self, max_failures: int, lockout_s: float, clock: Callable[[], float] = time.monotonic):
        self.max_failures, self.lockout_s, self.clock = max_failures, lockout_s, clock
        self._failures: dict[str, int] = {}
        self._locked: dict[str, float] = {}

    def locked(self, keys: Iterable[str]) -> bool:
        now = self.clock()
        for k in keys:
            until = self._locked.get(k)
            if until is not None and until > now:
                return True
            if until is not None:
                del self._locked[k]
                self._failures.pop(k, None)
        return False

    def fail(self, keys: Iterable[str]) -> bool:
        """Count one failure; whether it locked a key."""
        newly = False
        for k in keys:
            n = self._failures[k] = self._failures.get(k, 0) + 1
            if n >= self.max_failures and k not in self._locked:
                self._locked[k] = self.clock() + self.lockout_s
                newly = True
        if len(self._failures) > 100_000:  # a flood of distinct names: forget the oldest counts
            for k in list(self._failures)[:50_000]:
                if k not in self._locked:
                    del self._failures[k]
        return newly

    def succeed(self, keys: Iterable[str]) -> None:
        for k in keys:
            self._failures.pop(k, None)


__all__ = ["Throttle"]

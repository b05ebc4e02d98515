"""A circuit breaker per server: after `failures` consecutive failed attempts (transport failures,
each followed by a restart, or failed restarts) it opens and refuses calls for `cooldown`
seconds, so a crashing server cannot stall every episode. After the cooldown one trial call
goes through (half-open); its success closes the breaker, its failure reopens it."""

from __future__ import annotations

import time
from collections.abc import Callable


class CircuitBreaker:
    def __init__(self, failures: int, cooldown: float, clock: Callable[[], float] = time.monotonic):
        self.failures = failures
        self.cooldown = cooldown
        self._clock = clock
        self.consecutive = 0
        self.opened_at: float | None = None
        self._trial_running = False
        self.times_opened = 0

    @property
    def is_open(self) -> bool:
        return self.opened_at is not None

    def allow(self) -> bool:
        """Whether a call may go to the server now (at most one trial while half-open)."""
        if self.opened_at is None:
            return True
        if self._trial_running or self._clock() - self.opened_at < self.cooldown:
            return False
        self._trial_running = True
        return True

    def seconds_left(self) -> float:
        if self.opened_at is None:
            return 0.0
        return max(0.0, self.cooldown - (self._clock() - self.opened_at))

    def record_success(self) -> None:
        self.consecutive = 0
        self.opened_at = None
        self._trial_running = False

    def release(self) -> None:
        """A call that says nothing about the server's health (a timeout): free the trial slot."""
        self._trial_running = False

    def record_failure(self) -> None:
        """One failed attempt; opens the breaker at the threshold (or at once while half-open)."""
        self.consecutive += 1
        if self._trial_running or self.consecutive >= self.failures:
            if self.opened_at is None or self._trial_running:
                self.times_opened += 1
            self.opened_at = self._clock()
            self._trial_running = False

"""Where a collection's wall time went: generating, waiting on tools, tools hidden under
generation, other."""

from __future__ import annotations

import time


class Timeline:
    """Splits wall time by what the collection was doing.

    - generating: an engine call (`generate`, or `serve` under continuous batching) is in flight
      and the engine is not idle: a serving engine that waits on its feed for the next turns of
      parked sessions (`set_engine_idle`) generates nothing then. Calls run one at a time, so
      this is the summed duration of engine calls less those waits.
    - tools_only: at least one episode is inside its environment (`reset`/`step`, which is where
      tool calls happen) while no generation runs: time the engine sits idle waiting on tools.
    - tools_overlapped: episodes are in their environment while generation runs (hidden cost).
    - other: neither (batching waits, tokenization, bookkeeping).
    """

    def __init__(self) -> None:
        self.start = self._last = time.perf_counter()
        self.generating = False
        self.engine_idle = False
        self.in_env = 0
        self.seconds = {"generating": 0.0, "tools_only": 0.0, "tools_overlapped": 0.0, "other": 0.0}

    def _flush(self) -> None:
        now = time.perf_counter()
        dt, self._last = now - self._last, now
        if self.generating and not self.engine_idle:
            self.seconds["generating"] += dt
            if self.in_env:
                self.seconds["tools_overlapped"] += dt
        elif self.in_env:
            self.seconds["tools_only"] += dt
        else:
            self.seconds["other"] += dt

    def set_generating(self, value: bool) -> None:
        self._flush()
        self.generating = value
        self.engine_idle = False

    def set_engine_idle(self, value: bool) -> None:
        """The engine call in flight waits for requests (True) or works again (False)."""
        self._flush()
        self.engine_idle = value and self.generating

    def add_in_env(self, delta: int) -> None:
        self._flush()
        self.in_env += delta

    def wall(self) -> float:
        self._flush()
        return self._last - self.start

"""Where a collection's wall time went: generating, waiting on tools, tools hidden under
generation, other."""

from __future__ import annotations

import time


class Timeline:
    """Splits wall time by what the collection was doing.

    - generating: an `engine.generate` call is in flight (batches run one at a time, so this is
      the summed duration of engine calls).
    - tools_only: at least one episode is inside its environment (`reset`/`step`, which is where
      tool calls happen) while no generation runs: time the engine sits idle waiting on tools.
    - tools_overlapped: episodes are in their environment while generation runs (hidden cost).
    - other: neither (batching waits, tokenization, bookkeeping).
    """

    def __init__(self) -> None:
        self.start = self._last = time.perf_counter()
        self.generating = False
        self.in_env = 0
        self.seconds = {"generating": 0.0, "tools_only": 0.0, "tools_overlapped": 0.0, "other": 0.0}

    def _flush(self) -> None:
        now = time.perf_counter()
        dt, self._last = now - self._last, now
        if self.generating:
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

    def add_in_env(self, delta: int) -> None:
        self._flush()
        self.in_env += delta

    def wall(self) -> float:
        self._flush()
        return self._last - self.start

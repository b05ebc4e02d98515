"""What SharedToolManager counts about the calls it makes: `CallMetrics`, read as flat `tools/...`
metrics once per step (`snapshot`) and cleared (`reset`)."""

from __future__ import annotations

import math
from collections import Counter, deque

LATENCY_WINDOW = 10_000
"""Latest latencies kept per tool for the p50/p99 metrics."""
ALWAYS = ("tools/calls", "tools/errors", "tools/timeouts", "tools/retries", "tools/restarts",
          "tools/breaker_openings")
"""Reported even when nothing counted them (as 0)."""


class CallMetrics:
    """Counts and latencies since the last reset (see `snapshot` for the names)."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._latencies: dict[str, deque[float]] = {}

    def count(self, key: str) -> None:
        self._counts[key] += 1

    def count_server(self, what: str, server: str) -> None:
        """One `what` (restarts, breaker_openings) of `server`, in the total and the server's own."""
        self._counts[f"tools/{what}"] += 1
        self._counts[f"tools/server={server}/{what}"] += 1

    def call(self, metric: str | None, error_kind: str | None, latency_s: float) -> None:
        """One finished call (after its retries) of the tool named `metric` (`tools/<server>.<tool>`;
        None: no such tool), an error of `error_kind` unless that is None."""
        counts = self._counts
        if error_kind is not None:
            counts["tools/errors"] += 1
            counts[f"tools/errors/{error_kind}"] += 1
        if metric is None:
            return
        counts[f"{metric}/calls"] += 1
        if error_kind is not None:
            counts[f"{metric}/errors"] += 1
            counts[f"{metric}/errors/{error_kind}"] += 1
        window = self._latencies.get(metric)
        if window is None:
            window = self._latencies[metric] = deque(maxlen=LATENCY_WINDOW)
        window.append(latency_s)

    def snapshot(self) -> dict[str, float]:
        """tools/calls, tools/errors (results with is_error), tools/errors/<error_kind>,
        tools/timeouts and tools/transport_failures (attempts), tools/retries, tools/restarts,
        tools/breaker_openings; per server tools/server=<server>/restarts and /breaker_openings;
        per tool tools/<server>.<tool>/calls, /errors, /errors/<error_kind>, /p50_ms, /p99_ms."""
        out = dict.fromkeys(ALWAYS, 0.0)
        out.update({key: float(value) for key, value in self._counts.items()})
        for metric, window in self._latencies.items():
            ordered = sorted(window)
            out[f"{metric}/p50_ms"] = 1000.0 * _percentile(ordered, 0.50)
            out[f"{metric}/p99_ms"] = 1000.0 * _percentile(ordered, 0.99)
        return out

    def reset(self) -> None:
        self._counts.clear()
        self._latencies.clear()


def _percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

"""The order-preserving alignment of a task's expected steps with the calls an episode made."""

from __future__ import annotations

from collections.abc import Callable


def align(num_steps: int, num_calls: int, weight: Callable[[int, int], float]) -> tuple[float, dict[int, int]]:
    """The order-preserving alignment of steps with calls (a weighted longest common subsequence)
    of the largest total `weight(step, call)`: (that total, call index -> step index, 0-based).
    A pair of weight 0 is no match; among equal totals, earlier calls are preferred. The one
    alignment of the rewards (`tool_sequence`), the process reward and the turn credit."""
    weights = [[float(weight(i, j)) for j in range(num_calls)] for i in range(num_steps)]
    # best[i][j]: the largest total over the last num_steps - i steps and num_calls - j calls.
    best = [[0.0] * (num_calls + 1) for _ in range(num_steps + 1)]
    for i in range(num_steps - 1, -1, -1):
        for j in range(num_calls - 1, -1, -1):
            take = best[i + 1][j + 1] + weights[i][j] if weights[i][j] > 0 else 0.0
            best[i][j] = max(take, best[i + 1][j], best[i][j + 1])
    matched: dict[int, int] = {}
    i = j = 0
    while i < num_steps and j < num_calls:
        if weights[i][j] > 0 and best[i][j] == best[i + 1][j + 1] + weights[i][j]:
            matched[j] = i
            i, j = i + 1, j + 1
        elif best[i][j] == best[i + 1][j]:
            i += 1
        else:
            j += 1
    return best[0][0], matched

"""Turn-level GRPO (`estimator: turn_grpo`): the outcome advantage of each episode, plus on each
turn's tokens the advantage of that turn's credit units.

The units come from the environment (environments/turn_credit.py: with `turn_credit: verified`,
one per tool call, scored 1 when the call did a step of the gold chain, and one scoring 0 per
unreadable turn), each with a key: the episode's progress before it. Units are normalised among
the group's units of the same key, not of the same turn number: an episode that lost a turn to a
bad call faces step 2 at its third turn, and is compared with the episodes that faced step 2,
whenever they did (GiGPO groups steps by identical anchor states; the verified progress is such
a state, and one that two episodes reach by different routes still shares).

Per key, every episode that has units there weighs the same, its units sharing its weight: the
baseline is the mean over episodes of each one's mean score at the key, and the spread the std
of the units under those weights. So an episode that retries a failing call five times counts in
the baseline as one episode, not as five, and episodes with more turns gain nothing from them:
each key's advantages average to zero over the episodes that reached it. A key only one episode
reached, or whose units all scored the same, gives advantage 0 (nothing to compare with).

A turn's advantage is the mean of its units' advantages, on all of its tokens; so writing two
calls in one turn or in two turns of the same length puts the same advantage on the same number
of tokens: splitting a turn gains nothing. Token advantage = outcome advantage + turn_weight x
turn advantage (0 for a turn without units, e.g. the final answer).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence


def unit_advantages(units: Sequence[Sequence[tuple[str, float]]], normalize_std: bool = True,
                    eps: float = 1e-6) -> list[list[float]]:
    """units[i]: episode i's units as (key, score), in order -> the advantage of each unit."""
    by_key: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for episode, pairs in enumerate(units):
        for key, score in pairs:
            by_key[key][episode].append(float(score))
    baseline: dict[str, tuple[float, float] | None] = {}
    for key, members in by_key.items():
        scores = [s for member in members.values() for s in member]
        if len(members) < 2 or max(scores) == min(scores):
            baseline[key] = None
            continue
        weights = [(1.0 / (len(members) * len(member)), s) for member in members.values() for s in member]
        mean = sum(w * s for w, s in weights)
        std = math.sqrt(sum(w * (s - mean) ** 2 for w, s in weights))
        baseline[key] = (mean, std)
    advantages = []
    for pairs in units:
        row = []
        for key, score in pairs:
            stats = baseline[key]
            if stats is None:
                row.append(0.0)
                continue
            mean, std = stats
            row.append((score - mean) / (std + eps) if normalize_std else score - mean)
        advantages.append(row)
    return advantages

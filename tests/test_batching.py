"""Micro-batch grouping: length-sorted rows cut by a row count, optionally a padded-token budget,
and where the padding a cut saves outweighs the cost of one more forward/backward call."""

from __future__ import annotations

import itertools
import random

import torch

from grpo.algorithm.batching import (
    DEFAULT_OVERHEAD_TOKENS,
    micro_batch_rows,
    micro_batches,
    scatter,
)
from grpo.trajectory import Trajectory

LENGTHS = {0: 50, 1: 10, 2: 30, 3: 10, 4: 200, 5: 40}
# sorted: 1(10) 3(10) 2(30) 5(40) 0(50) 4(200)
HUGE = 10**9  # a call costs more than any padding: the fewest groups, then the least padding


def test_rows_are_length_sorted_and_cut_by_count():
    # Two groups of <= 4: [1,3,2,5]+[0,4] pads 160+400; [1,3,2]+[5,0,4] 90+600; [1,3]+[...] 20+800.
    assert micro_batch_rows(LENGTHS, list(LENGTHS), size=4, overhead_tokens=HUGE) == [[1, 3, 2, 5], [0, 4]]


def test_a_token_budget_counts_rows_times_the_longest():
    # [1, 3, 2] pads to 3 x 30 = 90; [1, 3, 2, 5] would pad to 160 > 100; 4 alone exceeds the
    # budget and gets a group of its own. Three groups is the fewest; of those, 90 + 100 + 200.
    assert micro_batch_rows(LENGTHS, list(LENGTHS), size=8, max_tokens=100, overhead_tokens=HUGE) == [
        [1, 3, 2], [5, 0], [4]]


def test_count_and_budget_both_bind():
    assert micro_batch_rows(LENGTHS, list(LENGTHS), size=2, max_tokens=1000, overhead_tokens=HUGE) == [
        [1, 3], [2, 5], [0, 4]]
    assert micro_batch_rows(LENGTHS, [4, 1], size=8, max_tokens=1) == [[1], [4]]
    assert micro_batch_rows(LENGTHS, [], size=8, max_tokens=100) == []


def test_a_long_row_is_cut_off_when_its_padding_outweighs_a_call():
    # All six in one: 6 x 200 + 100 = 1300. [1,3,2,5,0] + [4]: 250 + 200 + 2 x 100 = 650, the least.
    assert micro_batch_rows(LENGTHS, list(LENGTHS), size=8, overhead_tokens=100) == [[1, 3, 2, 5, 0], [4]]


def test_cheap_calls_cut_padding_away():
    lengths = {0: 10, 1: 10, 2: 30, 3: 45, 4: 50, 5: 200}
    # overhead 10: [0,1] [2] [3,4] [5] = 20 + 30 + 100 + 200 + 40 = 390, every other cut costs more
    # (each length alone 395, [0,1] [2,3] [4] [5] 400, [0,1,2] [3,4] [5] 420).
    assert micro_batch_rows(lengths, list(lengths), size=8, overhead_tokens=10) == [[0, 1], [2], [3, 4], [5]]
    # Free calls: each length alone; equal lengths still share (apart they cost the same).
    assert micro_batch_rows(lengths, list(lengths), size=8, overhead_tokens=0) == [[0, 1], [2], [3], [4], [5]]


def test_a_tie_takes_fewer_groups():
    lengths = {0: 10, 1: 20}
    assert micro_batch_rows(lengths, [0, 1], size=8, overhead_tokens=10) == [[0, 1]]  # 40 + 10 = 10 + 20 + 20
    assert micro_batch_rows(lengths, [0, 1], size=8, overhead_tokens=9) == [[0], [1]]  # 48 < 49


def _brute_force(lengths, rows, size, max_tokens, overhead):
    order = sorted(rows, key=lambda i: lengths[i])
    best = None
    for cuts in itertools.product((False, True), repeat=max(len(order) - 1, 0)):
        groups, current = [], [order[0]]
        for row, cut in zip(order[1:], cuts):
            if cut:
                groups.append(current)
                current = []
            current.append(row)
        groups.append(current)
        if any(len(g) > size or (len(g) > 1 and max_tokens is not None and len(g) * lengths[g[-1]] > max_tokens)
               for g in groups):
            continue
        key = (sum(len(g) * lengths[g[-1]] + overhead for g in groups), len(groups))
        if best is None or key < best[0]:
            best = (key, groups)
    return best


def test_the_cut_is_the_cheapest_of_all_cuts_of_the_sorted_rows():
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 9)
        lengths = {i: rng.randint(1, 60) for i in range(n)}
        size, overhead = rng.randint(1, 6), rng.choice([0, 5, 30, 200])
        max_tokens = rng.choice([None, 40, 120])
        got = micro_batch_rows(lengths, list(lengths), size, max_tokens, overhead)
        (cost, count), _ = _brute_force(lengths, list(lengths), size, max_tokens, overhead)
        assert sorted(i for g in got for i in g) == list(range(n))
        assert (sum(len(g) * max(lengths[i] for i in g) + overhead for g in got), len(got)) == (cost, count)


def test_micro_batches_take_the_device_default_overhead():
    assert DEFAULT_OVERHEAD_TOKENS["cpu"] == 256
    trajs = [Trajectory(task_id="t", group_id="g", token_ids=list(range(n)), loss_mask=[0] + [1] * (n - 1),
                        behavior_logprobs=[0.0] * n, prompt_length=1, reward=0.0)
             for n in (10, 12, 400)]
    # cpu: [10, 12] (24 padded) + [400] + 2 x 256 = 936 < one group: 3 x 400 + 256 = 1456.
    mbs = micro_batches(trajs, [0, 1, 2], size=8, pad_id=0, device="cpu")
    assert [mb.index.tolist() for mb in mbs] == [[0, 1], [2]]
    assert [tuple(mb.input_ids.shape) for mb in mbs] == [(2, 12), (1, 400)]
    # a larger overhead keeps them together
    (mb,) = micro_batches(trajs, [0, 1, 2], size=8, pad_id=0, device=torch.device("cpu"), overhead_tokens=800)  # 2000 < 2024
    assert mb.input_ids.shape == (3, 400)


def test_scatter_places_each_rows_values_on_its_target_positions():
    trajs = [Trajectory(task_id="t", group_id="g", token_ids=list(range(n)), loss_mask=[0] + [1] * (n - 1),
                        behavior_logprobs=[0.0] * n, prompt_length=1, reward=0.0)
             for n in (3, 5, 4)]
    (mb,) = micro_batches(trajs, [0, 1, 2], size=8, pad_id=0, device="cpu", overhead_tokens=HUGE)
    assert mb.index.tolist() == [0, 2, 1]  # length-sorted; the targets are [3, 4]
    per_row = {0: torch.tensor([1.0, 2.0]),  # 2 targets
               1: torch.tensor([3.0, 4.0, 5.0, 6.0, 7.0]),  # longer than the targets: cut to 4
               2: torch.tensor([8.0, 9.0, 10.0], dtype=torch.float64)}  # another dtype: cast
    out = scatter(per_row, mb)
    assert out.dtype == torch.float32
    assert out.tolist() == [[1.0, 2.0, 0.0, 0.0], [8.0, 9.0, 10.0, 0.0], [3.0, 4.0, 5.0, 6.0]]

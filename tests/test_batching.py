"""Micro-batch grouping: length-sorted rows cut by a row count and, optionally, a padded-token
budget."""

from __future__ import annotations

from grpo.algorithm.batching import micro_batch_rows

LENGTHS = {0: 50, 1: 10, 2: 30, 3: 10, 4: 200, 5: 40}


def test_rows_are_length_sorted_and_cut_by_count():
    assert micro_batch_rows(LENGTHS, list(LENGTHS), size=4) == [[1, 3, 2, 5], [0, 4]]


def test_a_token_budget_counts_rows_times_the_longest():
    # sorted: 1(10) 3(10) 2(30) 5(40) 0(50) 4(200)
    # [1, 3, 2] pads to 3 x 30 = 90; adding 5 would pad to 4 x 40 = 160 > 100.
    assert micro_batch_rows(LENGTHS, list(LENGTHS), size=8, max_tokens=100) == [
        [1, 3, 2], [5, 0], [4]]  # 4 alone exceeds the budget: a group of its own


def test_count_and_budget_both_bind():
    assert micro_batch_rows(LENGTHS, list(LENGTHS), size=2, max_tokens=1000) == [
        [1, 3], [2, 5], [0, 4]]
    assert micro_batch_rows(LENGTHS, [4, 1], size=8, max_tokens=1) == [[1], [4]]
    assert micro_batch_rows(LENGTHS, [], size=8, max_tokens=100) == []

"""Prefill batching: chunks by padded tokens, left padding, positions and the attention mask."""

from __future__ import annotations

import torch

from grpo.rollout.hf.prefill import left_padded, prefill_chunks


def test_chunks_hold_at_most_the_budget_of_padded_tokens():
    # longest first: 10 | 6 6 (2 x 6 = 12) | 5 4 3 (3 x 5 = 15 <= 15; a fourth would be 20)
    assert prefill_chunks([10, 6, 6, 5, 4, 3], 15) == [(0, 1), (1, 3), (3, 6)]
    assert prefill_chunks([40, 2], 15) == [(0, 1), (1, 2)]  # a long prompt gets a chunk alone
    assert prefill_chunks([], 15) == []


def test_chunks_weigh_padding_against_the_cost_of_a_forward():
    # One long delta among short ones (an episode back with a long tool result): padding all of
    # them to 519 costs 7 x 519 = 3,633 tokens; apart, 519 + 62 + 5 x 22 plus 3 forwards of 32.
    lengths = [519, 62, 22, 16, 16, 16, 16]
    assert prefill_chunks(lengths, 4096, call_tokens=32) == [(0, 1), (1, 2), (2, 7)]
    assert prefill_chunks(lengths, 4096, call_tokens=5700) == [(0, 7)]  # a forward dearer than padding
    # fewest padded tokens plus forwards, not the greedy fill: 3 x 8 + 4 x 2 + 2 x 5 = 42, where
    # [8] [7 7] [2 2 2 2] costs 45 and everything in one 61
    assert prefill_chunks([8, 7, 7, 2, 2, 2, 2], 100, call_tokens=5) == [(0, 3), (3, 7)]
    # the budget still bounds every chunk of more than one prompt
    assert prefill_chunks([10, 6, 6, 5, 4, 3], 15, call_tokens=100) == [(0, 1), (1, 3), (3, 6)]
    assert prefill_chunks([40, 2], 15, call_tokens=0) == [(0, 1), (1, 2)]
    # equal lengths: nothing to save by splitting, as few forwards as the budget allows
    assert prefill_chunks([5] * 7, 15, call_tokens=0) == [(0, 3), (3, 6), (6, 7)]
    assert prefill_chunks([], 15, call_tokens=32) == []


def test_left_padding_positions_and_mask():
    ids, positions, allowed = left_padded([(5, 6, 7), (8,)], pad_id=0, device=torch.device("cpu"))
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert positions.tolist() == [[0, 1, 2], [0, 0, 0]]
    assert allowed.shape == (2, 1, 3, 3)
    assert allowed[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    # row 1: the real token sees only itself; each padding query sees only itself
    assert allowed[1, 0].tolist() == [[True, False, False], [False, True, False], [False, False, True]]
    _, _, none = left_padded([(1, 2), (3, 4)], pad_id=0, device=torch.device("cpu"))
    assert none is None  # nothing padded: plain causal attention

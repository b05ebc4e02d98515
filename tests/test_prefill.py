"""Prefill batching: chunks by padded tokens, left padding, positions and the attention mask."""

from __future__ import annotations

import torch

from grpo.rollout.prefill import left_padded, prefill_chunks


def test_chunks_hold_at_most_the_budget_of_padded_tokens():
    # longest first: 10 | 6 6 (2 x 6 = 12) | 5 4 3 (3 x 5 = 15 <= 15; a fourth would be 20)
    assert prefill_chunks([10, 6, 6, 5, 4, 3], 15) == [(0, 1), (1, 3), (3, 6)]
    assert prefill_chunks([40, 2], 15) == [(0, 1), (1, 2)]  # a long prompt gets a chunk alone
    assert prefill_chunks([], 15) == []


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

"""grpo/forward/prefix_tree.py: a micro-batch packed as a prefix tree, and the policy's packed forward."""

from __future__ import annotations

import pytest
import torch

from grpo.forward.prefix_tree import (
    PackedRows,
    attention_pair_ratio,
    pack_rows,
    packed_cost,
    pair_cost,
    plan_packing,
    real_tokens,
    segments_cost,
    supports_tree_mask,
    trie_order,
)
from grpo.forward.segment_plan import Segment
from tests.test_policy import _assert_grad_close, _grouped_batch, _policy

PAD = 0


def _four_rows():
    """Row 0 [5 6 7 8]; row 1 [5 6 9] right-padded; row 2 [5 6 7] left-padded; row 3 [3 4]."""
    input_ids = torch.tensor([[5, 6, 7, 8], [5, 6, 9, PAD], [PAD, 5, 6, 7], [3, 4, PAD, PAD]])
    attention_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [0, 1, 1, 1], [1, 1, 0, 0]])
    return input_ids, attention_mask


def _allowed_sets(packed: PackedRows, bin_: int = 0) -> list[set[int]]:
    allowed = packed.allowed[bin_, 0]
    return [set(allowed[q].nonzero().flatten().tolist()) for q in range(allowed.shape[0])]


def test_rows_are_packed_as_their_trie_with_ancestor_attention():
    input_ids, attention_mask = _four_rows()
    assert real_tokens(input_ids, attention_mask) == [[5, 6, 7, 8], [5, 6, 9], [5, 6, 7], [3, 4]]
    assert trie_order(real_tokens(input_ids, attention_mask)) == ([3, 2, 0, 1], [0, 0, 3, 2])
    packed = pack_rows(input_ids, attention_mask, [[0, 1, 2, 3]])
    # Trie order: [3 4] (row 3), [5 6 7] (row 2), its child 8 (row 0), then 9 after [5 6] (row 1).
    assert packed.input_ids.tolist() == [[3, 4, 5, 6, 7, 8, 9]]
    assert packed.position_ids.tolist() == [[0, 1, 0, 1, 2, 3, 2]]
    assert _allowed_sets(packed) == [{0}, {0, 1}, {2}, {2, 3}, {2, 3, 4}, {2, 3, 4, 5}, {2, 3, 6}]
    assert packed.token_rows == 7
    # Padded columns read row 7 of the flattened outputs: the zero row after the 7 nodes.
    assert packed.index.tolist() == [[2, 3, 4, 5], [2, 3, 6, 7], [7, 2, 3, 4], [0, 1, 7, 7]]
    hidden = torch.arange(7.0).view(1, 7, 1) + 1  # node n's state: n + 1
    assert packed.unpack(hidden)[..., 0].tolist() == [[3, 4, 5, 6], [3, 4, 7, 0], [0, 3, 4, 5], [1, 2, 0, 0]]
    mask = packed.additive_mask(torch.float32)
    assert mask[0, 0, 6].tolist() == [torch.finfo(torch.float32).min] * 2 + [0, 0] + [torch.finfo(torch.float32).min] * 2 + [0]


def test_bins_pad_to_the_widest_and_unused_slots_see_only_themselves():
    input_ids, attention_mask = _four_rows()
    packed = pack_rows(input_ids, attention_mask, [[0, 2], [1, 3]])
    # Bin 0: [5 6 7 8] and its prefix [5 6 7]: 4 nodes. Bin 1: [3 4] then [5 6 9]: 5 nodes.
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 0], [3, 4, 5, 6, 9]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 0], [0, 1, 0, 1, 2]]
    assert _allowed_sets(packed, 0) == [{0}, {0, 1}, {0, 1, 2}, {0, 1, 2, 3}, {4}]
    assert _allowed_sets(packed, 1) == [{0}, {0, 1}, {2}, {2, 3}, {2, 3, 4}]
    assert packed.index.tolist() == [[0, 1, 2, 3], [7, 8, 9, 10], [10, 0, 1, 2], [5, 6, 10, 10]]


def test_the_cheapest_bins_are_chosen_by_rows_attention_and_calls():
    shared = list(range(100, 110))
    rows = [shared + [200 + 5 * r + k for k in range(5)] for r in range(4)]  # 10 shared + 5 each
    assert packed_cost([30], 0.2, 16) == 30 + 0.2 * 900 + 16
    assert packed_cost([20, 15], 0.2, 16) == 2 * (20 + 0.2 * 400) + 16  # padded to the widest bin
    # One bin of 30 nodes: 226; two of 20 (the prefix twice): 216; four of 15: 256.
    plan = plan_packing(rows, max_tokens=64, pair_cost=0.2, call_tokens=16)
    assert (plan.bins, plan.nodes, plan.cost) == ([[0, 1], [2, 3]], [20, 20], 216.0)
    plan = plan_packing(rows, max_tokens=64, pair_cost=0.01, call_tokens=16)
    assert (plan.bins, plan.nodes, plan.cost) == ([[0, 1, 2, 3]], [30], 55.0)
    plan = plan_packing(rows, max_tokens=15, pair_cost=0.0, call_tokens=16)  # the cap wins
    assert plan.bins == [[0], [1], [2], [3]]
    long_row = plan_packing([list(range(40)), [1, 2]], max_tokens=16, pair_cost=0.0, call_tokens=0)
    assert (long_row.bins, long_row.nodes) == ([[0], [1]], [40, 2])  # a row over the cap: a bin of its own
    assert plan_packing([[], []], 16, 0.0, 0) is None


def test_segment_plan_cost_counts_rows_attention_and_calls():
    rows = torch.arange(4)
    segments = [Segment(0, 10, rows[:1], torch.zeros(4, dtype=torch.long)), Segment(10, 15, rows, rows)]
    # 1 x 10 columns against keys up to 10, then 4 x 5 columns against keys up to 15.
    assert segments_cost(segments, 0.1, 16) == pytest.approx(10 * (1 + 1.0) + 16 + 20 * (1 + 1.5) + 16)


def test_pair_ratio_and_which_models_take_a_tree_mask():
    policy = _policy()
    config = policy.language_model().config
    hidden, heads, inner = config.hidden_size, config.num_attention_heads, config.intermediate_size
    head_dim = config.head_dim
    kv = config.num_key_value_heads
    layer = hidden * head_dim * (2 * heads + 2 * kv) + 3 * hidden * inner
    assert attention_pair_ratio(config) == pytest.approx(2 * heads * head_dim / layer)
    assert supports_tree_mask(config) is None
    assert pair_cost(config, "cpu") == pytest.approx(2.0 * 2 * heads * head_dim / layer)  # PAIR_COST_FACTOR
    assert pair_cost(config, "cuda") is None and pair_cost(config, "mps") is None  # not measured there
    sliding = config.__class__(**{**config.to_dict(), "sliding_window": 8})
    sliding._attn_implementation = "eager"
    assert supports_tree_mask(sliding) == "a sliding attention window"
    flash = config.__class__(**config.to_dict())
    flash._attn_implementation = "flash_attention_2"
    assert "flash_attention_2" in supports_tree_mask(flash)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("lora", [False, True])
def test_the_packed_forward_gives_the_plain_forwards_logprobs_values_and_gradients(lora, attention):
    policy = _policy(lora=lora, attn_implementation=attention)
    input_ids, attention_mask = _grouped_batch()
    # A left-padded fifth row repeating row 0's first 30 tokens: padding on both sides.
    extra_ids = torch.cat([torch.zeros(20, dtype=torch.long), input_ids[0, :30]])
    extra_mask = torch.cat([torch.zeros(20, dtype=torch.long), torch.ones(30, dtype=torch.long)])
    input_ids = torch.cat([input_ids, extra_ids[None]])
    attention_mask = torch.cat([attention_mask, extra_mask[None]])
    # Positions whose state and target are both real tokens (a padded column's state means
    # nothing: the plain forward computes one, the packed forward reads zeros).
    valid = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
    weights = torch.arange(float(input_ids.shape[1] - 1)).expand(input_ids.shape[0], -1) * valid
    results = []
    for packing in (False, True):
        policy.packing, policy.share_prefix_min = packing, 0 if not packing else 16
        layout = policy.forward_layout(input_ids, attention_mask)
        assert isinstance(layout, PackedRows) == packing
        out = policy(input_ids, attention_mask, with_entropy=True, with_values=True)
        grads = torch.autograd.grad(
            (out.logprobs * weights).sum() + (out.values * weights).sum(), policy.trainable_parameters()
        )
        results.append((out, grads, layout))
    (plain, plain_grads, _), (packed, packed_grads, layout) = results
    # 20 template + 2 x 20 group prompt + 10, 7 (right-padded), 10, 10 own tokens; the fifth
    # row is a prefix of row 0: no node of its own.
    assert layout.token_rows == 97
    for got, want in ((packed.logprobs, plain.logprobs), (packed.entropy, plain.entropy), (packed.values, plain.values)):
        torch.testing.assert_close(got[valid], want[valid], atol=1e-5, rtol=0)
    for got, want in zip(packed_grads, plain_grads, strict=True):
        _assert_grad_close(got, want)


def test_layout_falls_back_to_segments_when_packing_is_off_does_not_pay_or_cannot_run():
    policy = _policy()
    input_ids, attention_mask = _grouped_batch()
    # One call for 97 nodes against three segments of 128 token-rows each (the CPU's default).
    assert isinstance(policy.forward_layout(input_ids, attention_mask), PackedRows)
    policy.packing = False
    policy.segment_call_tokens = 16
    assert [(s.start, s.end) for s in policy.forward_layout(input_ids, attention_mask)] == [(0, 20), (20, 40), (40, 50)]
    policy.packing = True
    distinct = torch.randint(0, 2000, (2, 50), generator=torch.Generator().manual_seed(9))
    # Two unrelated full rows: packing saves nothing and adds attention pairs.
    assert isinstance(policy.forward_layout(distinct, torch.ones_like(distinct)), list)
    policy.language_model().config._attn_implementation = "flex_attention"
    assert pair_cost(policy.language_model().config, "cpu") is None
    assert isinstance(policy.forward_layout(input_ids, attention_mask), list)


def test_packing_runs_under_gradient_checkpointing():
    policy = _policy(gradient_checkpointing=True)
    input_ids, attention_mask = _grouped_batch()
    assert isinstance(policy.forward_layout(input_ids, attention_mask), PackedRows)
    out = policy(input_ids, attention_mask)
    policy.packing = False
    with torch.no_grad():
        plain = policy(input_ids, attention_mask)
    valid = attention_mask[:, 1:].bool()
    torch.testing.assert_close(out.logprobs[valid], plain.logprobs[valid], atol=1e-5, rtol=0)
    out.logprobs[valid].sum().backward()
    assert all(p.grad is not None for p in policy.language_model().parameters() if p.requires_grad)

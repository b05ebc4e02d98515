"""grpo/forward/segment_plan.py: which column segments of a training batch run for which rows."""

from __future__ import annotations

import itertools

import torch

from grpo.forward.segment_plan import common_prefix_lengths, plan_segments


def _ids(*parts_per_row: list[list[int]]) -> torch.Tensor:
    return torch.tensor([list(itertools.chain.from_iterable(parts)) for parts in parts_per_row])


def _plan(input_ids, attention_mask=None, min_tokens=16, call_tokens=16):
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    return [(s.start, s.end, s.rows.tolist(), s.owner.tolist())
            for s in plan_segments(input_ids, attention_mask, min_tokens, call_tokens)]


TEMPLATE = list(range(100, 120))  # 20 tokens every row starts with
TASK_A, TASK_B = list(range(200, 220)), list(range(300, 320))  # a group's further 20 prompt tokens


def _tail(seed: int) -> list[int]:
    return torch.randint(1000, 2000, (10,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_common_prefix_lengths_stop_at_the_first_difference_or_padding():
    input_ids = torch.tensor([[1, 2, 3, 4], [1, 2, 9, 4], [1, 2, 3, 4], [5, 2, 3, 4]])
    attention_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]])
    assert common_prefix_lengths(input_ids, attention_mask).tolist() == [
        [4, 2, 3, 0],
        [2, 4, 2, 0],
        [3, 2, 3, 0],  # row 2's padded last column ends its agreement with row 0
        [0, 0, 0, 4],
    ]


def test_a_batch_wide_prefix_then_each_groups_prompt_run_once():
    # Two groups of two (rows 0, 2 and 1, 3, interleaved as a length sort leaves them).
    input_ids = _ids([TEMPLATE, TASK_A, _tail(0)], [TEMPLATE, TASK_B, _tail(1)],
                     [TEMPLATE, TASK_A, _tail(2)], [TEMPLATE, TASK_B, _tail(3)])  # [4, 50]
    # Costs (token-rows + 16 per call): plain 216; [0,40) x2 then all 152; below 148.
    assert _plan(input_ids) == [
        (0, 20, [0], [0, 0, 0, 0]),
        (20, 40, [0, 1], [0, 1, 0, 1]),
        (40, 50, [0, 1, 2, 3], [0, 1, 2, 3]),
    ]


def test_the_cut_weighs_token_rows_against_what_each_segment_costs():
    input_ids = _ids([TEMPLATE, TASK_A, _tail(0)], [TEMPLATE, TASK_B, _tail(1)],
                     [TEMPLATE, TASK_A, _tail(2)], [TEMPLATE, TASK_B, _tail(3)])  # [4, 50]
    # A segment costing 30: both groups' whole prompts [0, 40) twice (80 + 30), then every row
    # (40 + 30) = 180 beats the three segments (190), the template alone (200) and no cut (230).
    assert [s[:3] for s in _plan(input_ids, call_tokens=30)] == [(0, 40, [0, 1]), (40, 50, [0, 1, 2, 3])]
    # Costing 100: no cut (300) beats every other (320 at best).
    assert [s[:3] for s in _plan(input_ids, call_tokens=100)] == [(0, 50, [0, 1, 2, 3])]


def test_a_shared_prefix_shorter_than_min_tokens_is_not_cut():
    input_ids = _ids([TEMPLATE[:10], _tail(0)], [TEMPLATE[:10], _tail(1)], [TEMPLATE[:10], _tail(2)])
    assert _plan(input_ids) == [(0, 20, [0, 1, 2], [0, 1, 2])]
    assert _plan(input_ids, min_tokens=8)[0] == (0, 10, [0], [0, 0, 0])
    assert _plan(input_ids, min_tokens=0) == [(0, 20, [0, 1, 2], [0, 1, 2])]  # 0: never share
    assert _plan(input_ids[:1]) == [(0, 20, [0], [0])]  # one row: nothing to share


def test_a_segment_must_save_more_than_the_call_it_adds():
    # Four rows share 20 columns; rows 0 and 1 share 16 more: the second segment would save 16
    # token-rows for one more call (16): a tie, and the fewer calls win. 18 more columns pay.
    def batch(extra: int):
        more = list(range(400, 400 + extra))
        return _ids([TEMPLATE, more, _tail(0)[: 20 - extra]], [TEMPLATE, more, _tail(1)[: 20 - extra]],
                    [TEMPLATE, _tail(2), _tail(5)], [TEMPLATE, _tail(3), _tail(6)])

    assert [s[:3] for s in _plan(batch(16))] == [(0, 20, [0]), (20, 40, [0, 1, 2, 3])]
    assert [s[:3] for s in _plan(batch(18))] == [(0, 20, [0]), (20, 38, [0, 2, 3]), (38, 40, [0, 1, 2, 3])]


def test_identical_rows_share_all_but_their_last_column():
    row = TEMPLATE + _tail(0)
    input_ids = torch.tensor([row, row, list(range(500, 530))])  # rows 0 and 1 equal, row 2 apart
    # [0, 29) for rows 0 and 2 (58 + 16), then every row's last column (3 + 16): 93 < plain 106.
    assert _plan(input_ids) == [(0, 29, [0, 2], [0, 0, 1]), (29, 30, [0, 1, 2], [0, 1, 2])]


def test_a_padded_column_agrees_with_no_row():
    input_ids = _ids([TEMPLATE, _tail(0)], [TEMPLATE, _tail(1)], [TEMPLATE, _tail(2)])
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :2] = 0  # row 1 is left-padded: it shares nothing, and runs its own prefix
    assert _plan(input_ids, attention_mask) == [(0, 20, [0, 1], [0, 1, 0]), (20, 30, [0, 1, 2], [0, 1, 2])]

"""Segments (one micro-batch): its columns cut into segments, each run once per distinct prefix.

A GRPO batch repeats itself: every row starts with the same chat template and system prompt (and
tool docs), and the G rows of a group share their whole prompt. The decoder's work on a token
depends only on the tokens before it, so rows that agree up to column c need the columns before c
computed once. `plan_segments` cuts the columns [0, T) into segments [start, end) and, for each,
picks the rows that run it: one row per distinct prefix [0, end). Each of those continues the KV
cache of the row that ran its prefix in the previous segment; the last segment runs every row.
The hidden states and gradients are those of the plain forward (the shared nodes sum their rows'
gradients through autograd); only the decoder work shrinks.

The cut is chosen by dynamic programming over the columns where the number of distinct prefixes
changes (at most one per row), minimising the token-rows run plus `call_tokens` per segment, with
every shared segment at least `min_tokens` columns long. A segment is a decoder call of its own
(its own per-layer kernels, smaller matrix products, and with gradients their backward):
SEGMENT_CALL_TOKENS gives what that costs, in token-rows. `run_segments` runs a plan through a
decoder.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from grpo.forward.cache_argument import cache_keyword, output_cache

SEGMENT_CALL_TOKENS = {"cpu": (128, 64), "cuda": (4096, 2048), "mps": (1024, 512)}
"""What one more segment costs, in token-rows, per device type: (with gradients, without). On the
2-core CPU (SmolLM2-135M, bf16 autocast; a micro-batch's last segment cut into 4 with no rows
saved): a full fine-tune's forward+backward takes 0.24-0.31 s longer per extra segment at
16 x 96 tokens and 0.43-0.55 s at 8 x 363, i.e. 75-150 token-rows (LoRA at 16 x 96: 0.26 s, 98);
a no-grad forward 0.07-0.11 s, 65-90 token-rows.
The CUDA and MPS values are estimates (a call there is launch-bound up to thousands of tokens).
`python -m bench.segment_cost --device ...` measures the figure on a machine. On a GPU the cost
of a call grows with its size (about 1,700 token-rows at 16 x 96 and 8,500 at 64 x 384), so no
one constant fits both, and the CUDA values stay estimates."""


@dataclass(frozen=True)
class Segment:
    """Columns [start, end) run for `rows` (ascending batch rows, one per distinct prefix
    [0, end)); `owner[b]` is the index into `rows` of the row that runs batch row b's prefix."""

    start: int
    end: int
    rows: torch.Tensor  # [k] long
    owner: torch.Tensor  # [B] long, values in [0, k)


def common_prefix_lengths(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, B]: how many leading columns rows i and j agree on, counting real tokens only (a padded
    column ends the agreement); the diagonal holds each row's run of leading real tokens."""
    valid = attention_mask.bool()  # [B, T]
    rows = []
    for i in range(input_ids.shape[0]):  # one [B, T] comparison at a time: no [B, B, T] tensor
        same = (input_ids == input_ids[i]) & valid & valid[i]  # [B, T]
        rows.append(same.long().cumprod(-1).sum(-1))  # [B]
    return torch.stack(rows)  # [B, B]


def _owners(common: torch.Tensor, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, owner) of the distinct prefixes [0, end): each row's owner is the first row that
    agrees with it on all `end` columns (itself when none before it does)."""
    batch = common.shape[0]
    agree = common >= end  # [B, B], an equivalence on the rows that reach `end`
    agree |= torch.eye(batch, dtype=torch.bool, device=common.device)
    first = agree.long().argmax(-1)  # [B]: the first agreeing row
    rows = torch.unique(first)  # [k] ascending
    return rows, torch.searchsorted(rows, first)


def plan_segments(input_ids: torch.Tensor, attention_mask: torch.Tensor, min_tokens: int,
                  call_tokens: int) -> list[Segment]:
    """The segments to run, in column order; a single segment [0, T) over every row when nothing
    is worth sharing (`min_tokens` <= 0, one row, no long enough common prefix, or none that
    saves more than the `call_tokens` its segment costs)."""
    batch, length = input_ids.shape
    everyone = torch.arange(batch, device=input_ids.device)
    plain = [Segment(0, length, everyone, everyone)]
    if min_tokens <= 0 or batch < 2 or length < 2:
        return plain
    common = common_prefix_lengths(input_ids, attention_mask)  # [B, B]
    # Row i starts a new distinct prefix of length c iff c > reach[i], its longest agreement with
    # an earlier row: so the number of distinct prefixes changes only at those values.
    earlier = torch.ones(batch, batch, dtype=torch.bool, device=common.device).tril(-1)
    reach = common.masked_fill(~earlier, -1).max(-1).values  # [B]; -1 for row 0
    reach = reach.clamp(max=length - 1).tolist()  # the last segment keeps at least one column
    cuts = sorted({c for c in reach if c >= min_tokens})
    if not cuts:
        return plain

    def distinct(end: int) -> int:
        return sum(1 for r in reach if r < end)

    # best[e]: (cost, segments) of running [0, e) ending with a segment cut at e.
    ends = [0, *cuts, length]
    best: dict[int, tuple[int, int]] = {0: (0, 0)}
    came_from: dict[int, int] = {}
    for index, end in enumerate(ends[1:], start=1):
        rows_run = batch if end == length else distinct(end)
        for start in ends[:index]:  # every earlier end is reachable: from 0 at least
            if end != length and end - start < min_tokens:
                continue
            cost, count = best[start]
            option = (cost + rows_run * (end - start) + call_tokens, count + 1)
            if end not in best or option < best[end]:
                best[end], came_from[end] = option, start
    chosen = [length]
    while chosen[-1] != 0:
        chosen.append(came_from[chosen[-1]])
    chosen.reverse()  # [0, c1, ..., T]
    if len(chosen) == 2:
        return plain
    segments = []
    for start, end in itertools.pairwise(chosen):
        if end == length:
            segments.append(Segment(start, end, everyone, everyone))
        else:
            rows, owner = _owners(common, end)
            segments.append(Segment(start, end, rows, owner))
    return segments


def run_segments(decoder, input_ids, attention_mask, position_ids, segments: list[Segment],
                 cache=None) -> torch.Tensor:
    """[B, segments' columns, H]: the segments in order, each continuing the KV cache of the
    rows that ran the one before (the first continues `cache`, sized to its rows, if given)."""
    pieces, previous, keyword = [], None, cache_keyword(decoder)
    for segment in segments:
        rows, cols = segment.rows, slice(segment.start, segment.end)
        if previous is not None:
            cache.batch_select_indices(previous.owner[rows])  # [k_prev] -> [k], differentiable
        out = decoder(
            input_ids=input_ids[rows, cols],
            attention_mask=attention_mask[rows, : segment.end],  # cached columns and these
            position_ids=position_ids[rows, cols],
            **{keyword: cache},
            use_cache=True,
        )
        cache, previous, hidden = output_cache(out), segment, out.last_hidden_state
        if len(rows) < len(segment.owner):  # each row's copy of its prefix's states
            hidden = hidden.index_select(0, segment.owner)
        pieces.append(hidden)  # [B, end - start, H]
    return torch.cat(pieces, dim=1)  # [B, T, H]

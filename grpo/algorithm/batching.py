"""Trajectories as padded tensors: the minibatches of an epoch, micro-batches of length-sorted rows
cut where padding costs more than another call, and per-row values placed back onto a
micro-batch's target positions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from grpo.trajectory import Trajectory


@dataclass
class MicroBatch:
    index: torch.Tensor  # [b] rows of the step's trajectory list
    input_ids: torch.Tensor  # [b, L]
    attention_mask: torch.Tensor  # [b, L]
    loss_mask: torch.Tensor  # [b, L-1] aligned to targets input_ids[:, 1:]
    behavior_logprobs: torch.Tensor  # [b, L-1]


def collate(trajectories: Sequence[Trajectory], rows: list[int], pad_id: int, device) -> MicroBatch:
    length = max(len(trajectories[i].token_ids) for i in rows)
    b = len(rows)
    input_ids = torch.full((b, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((b, length), dtype=torch.long)
    loss_mask = torch.zeros((b, length - 1), dtype=torch.bool)
    behavior = torch.zeros((b, length - 1), dtype=torch.float32)
    for r, i in enumerate(rows):
        t = trajectories[i]
        n = len(t.token_ids)
        input_ids[r, :n] = torch.tensor(t.token_ids)
        attention_mask[r, :n] = 1
        # Target position j scores token j + 1: shift the per-token lists left by one.
        loss_mask[r, : n - 1] = torch.tensor(t.loss_mask[1:], dtype=torch.bool)
        behavior[r, : n - 1] = torch.tensor(t.behavior_logprobs[1:])
    return MicroBatch(torch.tensor(rows), input_ids.to(device), attention_mask.to(device),
                      loss_mask.to(device), behavior.to(device))


def minibatch_order(num_rows: int, num_minibatches: int, shuffle: bool) -> list[list[int]]:
    """One epoch's minibatches of row indices: a fresh permutation from torch's global generator
    when `shuffle` (so every step and epoch gets its own, and a resumed run, whose checkpoint
    restores that generator, the same as an uninterrupted one), else the rows in order."""
    order = torch.randperm(num_rows).tolist() if shuffle else list(range(num_rows))
    return [order[part::num_minibatches] for part in range(num_minibatches)]


DEFAULT_OVERHEAD_TOKENS = {"cpu": 256, "cuda": 4096, "mps": 1024}
"""What one more micro-batch costs, in padded tokens, per device type (`overhead_tokens` of
`micro_batch_rows` when a config leaves it null). On the 2-core CPU a full fine-tune of
SmolLM2-135M costs about 0.34 s per forward/backward call plus 1.3 ms per padded token (weight
casts and gradient accumulation are per call and weight-sized): ~256 tokens. The CUDA and MPS
values are estimates (a call there is launch-bound up to thousands of tokens), not measured."""


FEWEST_CALLS = 1 << 40
"""An `overhead_tokens` above any padding: the fewest micro-batches (ceil(rows / size) without a
token cap), then the least padding among those cuts. Data-parallel ranks use it: each forward and
backward runs collectives, so every rank must run as many as the others."""


def micro_batch_rows(lengths: dict[int, int], rows: list[int], size: int,
                     max_tokens: int | None = None, overhead_tokens: int = 0) -> list[list[int]]:
    """Rows sorted by length, cut into groups of at most `size` rows and, with `max_tokens`, at
    most that many padded tokens (rows x the group's longest length; a single longer row still
    gets a group of its own). Among all such cuts of the sorted rows, the one with the least
    padded tokens + `overhead_tokens` per group (what a forward/backward call costs beyond its
    tokens), fewer groups on a tie: a batch of short and long rows is split where the padding
    it saves outweighs one more call, and kept whole where not."""
    order = sorted(rows, key=lambda i: lengths[i])
    n = len(order)
    # best[j]: (cost, groups) of the best cut of order[:j]; start[j]: where its last group starts.
    best: list[tuple[int, int]] = [(0, 0)] + [(0, 0)] * n
    start = [0] * (n + 1)
    for j in range(1, n + 1):
        longest = lengths[order[j - 1]]
        candidate = None
        for i in range(j - 1, max(j - size, 0) - 1, -1):
            rows_in = j - i
            if rows_in > 1 and max_tokens is not None and rows_in * longest > max_tokens:
                break
            if candidate is not None and rows_in * longest + overhead_tokens > candidate[0]:
                break  # best[i] >= 0: this group alone costs more already, and longer ones more
            cost, groups = best[i]
            option = (cost + rows_in * longest + overhead_tokens, groups + 1)
            if candidate is None or option < candidate:
                candidate, start[j] = option, i
        best[j] = candidate
    groups: list[list[int]] = []
    j = n
    while j > 0:
        groups.append(order[start[j]:j])
        j = start[j]
    return groups[::-1]


def micro_batches(trajectories: Sequence[Trajectory], rows: list[int], size: int, pad_id: int,
                  device, max_tokens: int | None = None,
                  overhead_tokens: int | None = None) -> list[MicroBatch]:
    """Collated micro-batches of `rows` (`micro_batch_rows`); `overhead_tokens` None takes the
    device type's default (DEFAULT_OVERHEAD_TOKENS)."""
    if overhead_tokens is None:
        overhead_tokens = DEFAULT_OVERHEAD_TOKENS.get(torch.device(device).type, 0)
    lengths = {i: len(trajectories[i].token_ids) for i in rows}
    return [collate(trajectories, group, pad_id, device)
            for group in micro_batch_rows(lengths, rows, size, max_tokens, overhead_tokens)]


def scatter(per_row: dict[int, torch.Tensor], mb: MicroBatch) -> torch.Tensor:
    """[b, L-1] fp32: each row's 1-D values over target positions, padded with 0. The rows are
    padded where they are and copied to the micro-batch's device at once: row by row, values
    kept on the host (advantages, returns) would cost a synchronising host-to-device copy each,
    hundreds per micro-batch on a GPU."""
    width = mb.loss_mask.shape[1]
    rows = [per_row[i][:width].float() for i in mb.index.tolist()]
    padded = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)  # [b, longest row]
    out = torch.zeros(mb.loss_mask.shape, device=mb.loss_mask.device)  # [b, L-1]
    out[:, : padded.shape[1]] = padded
    return out

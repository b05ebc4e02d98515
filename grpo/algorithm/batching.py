"""Trajectories as padded tensors: the minibatches of an epoch, micro-batches sorted by length,
and per-row values placed back onto a micro-batch's target positions."""

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


def micro_batch_rows(lengths: dict[int, int], rows: list[int], size: int,
                     max_tokens: int | None = None) -> list[list[int]]:
    """Rows sorted by length (padding, i.e. wasted compute, stays small inside each group), cut
    into groups of at most `size` rows and, with `max_tokens`, at most that many padded tokens
    (rows x the group's longest length; a single longer row still gets a group of its own)."""
    rows = sorted(rows, key=lambda i: lengths[i])
    groups: list[list[int]] = []
    for i in rows:
        group = groups[-1] if groups else None
        if (group is None or len(group) >= size
                or (max_tokens is not None and (len(group) + 1) * lengths[i] > max_tokens)):
            groups.append([i])
        else:
            group.append(i)
    return groups


def micro_batches(trajectories: Sequence[Trajectory], rows: list[int], size: int, pad_id: int,
                  device, max_tokens: int | None = None) -> list[MicroBatch]:
    lengths = {i: len(trajectories[i].token_ids) for i in rows}
    return [collate(trajectories, group, pad_id, device)
            for group in micro_batch_rows(lengths, rows, size, max_tokens)]


def scatter(per_row: dict[int, torch.Tensor], mb: MicroBatch) -> torch.Tensor:
    """[b, L-1]: each row's 1-D values over target positions, padded with 0."""
    width = mb.loss_mask.shape[1]
    out = torch.zeros(mb.loss_mask.shape, device=mb.loss_mask.device)  # [b, L-1]
    for r, i in enumerate(mb.index.tolist()):
        row = per_row[i][:width]
        out[r, : row.shape[0]] = row
    return out

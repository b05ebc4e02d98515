"""Prompt prefill for HFEngine: unique prompts, longest first, in left-padded chunks.

Prompts are right-aligned at one column (the longest prompt's length), so every row's first
sampled token lands in the same cache column. A chunk holds at most `chunk_tokens` padded tokens
(rows x the chunk's first, longest, prompt): it bounds a prefill forward's activation memory, and
on a GPU, where a forward's cost is mostly launches, larger chunks mean fewer forwards (half
the prefill time in chunks of 32768 as of 4096). Within that bound the engine splits
where the padding saved is worth more than a forward (`prefill_chunks`, PREFILL_CALL_TOKENS).

Prompts that join together and start alike (a chat template's system prompt, the tool docs, the
task instructions) share one prefill of their common prefix: it runs once in one row and is
copied to the others, and only each prompt's own rest is prefilled per row
(`shared_prefix_length`; the layout in grpo/rollout/hf/live_batch.py `LiveBatch.append`).
"""

from __future__ import annotations

import torch

from grpo.forward.common_prefix import leading_prefix_length

PREFILL_CALL_TOKENS = {"cpu": 32, "cuda": 5700}
"""A prefill forward's fixed cost in prompt tokens' worth, per device type (`prefill_chunks`:
where the padding a split saves is worth more than one more forward): a forward's own cost (its
weights read once, its kernels launched) over one more prompt token's, from timing SmolLM2-135M's
prefill at several lengths on each kind of device. A device type not listed keeps the fewest
forwards the budget allows."""


def prefill_chunks(
    lengths: list[int], chunk_tokens: int, call_tokens: int | None = None
) -> list[tuple[int, int]]:
    """[start, end) ranges over prompts sorted longest first: each holds at least one prompt and
    otherwise at most `chunk_tokens` padded tokens (rows x its first, longest, prompt).

    `call_tokens` None: as few chunks as that allows, each filled in turn. Otherwise the split
    with the fewest padded tokens plus `call_tokens` per chunk (a forward's fixed cost,
    PREFILL_CALL_TOKENS), so one long prompt does not pad every short one beside it to its
    length: the episodes that come back from their tools together carry new parts of 16 to 500+
    tokens."""
    if call_tokens is None or not lengths or lengths[0] == lengths[-1]:
        return _filled_chunks(lengths, chunk_tokens)
    # cost[end]: the cheapest split of lengths[:end]; its last chunk starts at first[end].
    cost = [0] + [float("inf")] * len(lengths)
    first = [0] * (len(lengths) + 1)
    for end in range(1, len(lengths) + 1):
        for start in range(end - 1, -1, -1):  # the chunk [start, end), growing leftwards
            padded = (end - start) * lengths[start]
            if end - start > 1 and padded > chunk_tokens:
                break  # longer chunks start at longer prompts: only more padded tokens
            if cost[start] + call_tokens + padded < cost[end]:
                cost[end], first[end] = cost[start] + call_tokens + padded, start
    chunks, end = [], len(lengths)
    while end:
        chunks.append((first[end], end))
        end = first[end]
    return chunks[::-1]


def _filled_chunks(lengths: list[int], chunk_tokens: int) -> list[tuple[int, int]]:
    chunks: list[tuple[int, int]] = []
    start = 0
    while start < len(lengths):
        end = start + 1  # longest first: the chunk's padded length is its first prompt's
        while end < len(lengths) and (end - start + 1) * lengths[start] <= chunk_tokens:
            end += 1
        chunks.append((start, end))
        start = end
    return chunks


def shared_prefix_length(prompts: list[tuple[int, ...]], min_saved_tokens: int) -> int:
    """How many leading tokens the distinct `prompts` share and prefill once: their common
    prefix, at most the shortest prompt's length less one (a prompt's last token runs in its own
    row: its logits give the first sample). 0 when sharing would save fewer than
    `min_saved_tokens` prefill tokens (prefix x (prompts - 1)), or min_saved_tokens is 0: the
    prefix costs a forward of its own and the copies (HFEngine's default 64 estimates that; not
    measured)."""
    if len(prompts) < 2 or min_saved_tokens <= 0:
        return 0
    shared = leading_prefix_length(prompts)
    return shared if shared > 0 and shared * (len(prompts) - 1) >= min_saved_tokens else 0


def left_padded(
    prompts: list[tuple[int, ...]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Prompts (longest first) as a left-padded batch: ids [n, L], position ids [n, L] (counting
    real tokens from 0), and the boolean "may attend" mask [n, 1, L, L] (None when nothing is
    padded: plain causal attention). Padding queries see only themselves: finite states that no
    real token reads."""
    length = len(prompts[0])
    # Built on the host and moved once (a copy per prompt costs a device round trip each).
    pad = torch.tensor([length - len(p) for p in prompts])  # [n]
    ids = torch.full((len(prompts), length), pad_id, dtype=torch.long)  # [n, L]
    for j, prompt in enumerate(prompts):
        ids[j, length - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
    no_padding = bool((pad == 0).all())
    ids, pad = ids.to(device), pad.to(device)
    columns = torch.arange(length, device=device)  # [L]
    positions = (columns.unsqueeze(0) - pad.unsqueeze(1)).clamp_(min=0)  # [n, L]
    if no_padding:
        return ids, positions, None
    causal = columns.unsqueeze(1) >= columns.unsqueeze(0)  # [L(q), L(k)]
    real_key = columns.unsqueeze(0) >= pad.unsqueeze(1)  # [n, L(k)]
    allowed = causal.unsqueeze(0) & real_key.unsqueeze(1)  # [n, L, L]
    allowed |= torch.eye(length, dtype=torch.bool, device=device).unsqueeze(0)
    return ids, positions, allowed.unsqueeze(1)  # [n, 1, L, L]

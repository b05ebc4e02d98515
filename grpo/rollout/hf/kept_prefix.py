"""A live batch's kept prefix: which rows hold it, when a batch keeps one, what a decode step reads.

A multi-turn batch's rows start alike: the chat template, the system prompt and the tool docs,
often hundreds of tokens, before each task's own words. The batch's cache may keep that prefix
once (grpo/rollout/hf/kv_cache.py `keep_prefix`). A row *holds* it when its columns [start, start + P)
are that prefix's keys and values bit for bit; decode steps then attend to the prefix once for all
holders (grpo/rollout/hf/decode_attention.py `_shared_prefix_decode`) and read only the rest of each
row from the cache, and rows that join with it get it written instead of prefilled
(grpo/rollout/hf/decode_loop.py).

A batch keeps a prefix (HFEngine `prefix_attention_min_tokens` tokens at least) when
- distinct prompts that join it together share one: the shared-prefix prefill runs it once in one
  row and copies it to the others, so they all hold it (batch_prefill.py `_add_group`);
- or, under continuous batching, where tasks' first turns join one group at a time, a joining
  prompt shares one with a row already in the batch (`adopt`): it is kept from that row, and the
  rows whose columns equal it bit for bit (the copies of the same prompt's prefill) hold it.
It keeps one prefix at a time, and a new one only once no row holds the old.
"""

from __future__ import annotations

import torch

from grpo.forward.common_prefix import common_prefix_length, leading_prefix_length
from grpo.rollout.hf.live_batch import LiveBatch


def _contiguous(batch: LiveBatch, row: int, length: int) -> bool:
    """Are row `row`'s first `length` tokens in its first `length` columns (no gap)?"""
    start = batch.starts[row]
    return bool(batch.allowed[row, start : start + length].all())


def may_keep(batch: LiveBatch, min_tokens: int) -> bool:
    """May `batch` keep a new prefix? Where prefixes are kept at all (`min_tokens` > 0: HFEngine
    `prefix_attention_min_tokens`), and while no row holds the one kept before."""
    return min_tokens > 0 and not any(batch.holds_prefix)


def starts_with_kept(batch: LiveBatch, prompt: tuple[int, ...]) -> bool:
    """Does `prompt` start with the prefix `batch` keeps, and go on past it?"""
    kept = batch.cache.prefix_tokens
    return bool(kept) and len(prompt) > len(kept) and prompt[: len(kept)] == kept


def adopt(batch: LiveBatch, prompts: list[tuple[int, ...]], min_tokens: int) -> bool:
    """Keep, from a row already in `batch`, the prefix the joining `prompts` share with its prompt
    (at least `min_tokens` tokens, every prompt keeping a token of its own), where the batch may
    keep one (`may_keep`). Marks the rows that hold it; True when one was kept."""
    if not batch.rows or not may_keep(batch, min_tokens):
        return False
    cache, shared = batch.cache, leading_prefix_length(prompts)
    if shared < min_tokens:
        return False
    for b, row in enumerate(batch.rows):
        length = min(shared, common_prefix_length([prompts[0], row.prompt_ids]))
        if length < min_tokens or not _contiguous(batch, b, length):
            continue
        tokens = row.prompt_ids[:length]
        cache.keep_prefix(tokens, b, batch.starts[b])
        batch.holds_prefix = [
            c == b
            or (
                other.prompt_ids[:length] == tokens
                and _contiguous(batch, c, length)
                and cache.holds_prefix(c, batch.starts[c])
            )
            for c, other in enumerate(batch.rows)
        ]
        return True
    return False


def decode_window(batch: LiveBatch, min_cells: int) -> tuple[int, torch.Tensor, bool]:
    """What the next decode forward of `batch` attends: (the first cache column it reads, the
    "may attend" mask [B, 1, 1, columns], whether it attends the kept prefix first). With a kept
    prefix of P tokens that rows hold, the cache is read from the first column some row needs
    beyond it, and the mask's first P columns say which rows hold it -- where that reads at least
    `min_cells` (>= 1) fewer cache cells (rows x columns): below that its fixed cost is more than
    the reads it saves (HFEngine `prefix_attention_min_cells`)."""
    lo, end = min(batch.starts), batch.pos + 1
    prefix = len(batch.cache.prefix_tokens)
    if prefix and any(batch.holds_prefix):
        own = [s + prefix if h else s for s, h in zip(batch.starts, batch.holds_prefix)]
        own_lo = min(own)
        if (own_lo - lo) * len(batch.rows) >= max(min_cells, 1):
            columns = batch.allowed[:, own_lo:end]
            if max(own) > own_lo:  # a holder's prefix columns inside the window: not twice
                first = torch.tensor(own, device=batch.device).unsqueeze(1)
                columns = columns & (torch.arange(own_lo, end, device=batch.device) >= first)
            holders = torch.tensor(batch.holds_prefix, device=batch.device).unsqueeze(1)
            allowed = torch.cat([holders.expand(-1, prefix), columns], dim=1)
            return own_lo, allowed[:, None, None], True
    return lo, batch.allowed[:, None, None, lo:end], False

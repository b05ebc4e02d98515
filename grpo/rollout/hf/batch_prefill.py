"""How requests admitted to HFEngine's live batch get into its rows and KV cache: `BatchPrefill`.

New requests are prefilled into the rows after the live ones (grpo/rollout/hf/decode_loop.py
`_admit`): unique prompts once, longest first, in left-padded chunks (prefill.py), each fanned out
to its samples' rows; a prefix that the joining prompts share is prefilled once and copied
(`shared_prefix_min_tokens`), and a prefix the batch keeps (kept_prefix.py) is written, not
prefilled. Parked sessions' next turns prefill only their new tokens into their own rows
(`resume`), after the columns their rows already hold.
"""

from __future__ import annotations

import torch

from grpo.rollout.config import HFEngineConfig
from grpo.rollout.hf.kept_prefix import adopt, may_keep, starts_with_kept
from grpo.rollout.hf.kv_cache import PreallocatedCache
from grpo.rollout.hf.live_batch import LiveBatch
from grpo.rollout.hf.prefill import (
    PREFILL_CALL_TOKENS,
    left_padded,
    prefill_chunks,
    shared_prefix_length,
)
from grpo.rollout.hf.runner import ModelRunner
from grpo.rollout.hf.sequence import Joiner


class BatchPrefill:
    """Prefill forwards into a live batch's rows (see the module docstring), through `runner`
    with the engine's resolved `settings`."""

    def __init__(self, runner: ModelRunner, settings: HFEngineConfig) -> None:
        self.runner = runner
        self.settings = settings
        self.device = runner.device
        self.prefill_call_tokens = PREFILL_CALL_TOKENS.get(runner.device.type)

    def new_rows(self, batch: LiveBatch, joiners: list[Joiner], metrics: dict) -> None:
        """Prefill `joiners` into the rows after the batch's, each prompt ending at pos - 1.
        Those whose prompts start with the batch's kept prefix get it written, not prefilled;
        the others' prompts are prefilled (a prefix they all share once: `_prefill_shared`).
        (grpo/rollout/hf/kept_prefix.py: when a batch keeps a prefix, and from which rows.)"""
        adopt(batch, sorted({j.prompt for j in joiners}), self.settings.prefix_attention_min_tokens)
        holders = [j for j in joiners if starts_with_kept(batch, j.prompt)]
        tickets = {j.ticket for j in holders}
        others = [j for j in joiners if j.ticket not in tickets]
        for group, with_kept in ((holders, True), (others, False)):
            if group:
                self._add_group(batch, group, metrics, with_kept=with_kept)

    def _add_group(
        self, batch: LiveBatch, joiners: list[Joiner], metrics: dict, *, with_kept: bool
    ) -> None:
        """`new_rows` for joiners that all start with the kept prefix (`with_kept`) or not."""
        # Unique prompts, longest first; the rows of one prompt adjacent.
        groups: dict[tuple[int, ...], list[Joiner]] = {}
        for joiner in joiners:
            groups.setdefault(joiner.prompt, []).append(joiner)
        prompts = sorted(groups, key=len, reverse=True)
        ordered = [joiner for prompt in prompts for joiner in groups[prompt]]
        source = torch.tensor(
            [u for u, prompt in enumerate(prompts) for _ in groups[prompt]],
            device=self.device,
        )  # [n]: each row's prompt
        first, pos = len(batch.rows), batch.pos
        cache = batch.cache
        cache.zero(slice(first, first + len(ordered)), 0, pos)
        saved = 0
        if with_kept:
            shared, holds = len(cache.prefix_tokens), True
            prompt_logits = self._prefill_shared(prompts, shared, cache, pos, first, kept=True)
            metrics["kept_prefix_tokens"] += float(shared * len(prompts))
        else:
            shared = shared_prefix_length(prompts, self.settings.shared_prefix_min_tokens)
            min_tokens = self.settings.prefix_attention_min_tokens
            holds = shared >= max(min_tokens, 1) and may_keep(batch, min_tokens)
            if shared:
                prompt_logits = self._prefill_shared(prompts, shared, cache, pos, first)
                metrics["prefill_tokens"] += float(shared)
                saved = shared * (len(prompts) - 1)
            else:
                prompt_logits = self.prompts(prompts, cache, pos, first)  # [U, V]
            if holds:
                cache.keep_prefix(prompts[0][:shared], first, pos - len(prompts[0]))
        if len(ordered) > len(prompts):  # fan each prompt out to its samples
            cache.copy_rows(source + first, pos - len(prompts[0]), pos, first=first)
        batch.append(ordered, prompt_logits[source], shared=shared, holds_prefix=holds)
        metrics["prefill_tokens"] += float(sum(len(p) - shared for p in prompts))
        metrics["shared_prefix_tokens"] += float(saved)

    def resume(self, batch: LiveBatch, returning: list[tuple[int, Joiner]], metrics) -> None:
        """Prefill the new tokens of parked sessions' next turns into their own rows, in chunks
        of at most `prefill_chunk_tokens` padded tokens (longest first). A chunk whose longest new
        part has D tokens writes the left-padded block of columns [pos - D, pos): `plan` put pos
        right of every returning row's last column plus the longest new part of all."""
        cached = {b: batch.rows[b].cached for b, _ in returning}
        by_length = sorted(returning, key=lambda entry: len(entry[1].prompt) - cached[entry[0]])
        by_length.reverse()
        lengths = [len(j.prompt) - cached[b] for b, j in by_length]
        for start, end in self._chunks(lengths):
            self._resume_chunk(
                batch, by_length[start:end], [cached[b] for b, _ in by_length[start:end]]
            )
        metrics["prefill_tokens"] += float(sum(lengths))
        metrics["resumed_requests"] += len(returning)

    def _resume_chunk(self, batch: LiveBatch, returning, cached: list[int]) -> None:
        pos = batch.pos
        rows = [b for b, _ in returning]
        deltas = [j.prompt[c:] for (_, j), c in zip(returning, cached)]
        width = len(deltas[0])  # longest first
        lo = min(batch.starts[b] for b in rows)
        index = torch.tensor(rows, device=self.device)  # [n]
        history = batch.allowed[index, lo : pos - width].to("cpu")  # [n, cols]
        logits = self._prefill_after(batch.cache, index, deltas, cached, history, lo, pos)
        starts = torch.tensor([pos - len(d) for d in deltas], device=self.device)  # [n]
        batch.resume(index, returning, logits, starts)

    def _chunks(self, lengths: list[int]) -> list[tuple[int, int]]:
        """Prefill chunks of these lengths (longest first) on this engine's device."""
        return prefill_chunks(lengths, self.settings.prefill_chunk_tokens, self.prefill_call_tokens)

    def _prefill_after(
        self,
        cache: PreallocatedCache,
        rows: slice | torch.Tensor,
        deltas: list[tuple[int, ...]],
        cached: list[int],
        history: torch.Tensor,
        lo: int,
        pos: int,
    ) -> torch.Tensor:
        """Prefill the new tokens `deltas` (longest first, D = len(deltas[0])) into cache `rows`
        as a left-padded block of columns [pos - D, pos), after row i's `cached[i]` tokens, which
        sit in the columns [lo, pos - D) that `history[i]` (a host bool tensor) marks. Returns
        the logits of each row's next token, [n, V]."""
        device = self.device
        width = len(deltas[0])  # D
        pad = torch.tensor([width - len(d) for d in deltas])  # [n]
        ids = torch.full((len(deltas), width), self.runner.pad_id, dtype=torch.long)  # [n, D]
        for i, delta in enumerate(deltas):
            ids[i, width - len(delta) :] = torch.tensor(delta, dtype=torch.long)
        query = torch.arange(width)  # [D]
        positions = (torch.tensor(cached).unsqueeze(1) + query - pad.unsqueeze(1)).clamp_(min=0)
        # A real query sees its row's cached columns and the real new tokens up to itself; a
        # padding query only itself (finite states nobody reads).
        real = query.unsqueeze(0) >= pad.unsqueeze(1)  # [n, D]
        block = (query.unsqueeze(1) >= query.unsqueeze(0)).unsqueeze(0) & real.unsqueeze(1)
        block |= torch.eye(width, dtype=torch.bool).unsqueeze(0)  # [n, D(q), D(k)]
        history = history.unsqueeze(1) & real.unsqueeze(2)  # [n, D, cols]
        allowed = torch.cat([history, block], dim=2).unsqueeze(1).to(device)  # [n, 1, D, pos-lo]
        cache.set_window(rows, lo=lo, pos=pos - width)
        return self.runner.forward(
            ids.to(device), self.runner.mask(allowed), positions.to(device), cache
        )

    def prompts(
        self, prompts: list[tuple[int, ...]], cache: PreallocatedCache, pos: int, first: int
    ) -> torch.Tensor:
        """Prefill unique prompts (sorted longest first) into cache rows first, first + 1, ...,
        each ending at column pos - 1; returns the logits of each one's first sampled token,
        [U, V]."""
        logits = []
        for start, end in self._chunks([len(p) for p in prompts]):
            ids, positions, allowed = left_padded(
                prompts[start:end], self.runner.pad_id, self.device
            )
            length = ids.shape[1]
            mask = None if allowed is None else self.runner.mask(allowed)
            cache.set_window(slice(first + start, first + end), lo=pos - length, pos=pos - length)
            logits.append(self.runner.forward(ids, mask, positions, cache))
        return torch.cat(logits)  # [U, V]

    def _prefill_shared(
        self,
        prompts: list[tuple[int, ...]],
        shared: int,
        cache: PreallocatedCache,
        pos: int,
        first: int,
        *,
        kept: bool = False,
    ) -> torch.Tensor:
        """As `prompts`, for prompts whose first `shared` tokens are the same: those run once,
        in row `first`, at columns [lo, lo + shared) (lo = pos - the longest prompt's length), and
        are copied to the other rows' same columns; then each prompt's rest is prefilled after
        them, right-aligned to end at pos - 1 (a shorter prompt leaves a gap of unattended
        columns between the two: grpo/rollout/hf/live_batch.py `LiveBatch.append`). `kept`: the
        shared tokens are the cache's kept prefix, written instead of prefilled."""
        lo = pos - len(prompts[0])
        if kept:
            cache.write_prefix(slice(first, first + 1), lo)
        else:
            self.prompts([prompts[0][:shared]], cache, lo + shared, first)
        if len(prompts) > 1:
            source = torch.full((len(prompts) - 1,), first, device=self.device)
            cache.copy_rows(source, lo, lo + shared, first=first + 1)
        rests = [prompt[shared:] for prompt in prompts]  # longest first, as the prompts
        logits = []
        for start, end in self._chunks([len(r) for r in rests]):
            width = len(rests[start])
            history = torch.zeros(end - start, pos - width - lo, dtype=torch.bool)
            history[:, :shared] = True
            logits.append(
                self._prefill_after(
                    cache,
                    slice(first + start, first + end),
                    rests[start:end],
                    [shared] * (end - start),
                    history,
                    lo,
                    pos,
                )
            )
        return torch.cat(logits)  # [U, V]

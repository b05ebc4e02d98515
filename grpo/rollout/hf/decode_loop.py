"""HFEngine's decode loop: the requests of a `generate` or `serve` call in one live batch.

Each turn of the loop takes what the feed has (grpo/rollout/base.py `RequestFeed`), admits what
fits into the batch (grpo/rollout/hf/live_batch.py: new rows prefilled after the live ones; the next
turns of parked sessions prefill only their new tokens into their own rows), samples one token
per live row (results delivered as rows finish), compacts finished rows away, and runs one decode
forward. It ends when nothing is live or parked and the feed has closed.

`generate` runs it over its own requests (a batch of `max_batch_size` rows that later requests
join as rows free up; no parking); `serve` over the collector's feed (continuous batching).
"""

from __future__ import annotations

import time

import torch

from grpo.rollout.base import GenerationResult, RequestFeed
from grpo.rollout.hf.kept_prefix import adopt, decode_window, may_keep, starts_with_kept
from grpo.rollout.hf.kv_cache import PreallocatedCache
from grpo.rollout.hf.live_batch import LiveBatch
from grpo.rollout.hf.prefill import left_padded, prefill_chunks, shared_prefix_length
from grpo.rollout.hf.sequence import Joiner, LiveSequence


class DecodeLoop:
    """Runs `generate` and `serve` calls for `engine` (an HFEngine; see the module docstring)."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def run(
        self,
        feed: RequestFeed,
        *,
        rows: int,
        extra_columns: int,
        park: bool,
        join_wait_steps: int = 0,
    ) -> None:
        """Decode the feed's requests until it closes. A batch's cache has `rows` rows and
        columns for its first prompts, their token budgets and `extra_columns` more (for the
        longer prompts of requests that join later; one that does not fit waits until the batch
        has drained, then a new cache is sized for it). Requests that arrive while rows are live
        join once the first of them has waited `join_wait_steps` decode steps (all of them in
        one prefill), or at once when nothing is live."""
        with (
            self.engine._lock,
            torch.inference_mode(),
            self.engine._autocast(),
            self.engine._eval_mode(),
        ):
            started = time.perf_counter()
            metrics = dict.fromkeys(_METRICS, 0.0)
            captured_before = self.engine._static.captures if self.engine._static is not None else 0
            batch: LiveBatch | None = None
            waiting: list[Joiner] = []

            def deliver(row: LiveSequence, result: GenerationResult) -> None:
                metrics["requests"] += 1
                metrics["tokens_generated"] += len(result.token_ids)
                feed.deliver(row.ticket, result)

            while True:
                live = batch.live() if batch is not None else 0
                parked = batch.parked() if batch is not None else 0
                # Only parked rows left: wait a little for their sessions' next turns.
                idle = self.engine.park_wait_s if parked and not live and not waiting else 0.0
                t_take = time.perf_counter()
                taken = feed.take(close_if_empty=not live and not parked and not waiting, wait_s=idle)
                if idle:
                    metrics["idle_seconds"] += time.perf_counter() - t_take
                if not live and not parked and not waiting and not taken:
                    break  # the feed closed
                for joiner in self._joiners(feed, taken, metrics):
                    joiner.arrived = metrics["decode_steps"]
                    waiting.append(joiner)
                if batch is not None and batch.rows:
                    self._unpark(batch, feed, waiting, nobody_came=bool(idle) and not taken)
                    dropped = batch.droppable()
                    if dropped and (
                        dropped == len(batch.rows)
                        or (waiting and len(batch.rows) + len(waiting) > batch.max_rows)
                    ):
                        self._compact(batch, metrics)  # free rows for the waiting requests
                if waiting and (
                    batch is None
                    or not batch.live()
                    or metrics["decode_steps"] - waiting[0].arrived >= join_wait_steps
                ):
                    admitted = set() if batch is None else self._admit(batch, waiting, metrics)
                    if not admitted and (batch is None or not batch.rows):
                        # Nothing decoding, and the cache is too small (or missing): a new one.
                        batch = self._new_batch(waiting, rows, extra_columns, park)
                        admitted = self._admit(batch, waiting, metrics)
                    waiting = [j for j in waiting if j.ticket not in admitted]
                    if waiting and not admitted and not batch.live():
                        batch.unpark()  # parked rows hold the room the waiting ones need
                        self._compact(batch, metrics)
                if batch is None or not batch.live():
                    continue
                t_sample = time.perf_counter()
                batch.sample(self.engine.tokenizer, deliver)
                metrics["sample_seconds"] += time.perf_counter() - t_sample
                dropped = batch.droppable()
                if dropped and (
                    dropped == len(batch.rows)
                    or dropped >= self.engine.compact_fraction * len(batch.rows)
                ):
                    self._compact(batch, metrics)
                if batch.live():
                    self._decode_step(batch, metrics)
            if self.engine._static is not None:
                metrics["graph_captures"] = float(self.engine._static.captures - captured_before)
            seconds = time.perf_counter() - started
            metrics["decode_seconds"] = (
                seconds - metrics["prefill_seconds"] - metrics["idle_seconds"]
            )
            metrics["seconds"] = seconds
            metrics["tokens_per_second"] = metrics["tokens_generated"] / seconds if seconds else 0.0
            self.engine.last_metrics = metrics

    def _joiners(self, feed: RequestFeed, taken, metrics: dict) -> list[Joiner]:
        """Taken requests as joiners; invalid ones fail, empty budgets are delivered at once.
        Unseeded requests get a seed from the engine's generator, in ticket order."""
        joiners = []
        for ticket, request in sorted(taken, key=lambda entry: entry[0]):
            try:
                self.engine._validate(request)
            except ValueError as exc:
                feed.fail(ticket, exc)
                continue
            seed = request.sampling.seed
            if seed is None:
                seed = int(torch.randint(0, 2**62, (), generator=self.engine._generator))
            joiners.append(Joiner(ticket, request, seed))
        by_ticket = {ticket: index for index, (ticket, _) in enumerate(taken)}
        joiners.sort(key=lambda j: by_ticket[j.ticket])  # the feed's order (groups adjacent)
        ready = []
        for joiner in joiners:
            if joiner.budget == 0:
                metrics["requests"] += 1
                feed.deliver(
                    joiner.ticket,
                    LiveSequence(joiner.ticket, joiner.prompt, joiner.request.sampling).result(),
                )
            else:
                ready.append(joiner)
        return ready

    def _new_batch(
        self, waiting: list[Joiner], rows: int, extra_columns: int, park: bool
    ) -> LiveBatch:
        """A batch over a cache sized for the first `rows` waiting requests plus `extra_columns`."""
        first = waiting[:rows]
        capacity = max(len(j.prompt) for j in first) + max(j.budget for j in first) + extra_columns
        if self.engine._static is not None:
            cache = self.engine._static.cache_for(rows, capacity)
        else:
            cache = PreallocatedCache(
                self.engine._num_layers, rows, capacity, zero_columns=0,
                dtype=self.engine.kv_cache_dtype, keys_transposed=self.engine.keys_transposed,
            )
        return LiveBatch(
            cache, rows, self.engine.device, park_steps=self.engine.park_steps if park else 0
        )

    def _unpark(self, batch: LiveBatch, feed: RequestFeed, waiting, *, nobody_came: bool) -> None:
        """Parked rows leave when their sessions end, when they have waited `park_steps`, when
        their session asks again with a prompt that does not extend them, when waiting requests
        need their rows (longest parked first), and all of them when nothing else is live and
        nobody came back within `park_wait_s`."""
        ended = feed.ended_sessions()
        if ended:
            batch.end_sessions(ended)
        if nobody_came:
            batch.unpark()
        batch.expire(self.engine.park_steps, keep={j.request.session for j in waiting})
        if waiting:
            batch.make_room(waiting)

    def _admit(self, batch: LiveBatch, waiting: list[Joiner], metrics: dict) -> set[int]:
        """Admit the waiting requests that fit (first come, first served): the next turns of
        parked sessions prefill only their new tokens into their rows; the others are prefilled
        into the rows after the live ones. Returns the admitted tickets."""
        returning, new, pos = batch.plan(waiting)
        if not returning and not new:
            return set()
        started = time.perf_counter()
        if not batch.rows:
            metrics["waves"] += 1
        else:
            metrics["joins"] += 1
            metrics["joined_requests"] += len(returning) + len(new)
        batch.open_columns(pos)
        if returning:
            self._resume(batch, returning, metrics)
        if new:
            self._add_rows(batch, new, metrics)
        metrics["prefill_seconds"] += time.perf_counter() - started
        return {j.ticket for j in new} | {j.ticket for _, j in returning}

    def _add_rows(self, batch: LiveBatch, joiners: list[Joiner], metrics: dict) -> None:
        """Prefill `joiners` into the rows after the batch's, each prompt ending at pos - 1.
        Those whose prompts start with the batch's kept prefix get it written, not prefilled;
        the others' prompts are prefilled (a prefix they all share once: `_prefill_shared`).
        (grpo/rollout/hf/kept_prefix.py: when a batch keeps a prefix, and from which rows.)"""
        adopt(batch, sorted({j.prompt for j in joiners}), self.engine.prefix_attention_min_tokens)
        holders = [j for j in joiners if starts_with_kept(batch, j.prompt)]
        tickets = {j.ticket for j in holders}
        others = [j for j in joiners if j.ticket not in tickets]
        for group, with_kept in ((holders, True), (others, False)):
            if group:
                self._add_group(batch, group, metrics, with_kept=with_kept)

    def _add_group(
        self, batch: LiveBatch, joiners: list[Joiner], metrics: dict, *, with_kept: bool
    ) -> None:
        """`_add_rows` for joiners that all start with the kept prefix (`with_kept`) or not."""
        # Unique prompts, longest first; the rows of one prompt adjacent.
        groups: dict[tuple[int, ...], list[Joiner]] = {}
        for joiner in joiners:
            groups.setdefault(joiner.prompt, []).append(joiner)
        prompts = sorted(groups, key=len, reverse=True)
        ordered = [joiner for prompt in prompts for joiner in groups[prompt]]
        source = torch.tensor(
            [u for u, prompt in enumerate(prompts) for _ in groups[prompt]],
            device=self.engine.device,
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
            shared = shared_prefix_length(prompts, self.engine.shared_prefix_min_tokens)
            min_tokens = self.engine.prefix_attention_min_tokens
            holds = shared >= max(min_tokens, 1) and may_keep(batch, min_tokens)
            if shared:
                prompt_logits = self._prefill_shared(prompts, shared, cache, pos, first)
                metrics["prefill_tokens"] += float(shared)
                saved = shared * (len(prompts) - 1)
            else:
                prompt_logits = self._prefill(prompts, cache, pos, first)  # [U, V]
            if holds:
                cache.keep_prefix(prompts[0][:shared], first, pos - len(prompts[0]))
        if len(ordered) > len(prompts):  # fan each prompt out to its samples
            cache.copy_rows(source + first, pos - len(prompts[0]), pos, first=first)
        batch.append(ordered, prompt_logits[source], shared=shared, holds_prefix=holds)
        metrics["prefill_tokens"] += float(sum(len(p) - shared for p in prompts))
        metrics["shared_prefix_tokens"] += float(saved)

    def _resume(self, batch: LiveBatch, returning: list[tuple[int, Joiner]], metrics) -> None:
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
        index = torch.tensor(rows, device=self.engine.device)  # [n]
        history = batch.allowed[index, lo : pos - width].to("cpu")  # [n, cols]
        logits = self._prefill_after(batch.cache, index, deltas, cached, history, lo, pos)
        starts = torch.tensor([pos - len(d) for d in deltas], device=self.engine.device)  # [n]
        batch.resume(index, returning, logits, starts)

    def _chunks(self, lengths: list[int]) -> list[tuple[int, int]]:
        """Prefill chunks of these lengths (longest first) on this engine's device."""
        engine = self.engine
        return prefill_chunks(lengths, engine.prefill_chunk_tokens, engine.prefill_call_tokens)

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
        device = self.engine.device
        width = len(deltas[0])  # D
        pad = torch.tensor([width - len(d) for d in deltas])  # [n]
        ids = torch.full((len(deltas), width), self.engine._pad_id, dtype=torch.long)  # [n, D]
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
        return self.engine._forward(
            ids.to(device), self.engine._mask(allowed), positions.to(device), cache
        )

    def _compact(self, batch: LiveBatch, metrics: dict) -> None:
        """Finished rows leave the batch and the cache: they stop costing compute."""
        batch.compact()
        metrics["compactions"] += 1

    def _decode_step(self, batch: LiveBatch, metrics: dict) -> None:
        """One forward of every row's last sampled token, written at column `batch.pos` (attended
        later only where it is a real token: not a parked row's)."""
        started = time.perf_counter()
        pos, tokens = batch.pos, batch.tokens
        fed = batch.fed()
        # The written column is attended later where it holds a real token (not a parked row's).
        batch.allowed[:, pos] = True if all(fed) else torch.tensor(fed, device=self.engine.device)
        drawn = None
        if self.engine._static is not None:
            draws = (
                batch.draws()
                if self.engine.sample_in_decode_step and not batch.kinds.any_nucleus
                else None
            )
            logits, drawn = self.engine._static.step(
                tokens, batch.positions, pos, batch.allowed, draws
            )
            metrics["steps_with_draws"] += drawn is not None
        else:
            # [B, 1, 1, columns]: the kept prefix's P columns first where rows attend it once
            lo, allowed, shared = decode_window(batch, self.engine.prefix_attention_min_cells)
            batch.cache.set_window(slice(0, len(batch.rows)), lo=lo, pos=pos)
            logits = self.engine._forward(
                tokens.unsqueeze(1), self.engine._mask(allowed), batch.positions.unsqueeze(1),
                batch.cache, shared_prefix=batch.cache.prefix if shared else None,
            )  # [B, V]
            metrics["prefix_attention_steps"] += shared
        batch.advance(logits, fed, drawn)
        metrics["decode_forward_seconds"] += time.perf_counter() - started
        metrics["decode_steps"] += 1

    def _prefill(
        self, prompts: list[tuple[int, ...]], cache: PreallocatedCache, pos: int, first: int
    ) -> torch.Tensor:
        """Prefill unique prompts (sorted longest first) into cache rows first, first + 1, ...,
        each ending at column pos - 1; returns the logits of each one's first sampled token,
        [U, V]."""
        logits = []
        for start, end in self._chunks([len(p) for p in prompts]):
            ids, positions, allowed = left_padded(
                prompts[start:end], self.engine._pad_id, self.engine.device
            )
            length = ids.shape[1]
            mask = None if allowed is None else self.engine._mask(allowed)
            cache.set_window(slice(first + start, first + end), lo=pos - length, pos=pos - length)
            logits.append(self.engine._forward(ids, mask, positions, cache))
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
        """As `_prefill`, for prompts whose first `shared` tokens are the same: those run once,
        in row `first`, at columns [lo, lo + shared) (lo = pos - the longest prompt's length), and
        are copied to the other rows' same columns; then each prompt's rest is prefilled after
        them, right-aligned to end at pos - 1 (a shorter prompt leaves a gap of unattended
        columns between the two: grpo/rollout/hf/live_batch.py `LiveBatch.append`). `kept`: the
        shared tokens are the cache's kept prefix, written instead of prefilled."""
        lo = pos - len(prompts[0])
        if kept:
            cache.write_prefix(slice(first, first + 1), lo)
        else:
            self._prefill([prompts[0][:shared]], cache, lo + shared, first)
        if len(prompts) > 1:
            source = torch.full((len(prompts) - 1,), first, device=self.engine.device)
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


_METRICS = (
    "requests",
    "tokens_generated",
    "prefill_seconds",
    "decode_seconds",
    "decode_forward_seconds",
    "sample_seconds",
    "prefill_tokens",
    "shared_prefix_tokens",
    "decode_steps",
    "compactions",
    "waves",
    "joins",
    "joined_requests",
    "resumed_requests",
    "kept_prefix_tokens",
    "prefix_attention_steps",
    "idle_seconds",
    "graph_captures",
    "steps_with_draws",
)
"""What `HFEngine.last_metrics` reports about its last call (plus seconds, tokens_per_second).
`prefill_tokens` counts the tokens prefill forwards ran; `shared_prefix_tokens` those a shared
prefix saved (it ran once instead of once per distinct prompt); `kept_prefix_tokens` those a
batch's kept prefix saved (written into joining rows instead of prefilled); and
`prefix_attention_steps` the decode steps that attended the kept prefix once for all rows;
`steps_with_draws` the decode steps that also drew the rows' next tokens
(`sample_in_decode_step`)."""

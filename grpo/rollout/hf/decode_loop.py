"""HFEngine's decode loop: the requests of a `generate` or `serve` call in one live batch.

Each turn of the loop takes what the feed has (grpo/rollout/base.py `RequestFeed`), admits what
fits into the batch (grpo/rollout/hf/live_batch.py: new rows prefilled after the live ones; the next
turns of parked sessions prefill only their new tokens into their own rows), samples one token
per live row (results delivered as rows finish), compacts finished rows away, and runs one decode
forward. It ends when nothing is live or parked and the feed has closed.

`generate` runs it over its own requests (a batch of `max_batch_size` rows that later requests
join as rows free up; no parking); `serve` over the collector's feed (continuous batching).

The loop is handed what it works with: the engine's `ModelRunner` (grpo/rollout/hf/runner.py:
forwards, masks, caches), its resolved settings (`rollout.hf`), the tokenizer (stop strings) and
the generator that seeds unseeded requests. The engine holds its lock and the runner's context
around each call (`HFEngine._run`) and keeps the metrics `run` returns.
"""

from __future__ import annotations

import time

import torch

from grpo.rollout.base import GenerationResult, RequestFeed, check_request
from grpo.rollout.config import HFEngineConfig
from grpo.rollout.hf.batch_prefill import BatchPrefill
from grpo.rollout.hf.kept_prefix import decode_window
from grpo.rollout.hf.live_batch import LiveBatch
from grpo.rollout.hf.runner import ModelRunner
from grpo.rollout.hf.sequence import Joiner, LiveSequence


class DecodeLoop:
    """Runs HFEngine's `generate` and `serve` calls (see the module docstring).

    runner: the engine's model side. settings: the engine's section resolved for its device.
    tokenizer: for stop strings (None: requests with stop strings fail).
    seeds: the generator that seeds requests that carry no seed of their own, in ticket order.
    """

    def __init__(
        self, runner: ModelRunner, settings: HFEngineConfig, tokenizer, seeds: torch.Generator
    ) -> None:
        self.runner = runner
        self.settings = settings
        self.tokenizer = tokenizer
        self.seeds = seeds
        self.device = runner.device
        self.prefill = BatchPrefill(runner, settings)
        """How admitted requests get into the batch's rows and cache (batch_prefill.py)."""

    def run(
        self,
        feed: RequestFeed,
        *,
        rows: int,
        extra_columns: int,
        park: bool,
        join_wait_steps: int = 0,
    ) -> dict[str, float]:
        """Decode the feed's requests until it closes; returns the call's metrics (`_METRICS`). A batch's cache has `rows` rows and
        columns for its first prompts, their token budgets and `extra_columns` more (for the
        longer prompts of requests that join later; one that does not fit waits until the batch
        has drained, then a new cache is sized for it). Requests that arrive while rows are live
        join once the first of them has waited `join_wait_steps` decode steps (all of them in
        one prefill), or at once when nothing is live. The caller holds the runner's context
        (`ModelRunner.running`)."""
        static = self.runner.static_decoder
        started = time.perf_counter()
        metrics = dict.fromkeys(_METRICS, 0.0)
        captured_before = static.captures if static is not None else 0
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
            idle = self.settings.park_wait_s if parked and not live and not waiting else 0.0
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
            batch.sample(self.tokenizer, deliver)
            metrics["sample_seconds"] += time.perf_counter() - t_sample
            dropped = batch.droppable()
            if dropped and (
                dropped == len(batch.rows)
                or dropped >= self.settings.compact_fraction * len(batch.rows)
            ):
                self._compact(batch, metrics)
            if batch.live():
                self.decode_step(batch, metrics)
        if static is not None:
            metrics["graph_captures"] = float(static.captures - captured_before)
        seconds = time.perf_counter() - started
        metrics["decode_seconds"] = (
            seconds - metrics["prefill_seconds"] - metrics["idle_seconds"]
        )
        metrics["seconds"] = seconds
        metrics["tokens_per_second"] = metrics["tokens_generated"] / seconds if seconds else 0.0
        return metrics

    def _joiners(self, feed: RequestFeed, taken, metrics: dict) -> list[Joiner]:
        """Taken requests as joiners; invalid ones fail, empty budgets are delivered at once.
        Unseeded requests get a seed from the engine's generator, in ticket order."""
        joiners = []
        for ticket, request in sorted(taken, key=lambda entry: entry[0]):
            try:
                check_request(request, has_tokenizer=self.tokenizer is not None)
            except ValueError as exc:
                feed.fail(ticket, exc)
                continue
            seed = request.sampling.seed
            if seed is None:
                seed = int(torch.randint(0, 2**62, (), generator=self.seeds))
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
        cache = self.runner.new_cache(rows, capacity)
        return LiveBatch(
            cache, rows, self.device, park_steps=self.settings.park_steps if park else 0
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
        batch.expire(self.settings.park_steps, keep={j.request.session for j in waiting})
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
            self.prefill.resume(batch, returning, metrics)
        if new:
            self.prefill.new_rows(batch, new, metrics)
        metrics["prefill_seconds"] += time.perf_counter() - started
        return {j.ticket for j in new} | {j.ticket for _, j in returning}

    def _compact(self, batch: LiveBatch, metrics: dict) -> None:
        """Finished rows leave the batch and the cache: they stop costing compute."""
        batch.compact()
        metrics["compactions"] += 1

    def decode_step(self, batch: LiveBatch, metrics: dict) -> None:
        """One forward of every row's last sampled token, written at column `batch.pos` (attended
        later only where it is a real token: not a parked row's)."""
        started = time.perf_counter()
        pos, tokens = batch.pos, batch.tokens
        fed = batch.fed()
        # The written column is attended later where it holds a real token (not a parked row's).
        batch.allowed[:, pos] = True if all(fed) else torch.tensor(fed, device=self.device)
        drawn = None
        static = self.runner.static_decoder
        if static is not None:
            draws = (
                batch.draws()
                if self.settings.sample_in_decode_step and not batch.kinds.any_nucleus
                else None
            )
            logits, drawn = static.step(
                tokens, batch.positions, pos, batch.allowed, draws
            )
            metrics["steps_with_draws"] += drawn is not None
        else:
            # [B, 1, 1, columns]: the kept prefix's P columns first where rows attend it once
            lo, allowed, shared = decode_window(batch, self.settings.prefix_attention_min_cells)
            batch.cache.set_window(slice(0, len(batch.rows)), lo=lo, pos=pos)
            logits = self.runner.forward(
                tokens.unsqueeze(1), self.runner.mask(allowed), batch.positions.unsqueeze(1),
                batch.cache, shared_prefix=batch.cache.prefix if shared else None,
            )  # [B, V]
            metrics["prefix_attention_steps"] += shared
        batch.advance(logits, fed, drawn)
        metrics["decode_forward_seconds"] += time.perf_counter() - started
        metrics["decode_steps"] += 1



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

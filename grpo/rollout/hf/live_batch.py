"""The rows an HFEngine decodes together, and where each row's tokens sit in the KV cache.

Rows come and go while a batch runs (continuous batching): requests join between two decode
steps -- their prompts prefilled into the cache rows after the live ones, right-aligned so the
prompt ends just before the column the next step writes -- and finished rows are compacted away.

All rows write the same cache column per step (`pos`), so a joining prompt longer than `pos`
moves `pos` ahead for everyone: the rows already live skip the columns in between (never
attended: `allowed` is false there; zeroed, since masked columns are still multiplied by zero
weights and must be finite). A row's tokens therefore start at column `start` but need not be
contiguous; its position ids count its own tokens (`positions`), and its random stream its own
draws (`steps`), so a row samples exactly what it would have sampled alone. Rows that join
together may share their prompts' common prefix, prefilled once into the same columns of each
(`append(shared=...)`); a shorter prompt's rest then starts after a gap of unattended columns.

A finished row whose request names a session (an episode) is *parked*: it stays in the batch,
its cache row intact, for up to `park_steps` decode steps. When the session's next request
arrives -- its prompt is this row's prompt and tokens plus the observation -- only the new tokens
are prefilled into the same row (the columns after its last one), instead of the whole
conversation. Parked rows still ride along in every decode step (their writes are never
attended), so they leave when their session ends, when they have waited `park_steps` steps, or
when nothing else is live and no request comes within the engine's `park_wait_s`.

This module keeps the per-row state (on the host and on the device) and the rules of who fits;
the engine's model runner (grpo/rollout/hf/runner.py) runs the prefill and decode forwards.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from grpo.rollout.base import GenerationResult
from grpo.rollout.hf.decode_graphs import Draws
from grpo.rollout.hf.kv_cache import PreallocatedCache
from grpo.rollout.hf.sampling import BatchKinds, draw_next_tokens, row_keys
from grpo.rollout.hf.sequence import Joiner, LiveSequence


class LiveBatch:
    """Up to `max_rows` rows decoding over `cache` (see the module docstring)."""

    def __init__(
        self, cache: PreallocatedCache, max_rows: int, device: torch.device, *, park_steps: int = 0
    ) -> None:
        self.cache = cache
        self.park_steps = park_steps
        self.ended: set[str] = set()
        """Sessions that ended (their episodes): their rows never park."""
        self.decode_steps = 0
        self.max_rows = min(max_rows, cache.rows)
        self.device = device
        self.rows: list[LiveSequence] = []
        self.pos = 0
        """The cache column the next decode forward writes (the same for every row)."""
        self.starts: list[int] = []
        """Row b's first column (its prompt's first token), on the host."""
        self.holds_prefix: list[bool] = []
        """Row b's columns [start, start + P) hold the cache's kept prefix (`cache.prefix`)."""
        empty_long = torch.zeros(0, dtype=torch.long, device=device)
        self.positions = empty_long  # [B] position id of the token the next forward feeds
        self.steps = empty_long  # [B] tokens drawn so far: the index into the row's stream
        self.keys = empty_long  # [B] the rows' random-stream keys
        self.temperature = torch.zeros(0, device=device)  # [B]
        self.top_p = torch.zeros(0, device=device)  # [B]
        self.tokens = empty_long  # [B] the tokens last sampled (the next forward's input)
        self.logits: torch.Tensor | None = None  # [B, V] next-token logits
        self.drawn: tuple[torch.Tensor, torch.Tensor] | None = None
        """The last decode step's draws from `logits` (tokens [B], log-probs [B]), if it drew."""
        self.presampled: list[bool] = []
        """Row b's next token is in `drawn` (False for rows whose logits came since: joined or
        resumed rows)."""
        self.allowed = torch.zeros(0, cache.capacity, dtype=torch.bool, device=device)
        """[B, capacity]: column c holds one of row b's tokens (what a forward may attend)."""
        self.kinds = BatchKinds.of([])

    # ------------------------------------------------------------------ row states
    def live(self) -> int:
        """Rows still sampling."""
        return sum(row.finish_reason is None for row in self.rows)

    def parked(self) -> int:
        return sum(row.parked_at is not None for row in self.rows)

    def droppable(self) -> int:
        """Finished rows that are not parked: compaction drops them."""
        return sum(r.finish_reason is not None and r.parked_at is None for r in self.rows)

    def end_sessions(self, sessions) -> None:
        """These sessions ask nothing more: their parked rows become droppable, and their live
        rows will not park when they finish."""
        self.ended.update(sessions)
        self.unpark(set(sessions))

    def unpark(self, sessions=None) -> None:
        """Parked rows of `sessions` (None: all) become droppable."""
        for row in self.rows:
            if row.parked_at is not None and (sessions is None or row.session in sessions):
                row.parked_at = None

    def expire(self, steps: int, keep) -> None:
        """Parked rows that have waited more than `steps` decode steps become droppable, except
        those of sessions in `keep` (their next turns are waiting to join)."""
        for row in self.rows:
            if (
                row.parked_at is not None
                and row.session not in keep
                and self.decode_steps - row.parked_at > steps
            ):
                row.parked_at = None

    def make_room(self, waiting: list[Joiner]) -> None:
        """Unpark what the waiting requests need gone: a parked row of a waiting session that
        the waiting request does not extend, and the longest-parked rows while the new requests
        would find no free row."""
        sessions = {j.request.session for j in waiting if j.request.session}
        parked_rows = self.parked_by_session()
        new_rows = 0
        for joiner in waiting:
            if self.returning(joiner, set(), parked_rows) is None:
                new_rows += 1
                for b in parked_rows.pop(joiner.request.session, ()):
                    self.rows[b].parked_at = None  # its session moved on without it
        parked = sorted(
            (r for r in self.rows if r.parked_at is not None and r.session not in sessions),
            key=lambda r: r.parked_at,
        )
        free = self.max_rows - len(self.rows) + self.droppable()
        for row in parked[: max(0, new_rows - free)]:
            row.parked_at = None

    def parked_by_session(self) -> dict[str, list[int]]:
        """The parked rows of each session, in row order (what `returning` looks through: one
        pass over the rows instead of one per waiting request)."""
        out: dict[str, list[int]] = {}
        for b, row in enumerate(self.rows):
            if row.parked_at is not None and row.session:
                out.setdefault(row.session, []).append(b)
        return out

    def returning(self, joiner: Joiner, taken: set[int],
                  parked_rows: dict[str, list[int]] | None = None) -> int | None:
        """The parked row whose cached tokens the joiner's prompt extends (not in `taken`).
        `parked_rows`: `parked_by_session()` of the rows as they are now (built here if None)."""
        if not joiner.request.session:
            return None
        if parked_rows is None:
            parked_rows = self.parked_by_session()
        for b in parked_rows.get(joiner.request.session, ()):
            if b in taken:
                continue
            row = self.rows[b]
            prompt = joiner.prompt
            if (
                len(prompt) > row.cached
                and prompt[: row.cached] == (row.prompt_ids + tuple(row.tokens))[: row.cached]
            ):
                return b
        return None

    # ------------------------------------------------------------------ who fits
    def remaining(self) -> int:
        """The most tokens any live row may still sample."""
        return max(
            (
                r.sampling.max_new_tokens - len(r.tokens)
                for r in self.rows
                if r.finish_reason is None
            ),
            default=0,
        )

    def plan(self, waiting: list[Joiner]) -> tuple[list[tuple[int, Joiner]], list[Joiner], int]:
        """Who of `waiting` (a prefix: first come, first served) joins now: (returning row,
        joiner) pairs, new joiners, and the column the next step writes. Returning rows write
        their new tokens into one block of columns right of every one of their last columns;
        new rows need free rows; the cache needs columns for every row's remaining tokens. A row
        writes at most its remaining budget of columns (the last token sampled is never written)."""
        returning: list[tuple[int, Joiner]] = []
        new: list[Joiner] = []
        taken: set[int] = set()
        pos = self.pos if self.rows else 0
        last_end, longest_delta, budget = 0, 0, self.remaining()
        parked_rows = self.parked_by_session()
        for joiner in waiting:
            b = self.returning(joiner, taken, parked_rows)
            if b is None:
                need_pos = max(pos, len(joiner.prompt))
                fits_rows = len(self.rows) + len(new) < self.max_rows
            else:
                row = self.rows[b]
                end = max(last_end, row.end_column)
                delta = max(longest_delta, len(joiner.prompt) - row.cached)
                need_pos, fits_rows = max(pos, end + delta), True
            need_budget = max(budget, joiner.budget)
            if not fits_rows or need_pos + need_budget > self.cache.capacity:
                break
            pos, budget = need_pos, need_budget
            if b is None:
                new.append(joiner)
            else:
                returning.append((b, joiner))
                taken.add(b)
                last_end, longest_delta = end, delta
        return returning, new, pos

    # ------------------------------------------------------------------ joining
    def open_columns(self, pos: int) -> None:
        """Move the column the next step writes to `pos`; the rows' skipped columns are zeroed."""
        if self.rows and pos > self.pos:
            self.cache.zero(slice(0, len(self.rows)), self.pos, pos)
        self.pos = pos

    def append(
        self,
        joiners: list[Joiner],
        logits: torch.Tensor,
        shared: int = 0,
        holds_prefix: bool = False,
    ) -> None:
        """Rows for `joiners` (already prefilled, in this order, into the rows after the live ones,
        each prompt ending at column pos - 1) with their first-token logits [n, V].

        `shared` > 0: their prompts' first `shared` tokens were prefilled once and copied
        (grpo/rollout/hf/prefill.py); they sit in the same columns [lo, lo + shared) of every row,
        lo = pos - the longest prompt's length, and each prompt's rest ends at pos - 1, so a
        shorter prompt's row has a gap of never-attended columns in between. `holds_prefix`:
        those first columns begin with the cache's kept prefix (kv_cache.py `keep_prefix`)."""
        first = len(self.rows)
        lo = self.pos - max(len(j.prompt) for j in joiners)
        starts = [lo if shared else self.pos - len(j.prompt) for j in joiners]
        self.rows += [self._sequence(j) for j in joiners]
        self.starts += starts
        self.holds_prefix += [holds_prefix] * len(joiners)
        n = len(joiners)
        lengths = torch.tensor([len(j.prompt) for j in joiners], device=self.device)
        self.positions = torch.cat([self.positions, lengths])
        self.steps = torch.cat([self.steps, torch.zeros(n, dtype=torch.long, device=self.device)])
        self.tokens = torch.cat([self.tokens, torch.zeros(n, dtype=torch.long, device=self.device)])
        self.keys = torch.cat([self.keys, row_keys([j.seed for j in joiners], self.device)])
        sampling = [j.request.sampling for j in joiners]
        self.temperature = torch.cat(
            [self.temperature, torch.tensor([s.temperature for s in sampling], device=self.device)]
        )
        self.top_p = torch.cat(
            [self.top_p, torch.tensor([s.top_p for s in sampling], device=self.device)]
        )
        self.logits = (
            logits if self.logits is None or first == 0 else torch.cat([self.logits, logits])
        )
        self.presampled += [False] * n
        if self.drawn is not None:
            tokens, logprobs = self.drawn
            self.drawn = (
                torch.cat([tokens, tokens.new_zeros(n)]),
                torch.cat([logprobs, logprobs.new_zeros(n)]),
            )
        rests = [self.pos - len(j.prompt) + shared for j in joiners]  # each rest's first column
        allowed = self._up_to_pos(torch.tensor(rests, device=self.device))  # [n, capacity]
        allowed[:, lo : lo + shared] = True
        self.allowed = torch.cat([self.allowed, allowed])
        self.kinds = BatchKinds.of(self.rows)

    def _up_to_pos(self, starts: torch.Tensor) -> torch.Tensor:
        """[n, capacity]: columns [starts[i], pos)."""
        columns = torch.arange(self.cache.capacity, device=self.device)
        return (columns >= starts.unsqueeze(1)) & (columns < self.pos)

    def _sequence(self, joiner: Joiner) -> LiveSequence:
        """A fresh row for `joiner`, its whole prompt in the cache, ending at column pos - 1."""
        return LiveSequence(
            joiner.ticket,
            joiner.prompt,
            joiner.request.sampling,
            session=joiner.request.session,
            cached=len(joiner.prompt),
            end_column=self.pos,
        )

    def resume(
        self,
        index: torch.Tensor,
        returning: list[tuple[int, Joiner]],
        logits: torch.Tensor,
        starts: torch.Tensor,
    ) -> None:
        """Parked rows `index` [n] take their sessions' next requests, whose new tokens were just
        prefilled into columns [starts[i], pos); `logits` [n, V] predict their first tokens."""
        self.allowed[index] |= self._up_to_pos(starts)
        joiners = [j for _, j in returning]
        for b, joiner in returning:
            self.rows[b] = self._sequence(joiner)
        sampling = [j.request.sampling for j in joiners]
        self.positions[index] = torch.tensor([len(j.prompt) for j in joiners], device=self.device)
        self.steps[index] = 0
        self.keys[index] = row_keys([j.seed for j in joiners], self.device)
        self.temperature[index] = torch.tensor(
            [s.temperature for s in sampling], device=self.device
        )
        self.top_p[index] = torch.tensor([s.top_p for s in sampling], device=self.device)
        self.logits[index] = logits.to(self.logits.dtype)
        for b, _ in returning:
            self.presampled[b] = False
        self.kinds = BatchKinds.of(self.rows)

    # ------------------------------------------------------------------ a step
    def sample(self, tokenizer, deliver: Callable[[LiveSequence, GenerationResult], None]) -> None:
        """Every row's next token: drawn by the last decode step where it drew (`drawn`), else
        sampled from `logits` here; rows that finish are delivered at once."""
        pending = [b for b, done in enumerate(self.presampled) if not done]
        if self.drawn is None or len(pending) == len(self.rows):
            tokens, logprobs = self._draw(None)  # [B], [B]
        else:
            tokens, logprobs = self.drawn
            if not pending:  # a view of a CUDA graph's output, which its next replay overwrites
                tokens = tokens.clone()
            else:
                index = torch.tensor(pending, device=self.device)
                late_tokens, late_logprobs = self._draw(index, pending)
                tokens = tokens.index_copy(0, index, late_tokens)
                logprobs = logprobs.index_copy(0, index, late_logprobs)
        self.drawn = None
        self.presampled = [False] * len(self.rows)
        self.steps += 1
        sampling = [row.finish_reason is None for row in self.rows]
        if all(sampling):
            self.tokens = tokens
        else:  # a finished row keeps its last token: a parked one still has to feed it
            self.tokens = torch.where(
                torch.tensor(sampling, device=self.device), tokens, self.tokens
            )
        # One device-to-host copy for both (token ids are exact in float64).
        drawn = torch.stack([tokens.to(torch.float64), logprobs.to(torch.float64)]).tolist()
        for row, token, logprob in zip(self.rows, drawn[0], drawn[1]):
            if row.finish_reason is None:
                token = int(token)
                row.tokens.append(token)
                row.logprobs.append(logprob)
                row.finish_reason = row.finish_reason_after(token, tokenizer)
                if row.finish_reason is not None:
                    if row.session and self.park_steps > 0 and row.session not in self.ended:
                        row.parked_at = self.decode_steps
                    deliver(row, row.result())

    def _draw(
        self, index: torch.Tensor | None, rows: list[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample the next tokens of rows `index` (None: all; `rows`: the same on the host) from
        their logits: (tokens [n], log-probs [n]). A row's draw depends on its own logits, key
        and step alone."""
        if index is None:
            logits, keys, steps = self.logits, self.keys, self.steps
            temperature, top_p, kinds = self.temperature, self.top_p, self.kinds
        else:
            logits, keys, steps = self.logits[index], self.keys[index], self.steps[index]
            temperature, top_p = self.temperature[index], self.top_p[index]
            kinds = BatchKinds.of([self.rows[b] for b in rows])
        return draw_next_tokens(logits, keys, steps, temperature, top_p, kinds)

    def draws(self) -> Draws:
        """What a decode step needs to draw every row's next token
        (grpo/rollout/hf/decode_graphs.py)."""
        return Draws(self.keys, self.steps, self.temperature, self.top_p, self.kinds)

    def compact(self) -> None:
        """Drop the finished, unparked rows from the batch and the cache (the others move up, in
        order)."""
        keep_list = [
            i
            for i, row in enumerate(self.rows)
            if row.finish_reason is None or row.parked_at is not None
        ]
        keep = torch.tensor(keep_list, dtype=torch.long, device=self.device)
        if keep_list:
            # Rows before the first finished one stay where they are; only the rest move.
            moved = next((i for i, old in enumerate(keep_list) if old != i), len(keep_list))
            if moved < len(keep_list):
                lo = min(self.starts[i] for i in keep_list[moved:])
                self.cache.copy_rows(keep[moved:], lo, self.pos, first=moved)
        else:
            self.pos = 0  # nothing live: the next rows start from column 0 again
        self.rows = [self.rows[i] for i in keep_list]
        self.starts = [self.starts[i] for i in keep_list]
        self.holds_prefix = [self.holds_prefix[i] for i in keep_list]
        for name in ("positions", "steps", "keys", "temperature", "top_p", "tokens"):
            setattr(self, name, getattr(self, name)[keep])
        if self.logits is not None:
            self.logits = self.logits[keep]
        if self.drawn is not None:
            self.drawn = (self.drawn[0][keep], self.drawn[1][keep])
        self.presampled = [self.presampled[i] for i in keep_list]
        self.allowed = self.allowed[keep]
        self.kinds = BatchKinds.of(self.rows)

    def fed(self) -> list[bool]:
        """Per row: does the next decode forward feed one of its real tokens (its last sampled
        one, not yet in the cache)? False for parked rows once their last token is in."""
        return [row.cached < len(row.prompt_ids) + len(row.tokens) for row in self.rows]

    def advance(
        self,
        logits: torch.Tensor,
        fed: list[bool],
        drawn: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """A decode forward wrote column `pos` for every row (`fed`: a real token); `logits`
        [B, V] predict their next tokens, and `drawn` holds those tokens where the step drew
        them (tokens [B], log-probs [B])."""
        self.drawn = drawn
        self.presampled = [drawn is not None] * len(self.rows)
        for row, real in zip(self.rows, fed):
            if real:
                row.cached += 1
                row.end_column = self.pos + 1
        self.logits = logits
        self.positions += 1
        self.pos += 1
        self.decode_steps += 1

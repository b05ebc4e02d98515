"""Fixed-shape decode steps for HFEngine, replayed as CUDA graphs on a GPU.

A decode step of a small model on a GPU is launch-bound: SmolLM2-135M's eager step launches
over a thousand kernels from Python (sampling included), each doing microseconds of work, so the
step costs the same at batch 16 as at 512 and the GPU idles. A CUDA graph records the step's kernels once and replays them with one
launch; that needs every tensor shape and address to be the same at every replay. So the decode
steps run over

- one persistent KV cache (grpo/rollout/hf/kv_cache.py, zeroed when allocated) that every wave
  reuses; it grows, and drops its graphs, only when a wave needs more rows or columns;
- a bucketed shape: the live rows padded up to a power of two, and the attended columns [0, width)
  with width rounded up to a multiple of `width_step`. Padding rows attend to every column and
  compute finite garbage that nobody reads; the columns a live row may not see are masked;
- static input buffers (token ids, positions, the boolean attention mask, the column written) that
  are filled in place before each step; the mask is copied from the live batch's own
  (grpo/rollout/hf/live_batch.py), the one place that says which columns each row may attend.

One graph is captured per (rows, width) bucket when first needed, then replayed to run the step
(capturing runs no kernels); the first capture of a cache's life (per kind of step) follows an
eager warm-up on a side stream, for what the kernels set up lazily (a warm-up before every
capture made large training steps, whose new buckets keep appearing for a few steps, spend a
large share of their rollout capturing). Graphs share one memory pool;
they are replayed one at a time, and each one's output stays referenced, so a later capture never
reuses memory an earlier graph's output lives in.

A step may also draw the rows' next tokens (`Draws`): the sampler (grpo/rollout/hf/sampling.py) then
runs right after the forward, in the same graph, from static buffers of the rows' random-stream
keys, step counts, temperatures and top-p. Eagerly it is dozens of small kernels launched from
Python after every replay, with synchronisations around them, a large share of a decode step; in
the graph they cost only their device time, and what is left after the replay is the copy to the
host and the finish checks. It pays at large batches; at small ones the eager launches had
overlapped the replay anyway. Its branches depend on which kinds of rows the batch
holds, so those kinds are part of a graph's key; nucleus (top-p < 1) rows pick their threshold with
data-dependent shapes and are never drawn here (the caller samples them eagerly). Each row's draw
depends on its own logits, key and step alone, so it is the token the eager sampler would have
drawn.

`capture=False` runs the same fixed-shape forwards eagerly: what CPUs and the tests use to check
that the bucketing and the static cache give the results of the dynamic path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from grpo.rollout.hf.kv_cache import PreallocatedCache
from grpo.rollout.hf.sampling import BatchKinds, draw_next_tokens

Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, PreallocatedCache], torch.Tensor]
"""(input_ids [R, 1], allowed mask [R, 1, 1, W], position_ids [R, 1], cache) -> logits [R, V]."""


@dataclass(frozen=True)
class Draws:
    """What a decode step needs to draw the live rows' next tokens: per row [n] its random-stream
    key, the index of its next draw, its temperature and top-p; `kinds` of the whole batch (no
    nucleus rows: see the module docstring)."""

    keys: torch.Tensor
    steps: torch.Tensor
    temperature: torch.Tensor
    top_p: torch.Tensor
    kinds: BatchKinds


Outputs = tuple[torch.Tensor, ...]
"""A step's outputs over the bucket's rows: (logits [R, V]) or (logits, tokens [R],
logprobs [R])."""


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def row_bucket(rows: int) -> int:
    """Rows a step with `rows` live rows runs with: the next power of two."""
    return 1 << max(rows - 1, 0).bit_length()


class StaticDecoder:
    """Decode steps with fixed shapes over a persistent cache (see the module docstring).

    forward: the engine's forward (its model, in the engine's dtype).
    num_layers: the model's decoder layers (one cache layer each).
    capture: record each (rows, width) bucket as a CUDA graph and replay it (CUDA only).
    width_step: attended columns are rounded up to a multiple of this.
    min_rows: a step runs at least this many rows (padding; the cache's rows permitting): fewer
        buckets to capture, where a step costs about the same at a few rows as at this many.
    cache_dtype, keys_transposed: the cache's layout (grpo/rollout/hf/kv_cache.py).
    """

    def __init__(
        self,
        forward: Forward,
        num_layers: int,
        device: torch.device,
        *,
        capture: bool,
        width_step: int = 64,
        min_rows: int = 1,
        cache_dtype: torch.dtype | None = None,
        keys_transposed: bool = False,
    ) -> None:
        if capture and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {device}")
        self.forward = forward
        self.num_layers = num_layers
        self.device = device
        self.capture = capture
        self.width_step = width_step
        self.min_rows = min_rows
        self.buckets: set[tuple[int, int]] = set()
        """The (rows, width) shapes the steps have run (a graph each, per kind of step, when
        captured); kept across caches."""
        self.cache_dtype, self.keys_transposed = cache_dtype, keys_transposed
        self.cache: PreallocatedCache | None = None
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, Outputs]] = {}
        self._pool = None
        self._warmed: set[BatchKinds | None] = set()
        self.captures = 0
        """Graphs captured so far (each costs a capture, the first of each kind a warm-up too)."""

    # ------------------------------------------------------------------ the cache
    def cache_for(self, rows: int, capacity: int) -> PreallocatedCache:
        """The persistent cache, regrown (and its graphs dropped) if it lacks rows or columns."""
        cache = self.cache
        if cache is None or cache.rows < rows or cache.capacity < capacity:
            rows = row_bucket(max(rows, cache.rows if cache else 0))
            capacity = _round_up(max(capacity, cache.capacity if cache else 0), 4 * self.width_step)
            self.release()
            cache = PreallocatedCache(
                self.num_layers, rows, capacity, zero_columns=capacity,
                dtype=self.cache_dtype, keys_transposed=self.keys_transposed,
            )
            self.cache = cache
            self._input_ids = torch.zeros(rows, 1, dtype=torch.long, device=self.device)
            self._positions = torch.zeros(rows, 1, dtype=torch.long, device=self.device)
            self._allowed = torch.ones(rows, 1, 1, capacity, dtype=torch.bool, device=self.device)
            self._write_index = torch.zeros(1, dtype=torch.long, device=self.device)
            # The sampler's inputs; padding rows keep finite values (a draw nobody reads).
            self._keys = torch.zeros(rows, dtype=torch.long, device=self.device)
            self._steps = torch.zeros(rows, dtype=torch.long, device=self.device)
            self._temperature = torch.ones(rows, device=self.device)
            self._top_p = torch.ones(rows, device=self.device)
        return cache

    def release(self) -> None:
        """Drop the cache, the buffers and the graphs (their memory returns to the allocator)."""
        self._graphs.clear()
        self._warmed.clear()
        self.cache = None
        self._pool = None

    # ------------------------------------------------------------------ the steps
    def step(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        pos: int,
        allowed: torch.Tensor,
        draws: Draws | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """One decode step: live row b (of B) feeds `tokens[b]` at `positions[b]`, written to
        column `pos`, attending the columns where `allowed[b]` ([B, capacity], the batch's own
        mask, column `pos` included) is true. Returns the next-token logits [B, V] and, when
        `draws` is given, the tokens drawn from them with their log-probs ([B] each; else None)."""
        n = tokens.numel()
        rows = min(row_bucket(max(n, self.min_rows)), self.cache.rows)
        width = min(_round_up(pos + 1, self.width_step), self.cache.capacity)
        self._input_ids[:n, 0] = tokens
        self._positions[:n, 0] = positions
        self._allowed[:n, 0, 0, :width] = allowed[:, :width]
        self._allowed[n:rows, 0, 0, :width] = True  # padding rows: finite, never read
        self._write_index.fill_(pos)
        self.buckets.add((rows, width))
        kinds = None
        if draws is not None:
            if draws.kinds.any_nucleus:
                raise ValueError("nucleus (top_p < 1) rows are sampled outside the decode step")
            kinds = draws.kinds
            self._keys[:n] = draws.keys
            self._steps[:n] = draws.steps
            self._temperature[:n] = draws.temperature
            self._top_p[:n] = draws.top_p
        if not self.capture:
            outputs = self._run(rows, width, kinds)
        else:
            entry = self._graphs.get((rows, width, kinds))
            if entry is None:
                entry = self._graphs[(rows, width, kinds)] = self._record(rows, width, kinds)
                self.captures += 1
            else:
                entry[0].replay()
            outputs = entry[1]
        drawn = None if kinds is None else (outputs[1][:n], outputs[2][:n])
        return outputs[0][:n], drawn

    def _run(self, rows: int, width: int, kinds: BatchKinds | None) -> Outputs:
        self.cache.set_static(slice(0, rows), width, self._write_index)
        logits = self.forward(
            self._input_ids[:rows],
            self._allowed[:rows, :, :, :width],
            self._positions[:rows],
            self.cache,
        )
        if kinds is None:
            return (logits,)
        tokens, logprobs = draw_next_tokens(
            logits, self._keys[:rows], self._steps[:rows], self._temperature[:rows],
            self._top_p[:rows], kinds,
        )
        return logits, tokens, logprobs

    def _record(
        self, rows: int, width: int, kinds: BatchKinds | None
    ) -> tuple[torch.cuda.CUDAGraph, Outputs]:
        """Capture the step, then replay it (capturing runs no kernels): the replay is this step.
        The first capture of each kind of step since the cache was made is preceded by an eager
        warm-up on a side stream, for whatever its kernels initialise lazily; later buckets
        differ only in shapes and skip it, which halves the host work of a capture."""
        if kinds not in self._warmed:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self._run(rows, width, kinds)
            torch.cuda.current_stream(self.device).wait_stream(side)
            self._warmed.add(kinds)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = self._run(rows, width, kinds)
        graph.replay()
        return graph, outputs

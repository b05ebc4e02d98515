"""Fixed-shape decode steps for HFEngine, replayed as CUDA graphs on a GPU.

A decode step of a small model on a GPU is launch-bound: SmolLM2-135M's eager step launched
~1,200 kernels from Python (H100 profile at batch 512, sampling included), each doing
microseconds of work, so the step costs the same at batch 16 as at 512 and the GPU idles. A CUDA graph records the step's kernels once and replays them with one
launch; that needs every tensor shape and address to be the same at every replay. So the decode
steps run over

- one persistent KV cache (grpo/rollout/kv_cache.py, zeroed when allocated) that every wave
  reuses; it grows, and drops its graphs, only when a wave needs more rows or columns;
- a bucketed shape: the live rows padded up to a power of two, and the attended columns [0, width)
  with width rounded up to a multiple of `width_step`. Padding rows attend to every column and
  compute finite garbage that nobody reads; the columns a live row may not see are masked;
- static input buffers (token ids, positions, the boolean attention mask, the column written) that
  are filled in place before each step; the mask is copied from the live batch's own
  (grpo/rollout/live_batch.py), the one place that says which columns each row may attend.

One graph is captured per (rows, width) bucket when first needed: a warm-up forward on a side
stream (its result is this step's real result), then the capture. Graphs share one memory pool;
they are replayed one at a time, and each one's output stays referenced, so a later capture never
reuses memory an earlier graph's output lives in.

`capture=False` runs the same fixed-shape forwards eagerly: what CPUs and the tests use to check
that the bucketing and the static cache give the results of the dynamic path.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from grpo.rollout.kv_cache import PreallocatedCache

Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, PreallocatedCache], torch.Tensor]
"""(input_ids [R, 1], allowed mask [R, 1, 1, W], position_ids [R, 1], cache) -> logits [R, V]."""


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
    cache_dtype, keys_transposed: the cache's layout (grpo/rollout/kv_cache.py).
    """

    def __init__(
        self,
        forward: Forward,
        num_layers: int,
        device: torch.device,
        *,
        capture: bool,
        width_step: int = 64,
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
        self.cache_dtype, self.keys_transposed = cache_dtype, keys_transposed
        self.cache: PreallocatedCache | None = None
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = None
        self.captures = 0
        """Graphs captured so far (each costs a warm-up forward and a capture)."""

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
        return cache

    def release(self) -> None:
        """Drop the cache, the buffers and the graphs (their memory returns to the allocator)."""
        self._graphs.clear()
        self.cache = None
        self._pool = None

    # ------------------------------------------------------------------ the steps
    def step(
        self, tokens: torch.Tensor, positions: torch.Tensor, pos: int, allowed: torch.Tensor
    ) -> torch.Tensor:
        """One decode step: live row b (of B) feeds `tokens[b]` at `positions[b]`, written to
        column `pos`, attending the columns where `allowed[b]` ([B, capacity], the batch's own
        mask, column `pos` included) is true. Returns the next-token logits, [B, V]."""
        n = tokens.numel()
        rows = min(row_bucket(n), self.cache.rows)
        width = min(_round_up(pos + 1, self.width_step), self.cache.capacity)
        self._input_ids[:n, 0] = tokens
        self._positions[:n, 0] = positions
        self._allowed[:n, 0, 0, :width] = allowed[:, :width]
        self._allowed[n:rows, 0, 0, :width] = True  # padding rows: finite, never read
        self._write_index.fill_(pos)
        if not self.capture:
            return self._run(rows, width)[:n]
        entry = self._graphs.get((rows, width))
        if entry is None:
            entry = self._graphs[(rows, width)] = self._record(rows, width)
            self.captures += 1
        else:
            entry[0].replay()
        return entry[1][:n]

    def _run(self, rows: int, width: int) -> torch.Tensor:
        self.cache.set_static(slice(0, rows), width, self._write_index)
        return self.forward(
            self._input_ids[:rows],
            self._allowed[:rows, :, :, :width],
            self._positions[:rows],
            self.cache,
        )

    def _record(self, rows: int, width: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Warm up on a side stream (the result is this step's), then capture the same step.
        Capturing runs no kernels, so the cache holds what the warm-up wrote."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            warm = self._run(rows, width)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._run(rows, width)
        out.copy_(warm)
        return graph, out

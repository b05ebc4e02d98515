"""HFEngine: batched, KV-cached sampling with a transformers causal LM (CPU first; CUDA/MPS work).

A `generate` call decodes its requests in one live batch of up to `max_batch_size` rows
(grpo/rollout/hf/decode_loop.py); `serve` does the same for requests that keep arriving from the
collector while it decodes (continuous batching):

1. Requests with identical prompt ids (the G samples of a GRPO group) share one prefill: unique
   prompts are prefilled in length-sorted, left-padded chunks (grpo/rollout/hf/prefill.py) into a
   preallocated KV cache (grpo/rollout/hf/kv_cache.py), then the prompt's cache rows are copied out
   to every sample.
2. A decode loop written over the model's own forward (its KV-cache argument, an explicit 4-D
   attention mask and per-row position ids, so left padding gives the same result as unpadded
   sampling) samples one token per live row and step (grpo/rollout/hf/sampling.py). The engine's copy
   attends for decode steps with grpo/rollout/hf/decode_attention.py (two small batched matmuls per
   layer instead of SDPA's CPU kernel).
3. Rows that finish (stop token, stop string, max_new_tokens) are delivered at once and stop being
   sampled; once enough of them have finished, the batch and its cache are compacted so they stop
   costing compute. Requests waiting for a row join between two steps
   (grpo/rollout/hf/live_batch.py); in `serve`, a finished row of an episode waits a few steps for
   the episode's next turn, which then prefills only its new tokens into the same row.
4. On CUDA (`decode_mode="graph"`, the default there) the decode steps run with fixed shapes over
   one persistent cache and are replayed as CUDA graphs (grpo/rollout/hf/decode_graphs.py): a
   small model's eager step launches over a thousand kernels, launch-bound whatever the batch.

The model side (grpo/rollout/hf/runner.py `ModelRunner`): by default the engine keeps its own
inference copy of the policy (LoRA merged in): Linear weights in bf16, pre-packed for oneDNN and
with q/k/v and gate/up fused into one matmul each, everything else (embeddings, norms, residual
stream, attention, KV cache) in the policy's fp32 -- what bf16 autocast computes, without
autocast re-casting every weight at every call (grpo/rollout/hf/weights.py). `sync_weights`
copies the policy's current weights into the copy. `copy_weights: false` samples from the policy
module itself (under autocast in the compute dtype) instead, and `sync_weights` then has nothing
to do. What a model family allows (fused projections, norms, the lean forward) is its record in
grpo/rollout/hf/families/.

Settings: the engine takes its config section (`rollout.hf`, grpo/rollout/config.py
`HFEngineConfig`) and resolves it for its device once (`HFEngineConfig.for_device`); the run's
compute dtype, device and seed come from the other sections (grpo/rollout/registry.py).

Reproducibility: a seeded request draws its random numbers from its own counter-based stream
(grpo/rollout/hf/sampling.py), so the same requests in the same batch give the same tokens and
log-probs everywhere; in fp32 on a CPU its tokens do not depend on the rows beside it either (up
to near-ties within fp32 rounding), in bf16 they do. `sampling_promise` says which holds here
(grpo/rollout/hf/batch_invariance.py has the promise and its measurements).

Thread safety: `generate` and `serve` may be called from a worker thread (the collector uses
`asyncio.to_thread`); a lock serialises callers, and torch ops release the GIL while they run.
"""

from __future__ import annotations

import threading

import torch

from grpo.models.peft_weights import language_model_of
from grpo.rollout.base import (
    GenerationRequest,
    GenerationResult,
    RequestFeed,
    RolloutEngine,
    check_request,
)
from grpo.rollout.config import HFEngineConfig
from grpo.rollout.hf.batch_invariance import SamplingPromise, sampling_promise
from grpo.rollout.hf.decode_loop import DecodeLoop
from grpo.rollout.hf.runner import ModelRunner


class HFEngine(RolloutEngine):
    """Batched KV-cached sampling over a transformers causal LM (see the module docstring).

    model: a transformers causal LM, a peft model, or a wrapper holding one (`language_model_of`).
    tokenizer: needed only for `stop_strings` (and to find a pad id).
    config: the engine's section (`rollout.hf`; None: its defaults), resolved for the device here.
    device: where the engine runs (None: where the model's parameters are).
    dtype: the compute dtype: of the copy's Linear weights, i.e. of its matmuls (None: the
        policy's dtype; everything else keeps the policy's dtype, grpo/rollout/hf/weights.py);
        without a weight copy, the autocast dtype where it differs from the model's.
    seed: seeds the engine's generator, which seeds requests that carry no seed of their own.
    """

    def __init__(
        self,
        model,
        tokenizer=None,
        config: HFEngineConfig | None = None,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = torch.bfloat16,
        seed: int = 0,
    ) -> None:
        if device is None:
            device = next(language_model_of(model).parameters()).device
        self.device = torch.device(device)
        self.settings = (config or HFEngineConfig()).for_device(self.device.type)
        """The `rollout.hf` section resolved for this device (every null a number)."""
        self.tokenizer = tokenizer
        self.joins_running_batches = self.settings.continuous_batching
        pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        self.runner = ModelRunner(model, self.settings, self.device, dtype, pad)
        self.dtype = dtype
        self.loop = DecodeLoop(
            self.runner, self.settings, tokenizer, torch.Generator().manual_seed(seed)
        )
        """The decode loop every `generate` and `serve` call runs (grpo/rollout/hf/decode_loop.py)."""
        self._lock = threading.Lock()
        self.last_metrics: dict[str, float] = {}

    def describe(self) -> dict[str, str]:
        settings = self.settings
        return {
            "engine": "hf",
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "forward": self.runner.forward_kind,
            "decode_mode": settings.decode_mode,
            "max_batch_size": str(settings.max_batch_size),
            "kv_cache_dtype": str(self.runner.kv_cache_dtype or "model").removeprefix("torch."),
            "continuous_batching": str(settings.continuous_batching).lower(),
            "weight_bytes": str(self.runner.weight_bytes()),
            "sampling": str(self.sampling_promise),
        }

    @property
    def sampling_promise(self) -> SamplingPromise:
        """What a seeded request's tokens depend on here: reproducible for a fixed batch, or
        batch-invariant too (batch_invariance.py); the products are probed once per process."""
        runner = self.runner
        return sampling_promise(
            runner.model, self.device, runner.autocast_dtype, runner.kv_cache_dtype
        )

    def sync_weights(self, policy) -> None:
        """Copy the policy's current weights (LoRA merged) into the engine's copy."""
        with self._lock:
            self.runner.sync_weights(policy)

    def close(self) -> None:
        """Drop the engine's weight copy (the engine cannot generate afterwards)."""
        with self._lock:
            self.runner.close()

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        if not requests:
            return []
        for request in requests:
            check_request(request, has_tokenizer=self.tokenizer is not None)
        # Identical prompts adjacent: they share one prefill when they join together.
        groups: dict[tuple[int, ...], list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault(tuple(request.prompt_ids), []).append(index)
        feed = _ListFeed(requests, [i for members in groups.values() for i in members])
        # Requests beyond the first max_batch_size join as rows finish: room for one more budget.
        budget = max(r.sampling.max_new_tokens for r in requests)
        rows = self.settings.max_batch_size
        waves = len(requests) > rows
        self._run(feed, rows=min(len(requests), rows), extra_columns=budget if waves else 0,
                  park=False)
        if feed.error is not None:
            raise feed.error
        return feed.results  # type: ignore[return-value]

    def serve(self, feed: RequestFeed) -> None:
        """Continuous batching (see RolloutEngine.serve): a request that fails validation is
        delivered as an error (`feed.fail`), the others are not affected."""
        self._run(feed, rows=self.settings.max_batch_size, extra_columns=self.settings.join_columns,
                  park=True, join_wait_steps=self.settings.join_wait_steps)

    def _run(self, feed: RequestFeed, **options) -> None:
        with self._lock, self.runner.running():
            self.last_metrics = self.loop.run(feed, **options)


class _ListFeed(RequestFeed):
    """The feed of one `generate` call: its requests (in `order`), then closed; results by index."""

    def __init__(self, requests: list[GenerationRequest], order: list[int]) -> None:
        self.pending = [(i, requests[i]) for i in order]
        self.results: list[GenerationResult | None] = [None] * len(requests)
        self.error: Exception | None = None

    def take(
        self, *, close_if_empty: bool, wait_s: float = 0.0
    ) -> list[tuple[int, GenerationRequest]]:
        taken, self.pending = self.pending, []
        return taken

    def deliver(self, ticket: int, result: GenerationResult) -> None:
        self.results[ticket] = result

    def fail(self, ticket: int, error: Exception) -> None:
        self.error = self.error or error

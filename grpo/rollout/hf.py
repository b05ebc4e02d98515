"""HFEngine: batched, KV-cached sampling with a transformers causal LM (CPU first; CUDA/MPS work).

A `generate` call decodes its requests in one live batch of up to `max_batch_size` rows
(grpo/rollout/decode_loop.py); `serve` does the same for requests that keep arriving from the
collector while it decodes (continuous batching):

1. Requests with identical prompt ids (the G samples of a GRPO group) share one prefill: unique
   prompts are prefilled in length-sorted, left-padded chunks (grpo/rollout/prefill.py) into a
   preallocated KV cache (grpo/rollout/kv_cache.py), then the prompt's cache rows are copied out
   to every sample.
2. A decode loop written over the model's own forward (its KV-cache argument, an explicit 4-D
   attention mask and per-row position ids, so left padding gives the same result as unpadded
   sampling) samples one token per live row and step (grpo/rollout/sampling.py). The engine's copy
   attends for decode steps with grpo/rollout/decode_attention.py (two small batched matmuls per
   layer instead of SDPA's CPU kernel: batch-64 decode steps 14% faster).
3. Rows that finish (stop token, stop string, max_new_tokens) are delivered at once and stop being
   sampled; once enough of them have finished, the batch and its cache are compacted so they stop
   costing compute. Requests waiting for a row join between two steps
   (grpo/rollout/live_batch.py); in `serve`, a finished row of an episode waits a few steps for
   the episode's next turn, which then prefills only its new tokens into the same row.
4. On CUDA (`decode_mode="graph"`, the default there) the decode steps run with fixed shapes over
   one persistent cache and are replayed as CUDA graphs (grpo/rollout/decode_graphs.py): a
   135M model's eager step launches ~1,200 kernels, 33-40 ms on an H100 whatever the batch.

Weights: by default the engine keeps its own inference copy of the policy (LoRA merged in):
Linear weights in bf16, pre-packed for oneDNN and with q/k/v and gate/up fused into one matmul
each, everything else (embeddings, norms, residual stream, attention, KV cache) in the policy's
fp32 -- what bf16 autocast computes, without autocast re-casting every weight at every call
(grpo/rollout/weights.py has the measurements). `sync_weights` copies the policy's current
weights into the copy. `copy_weights=False` samples from the policy module itself (optionally
under autocast) instead, and `sync_weights` then has nothing to do.

Reproducibility: a seeded request draws its random numbers from its own counter-based stream
(grpo/rollout/sampling.py), so the same requests in the same batch give the same tokens and
log-probs everywhere; in fp32 on a CPU its tokens do not depend on the rows beside it either (up
to near-ties within fp32 rounding), in bf16 they do. `sampling_promise` says which holds here
(grpo/rollout/batch_invariance.py has the promise and its measurements).

Thread safety: `generate` and `serve` may be called from a worker thread (the collector uses
`asyncio.to_thread`); a lock serialises callers, and torch ops release the GIL while they run.
"""

from __future__ import annotations

import contextlib
import threading
from typing import get_args

import torch
from torch import nn

from grpo.models.cache_argument import cache_keyword
from grpo.models.peft_weights import base_model_of, language_model_of
from grpo.models.training_attention import ADDITIVE_MASK_ATTENTIONS
from grpo.rollout.base import (
    GenerationRequest,
    GenerationResult,
    RequestFeed,
    RolloutEngine,
    check_request,
)
from grpo.rollout.batch_invariance import SamplingPromise, sampling_promise
from grpo.rollout.config import DecodeMode, HFEngineConfig
from grpo.rollout.decode_attention import ENGINE_ATTENTION
from grpo.rollout.decode_graphs import StaticDecoder
from grpo.rollout.decode_loop import DecodeLoop
from grpo.rollout.lean_forward import LeanForward
from grpo.rollout.prefill import PREFILL_CALL_TOKENS
from grpo.rollout.weights import copy_weights_into, inference_copy

DECODE_MODES = get_args(DecodeMode)
GRAPH_MIN_ROWS = 64
"""CUDA-graph decode steps run at least this many rows (padding), so the 1-32-row buckets of a
draining batch's tail need no graphs of their own at every width (a 512-episode step still
captured new graphs after two steps). The price: on one H200 (`bench.run --sections generation`,
2026-11-27) a step took ~4.7 ms at 16 rows and ~5.7 ms at 64 (3,390 and 11,177 tokens/s); the
trade's net effect on a training step was not measured on its own."""


def _check_full_attention(model) -> None:
    config = (
        model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    )
    layer_types = getattr(config, "layer_types", None) or []
    other = sorted({t for t in layer_types if t != "full_attention"})
    if other:
        raise NotImplementedError(
            f"HFEngine handles full-attention layers only; this model also has {other} layers"
        )


class HFEngine(RolloutEngine):
    """Batched KV-cached sampling over a transformers causal LM (see the module docstring).

    model: a transformers causal LM, a peft model, or a wrapper holding one (`language_model_of`).
    tokenizer: needed only for `stop_strings` (and to find a pad id).
    dtype: dtype of the copy's Linear weights, i.e. of its matmuls (None: the policy's dtype).
        Everything else keeps the policy's dtype (grpo/rollout/weights.py).
    head_dtype: dtype of the copy's LM head (None: `dtype`).
    fuse_norms: the copy's RMSNorm layers as one `torch.rms_norm` op each (fused_norms.py).
    lean_forward: run the copy's forwards without transformers' module plumbing, the same ops
        and logits (lean_forward.py), where the model is a Llama; `lean_reason` says why not.
    autocast_dtype: run forwards under `torch.autocast` in this dtype (for `copy_weights=False`).
    compact_fraction: compact the batch once this fraction of its rows has finished (0: at every
        finish; > 1: never).
    max_batch_size: rows decoded together (None: 512 on CUDA, else 64).
    prefill_chunk_tokens: padded prompt tokens per prefill forward (bounds activation memory;
        None: 32768 on CUDA, else 4096).
    seed: seeds the engine's generator, which seeds requests that carry no seed of their own.
    decode_attention: "grouped" (the copy's decode steps use grpo/rollout/decode_attention.py) or
        "sdpa" (transformers' SDPA throughout). Only the engine's own copy is switched.
    decode_mode: "dynamic" (each step attends exactly the columns in use, a fresh cache per
        wave), "static" (fixed-shape steps over a persistent cache, grpo/rollout/decode_graphs.py),
        "graph" (static steps replayed as CUDA graphs; CUDA only) or "auto" (graph on CUDA with
        the engine's own weight copy, else dynamic).
    sample_in_decode_step: with "static" or "graph" decode, draw the rows' next tokens inside the
        decode step (in its CUDA graph), unless a row samples with top_p < 1
        (grpo/rollout/decode_graphs.py); the same tokens either way.
    continuous_batching: offer `serve` to the collector (`joins_running_batches`); False: the
        collector batches each turn's requests into `generate` calls.
    park_steps, park_wait_s: how long `serve` keeps a finished row of a session for the
        session's next turn (grpo/rollout/live_batch.py): at most `park_steps` decode steps, and
        at most `park_wait_s` seconds of waiting when nothing else is live (0 steps: never).
    join_columns: `serve` sizes a batch's cache for its first prompts, their token budgets and
        this many columns more, for the longer prompts of requests that join later (None: 512
        on CUDA, else 1024).
    join_wait_steps: in `serve`, requests that arrive while rows are decoding wait until the
        first of them has waited this many decode steps, then join together in one prefill
        (0: each decode step admits what arrived).
    kv_cache_dtype: the KV cache's dtype: "auto" (the copy's matmul dtype on a CPU or a CUDA GPU
        with grouped decode attention, else the model's), a torch dtype, or None (the model's).
    keys_transposed: store keys [rows, heads, dim, columns] (None: on a CPU with a bf16 cache,
        where it pays).
    shared_prefix_min_tokens: distinct prompts that join together prefill the prefix they all
        start with once, where that saves at least this many prefill tokens (0: never;
        grpo/rollout/prefill.py `shared_prefix_length`).
    prefix_attention_min_tokens: a batch keeps a shared prefix of at least this many tokens
        once (kv_cache.py `keep_prefix`): decode steps attend to it once for all the rows that
        start with it, and rows that join later with it are not prefilled with it again
        (decode_attention.py; 0: never). Dynamic decode with the engine's own weight copy and
        grouped decode attention only.
    prefix_attention_min_cells: a decode step attends the kept prefix once where that reads at
        least this many fewer cache cells (rows x columns) from the rows; below, its fixed cost
        is more than the copies it saves (SmolLM2-135M on this project's 2-core CPU: break-even
        near 4,096, e.g. 16 rows x 256 columns or 64 x 64: the default; README, "Performance").
    """

    joins_running_batches = True

    def __init__(
        self,
        model,
        tokenizer=None,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = torch.bfloat16,
        head_dtype: torch.dtype | None = None,
        copy_weights: bool = True,
        fuse_norms: bool = True,
        lean_forward: bool = True,
        autocast_dtype: torch.dtype | None = None,
        max_batch_size: int | None = None,
        compact_fraction: float = 0.25,
        prefill_chunk_tokens: int | None = None,
        seed: int = 0,
        decode_attention: str = "grouped",
        decode_mode: str = "auto",
        sample_in_decode_step: bool = True,
        continuous_batching: bool = True,
        join_columns: int | None = None,
        join_wait_steps: int = 0,
        shared_prefix_min_tokens: int = 64,
        prefix_attention_min_tokens: int = 64,
        prefix_attention_min_cells: int = 4096,
        kv_cache_dtype: torch.dtype | str | None = "auto",
        keys_transposed: bool | None = None,
        park_steps: int = 64,
        park_wait_s: float = 2.0,
    ) -> None:
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if decode_attention not in ("grouped", "sdpa"):
            raise ValueError(
                f"decode_attention must be 'grouped' or 'sdpa', got {decode_attention!r}"
            )
        if decode_mode not in DECODE_MODES:
            raise ValueError(f"decode_mode must be one of {DECODE_MODES}, got {decode_mode!r}")
        lm = language_model_of(model)
        self.device = torch.device(device) if device is not None else next(lm.parameters()).device
        if decode_mode == "auto":
            decode_mode = "graph" if self.device.type == "cuda" and copy_weights else "dynamic"
        if decode_mode == "graph" and self.device.type != "cuda":
            raise ValueError(f"decode_mode 'graph' needs a CUDA device, not {self.device}")
        self.decode_mode = decode_mode
        self.sample_in_decode_step = sample_in_decode_step
        self.tokenizer = tokenizer
        self.copy_weights = copy_weights
        self.autocast_dtype = autocast_dtype
        defaults = HFEngineConfig()  # the device-dependent defaults of the `hf:` config section
        self.max_batch_size = max_batch_size or defaults.batch_size_for(self.device.type)
        self.compact_fraction = compact_fraction
        if join_columns is not None and join_columns < 0:
            raise ValueError(f"join_columns must be >= 0, got {join_columns}")
        self.join_columns = (
            defaults.join_columns_for(self.device.type) if join_columns is None else join_columns
        )
        if join_wait_steps < 0:
            raise ValueError(f"join_wait_steps must be >= 0, got {join_wait_steps}")
        self.join_wait_steps = join_wait_steps
        if shared_prefix_min_tokens < 0:
            raise ValueError(
                f"shared_prefix_min_tokens must be >= 0, got {shared_prefix_min_tokens}"
            )
        self.shared_prefix_min_tokens = shared_prefix_min_tokens
        if prefix_attention_min_tokens < 0:
            raise ValueError(
                f"prefix_attention_min_tokens must be >= 0, got {prefix_attention_min_tokens}"
            )
        if prefix_attention_min_cells < 1:
            raise ValueError(
                f"prefix_attention_min_cells must be >= 1, got {prefix_attention_min_cells}"
            )
        self.prefix_attention_min_cells = prefix_attention_min_cells
        grouped_copy = copy_weights and decode_attention == "grouped"
        self.prefix_attention_min_tokens = (
            prefix_attention_min_tokens if grouped_copy and decode_mode == "dynamic" else 0
        )
        if park_steps < 0 or park_wait_s < 0:
            raise ValueError(
                f"park_steps and park_wait_s must be >= 0, got {park_steps}, {park_wait_s}"
            )
        self.park_steps, self.park_wait_s = park_steps, park_wait_s
        self.joins_running_batches = continuous_batching
        self.prefill_chunk_tokens = prefill_chunk_tokens or defaults.prefill_chunk_for(
            self.device.type
        )
        self.prefill_call_tokens = PREFILL_CALL_TOKENS.get(self.device.type)
        if copy_weights:
            self.model = inference_copy(lm, dtype, head_dtype, self.device, fuse_norms)
            # Our 4-D masks are boolean SDPA masks; the copy is ours to configure.
            self.model.set_attn_implementation(
                ENGINE_ATTENTION if decode_attention == "grouped" else "sdpa"
            )
        else:
            self.model = lm
        self.lean, self.lean_reason = (
            LeanForward.build(self.model) if lean_forward else (None, "lean_forward is off")
        )
        self._mask_kind = self._attention_mask_kind()
        self._cache_keyword = cache_keyword(self.model)
        self.kv_cache_dtype = self._cache_dtype(
            kv_cache_dtype, dtype, copy_weights, decode_attention
        )
        # Measured on CPU: stored transposed, a bf16 cache's query x keys product runs ~2x faster;
        # an fp32 one's slower (README, "Performance").
        self.keys_transposed = (
            self.device.type == "cpu" and self.kv_cache_dtype == torch.bfloat16
            if keys_transposed is None
            else keys_transposed
        )
        _check_full_attention(self._plain_model())
        config = self._plain_model().config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        self._num_layers = text_config.num_hidden_layers
        pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        self._pad_id = pad if pad is not None else (getattr(text_config, "pad_token_id", None) or 0)
        if decode_mode in ("static", "graph") and self._mask_kind != "bool":
            raise ValueError(
                f"decode_mode {decode_mode!r} needs boolean attention masks (sdpa or the engine's "
                "attention), not this model's additive ones"
            )
        self._static = (
            StaticDecoder(
                self._forward, self._num_layers, self.device, capture=decode_mode == "graph",
                min_rows=GRAPH_MIN_ROWS if decode_mode == "graph" else 1,
                cache_dtype=self.kv_cache_dtype, keys_transposed=self.keys_transposed,
            )
            if decode_mode in ("static", "graph")
            else None
        )
        self._lock = threading.Lock()
        self._loop = DecodeLoop(self)
        self._generator = torch.Generator().manual_seed(seed)
        self.last_metrics: dict[str, float] = {}

    def _cache_dtype(self, asked, dtype, copy_weights: bool, decode_attention: str):
        """The KV cache's dtype (None: the key states', i.e. the model's). "auto": on a CPU or a
        CUDA GPU, the engine copy's matmul dtype (bf16 by default: the cache is read at every
        decode step, and a bf16 one halves that; the trainer's attention under autocast reads
        bf16 keys too). On a GPU the model's fp32 cache also made both attention products fp32
        matmuls: on one H200 at batch 512 they were 1.45 ms of a 6.9 ms decode step."""
        grouped = copy_weights and decode_attention == "grouped"
        if asked == "auto":
            return dtype if grouped and self.device.type in ("cpu", "cuda") else None
        if asked is not None and not isinstance(asked, torch.dtype):
            raise TypeError(f"kv_cache_dtype must be 'auto', a torch dtype or None, not {asked!r}")
        states = self._plain_model().get_input_embeddings().weight.dtype
        if asked is not None and asked != states and not grouped:
            raise ValueError(
                f"kv_cache_dtype {asked} differs from the model's {states}: that needs the "
                "engine's own weight copy with decode_attention 'grouped' (SDPA takes queries "
                "and keys of one dtype)"
            )
        return asked

    # ------------------------------------------------------------------ weights
    def _plain_model(self) -> nn.Module:
        return base_model_of(self.model)

    def _attention_mask_kind(self) -> str:
        impl = getattr(self._plain_model().config, "_attn_implementation", "sdpa")
        if impl in ("sdpa", ENGINE_ATTENTION):
            return "bool"
        if impl in ADDITIVE_MASK_ATTENTIONS:
            return "additive"
        raise NotImplementedError(
            f"HFEngine(copy_weights=False) needs attn_implementation 'sdpa' or one of "
            f"{ADDITIVE_MASK_ATTENTIONS}, not {impl!r}"
        )

    @torch.no_grad()
    def sync_weights(self, policy) -> None:
        """Copy the policy's current weights (LoRA merged) into the engine's copy."""
        lm = language_model_of(policy)
        if not self.copy_weights:
            if lm is not self.model:
                raise ValueError(
                    "HFEngine(copy_weights=False) samples from the module it was built with"
                )
            return
        with self._lock:
            copy_weights_into(self.model, lm)

    @property
    def forward_kind(self) -> str:
        """"lean" (lean_forward.py), or "transformers' modules (<why not lean>)"."""
        return "lean" if self.lean is not None else f"transformers' modules ({self.lean_reason})"

    @property
    def sampling_promise(self) -> SamplingPromise:
        """What a seeded request's tokens depend on here: reproducible for a fixed batch, or
        batch-invariant too (batch_invariance.py); the products are probed once per process."""
        return sampling_promise(self.model, self.device, self.autocast_dtype, self.kv_cache_dtype)

    def close(self) -> None:
        """Drop the engine's weight copy (the engine cannot generate afterwards)."""
        with self._lock:
            if self._static is not None:
                self._static.release()
            if self.copy_weights:
                self.model = self.lean = None

    # --------------------------------------------------------------- generation
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        if not requests:
            return []
        for request in requests:
            self._validate(request)
        # Identical prompts adjacent: they share one prefill when they join together.
        groups: dict[tuple[int, ...], list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault(tuple(request.prompt_ids), []).append(index)
        feed = _ListFeed(requests, [i for members in groups.values() for i in members])
        # Requests beyond the first max_batch_size join as rows finish: room for one more budget.
        budget = max(r.sampling.max_new_tokens for r in requests)
        waves = len(requests) > self.max_batch_size
        self._loop.run(
            feed,
            rows=min(len(requests), self.max_batch_size),
            extra_columns=budget if waves else 0,
            park=False,
        )
        if feed.error is not None:
            raise feed.error
        return feed.results  # type: ignore[return-value]

    def serve(self, feed: RequestFeed) -> None:
        """Continuous batching (see RolloutEngine.serve): a request that fails validation is
        delivered as an error (`feed.fail`), the others are not affected."""
        self._loop.run(
            feed, rows=self.max_batch_size, extra_columns=self.join_columns, park=True,
            join_wait_steps=self.join_wait_steps,
        )

    def _validate(self, request: GenerationRequest) -> None:
        check_request(request, has_tokenizer=self.tokenizer is not None)

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    @contextlib.contextmanager
    def _eval_mode(self):
        was_training = self.model.training
        self.model.eval()
        try:
            yield
        finally:
            self.model.train(was_training)

    def _forward(
        self, input_ids, attention_mask, position_ids, cache, shared_prefix=None
    ) -> torch.Tensor:
        """Logits of the last position: [n, V] (the model's output dtype; the sampler upcasts).
        `shared_prefix`: a decode step's kept prefix (decode_attention.py `PrefixAttention`)."""
        if self.lean is not None:
            return self.lean(input_ids, attention_mask, position_ids, cache, shared_prefix)
        extra = {} if shared_prefix is None else {"shared_prefix": shared_prefix}
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **{self._cache_keyword: cache},
            use_cache=True,
            logits_to_keep=1,
            **extra,
        )
        return out.logits[:, -1]

    def _mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """A boolean [.., q, k] "may attend" mask in the form the attention implementation takes."""
        if self._mask_kind == "bool":
            return allowed
        dtype = self.autocast_dtype or self._plain_model().get_input_embeddings().weight.dtype
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
            ~allowed, torch.finfo(dtype).min
        )


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

"""HFEngine: batched, KV-cached sampling with a transformers causal LM (CPU first; CUDA/MPS work).

One `generate` call runs the requests in waves of up to `max_batch_size` rows:

1. Requests with identical prompt ids (the G samples of a GRPO group) share one prefill: unique
   prompts are prefilled in length-sorted, left-padded chunks (grpo/rollout/prefill.py) into a
   preallocated KV cache (grpo/rollout/kv_cache.py), then the prompt's cache rows are copied out to every sample.
2. A decode loop written over the model's own forward (`past_key_values`, an explicit 4-D
   attention mask and per-row position ids, so left padding gives the same result as unpadded
   sampling) samples one token per live row and step (grpo/rollout/sampling.py). The engine's copy
   attends for decode steps with grpo/rollout/decode_attention.py (two small batched matmuls per
   layer instead of SDPA's CPU kernel: batch-64 decode steps 14% faster).
3. Rows that finish (stop token, stop string, max_new_tokens) stop being sampled; once enough of
   them have finished, the batch and its cache are compacted so they stop costing compute.
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
(grpo/rollout/sampling.py), so its tokens
do not depend on its batch company as long as its logits do not. In fp32 they do not (the real
model, 20 seeded requests × 48 tokens, alone vs batched together: identical tokens and
log-probs). In bf16, batch shape and padding change the last bits of some activations and bf16
rounding amplifies that: seeded requests reproduce exactly in the same batch, but 9 of those 20
diverged somewhere within 48 tokens when batched. Use `dtype=None` (an fp32 copy, ~2.5x slower
on CPU) where batch-independent reproducibility matters more than speed.

Thread safety: `generate` may be called from a worker thread (the collector uses
`asyncio.to_thread`); a lock serialises callers, and torch ops release the GIL while they run.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import get_args

import torch
from torch import nn

from grpo.models.peft_weights import base_model_of, language_model_of
from grpo.rollout.base import GenerationRequest, GenerationResult, RolloutEngine, check_request
from grpo.rollout.config import DecodeMode, HFEngineConfig
from grpo.rollout.decode_attention import ENGINE_ATTENTION
from grpo.rollout.decode_graphs import StaticDecoder
from grpo.rollout.kv_cache import PreallocatedCache
from grpo.rollout.prefill import left_padded, prefill_chunks
from grpo.rollout.sampling import (
    BatchKinds,
    counter_uniforms,
    row_keys,
    sample_next_tokens,
    uniforms_per_row,
    wide_dtype,
)
from grpo.rollout.sequence import LiveSequence
from grpo.rollout.weights import copy_weights_into, inference_copy

DECODE_MODES = get_args(DecodeMode)


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
    """

    def __init__(
        self,
        model,
        tokenizer=None,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = torch.bfloat16,
        head_dtype: torch.dtype | None = None,
        copy_weights: bool = True,
        autocast_dtype: torch.dtype | None = None,
        max_batch_size: int | None = None,
        compact_fraction: float = 0.25,
        prefill_chunk_tokens: int | None = None,
        seed: int = 0,
        decode_attention: str = "grouped",
        decode_mode: str = "auto",
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
        self.tokenizer = tokenizer
        self.copy_weights = copy_weights
        self.autocast_dtype = autocast_dtype
        defaults = HFEngineConfig()  # the device-dependent defaults of the `hf:` config section
        self.max_batch_size = max_batch_size or defaults.batch_size_for(self.device.type)
        self.compact_fraction = compact_fraction
        self.prefill_chunk_tokens = prefill_chunk_tokens or defaults.prefill_chunk_for(
            self.device.type
        )
        if copy_weights:
            self.model = inference_copy(lm, dtype, head_dtype, self.device)
            # Our 4-D masks are boolean SDPA masks; the copy is ours to configure.
            self.model.set_attn_implementation(
                ENGINE_ATTENTION if decode_attention == "grouped" else "sdpa"
            )
        else:
            self.model = lm
        self._mask_kind = self._attention_mask_kind()
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
                self._forward, self._num_layers, self.device, capture=decode_mode == "graph"
            )
            if decode_mode in ("static", "graph")
            else None
        )
        self._lock = threading.Lock()
        self._generator = torch.Generator().manual_seed(seed)
        self.last_metrics: dict[str, float] = {}

    # ------------------------------------------------------------------ weights
    def _plain_model(self) -> nn.Module:
        return base_model_of(self.model)

    def _attention_mask_kind(self) -> str:
        impl = getattr(self._plain_model().config, "_attn_implementation", "sdpa")
        if impl in ("sdpa", ENGINE_ATTENTION):
            return "bool"
        if impl == "eager":
            return "additive"
        raise NotImplementedError(
            "HFEngine(copy_weights=False) needs attn_implementation 'sdpa' or 'eager', "
            f"not {impl!r}"
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

    def close(self) -> None:
        """Drop the engine's weight copy (the engine cannot generate afterwards)."""
        with self._lock:
            if self._static is not None:
                self._static.release()
            if self.copy_weights:
                self.model = None

    # --------------------------------------------------------------- generation
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        if not requests:
            return []
        for request in requests:
            self._validate(request)
        with self._lock, torch.inference_mode(), self._autocast(), self._eval_mode():
            started = time.perf_counter()
            # Unseeded requests get a seed from the engine's generator, drawn in request order.
            seeds = [
                r.sampling.seed
                if r.sampling.seed is not None
                else int(torch.randint(0, 2**62, (), generator=self._generator))
                for r in requests
            ]
            results: list[GenerationResult | None] = [None] * len(requests)
            metrics = {
                "prefill_seconds": 0.0,
                "decode_seconds": 0.0,
                "decode_forward_seconds": 0.0,
                "sample_seconds": 0.0,
                "prefill_tokens": 0.0,
                "decode_steps": 0.0,
                "compactions": 0.0,
                "waves": 0.0,
                "graph_captures": 0.0,
            }
            captured_before = self._static.captures if self._static is not None else 0
            for wave in self._waves(requests):
                metrics["waves"] += 1
                self._run_wave(requests, wave, seeds, results, metrics)
            if self._static is not None:
                metrics["graph_captures"] = float(self._static.captures - captured_before)
            seconds = time.perf_counter() - started
            generated = float(sum(len(r.token_ids) for r in results))
            metrics.update(
                requests=float(len(requests)),
                tokens_generated=generated,
                seconds=seconds,
                tokens_per_second=generated / seconds if seconds > 0 else 0.0,
            )
            self.last_metrics = metrics
            return results  # type: ignore[return-value]

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

    def _waves(self, requests: list[GenerationRequest]) -> list[list[int]]:
        """Request indices in waves of at most max_batch_size, identical prompts kept adjacent."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault(tuple(request.prompt_ids), []).append(index)
        order = [index for members in groups.values() for index in members]
        return [
            order[i : i + self.max_batch_size] for i in range(0, len(order), self.max_batch_size)
        ]

    def _forward(self, input_ids, attention_mask, position_ids, cache) -> torch.Tensor:
        """Logits of the last position: [n, V] (the model's output dtype; the sampler upcasts)."""
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
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

    def _prefill(
        self, prompts: list[tuple[int, ...]], cache: PreallocatedCache, width: int
    ) -> torch.Tensor:
        """Prefill unique prompts (sorted longest first) into cache rows 0..U-1, right-aligned at
        column `width`; returns the logits of each prompt's first sampled token, [U, V]."""
        logits = []
        for start, end in prefill_chunks([len(p) for p in prompts], self.prefill_chunk_tokens):
            ids, positions, allowed = left_padded(prompts[start:end], self._pad_id, self.device)
            length = ids.shape[1]
            mask = None if allowed is None else self._mask(allowed)
            cache.set_window(slice(start, end), lo=width - length, pos=width - length)
            logits.append(self._forward(ids, mask, positions, cache))
        return torch.cat(logits)  # [U, V]

    def _run_wave(
        self, requests, wave: list[int], seeds: list[int], results: list, metrics: dict
    ) -> None:
        for index in wave:
            if requests[index].sampling.max_new_tokens == 0:
                results[index] = LiveSequence(index, requests[index].sampling, 0).result(requests)
        # Unique prompts, longest first; the rows of one prompt adjacent.
        groups: dict[tuple[int, ...], list[int]] = {}
        for index in wave:
            if requests[index].sampling.max_new_tokens > 0:
                groups.setdefault(tuple(requests[index].prompt_ids), []).append(index)
        if not groups:
            return
        prompts = sorted(groups, key=len, reverse=True)
        rows: list[LiveSequence] = []
        row_prompt: list[int] = []
        for u, prompt in enumerate(prompts):
            for index in groups[prompt]:
                rows.append(LiveSequence(index, requests[index].sampling, seeds[index]))
                row_prompt.append(u)
        width = len(prompts[0])  # P: every prompt ends at column P - 1
        capacity = width + max(row.sampling.max_new_tokens for row in rows)
        if self._static is not None:
            cache = self._static.cache_for(len(rows), capacity)
        else:
            cache = PreallocatedCache(self._num_layers, len(rows), capacity, zero_columns=width)

        started = time.perf_counter()
        prompt_logits = self._prefill(prompts, cache, width)  # [U, V]
        source = torch.tensor(row_prompt, device=self.device)  # [B]
        if len(rows) > len(prompts):
            cache.copy_rows(source, 0, width)  # fan each prompt out to its samples
        metrics["prefill_seconds"] += time.perf_counter() - started
        metrics["prefill_tokens"] += float(sum(len(p) for p in prompts))

        started = time.perf_counter()
        first_column = [width - len(prompts[u]) for u in row_prompt]
        self._decode(
            requests, rows, cache, prompt_logits[source], first_column, width, results, metrics
        )
        metrics["decode_seconds"] += time.perf_counter() - started

    def _decode(
        self, requests, rows: list[LiveSequence], cache, logits, first_column, pos, results, metrics
    ) -> None:
        """Sample until every row has finished. `logits` [B, V] predict each row's first token;
        row b's prompt occupies cache columns [first_column[b], pos)."""
        device = self.device
        start = torch.tensor(first_column, device=device)  # [B]
        columns = torch.arange(cache.layers[0].capacity, device=device)  # [cap]
        # allowed[b, c]: column c holds one of row b's tokens (left of its prompt: padding)
        allowed = columns.unsqueeze(0) >= start.unsqueeze(1)  # [B, cap]
        temperature = torch.tensor([r.sampling.temperature for r in rows], device=device)  # [B]
        top_p = torch.tensor([r.sampling.top_p for r in rows], device=device)  # [B]
        keys = row_keys([r.seed for r in rows], device)  # [B]
        kinds = BatchKinds.of(rows)  # known here: the sampler need not ask the device
        wide = wide_dtype(device)
        n_uniforms = uniforms_per_row(logits.shape[-1])
        step = 0  # tokens each live row has drawn so far
        static = self._static
        if static is not None:
            static.begin(start, pos)
        finished = 0  # rows finished but not yet compacted away
        while True:
            t_sample = time.perf_counter()
            # [B, U]; an all-greedy batch (held-out evaluation) draws nothing
            uniforms = None if kinds.all_greedy else counter_uniforms(keys, step, n_uniforms, wide)
            tokens, logprobs = sample_next_tokens(
                logits, temperature, top_p, uniforms, kinds=kinds
            )  # [B], [B]
            step += 1
            # One device-to-host copy for both (token ids are exact in float64).
            drawn = torch.stack([tokens.to(torch.float64), logprobs.to(torch.float64)]).tolist()
            metrics["sample_seconds"] += time.perf_counter() - t_sample
            for row, token, logprob in zip(rows, drawn[0], drawn[1]):
                token = int(token)
                if row.finish_reason is None:
                    row.tokens.append(token)
                    row.logprobs.append(logprob)
                    row.finish_reason = row.finish_reason_after(token, self.tokenizer)
                    finished += row.finish_reason is not None
            if finished == len(rows):
                break
            if finished and finished >= self.compact_fraction * len(rows):
                # Finished rows leave the batch and the cache: they stop costing compute.
                for row in rows:
                    if row.finish_reason is not None:
                        results[row.request_index] = row.result(requests)
                keep_list = [i for i, row in enumerate(rows) if row.finish_reason is None]
                keep = torch.tensor(keep_list, device=device)
                cache.select_rows(keep, int(start[keep].min()), pos)
                if static is not None:
                    static.compact(keep)
                rows = [rows[i] for i in keep_list]
                tokens, start, allowed = tokens[keep], start[keep], allowed[keep]
                temperature, top_p, keys = temperature[keep], top_p[keep], keys[keep]
                kinds = BatchKinds.of(rows)
                finished = 0
                metrics["compactions"] += 1
            t_forward = time.perf_counter()
            if static is not None:
                logits = static.step(tokens, pos - start, pos)  # [B, V]
            else:
                lo = int(start.min())
                cache.set_window(slice(0, len(rows)), lo=lo, pos=pos)
                mask = self._mask(allowed[:, None, None, lo : pos + 1])  # [B, 1, 1, pos + 1 - lo]
                positions = (pos - start).unsqueeze(1)  # [B, 1]
                logits = self._forward(tokens.unsqueeze(1), mask, positions, cache)  # [B, V]
            metrics["decode_forward_seconds"] += time.perf_counter() - t_forward
            pos += 1
            metrics["decode_steps"] += 1
        for row in rows:
            results[row.request_index] = row.result(requests)

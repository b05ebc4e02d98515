"""What the HF engine does with seeded requests, and what it says it does (its sampling promise),
measured on the tiny model: tests/test_sampling_promise.py runs it in process, and as a script
(`python tests/promise_report.py`, printing JSON) under another CPU family's kernels, which only
the environment of a fresh process can force."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # as a script: conftest beside it

from conftest import build_varied_tiny_model

from grpo.models.source import load_tokenizer
from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.hf import HFEngine
from grpo.rollout.weights import _onednn_bf16, linear_products

DIRECT_ROWS = 80
DIRECT_COUNTS = (*range(1, 18), 31, 33, 63, 64)
"""Row counts the direct check computes alone among `DIRECT_ROWS`: every decode batch up to 17
and the block edges above, more than the probe itself tries (weights.py `_PROBE_COUNTS`)."""


def requests(tokenizer) -> list[GenerationRequest]:
    """Prompts of different lengths (so batching pads them), a group of identical ones, greedy,
    nucleus and tempered rows, rows that finish at different steps."""
    texts = ["What is 964 * 494?", "Hi", "A longer prompt, with a few more tokens in it.", "2+2"]
    out = [
        GenerationRequest(tokenizer.encode(text), SamplingParams(max_new_tokens=12, seed=i))
        for i, text in enumerate(texts)
    ]
    out += [
        GenerationRequest(tokenizer.encode("Hi"), SamplingParams(max_new_tokens=9, seed=10 + k))
        for k in range(3)
    ]
    out.append(GenerationRequest(tokenizer.encode(texts[2]), SamplingParams(
        max_new_tokens=10, seed=20, temperature=0.7, top_p=0.9)))
    out.append(GenerationRequest(tokenizer.encode(texts[0]), SamplingParams(
        max_new_tokens=6, temperature=0.0)))
    return out


def measure(model, tokenizer, dtype: torch.dtype) -> dict:
    """The engine's promise, and what its samples do: one batch twice and on a fresh engine
    (reproducible?), and each request alone (batch-invariant?)."""
    batch = requests(tokenizer)
    engine = HFEngine(model, tokenizer, dtype=dtype)
    first, again = engine.generate(batch), engine.generate(batch)
    fresh = HFEngine(model, tokenizer, dtype=dtype).generate(batch)
    alone = [engine.generate([request])[0] for request in batch]
    promise = engine.sampling_promise
    same_tokens = [a.token_ids == b.token_ids for a, b in zip(first, alone)]
    return {
        "promise": str(promise),
        "batch_invariant": promise.batch_invariant,
        "reproducible": all(
            [r.token_ids for r in run] == [r.token_ids for r in first]
            and [r.behavior_logprobs for r in run] == [r.behavior_logprobs for r in first]
            for run in (again, fresh)
        ),
        "alone_same_tokens": sum(same_tokens),
        "requests": len(batch),
        # The log-probs of the requests that sampled the same tokens alone, and batched.
        "alone_logprobs": [x for r, same in zip(alone, same_tokens) if same
                           for x in r.behavior_logprobs],
        "batched_logprobs": [x for r, same in zip(first, same_tokens) if same
                             for x in r.behavior_logprobs],
        "vocab": model.config.vocab_size,
        "packers": sorted({str(m.packer) for m in linear_products(engine.model)}),
    }


def probe_against_direct(model, tokenizer, dtype: torch.dtype) -> list[dict]:
    """For each kind of product in the engine's copy: what the probe says, and what computing
    each of `DIRECT_COUNTS` rows alone among `DIRECT_ROWS` (other data) shows."""
    engine = HFEngine(model, tokenizer, dtype=dtype)
    found = []
    for matmul in linear_products(engine.model):
        x = torch.randn(
            DIRECT_ROWS, matmul.weight.shape[1], generator=torch.Generator().manual_seed(7)
        ).to(dtype)
        together = matmul(x)
        direct = all(torch.equal(matmul(x[:n]), together[:n]) for n in DIRECT_COUNTS)
        found.append({
            "shape": list(matmul.weight.shape), "packer": str(matmul.packer),
            "probe": matmul.rows_independent(), "direct": direct,
        })
    return found


def main() -> None:
    torch.set_num_threads(1)
    tokenizer = load_tokenizer("tiny-random")
    model = build_varied_tiny_model(tokenizer)
    report = {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn_bf16": _onednn_bf16(),
        "probe": probe_against_direct(model, tokenizer, torch.float32),
    }
    for dtype in (torch.float32, torch.bfloat16):
        report[str(dtype)] = measure(model, tokenizer, dtype)
    print(json.dumps(report))


if __name__ == "__main__":
    main()

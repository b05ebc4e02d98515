"""What the HF engine promises about a seeded request's tokens, on the CPU it runs on.

Reproducible, everywhere: the same requests with the same seeds, in the same batch (the same
requests, joining at the same steps), give the same tokens and log-probs bit for bit, call after
call and engine after engine on one machine. The engine's ops are deterministic for given shapes
and threads, and each request draws its random numbers from a stream of its own
(grpo/rollout/sampling.py).

Batch-invariant up to fp32 rounding, where the engine computes in fp32 on a CPU (`auto` on a CPU
without bf16 instructions, or `dtype=None` over an fp32 policy): a seeded request samples the same
tokens whatever rows run beside it, unless the sampler's two best candidates tie within fp32
rounding. Its log-probs are not the same bits: the rows beside it change the columns its attention
reduces over and the padding of its prefill, and on some CPUs the blocking of its Linear
products. They stay within a few 1e-5 of each other, the noise the sampler is built to absorb (a
token changes only on a near-tie). SmolLM2-135M, 12 seeded requests x 40 tokens, each alone
against all batched: identical tokens, log-probs within 1.9e-5 with row-independent products and
2.3e-5 with MKL's AVX2 kernels, whose products depend on the rows beside them
(MKL_ENABLE_INSTRUCTIONS=AVX2).

Reproducible only, with anything in bf16 (matmuls -- the default on a CPU with bf16 instructions
--, autocast, the KV cache): rounding to bf16 turns last-bit differences into 2^-8 ones, and some
seeded requests sample other tokens once batched (SmolLM2-135M: 9 of 20 seeded requests within 48
tokens). On a GPU only reproducibility is claimed: the batch dependence was not measured there.

Whether the weight copy's Linear products give each row the same bits whatever rows run beside it
depends on the CPU and the BLAS path, so the engine probes it (`products_rows_independent`, once
per process and kind of product) and says so; it does not change the promise above, only which
parts of the pipeline carry the last-bit differences. Tests assert exactly this: reproducibility
everywhere, batch-invariant tokens where `batch_invariant` is true, and the probe against a
direct check, also with the other CPU family's kernels forced (tests/test_sampling_promise.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from grpo.rollout.weights import products_rows_independent


@dataclass(frozen=True)
class SamplingPromise:
    batch_invariant: bool
    """A seeded request samples the same tokens whatever rows run beside it (up to fp32 ties)."""
    products_rows_independent: bool
    """The Linear products give each row the same bits whatever rows run beside it (probed)."""
    reason: str
    """Why not batch-invariant ("" where it is)."""

    def __str__(self) -> str:
        products = (
            "Linear products row-independent"
            if self.products_rows_independent
            else "Linear products depend on the rows beside them in the last bits"
        )
        if self.batch_invariant:
            return f"batch-invariant up to fp32 rounding ({products})"
        return f"reproducible for a fixed batch ({self.reason}; {products})"


def sampling_promise(
    model: nn.Module,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
    kv_cache_dtype: torch.dtype | None,
) -> SamplingPromise:
    """The promise of an engine that samples from `model` (its weight copy, or the policy) on
    `device`, under `autocast_dtype`, with a KV cache in `kv_cache_dtype` (None: the model's)."""
    dtypes = {param.dtype for param in model.parameters()} - {torch.float32}
    reasons = [f"{', '.join(sorted(map(_name, dtypes)))} weights"] if dtypes else []
    if autocast_dtype not in (None, torch.float32):
        reasons.append(f"autocast to {_name(autocast_dtype)}")
    if kv_cache_dtype not in (None, torch.float32):
        reasons.append(f"a {_name(kv_cache_dtype)} KV cache")
    if device.type != "cpu":
        reasons.append(f"not measured on {device.type}")
    return SamplingPromise(
        batch_invariant=not reasons,
        products_rows_independent=products_rows_independent(model),
        reason="; ".join(reasons),
    )


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")

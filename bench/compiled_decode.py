"""Does a compiled decode step pay? HFEngine's decode forward, eager vs `torch.compile`.

    .venv/bin/python -m bench.compiled_decode                 # batch 64 on this machine's device
    .venv/bin/python -m bench.compiled_decode --batches 16 64 --window 40
    .venv/bin/python -m bench.compiled_decode --batches 16 64 --dynamic

The work: one decode step of the engine's weight copy of SmolLM2-135M-Instruct for a batch of
distinct 48-token chat prompts, attending over the prompt plus `--window` cached columns,
repeated on the same shapes. The copy's dtype is `--dtype`, by default the one a training run's
engine takes here (`model.dtype: auto`: bf16 on a GPU or a CPU with bf16 instructions, else
fp32). Eager is the engine as it runs (on CPU its weights pre-packed: for MKL in fp32, for
oneDNN in bf16). Compiled is `torch.compile` of the same forward: on CPU inductor with
`freezing` (it packs the weights itself: it cannot lower the engine's pre-packed matmuls, so
the copy is built unpacked for it), on CUDA `mode="reduce-overhead"` (the step captured as a
CUDA graph). Reported: ms per step for both, the first compiled call's seconds (the compile),
and the largest |logit difference| between the two (exactness).

Shapes are static by default: a real decode changes the batch (rows finish) and the window (one
column per step) every step, so every new shape compiles again unless shapes are made static (a
fixed-capacity cache and batch buckets); the figure printed is the best case. `--dynamic`
compiles with symbolic shapes (`dynamic=True`): one compile that other batch sizes and windows
reuse, with code that knows fewer sizes in advance (run this bench with and without it to compare).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch._inductor.config

import grpo.rollout.hf.weights as engine_weights
from bench.generation import make_prompts
from grpo.models.devices import compute_dtype
from grpo.models.source import load_causal_lm, load_tokenizer
from grpo.rollout.hf.engine import HFEngine
from grpo.rollout.hf.kv_cache import PreallocatedCache


def _ms_per_call(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1000


def measure(model, tokenizer, device: torch.device, batch: int, window: int, repeats: int,
            dtype: torch.dtype = torch.bfloat16, dynamic: bool = False) -> dict:
    engine = HFEngine(model, tokenizer, device=device, dtype=dtype)
    prompts = sorted({tuple(p) for p in make_prompts(tokenizer, batch, 1)}, key=len, reverse=True)
    width = len(prompts[0])
    capacity = width + window + 1
    with torch.inference_mode():
        # Every column zeroed: the timed step reads `window` columns no decode has written.
        cache = PreallocatedCache(engine.runner.num_layers, len(prompts), capacity, zero_columns=capacity)
        logits = engine.loop.prefill.prompts(prompts, cache, pos=width, first=0)
        start = torch.tensor([width - len(p) for p in prompts], device=device)  # [B]
        allowed = torch.arange(capacity, device=device)[None] >= start[:, None]  # [B, cap]
        pos, lo = width + window, int(start.min())
        cache.set_window(slice(0, len(prompts)), lo=lo, pos=pos)
        mask = allowed[:, None, None, lo : pos + 1]  # [B, 1, 1, L]
        positions = (pos - start)[:, None]  # [B, 1]
        tokens = logits.argmax(-1)[:, None]  # [B, 1]
        eager_ms = _ms_per_call(lambda: engine.runner.forward(tokens, mask, positions, cache), repeats)
        reference = engine.runner.forward(tokens, mask, positions, cache).float()

        if device.type == "cpu":
            packed, packs_fp32 = engine_weights.can_pack, engine_weights.packs_fp32
            engine_weights.can_pack = lambda weight: False
            engine_weights.packs_fp32 = lambda device: False
            try:
                engine = HFEngine(model, tokenizer, device=device, dtype=dtype)
            finally:
                engine_weights.can_pack, engine_weights.packs_fp32 = packed, packs_fp32
            compiled = torch.compile(engine.runner.forward, dynamic=dynamic)
        else:
            compiled = torch.compile(engine.runner.forward, dynamic=dynamic, mode="reduce-overhead")
        # Inductor compiles at the first call; freezing (CPU: weights as constants) only for it.
        with torch._inductor.config.patch(freezing=device.type == "cpu"):
            started = time.perf_counter()
            out = compiled(tokens, mask, positions, cache).float()
            compile_s = time.perf_counter() - started
            compiled_ms = _ms_per_call(lambda: compiled(tokens, mask, positions, cache), repeats)
    return {
        "batch": len(prompts),
        "dtype": str(dtype).removeprefix("torch."),
        "window": window,
        "eager_ms": round(eager_ms, 2),
        "compiled_ms": round(compiled_ms, 2),
        "speedup": round(eager_ms / compiled_ms, 2),
        "compile_s": round(compile_s, 1),
        "max_abs_logit_diff": float((out - reference).abs().max()),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[64])
    parser.add_argument("--window", type=int, default=40, help="decoded columns already cached")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--dtype", default="auto", help="the engine copy's dtype (auto: as `model.dtype: auto`)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dynamic", action="store_true",
                        help="compile with symbolic shapes (one compile for every batch and window)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = compute_dtype(device, args.dtype)
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    model = load_causal_lm("smollm2-135m-instruct").eval().to(device)
    print(f"device {device}, {torch.get_num_threads()} threads, {dtype}")
    for batch in args.batches:
        row = measure(model, tokenizer, device, batch, args.window, args.repeats, dtype, args.dynamic)
        print(
            f"batch {row['batch']:4d}: eager {row['eager_ms']:7.2f} ms/step, compiled "
            f"{row['compiled_ms']:7.2f} ms/step (x{row['speedup']}), compile {row['compile_s']} s, "
            f"max |logit diff| {row['max_abs_logit_diff']:.3g}"
        )


if __name__ == "__main__":
    main()

"""Measure HFEngine sampling speed on the embedded default model against the machine's matmul peak.

    .venv/bin/python -m bench.generation                     # batches 1, 16, 64
    .venv/bin/python -m bench.generation --batches 64 --variants bf16 fp32
    .venv/bin/python -m bench.generation --group 8 --compact 0 0.25 2
    .venv/bin/python -m bench.generation --batches 32 64 --group 4 --system-tokens 300 \
        --variants bf16 bf16-no-kept-prefix --repeats 5     # a multi-turn batch's long prefix
    python -m bench.generation --device cuda --batches 16 64 256 512 --variants bf16 bf16-dynamic

The work: SmolLM2-135M-Instruct, chat-template prompts "What is A * B? Answer with the number
only." (48 tokens, random 3-digit A and B, every prompt distinct unless --group G makes groups of
G identical prompts; --system-tokens N puts a system prompt of tool docs, at least N tokens, before
every one, as a multi-turn run's prompts have), 64 new tokens each at temperature 1 and no stop token, so every row runs
to the end (--stop: rows end at the eos token instead, at different steps). The peaks are
measured in the same run: 2048² fp32 and bf16 matmuls on the same threads (on CUDA: 8192², timed
with events). Fraction of peak = tokens/s × 2 × parameters (FLOP per token of the forward) / the
peak of the dtype the variant's products compute in (`matmul_dtype`: on a CPU without bf16
instructions bf16 is emulated, slower than fp32, so fp32 work is measured against fp32's peak).

Variants (the engine's weight copy, grpo/rollout/hf/weights.py):
  bf16             Linear weights bf16 (packed, fused), the rest fp32: the engine's default
  bf16-fp32-head   as bf16 with an fp32 LM head (closer log-probs, slower head)
  bf16-sdpa-decode as bf16 with transformers' SDPA for decode steps too (the engine's default is
                   grpo/rollout/hf/decode_attention.py)
  bf16-dynamic     as bf16, decode_mode dynamic (the default on CPU; on CUDA the default is graph)
  bf16-static      as bf16, decode_mode static (fixed-shape steps, no graphs)
  bf16-fp32-cache  as bf16 with an fp32 KV cache (the CPU default is a bf16 one, keys transposed)
  bf16-whole-prefill as bf16, every prompt prefilled whole (no shared-prefix prefill)
  bf16-previous    both of the above: the engine before the bf16 cache and shared prefixes
  bf16-no-kept-prefix as bf16, without the kept prefix (decode steps read every row's prefix from
                   the cache; grpo/rollout/hf/kept_prefix.py)
  fp32             an fp32 copy
  fp32-unfused-norms  as fp32, the RMSNorm layers in transformers' forward (fuse_norms=False;
                   the default runs each as one torch.rms_norm op: grpo/rollout/hf/fused_norms.py)
  fp32-transformers-forward  as fp32, each forward through transformers' modules (lean_forward=False;
                   the default skips their plumbing: grpo/rollout/hf/lean_forward.py)
  bf16-transformers-forward  the same for bf16
  autocast         no copy: the fp32 policy under bf16 autocast
One warm-up call per variant and batch precedes the timed repeats, which alternate between the
variants (the median of each is reported).
"""

from __future__ import annotations

import argparse
import time

import torch

from grpo.models.source import load_causal_lm, load_tokenizer
from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.config import HFEngineConfig
from grpo.rollout.hf.engine import HFEngine

VARIANTS: dict[str, tuple[torch.dtype | None, dict]] = {
    # name: (the engine's compute dtype (None: the model's fp32), its `rollout.hf` settings)
    "bf16": (torch.bfloat16, {}),
    "bf16-fp32-head": (torch.bfloat16, {"head_dtype": "float32"}),
    "bf16-sdpa-decode": (torch.bfloat16, {"decode_attention": "sdpa"}),
    "bf16-dynamic": (torch.bfloat16, {"decode_mode": "dynamic"}),
    "bf16-static": (torch.bfloat16, {"decode_mode": "static"}),
    "bf16-fp32-cache": (torch.bfloat16, {"kv_cache_dtype": "model"}),
    "bf16-whole-prefill": (torch.bfloat16, {"shared_prefix_min_tokens": 0}),
    "bf16-previous": (torch.bfloat16, {"kv_cache_dtype": "model", "shared_prefix_min_tokens": 0}),
    "bf16-no-kept-prefix": (torch.bfloat16, {"prefix_attention_min_tokens": 0}),
    "fp32": (None, {}),
    "fp32-unfused-norms": (None, {"fuse_norms": False}),
    "fp32-transformers-forward": (None, {"lean_forward": False}),
    "bf16-transformers-forward": (torch.bfloat16, {"lean_forward": False}),
    "autocast": (torch.bfloat16, {"copy_weights": False}),  # the policy itself under bf16 autocast
}


PEAK_DTYPES = (torch.float32, torch.bfloat16)


def matmul_dtype(variant: str) -> torch.dtype:
    """The dtype a variant's products compute in (its `% peak` is of that dtype's peak): the
    copy's dtype, autocast's, or the model's own (fp32) where the copy keeps it."""
    return VARIANTS[variant][0] or torch.float32


def best_seconds(work, repeats: int, device: str) -> float:
    """The fastest of `repeats` runs of `work()`, in seconds (on CUDA timed with events)."""
    best = float("inf")
    for _ in range(repeats):
        if torch.device(device).type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            work()
            end.record()
            end.synchronize()
            best = min(best, begin.elapsed_time(end) / 1000)
        else:
            start = time.perf_counter()
            work()
            best = min(best, time.perf_counter() - start)
    return best


def measure_peak_gflops(
    dtype: torch.dtype = torch.bfloat16, size: int = 2048, repeats: int = 10, device: str = "cpu"
) -> float:
    """The best of `repeats` size³ matmuls, GFLOP/s (on CUDA: 8192³ at least, timed with events)."""
    if torch.device(device).type == "cuda":
        size = max(size, 8192)
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    for _ in range(3):
        a @ b
    return 2 * size**3 / best_seconds(lambda: a @ b, repeats, device) / 1e9


def measure_bandwidth_gbs(device: str, megabytes: int = 1024, repeats: int = 10) -> float:
    """Device-to-device copy, bytes read + written per second, GB/s (the best of `repeats`)."""
    src = torch.empty(megabytes * 2**20, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    return 2 * src.numel() / best_seconds(lambda: dst.copy_(src), repeats, device) / 1e9


_TOOL_DOCS = (
    "add(a, b): returns a + b. subtract(a, b): returns a - b. multiply(a, b): returns a * b. "
    "divide(a, b): returns a / b, an error for b = 0. power(a, b): a to the power b. "
    "sqrt(x): the square root of x. Call one tool at a time, as <tool_call>{\"name\": ..., "
    "\"arguments\": {...}}</tool_call>, wait for its result, and answer with the number only. "
)


def system_prompt(tokenizer, tokens: int) -> str:
    """Tool docs repeated until they are at least `tokens` tokens long."""
    text = "You are a calculator agent. Tools: "
    while len(tokenizer.encode(text)) < tokens:
        text += _TOOL_DOCS
    return text


def make_prompts(
    tokenizer, n: int, group: int, seed: int = 0, system_tokens: int = 0
) -> list[list[int]]:
    """`n` chat-template prompts, groups of `group` identical ones; `system_tokens` > 0: each
    starts with the same system prompt of at least that many tokens."""
    generator = torch.Generator().manual_seed(seed)
    system = system_prompt(tokenizer, system_tokens) if system_tokens else None
    prompts = []
    for i in range(-(-n // group)):
        a, b = (int(x) for x in torch.randint(100, 1000, (2,), generator=generator))
        messages = [{"role": "user", "content": f"What is {a} * {b}? Answer with the number only."}]
        if system is not None:
            messages.insert(0, {"role": "system", "content": system})
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        prompts.extend([ids] * group)
    return prompts[:n]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--variants", nargs="+", default=["bf16"], choices=sorted(VARIANTS))
    parser.add_argument(
        "--compact", type=float, nargs="+", default=[0.25], help="compact_fraction values"
    )
    parser.add_argument(
        "--group", type=int, default=1, help="identical prompts per group (shared prefill)"
    )
    parser.add_argument(
        "--system-tokens", type=int, default=0,
        help="a shared system prompt of at least this many tokens before every prompt",
    )
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument(
        "--stop",
        action="store_true",
        help="stop at the eos token (rows finish at different steps: measures compaction)",
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    cuda = torch.device(args.device).type == "cuda"

    tokenizer = load_tokenizer(args.model)
    model = load_causal_lm(args.model).eval().to(args.device)
    n_params = sum(p.numel() for p in model.parameters())  # tied embedding counted once
    flop_per_token = 2 * n_params
    peaks = {dtype: measure_peak_gflops(dtype, device=args.device) for dtype in PEAK_DTYPES}
    where = torch.cuda.get_device_name() if cuda else f"{args.threads} threads"
    print(
        f"model {args.model}: {n_params / 1e6:.1f}M parameters, {flop_per_token / 1e6:.0f} MFLOP/token; "
        f"peak ({where}): fp32 {peaks[torch.float32]:.0f}, bf16 {peaks[torch.bfloat16]:.0f} GFLOP/s"
        + (f"; copy bandwidth {measure_bandwidth_gbs(args.device):.0f} GB/s" if cuda else "")
    )
    header = (
        f"{'variant':<20}{'compact':>8}{'batch':>6}{'tok/s':>9}{'decode tok/s':>14}{'prefill s':>10}"
        f"{'decode s':>9}{'ms/step':>8}{'% peak':>8}{'captures':>9}"
    )
    print(header)
    print("-" * len(header))
    stop_ids = (tokenizer.eos_token_id,) if args.stop else ()
    # Every (variant, compact) engine is built and warmed up first; then the timed repeats
    # alternate between them, so a busy spell on a shared machine hits them all alike.
    engines = {
        (variant, compact): HFEngine(
            model, tokenizer, HFEngineConfig(
                compact_fraction=compact, max_batch_size=max(args.batches), **VARIANTS[variant][1]
            ),
            dtype=VARIANTS[variant][0],
        )
        for variant in args.variants
        for compact in args.compact
    }
    for batch in args.batches:
        prompts = make_prompts(tokenizer, batch, args.group, system_tokens=args.system_tokens)
        requests = [
            GenerationRequest(
                p,
                SamplingParams(
                    temperature=1.0, max_new_tokens=args.new_tokens, seed=i, stop_token_ids=stop_ids
                ),
            )
            for i, p in enumerate(prompts)
        ]
        runs: dict[tuple[str, float], list[dict]] = {key: [] for key in engines}
        for engine in engines.values():
            engine.generate(requests)  # warm-up
        for _ in range(args.repeats):
            for key, engine in engines.items():
                engine.generate(requests)
                runs[key].append(dict(engine.last_metrics))
        for (variant, compact), measured in runs.items():
            m = sorted(measured, key=lambda r: r["seconds"])[len(measured) // 2]
            tps = m["tokens_generated"] / m["seconds"]
            decode_tps = m["tokens_generated"] / m["decode_seconds"]
            step_ms = 1000 * m["decode_seconds"] / max(m["decode_steps"], 1)
            share = tps * flop_per_token / (peaks[matmul_dtype(variant)] * 1e9)
            print(
                f"{variant:<20}{compact:>8.2f}{batch:>6}{tps:>9.1f}{decode_tps:>14.1f}"
                f"{m['prefill_seconds']:>10.2f}{m['decode_seconds']:>9.2f}{step_ms:>8.1f}{share:>8.1%}"
                f"{int(m['graph_captures']):>9}",
                flush=True,
            )
    for engine in engines.values():
        engine.close()
    print(
        f"peaks re-measured after the runs: fp32 {measure_peak_gflops(torch.float32, device=args.device):.0f}, "
        f"bf16 {measure_peak_gflops(device=args.device):.0f} GFLOP/s "
        "(a large drift means the machine was shared meanwhile)"
    )


if __name__ == "__main__":
    main()

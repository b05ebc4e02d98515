"""Where an HF-engine decode step's time goes: the forward, the sampling, and the rest.

    python -m bench.decode_profile --device cuda --batches 16 512   # on a GPU machine
    .venv/bin/python -m bench.decode_profile --batches 16 64        # this CPU

On a GPU a decode step is one CUDA-graph replay of the forward and the sampler
(grpo/rollout/hf/decode_graphs.py; `--sample-after-step`: the sampler runs eagerly after the
replay, as before), then the tokens are copied to the host, then the engine's Python bookkeeping
(finish checks, compaction, admission) runs before the next replay. The host waits for the
device at the copy and the device waits for the host until the next launch, so the step costs
their sum. Which part to shrink (fewer kernels per graph, host work overlapped with the device)
depends on the split, which this measures.

The engine copy's dtype is `--dtype`: by default the one a training run's engine takes here
(`model.dtype: auto`), so a CPU without bf16 instructions profiles its fp32 copy, not bf16
products that CPU only emulates and training never runs.

Per batch size B: `generate` of B prompts (the standard work's chat prompts, groups of 4, as
many new tokens as `--new-tokens`, no stop token: every row runs every step), after one warm-up
call (graph captures). Three passes over the same requests:
1. plain: the engine as it runs; ms per decode step.
2. attributed: a device synchronisation after the decode forward and after the sampling, so
   each one's wall time includes its device work. forward: the inputs copied into the static
   buffers and the replay (CUDA) or the eager forward (CPU), with the draws where the step makes
   them. sample: random numbers and sampling where the step did not draw, the device-to-host
   copy, the finish checks. rest: everything else in the step. The extra
   synchronisations remove what little overlap there was, so the sum can exceed the plain step.
3. profiled (torch.profiler): device kernels (CUDA) or operator calls (CPU) per decode step, and
   the ten largest by self time. Kernels inside a replayed CUDA graph are listed only where the
   profiler traces graph kernels.
Printed as JSON; `--out` writes it to a file too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from bench.generation import make_prompts
from grpo.models.devices import compute_dtype
from grpo.models.source import load_causal_lm, load_tokenizer
from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.config import HFEngineConfig
from grpo.rollout.hf.engine import HFEngine
from grpo.rollout.hf.live_batch import LiveBatch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _timed_parts(engine: HFEngine, seconds: dict[str, float]):
    """While open, the engine's decode forwards and samplings add their synchronised wall time
    to `seconds["forward"]` and `seconds["sample"]`."""
    loop, device = engine.loop, engine.device
    decode_step, sample = loop.decode_step, LiveBatch.sample

    def timed_step(batch, metrics):
        started = time.perf_counter()
        decode_step(batch, metrics)
        _sync(device)
        seconds["forward"] += time.perf_counter() - started

    def timed_sample(self, tokenizer, deliver):
        started = time.perf_counter()
        sample(self, tokenizer, deliver)
        _sync(device)
        seconds["sample"] += time.perf_counter() - started

    loop.decode_step = timed_step
    LiveBatch.sample = timed_sample
    try:
        yield
    finally:
        del loop.decode_step
        LiveBatch.sample = sample


def _per_step_ms(seconds: float, steps: float) -> float:
    return round(1000 * seconds / max(steps, 1), 3)


def profile_batch(engine: HFEngine, requests: list[GenerationRequest], top: int = 10) -> dict:
    """The three passes of the module docstring for one list of requests (warm-up included)."""
    device = engine.device
    engine.generate(requests)  # warm-up: graph captures, caches
    _sync(device)
    engine.generate(requests)
    plain = dict(engine.last_metrics)
    steps = plain["decode_steps"]

    seconds = {"forward": 0.0, "sample": 0.0}
    with _timed_parts(engine, seconds):
        engine.generate(requests)
    attributed = dict(engine.last_metrics)
    rest = attributed["decode_seconds"] - seconds["forward"] - seconds["sample"]

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        engine.generate(requests)
        _sync(device)
    profiled_steps = engine.last_metrics["decode_steps"]
    events = prof.events()
    if device.type == "cuda":
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        unit, sort_by = "device kernels", "self_cuda_time_total"
    else:
        kernels = [e for e in events if e.name.startswith("aten::") and e.cpu_parent is None]
        unit, sort_by = "top-level aten calls", "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort_by, row_limit=top, max_name_column_width=48)
    return {
        "rows": len(requests),
        "decode_steps": int(steps),
        "plain_ms_per_step": _per_step_ms(plain["decode_seconds"], steps),
        "attributed_ms_per_step": {
            "forward": _per_step_ms(seconds["forward"], attributed["decode_steps"]),
            "sample": _per_step_ms(seconds["sample"], attributed["decode_steps"]),
            "rest": _per_step_ms(rest, attributed["decode_steps"]),
        },
        "prefill_s": round(plain["prefill_seconds"], 4),
        "per_step": {unit: round(len(kernels) / max(profiled_steps, 1), 1)},
        "top": table.splitlines(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="auto",
                        help="the engine copy's dtype (auto: what a training run's engine takes here)")
    parser.add_argument("--sample-after-step", action="store_true",
                        help="sample after each decode step, not inside it (rollout.hf.sample_in_decode_step=false)")
    parser.add_argument("--kv-cache-dtype", choices=("auto", "model"), default="auto",
                        help="the engine's KV cache dtype (rollout.hf.kv_cache_dtype; model: the copy's states' dtype)")
    parser.add_argument("--unfused-norms", action="store_true",
                        help="the RMSNorm layers as transformers writes them (rollout.hf.fuse_norms=false)")
    parser.add_argument("--transformers-forward", action="store_true",
                        help="each forward through transformers' modules (rollout.hf.lean_forward=false)")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.model)
    model = load_causal_lm(args.model).eval().to(device)
    dtype = compute_dtype(torch.device(device), args.dtype)
    settings = HFEngineConfig(
        max_batch_size=max(args.batches), sample_in_decode_step=not args.sample_after_step,
        kv_cache_dtype=args.kv_cache_dtype, fuse_norms=not args.unfused_norms,
        lean_forward=not args.transformers_forward,
    )
    engine = HFEngine(model, tokenizer, settings, dtype=dtype)
    results = []
    for batch in args.batches:
        requests = [
            GenerationRequest(prompt, SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=i))
            for i, prompt in enumerate(make_prompts(tokenizer, batch, group=4))
        ]
        results.append(profile_batch(engine, requests))
    described = engine.describe()
    engine.close()
    report = {"device": described["device"], "dtype": described["dtype"],
              "decode_mode": described["decode_mode"],
              "sample_in_decode_step": engine.settings.sample_in_decode_step,
              "kv_cache_dtype": described["kv_cache_dtype"],
              "fuse_norms": not args.unfused_norms, "forward": described["forward"],
              "new_tokens": args.new_tokens, "results": results}
    if device == "cuda":
        report["gpu"] = torch.cuda.get_device_name()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

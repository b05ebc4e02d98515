"""`make bench`: how fast a training step runs here, and how close to this machine's limits.

    .venv/bin/python -m bench.run                      # every section, ~5-8 minutes on 2 cores
    .venv/bin/python -m bench.run --sections peak generation --out /tmp/bench
    python -m bench.run --device cuda                  # on a GPU machine (the default there)

Sections (all in one process, on `--threads` threads; the report says the load average, since
on a shared machine every wall time is an upper bound):
  peak        fp32 and bf16 2048² matmul GFLOP/s: this machine's compute limit, measured now
  standard    the standard benchmark work of docs/design.md (bench/steps.py): median
              seconds per optimizer step over `--steps` steps after a warm-up, split into rollout,
              reference, update and weight push
  generation  HF engine sampled tokens/s at batch 1, 16, 64 (64 new tokens, no stop) and the share
              of the peak that the model's forward FLOPs (2 x parameters per token) reach, and of
              the decode-shape matmul ceiling: both in the engine's dtype (`model.dtype: auto`:
              bf16, or fp32 on a CPU without bf16 instructions, where bf16 is only emulated)
  training    forward+backward tokens/s on 16 x 128-token sequences (fp32 weights, autocast to
              the compute dtype, full fine-tuning) and its share of that dtype's peak (6 x
              parameters per token)
  tools       calls/s and p50/p99 latency through SharedToolManager vs the raw SDK client
  multiturn   one step of configs/cpu.yaml (calculator server, 8 tasks x G=4) through the trainer:
              seconds, and the share generating / waiting on tools / updating
  async       configs/cpu.yaml with every calculator call taking 0.3 s: synchronous steps beside
              `train.async_rollouts` (max_staleness 1), groups trained per hour and their ratio;
              where vLLM is installed (CPU), the same pair sampled by two `vllm serve` processes
              (bench/async_rollouts.py)
  calculator512  (CUDA only) one step of configs/gpu.yaml: 64 calculator tasks x G=8, 512
              episodes, through the trainer (median of the steps after a warm-up)
  trl         (where TRL is installed; not a dependency) the standard work under TRL's
              GRPOTrainer (bench/trl_baseline.py), and with `standard` in the same run the ratio
  continuous  (where `make train-multistep` left its model) continuous batching vs turn-batched
              collection of 8 chain tasks x G=4, side by side (bench/continuous.py, 2 each)
  engines     (where vLLM is installed) the HF engine and vLLM on the same requests: tokens/s at
              batch 16, 64, 256 with full weights and with LoRA, and one calculator training step
              with each (bench/engines.py)

On CUDA (`--device cuda`, the default where a GPU is visible) the same sections run on the GPU:
peak is the bf16 8192³ matmul and the device-to-device copy bandwidth; generation runs batches
16, 64, 256 and 512 and reports the share of the peak and of the copy bandwidth (a decode
step reads every weight once: steps/s x weight bytes); training reports tokens/s; the matmul
ceiling (a CPU measure) is skipped.

`--set KEY=VALUE` (repeatable) overrides the training config of standard, multiturn and
calculator512, e.g. `--set rollout.hf.fuse_norms=false` for the engine's RMSNorm layers as transformers
writes them; `--cudnn-attention` lets our sections' attention use cuDNN (off by default:
`model.cudnn_attention`); the TRL section always runs with torch's own setting.

Writes `<out>/report.json` (default outputs/bench) and prints a short table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.async_rollouts import async_vs_sync, async_vs_sync_vllm_servers
from bench.continuous import TRAINED
from bench.continuous import measure as measure_continuous
from bench.continuous import parse_args as continuous_args
from bench.engines import compare_engines, vllm_installed
from bench.generation import make_prompts, measure_bandwidth_gbs, measure_peak_gflops
from bench.report import print_table, write_performance_page
from bench.steps import multi_turn_step, standard_step
from bench.tools import compare_with_raw_client
from bench.trl_baseline import trl_available, trl_standard_step
from grpo.models.config import LoraConfig, ModelConfig
from grpo.models.devices import compute_dtype
from grpo.models.policy import PolicyWithValueHead
from grpo.models.source import load_causal_lm, load_tokenizer
from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.config import HFEngineConfig
from grpo.rollout.hf.engine import HFEngine

SECTIONS = ("peak", "standard", "generation", "training", "tools", "multiturn", "async", "calculator512", "trl",
            "continuous", "engines")
CPU_SECTIONS = tuple(s for s in SECTIONS if s != "calculator512")
CUDA_BATCHES = [16, 64, 256, 512]
TORCH_CUDNN_SDP = torch.backends.cuda.cudnn_sdp_enabled()
"""torch's own setting of the cuDNN attention switch (what the TRL section runs with)."""


def cpu_model() -> str | None:
    """The CPU's model name as the kernel reports it (Linux), e.g. to tell two hosts apart."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _peaks(device: str = "cpu") -> dict:
    out = {
        "fp32_gflops": round(measure_peak_gflops(torch.float32, repeats=5, device=device), 1),
        "bf16_gflops": round(measure_peak_gflops(torch.bfloat16, device=device), 1),
    }
    if device == "cuda":
        out["copy_gbs"] = round(measure_bandwidth_gbs(device), 1)
        out["gpu"] = torch.cuda.get_device_name()
    return out


def _n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied embedding is counted once


def decode_matmul_ceiling(model, batch: int = 64, repeats: int = 5, dtype: torch.dtype = torch.bfloat16) -> float:
    """GFLOP/s of one decode step's matmuls alone: every Linear of `model` (and its LM head) as a
    [batch, in] x [in, out] product in `dtype` (the engine's: bf16, or fp32 on a CPU without bf16
    instructions), each timed best-of-`repeats`. What a decode step could reach if norms,
    attention, sampling and Python cost nothing: the ceiling for generation."""

    shapes = [tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)]
    weights = {shape: torch.randn(shape).to(dtype) for shape in set(shapes)}
    x = {shape: torch.randn(batch, shape[1]).to(dtype) for shape in weights}
    best = {shape: float("inf") for shape in weights}
    for sweep in range(3):  # the first sweep only warms up (oneDNN picks kernels on first use)
        for shape, w in weights.items():
            for _ in range(repeats):
                start = time.perf_counter()
                F.linear(x[shape], w)
                if sweep:
                    best[shape] = min(best[shape], time.perf_counter() - start)
    seconds = sum(best[shape] for shape in shapes)
    flop = sum(2 * batch * out_f * in_f for out_f, in_f in shapes)
    return flop / seconds / 1e9


def _generation(batches: list[int], new_tokens: int = 64, device: str = "cpu") -> dict:
    tok = load_tokenizer("smollm2-135m-instruct")
    model = load_causal_lm("smollm2-135m-instruct").eval().to(device)
    dtype = compute_dtype(torch.device(device), "auto")
    engine = HFEngine(model, tok, HFEngineConfig(max_batch_size=max(batches)), dtype=dtype)
    described = engine.describe()
    out = {"parameters": _n_params(model), "new_tokens": new_tokens,
           "decode_mode": described["decode_mode"], "dtype": described["dtype"],
           "weight_bytes": int(described["weight_bytes"])}
    if device == "cpu":
        out["b64_decode_matmul_ceiling_gflops"] = round(decode_matmul_ceiling(model, 64, dtype=dtype), 1)
    for batch in batches:
        requests = [
            GenerationRequest(p, SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=i))
            for i, p in enumerate(make_prompts(tok, batch, group=1))
        ]
        engine.generate(requests)  # warm-up: one-off kernel selection and allocations
        runs = []
        for _ in range(2):
            start = time.perf_counter()
            results = engine.generate(requests)
            runs.append((sum(len(r.token_ids) for r in results) / (time.perf_counter() - start),
                         dict(engine.last_metrics)))
        best, metrics = max(runs, key=lambda run: run[0])
        out[f"b{batch}_tokens_per_s"] = round(best, 1)
        # Where a generate call's time went: prefill, the decode steps' forwards, sampling.
        out[f"b{batch}_split_s"] = {key: round(metrics.get(key, 0.0), 3) for key in (
            "seconds", "prefill_seconds", "decode_seconds", "decode_forward_seconds", "sample_seconds")}
        out[f"b{batch}_decode_steps_per_s"] = round(metrics["decode_steps"] / metrics["decode_seconds"], 1)
    engine.close()
    return out


def _training(batch: int = 16, length: int = 128, repeats: int = 3, device: str = "cpu") -> dict:
    policy, _ = PolicyWithValueHead.from_config(ModelConfig(), LoraConfig(enabled=False), device)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 49152, (batch, length), generator=gen).to(device)  # [B, T]
    mask = torch.ones_like(ids)  # [B, T]
    seconds = []
    for _ in range(repeats + 1):  # the first pass is a warm-up
        for p in policy.parameters():
            p.grad = None
        start = time.perf_counter()
        out = policy(ids, mask)
        (-out.logprobs.mean()).backward()
        if device == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    best = min(seconds[1:])
    return {
        "parameters": _n_params(policy.language_model()),
        "compute_dtype": str(policy.compute_dtype).removeprefix("torch."),
        "tokens": batch * length,
        "first_s": round(seconds[0], 3),
        "steady_s": round(best, 3),
        "tokens_per_s": round(batch * length / best, 1),
    }


def _tools(calls: int) -> dict:
    out = {}
    for concurrency in (1, 32):
        report = asyncio.run(compare_with_raw_client(calls, concurrency, rounds=10))
        out[f"c{concurrency}"] = report
    return out


def run(sections: list[str], steps: int, threads: int, tool_calls: int, skip_zero_advantage: bool = True,
        device: str = "cpu", cudnn_attention: bool = False, overrides: tuple[str, ...] = ()) -> dict:
    torch.set_num_threads(threads)
    cuda = device == "cuda"
    # Our sections' attention kernels as a run's `model.cudnn_attention` sets them, also where a
    # section builds its policy or engine without the trainer.
    torch.backends.cuda.enable_cudnn_sdp(cudnn_attention)
    # The sections that run a training config get the same setting, then the caller's overrides.
    trainer_overrides = (f"model.cudnn_attention={str(cudnn_attention).lower()}", *overrides)
    if "calculator512" in sections and not cuda:
        raise ValueError("section calculator512 needs --device cuda (512 episodes a step)")
    report: dict = {
        "machine": {"cpus": os.cpu_count(), "threads": threads, "torch": torch.__version__,
                    "processor": platform.processor() or platform.machine(), "cpu_model": cpu_model(),
                    "device": device,
                    "gpu": torch.cuda.get_device_name() if cuda else None},
        "load_average_start": round(os.getloadavg()[0], 2),
    }
    timings = {}
    for section in sections:
        start = time.perf_counter()
        if section == "peak":
            report["peak"] = _peaks(device)
        elif section == "standard":
            report["standard"] = standard_step(steps=steps, threads=threads,
                                               skip_zero_advantage=skip_zero_advantage, device=device,
                                               cudnn_attention=cudnn_attention, overrides=overrides)
        elif section == "generation":
            report["generation"] = _generation(CUDA_BATCHES if cuda else [1, 16, 64], device=device)
        elif section == "training":
            report["training"] = _training(device=device)
        elif section == "tools":
            report["tools"] = _tools(tool_calls)
        elif section == "multiturn":
            report["multiturn"] = multi_turn_step(
                threads=threads, overrides=(f"device={device}", *trainer_overrides))
        elif section == "async":
            report["async"] = async_vs_sync(threads=threads, overrides=(f"device={device}", *trainer_overrides))
            if device == "cpu" and vllm_installed():  # configs/vllm_servers.yaml is a CPU run
                report["async"]["vllm_server"] = async_vs_sync_vllm_servers(threads=threads)
        elif section == "trl":
            # TRL with torch's own attention kernels, as its users get them (our sections may
            # have switched cuDNN's off: model.cudnn_attention).
            torch.backends.cuda.enable_cudnn_sdp(TORCH_CUDNN_SDP)
            report["trl"] = (trl_standard_step(steps=steps, threads=threads, device=device) if trl_available()
                             else {"skipped": "TRL is not installed (pip install trl datasets)"})
            report["trl"]["cudnn_attention"] = torch.backends.cuda.cudnn_sdp_enabled()
        elif section == "continuous":
            report["continuous"] = (
                asyncio.run(measure_continuous(continuous_args(
                    ["--repeats", "2", "--threads", str(threads), f"device={device}"])))
                if Path(TRAINED).is_dir() else {"skipped": f"no trained model at {TRAINED} (make train-multistep)"})
        elif section == "engines":
            report["engines"] = (compare_engines(threads=threads, device=device) if vllm_installed()
                                 else {"skipped": "vLLM is not installed here (make install has its CPU build)"})
        elif section == "calculator512":
            report["calculator512"] = multi_turn_step(
                steps=3, config_path="configs/gpu.yaml", threads=threads, tasks_per_step=64,
                group_size=8, overrides=trainer_overrides)
        timings[section] = round(time.perf_counter() - start, 1)
        print(f"[bench] {section}: {timings[section]} s (load average {os.getloadavg()[0]:.2f})", flush=True)
    report["section_seconds"] = timings
    report["load_average_end"] = round(os.getloadavg()[0], 2)
    report.update(headline(report))
    return report


_SHORT_DTYPE = {"float32": "fp32", "bfloat16": "bf16"}
"""The peak section's name for a dtype (`fp32_gflops`, `bf16_gflops`)."""


def headline(report: dict) -> dict:
    """The report's top-level figures (null where a section did not run)."""
    peaks = report.get("peak", {})
    gen, train = report.get("generation", {}), report.get("training", {})
    # Each share is of the peak of the dtype its work computes in (fp32 on a CPU without bf16
    # instructions, where bf16 products are emulated and slower than fp32 ones).
    gen_dtype = gen.get("dtype", "bfloat16") if gen else None
    train_dtype = train.get("compute_dtype", "bfloat16") if train else None
    out = {
        "standard_step_median_s": report.get("standard", {}).get("standard_step_median_s"),
        "gen_tokens_per_s_b64": gen.get("b64_tokens_per_s"),
        "gen_dtype": gen_dtype,
        "gen_fraction_of_peak": None,
        "gen_fraction_of_decode_matmul_ceiling": None,
        "train_tokens_per_s": train.get("tokens_per_s"),
        "train_dtype": train_dtype,
        "train_fraction_of_peak": None,
        "tool_overhead_fraction": None,
        "multi_turn_step_s": report.get("multiturn", {}).get("multi_turn_step_s"),
        "async_speedup": report.get("async", {}).get("async_speedup"),
        "async_speedup_vllm_server": report.get("async", {}).get("vllm_server", {}).get("async_speedup"),
    }
    gen_peak = peaks.get(f"{_SHORT_DTYPE.get(gen_dtype)}_gflops")
    if gen_peak and gen.get("b64_tokens_per_s"):
        out["gen_fraction_of_peak"] = round(gen["b64_tokens_per_s"] * 2 * gen["parameters"] / (gen_peak * 1e9), 3)
    if gen.get("b64_tokens_per_s") and gen.get("b64_decode_matmul_ceiling_gflops"):
        # The same FLOPs against what the decode step's own matmul shapes reach on this CPU.
        out["gen_fraction_of_decode_matmul_ceiling"] = round(
            gen["b64_tokens_per_s"] * 2 * gen["parameters"] / (gen["b64_decode_matmul_ceiling_gflops"] * 1e9), 3)
    train_peak = peaks.get(f"{_SHORT_DTYPE.get(train_dtype)}_gflops")
    if train_peak and train.get("tokens_per_s"):
        out["train_fraction_of_peak"] = round(train["tokens_per_s"] * 6 * train["parameters"] / (train_peak * 1e9), 3)
    copy = report.get("peak", {}).get("copy_gbs")
    for b in CUDA_BATCHES:
        if gen.get(f"b{b}_tokens_per_s") is not None:
            out[f"gen_tokens_per_s_b{b}"] = gen[f"b{b}_tokens_per_s"]
            if copy:  # every decode step reads every weight once
                out[f"gen_b{b}_fraction_of_copy_bandwidth"] = round(
                    gen[f"b{b}_decode_steps_per_s"] * gen["weight_bytes"] / (copy * 1e9), 4)
    trl_s = report.get("trl", {}).get("trl_step_median_s")
    out["trl_step_median_s"] = trl_s
    out["standard_step_speedup_vs_trl"] = (
        round(trl_s / out["standard_step_median_s"], 2) if trl_s and out["standard_step_median_s"] else None)
    if "calculator512" in report:
        steps = report["calculator512"]["steps"][1:]
        out["calculator512_step_s"] = round(statistics.median(r["step_s"] for r in steps), 3)
    if "speedup" in report.get("continuous", {}):
        out["continuous_batching_speedup"] = report["continuous"]["speedup"]
    if "tools" in report:
        # The worse of the two concurrencies: the manager must stay within budget at both.
        out["tool_overhead_fraction"] = round(
            max(report["tools"][c]["overhead_pct"] for c in report["tools"]) / 100, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", nargs="+", choices=SECTIONS,
                        help="default: every section (calculator512 on CUDA only)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: cuda where a GPU is visible, else cpu")
    parser.add_argument("--steps", type=int, default=4, help="timed standard steps after the warm-up")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tool-calls", type=int, default=1000, help="calls per side and concurrency")
    parser.add_argument("--out", default="outputs/bench", help="directory for report.json")
    parser.add_argument("--docs", default=None, metavar="PATH",
                        help="the performance page to update with this device's table (default: "
                             "docs/performance.md after a run of every default section; '' never)")
    parser.add_argument("--no-skip", action="store_true",
                        help="standard step: train every sequence (no zero-advantage skipping)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config override for the sections that run a training config "
                             "(multiturn, calculator512), e.g. --set rollout.hf.sample_in_decode_step=false")
    parser.add_argument("--cudnn-attention", action="store_true",
                        help="CUDA: let our sections' scaled_dot_product_attention use cuDNN's "
                             "kernels (model.cudnn_attention=true; off by default), to compare")
    args = parser.parse_args(argv)
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    sections = args.sections or [s for s in (SECTIONS if device == "cuda" else CPU_SECTIONS)
                                 if s != "trl" or trl_available()]
    report = run(sections, args.steps, args.threads, args.tool_calls, not args.no_skip, device,
                 args.cudnn_attention, tuple(args.overrides))
    report["machine"]["overrides"] = args.overrides
    report["machine"]["cudnn_attention"] = args.cudnn_attention
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print_table(report)
    print(f"report: {out / 'report.json'}")
    docs = args.docs
    if docs is None:  # a partial run would replace a whole table with a few rows
        docs = "docs/performance.md" if args.sections is None else ""
    if docs:
        write_performance_page(report, list(argv if argv is not None else sys.argv[1:]), Path(docs))
        print(f"performance page: {docs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

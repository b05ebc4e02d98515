"""Measure one policy forward+backward: seconds and peak memory, fp32 vs bf16 autocast.

    .venv/bin/python -m bench.fwd_bwd                       # defaults below
    .venv/bin/python -m bench.fwd_bwd --lora --gradient-checkpointing

Each dtype runs in a fresh subprocess so that its peak resident memory (getrusage ru_maxrss) is
its own. The work: the embedded default model (SmolLM2-135M-Instruct, fp32 weights, full
fine-tuning unless --lora), 16 sequences x 128 tokens, the log-probs of every next token through
PolicyWithValueHead.forward (chunked LM head), loss = -mean(log-prob), backward. The first
repetition includes one-off costs (allocator warm-up, kernel selection); later ones are steady.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

from grpo.models.config import LoraConfig, ModelConfig
from grpo.models.policy import PolicyWithValueHead


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _child(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)

    baseline_import = _maxrss_mib()
    model_cfg = ModelConfig(
        name_or_path=args.model,
        dtype=args.dtype,
        gradient_checkpointing=args.gradient_checkpointing,
    )
    policy, _ = PolicyWithValueHead.from_config(
        model_cfg, LoraConfig(enabled=args.lora), "cpu", seed=0
    )
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, 49152, (args.batch, args.length), generator=gen)  # [B, T]
    attention_mask = torch.ones_like(input_ids)  # [B, T]
    after_load = _maxrss_mib()

    seconds, cpu_seconds = [], []
    for _ in range(args.repeats):
        for p in policy.parameters():
            p.grad = None
        start, cpu_start = time.perf_counter(), _cpu_seconds()
        out = policy(input_ids, attention_mask, with_values=True)
        loss = -out.logprobs.mean() + out.values.square().mean()
        loss.backward()
        seconds.append(time.perf_counter() - start)
        cpu_seconds.append(_cpu_seconds() - cpu_start)
    return {
        "dtype": args.dtype,
        "compute_dtype": str(policy.compute_dtype).removeprefix("torch."),
        "lora": args.lora,
        "gradient_checkpointing": args.gradient_checkpointing,
        "trainable_parameters": policy.num_trainable_parameters(),
        "tokens": args.batch * args.length,
        "threads": torch.get_num_threads(),
        "seconds_first": round(seconds[0], 3),
        "seconds_steady": round(min(seconds[1:]), 3) if len(seconds) > 1 else None,
        # CPU seconds of the last pass: on a shared machine, cpu / threads approximates the wall
        # time of a quiet one (an overestimate when threads spin-wait for descheduled siblings).
        "cpu_seconds_last": round(cpu_seconds[-1], 3),
        "maxrss_after_imports_mib": round(baseline_import),
        "maxrss_after_load_mib": round(after_load),
        "peak_rss_mib": round(_maxrss_mib()),
        "peak_over_loaded_model_mib": round(_maxrss_mib() - after_load),
        "load_average_1min": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument(
        "--dtypes", default="float32,bfloat16", help="comma-separated compute dtypes"
    )
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="forward+backward passes per dtype")
    parser.add_argument(
        "--lora", action="store_true", help="LoRA (default r=16) instead of full fine-tuning"
    )
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one JSON object per dtype only")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        print("RESULT " + json.dumps(_child(args)), flush=True)
        return 0

    results = []
    for dtype in args.dtypes.split(","):
        cmd = [sys.executable, "-m", "bench.fwd_bwd", "--child", "--dtype", dtype]
        for flag in ("model", "batch", "length", "threads", "repeats"):
            cmd += [f"--{flag}", str(getattr(args, flag))]
        cmd += ["--lora"] * args.lora + ["--gradient-checkpointing"] * args.gradient_checkpointing
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            print(proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"measurement for {dtype} failed (exit {proc.returncode})")
        result = json.loads(lines[-1].removeprefix("RESULT "))
        results.append(result)
        if args.json:
            print(json.dumps(result))
    if not args.json:
        print(
            f"{args.model}: one forward+backward of {args.batch} x {args.length} tokens, "
            f"{args.threads} threads, {'LoRA' if args.lora else 'full fine-tuning'}"
            f"{', gradient checkpointing' if args.gradient_checkpointing else ''}"
        )
        print(
            f"{'compute':>9} {'first s':>8} {'steady s':>9} {'cpu s':>7} "
            f"{'peak RSS MiB':>13} {'over model MiB':>15} {'load avg':>9}"
        )
        for r in results:
            print(
                f"{r['compute_dtype']:>9} {r['seconds_first']:>8} {r['seconds_steady']!s:>9} "
                f"{r['cpu_seconds_last']:>7} "
                f"{r['peak_rss_mib']:>13} {r['peak_over_loaded_model_mib']:>15} {r['load_average_1min']:>9}"
            )
        print(
            "(load avg above the thread count means other processes shared the CPU: wall times are then "
            "upper bounds, and cpu s / threads estimates a quiet machine)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The HF engine and vLLM side by side: the same requests, the same model, one process.

    .venv/bin/python -m bench.engines                       # b16, b64, b256; without and with LoRA
    .venv/bin/python -m bench.engines --batches 64 --no-lora --no-step
    .venv/bin/python -m bench.engines --profile 16 --out outputs/bench/engines_profile.json
    .venv/bin/python -m bench.run --sections engines        # as a section of `make bench`

Generation: SmolLM2-135M-Instruct from configs/cpu.yaml (its `model.dtype: auto`: bf16 on CPUs
with bf16 instructions, else fp32; both engines sample in that dtype), chat-template prompts
"What is A * B? Answer with the number only." (bench/generation.py), 64 new tokens at temperature
1, no stop token (every row runs to the end), one seed per request. Both engines are built from
one policy through the registry (`make_engine`), as a training run builds them, and get the very
same request lists: one warm-up call each, then `--repeats` calls alternating which engine goes
first; the median tokens/s of each is reported. With LoRA (`lora.enabled=true`, the trainer's
adapter) the HF engine samples the merged weights and vLLM its LoRA kernels on the base model.

The calculator step: one training step of configs/cpu.yaml (8 tasks x G=4 on the calculator
server, the update included) through the trainer with `rollout.engine=hf` and with `vllm`, the
median of the steps after a warm-up (bench/steps.py `multi_turn_step`).

vLLM's start-up (loading, and on a CPU torch.compile of its model unless `--eager`) is reported
apart: it is paid once per run, not per step.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import time

import torch

from bench.generation import make_prompts
from bench.report import write_json_report
from bench.steps import multi_turn_step
from grpo.config import load_config
from grpo.models.policy import PolicyWithValueHead
from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.registry import make_engine

CONFIG = "configs/cpu.yaml"
BATCHES = (16, 64, 256)
ENGINES = ("hf", "vllm")


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _requests(tokenizer, batch: int, new_tokens: int) -> list[GenerationRequest]:
    return [GenerationRequest(p, SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=i))
            for i, p in enumerate(make_prompts(tokenizer, batch, group=1))]


def _timed(engine, requests: list[GenerationRequest]) -> tuple[float, int]:
    start = time.perf_counter()
    results = engine.generate(requests)
    return time.perf_counter() - start, sum(len(r.token_ids) for r in results)


def _engines(*, lora: bool, max_batch: int, new_tokens: int, threads: int, device: str, eager: bool,
             kv_cache_gib: float, overrides: tuple[str, ...]):
    """(engines by name, start-up seconds by name, tokenizer): both engines from one policy."""
    settings = [f"threads={threads}", f"device={device}", f"lora.enabled={str(lora).lower()}",
                f"rollout.hf.max_batch_size={max_batch}", f"rollout.max_concurrent_episodes={max_batch}",
                f"rollout.max_total_tokens={64 + new_tokens + 64}",
                f"rollout.vllm.enforce_eager={str(eager).lower()}"]
    if device == "cpu":
        settings.append(f"rollout.vllm.kv_cache_gib={kv_cache_gib}")
    config = load_config(CONFIG, [*settings, *overrides])
    torch.set_num_threads(threads)
    policy, tokenizer = PolicyWithValueHead.from_config(config.model, config.lora, torch.device(device),
                                                        seed=config.seed)
    engines, startup = {}, {}
    for name in ENGINES:
        start = time.perf_counter()
        engines[name] = make_engine(name, policy=policy, tokenizer=tokenizer, config=config, device=device)
        if lora:
            engines[name].sync_weights(policy)  # what the trainer does after each update
        startup[name] = round(time.perf_counter() - start, 1)
    return engines, startup, tokenizer


def generation_side_by_side(*, lora: bool, batches=BATCHES, new_tokens: int = 64, repeats: int = 3,
                            threads: int = 2, device: str = "cpu", eager: bool = False,
                            kv_cache_gib: float = 4.0, overrides: tuple[str, ...] = ()) -> dict:
    """tokens/s of both engines on the same requests at each batch size (see the module doc);
    `overrides` go on top of configs/cpu.yaml (another model, say)."""
    engines, startup, tokenizer = _engines(lora=lora, max_batch=max(batches), new_tokens=new_tokens,
                                           threads=threads, device=device, eager=eager,
                                           kv_cache_gib=kv_cache_gib, overrides=overrides)
    out = {"lora": lora, "new_tokens": new_tokens, "repeats": repeats, "startup_s": startup,
           "engines": {name: engine.describe() for name, engine in engines.items()}}
    try:
        for batch in batches:
            requests = _requests(tokenizer, batch, new_tokens)
            for engine in engines.values():
                _timed(engine, requests)  # warm-up: kernel choice, first allocations, compiled shapes
            rates: dict[str, list[float]] = {name: [] for name in ENGINES}
            generated: dict[str, int] = {}
            for repeat in range(repeats):
                for name in ENGINES if repeat % 2 == 0 else ENGINES[::-1]:
                    seconds, generated[name] = _timed(engines[name], requests)
                    rates[name].append(generated[name] / seconds)
            row = {f"{name}_tokens_per_s": round(statistics.median(r), 1) for name, r in rates.items()}
            row.update({f"{name}_tokens": tokens for name, tokens in generated.items()})
            row["vllm_over_hf"] = round(row["vllm_tokens_per_s"] / row["hf_tokens_per_s"], 3)
            row["load_average"] = round(os.getloadavg()[0], 2)
            out[f"b{batch}"] = row
            print(f"[bench.engines] lora={lora} b{batch}: {json.dumps(row)}", flush=True)
    finally:
        for engine in engines.values():
            engine.close()
    return out


def profile_side_by_side(*, lora: bool, batch: int, new_tokens: int = 64, threads: int = 2,
                         device: str = "cpu", eager: bool = False, kv_cache_gib: float = 4.0,
                         top: int = 12, overrides: tuple[str, ...] = ()) -> dict:
    """Where each engine's time goes on one batch: torch.profiler over one generate call after a
    warm-up (vLLM's engine core runs in this process, so its operators are seen too). Per engine:
    the call's seconds, operator calls per generated token, and the `top` operators by their own
    CPU time (ms, calls)."""
    engines, _, tokenizer = _engines(lora=lora, max_batch=batch, new_tokens=new_tokens, threads=threads,
                                     device=device, eager=eager, kv_cache_gib=kv_cache_gib,
                                     overrides=overrides)
    out: dict = {"lora": lora, "batch": batch, "new_tokens": new_tokens}
    try:
        requests = _requests(tokenizer, batch, new_tokens)
        for name, engine in engines.items():
            _timed(engine, requests)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                seconds, tokens = _timed(engine, requests)
            events = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]
            ranked = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
            out[name] = {
                "seconds": round(seconds, 3), "tokens": tokens,
                "op_calls_per_token": round(sum(e.count for e in events) / tokens, 1),
                "top_self_cpu": [[e.key, round(e.self_cpu_time_total / 1000, 1), e.count] for e in ranked],
            }
            print(f"[bench.engines] profile lora={lora} b{batch} {name}: {seconds:.2f} s, "
                  f"{out[name]['op_calls_per_token']} op calls per token", flush=True)
            for key, ms, count in out[name]["top_self_cpu"]:
                print(f"    {ms:10.1f} ms {count:8d}x  {key}", flush=True)
    finally:
        for engine in engines.values():
            engine.close()
    return out


def calculator_steps(threads: int = 2, device: str = "cpu", steps: int = 3) -> dict:
    """One training step of configs/cpu.yaml with each engine (median of the steps after the first)."""
    out = {}
    for name in ENGINES:
        report = multi_turn_step(steps=steps, config_path=CONFIG, threads=threads,
                                 overrides=(f"device={device}", f"rollout.engine={name}"))
        timed = report["steps"][1:]
        out[name] = {key: round(statistics.median(r[key] for r in timed), 2)
                     for key in ("step_s", "generate_s", "update_s")}
        out[name]["steps"] = report["steps"]
        print(f"[bench.engines] calculator step, {name}: {out[name]['step_s']} s", flush=True)
    out["vllm_over_hf_step_speed"] = round(out["hf"]["step_s"] / out["vllm"]["step_s"], 3)
    return out


def compare_engines(batches=BATCHES, repeats: int = 3, threads: int = 2, device: str = "cpu",
                    lora_modes=(False, True), step: bool = True, eager: bool = False) -> dict:
    """The section's report: generation without and with LoRA, then the calculator step."""
    report = {"load_average_start": round(os.getloadavg()[0], 2)}
    for lora in lora_modes:
        report["lora" if lora else "full"] = generation_side_by_side(
            lora=lora, batches=batches, repeats=repeats, threads=threads, device=device, eager=eager)
    if step:
        report["calculator_step"] = calculator_steps(threads, device)
    report["load_average_end"] = round(os.getloadavg()[0], 2)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--no-lora", action="store_true", help="full weights only")
    parser.add_argument("--no-step", action="store_true", help="skip the calculator step")
    parser.add_argument("--eager", action="store_true", help="vLLM without torch.compile / CUDA graphs")
    parser.add_argument("--profile", type=int, metavar="BATCH",
                        help="instead of the rates: where each engine's time goes at this batch")
    parser.add_argument("--out", default="outputs/bench/engines.json")
    args = parser.parse_args(argv)
    lora_modes = (False,) if args.no_lora else (False, True)
    if args.profile:
        report = {"lora" if lora else "full": profile_side_by_side(
            lora=lora, batch=args.profile, threads=args.threads, device=args.device, eager=args.eager)
            for lora in lora_modes}
    else:
        report = compare_engines(tuple(args.batches), args.repeats, args.threads, args.device, lora_modes,
                                 not args.no_step, args.eager)
    write_json_report(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

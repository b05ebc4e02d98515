"""The standard work's rollout with two engine settings, alternating in one process.

    python -m bench.rollout_ab --set rollout.hf.lean_forward=false --rounds 9
    python -m bench.rollout_ab --set rollout.hf.fuse_norms=false --device cuda

On a shared machine two separate runs of `bench.run` differ by more than most engine changes
gain. Here one policy feeds two HF engines, one built from the standard work's config (bench/steps.py)
and one with the `--set` overrides on top, and each round hands both the same requests (a fresh
step of the standard work: 4 prompts x G=4, at most 48 new tokens), the order alternating
between rounds. Both engines must sample the same tokens (the comparison is of speed, not of
what is sampled; `--allow-different` for settings that change it). Prints one JSON object: each
round's seconds and tokens, and the medians of the rounds after the first (a warm-up).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from bench.steps import standard_config, standard_requests
from grpo.models.policy import PolicyWithValueHead
from grpo.rollout.registry import make_engine


def rollout_ab(overrides: tuple[str, ...], rounds: int = 9, threads: int = 2, device: str = "cpu",
               model: str = "smollm2-135m-instruct", allow_different: bool = False) -> dict:
    torch.set_num_threads(threads)
    base = standard_config(threads, 16, model=model, device=device)
    other = standard_config(threads, 16, model=model, device=device, overrides=overrides)
    policy, tok = PolicyWithValueHead.from_config(base.model, base.lora, device, seed=0)
    engines = {name: make_engine("hf", policy=policy, tokenizer=tok, config=cfg, device=device)
               for name, cfg in (("base", base), ("set", other))}
    gen = torch.Generator().manual_seed(0)
    rows = []
    for step in range(rounds):
        _, requests = standard_requests(tok, gen, base.algorithm.group_size, step * 1000)
        row = {"round": step, "load": round(os.getloadavg()[0], 2)}
        tokens = {}
        for name in ("base", "set") if step % 2 == 0 else ("set", "base"):
            start = time.perf_counter()
            results = engines[name].generate(requests)
            row[f"{name}_s"] = round(time.perf_counter() - start, 4)
            tokens[name] = [r.token_ids for r in results]
        if tokens["base"] != tokens["set"] and not allow_different:
            raise AssertionError(f"round {step}: the two engines sampled different tokens ({list(overrides)})")
        row["generated_tokens"] = sum(map(len, tokens["base"]))
        rows.append(row)
    for engine in engines.values():
        engine.close()
    timed = rows[1:] or rows
    return {
        "overrides": list(overrides),
        "median_s": {name: round(statistics.median(r[f"{name}_s"] for r in timed), 4) for name in ("base", "set")},
        "set_faster_rounds": sum(r["set_s"] < r["base_s"] for r in timed),
        "rounds": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        required=True, help="config override of the second engine (repeatable)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--allow-different", action="store_true",
                        help="the setting changes what is sampled: compare speed anyway")
    args = parser.parse_args(argv)
    report = rollout_ab(tuple(args.overrides), args.rounds, args.threads, args.device,
                        allow_different=args.allow_different)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

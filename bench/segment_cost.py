"""What one more prefix segment costs the update on this device: the figure behind
`SEGMENT_CALL_TOKENS` (grpo/forward/segment_plan.py).

    .venv/bin/python -m bench.segment_cost                          # CPU: 16 x 96 and 8 x 363
    python -m bench.segment_cost --device cuda --shapes 16x96 64x384   # on a GPU machine

The update runs a micro-batch's shared prefixes once per group of rows that shares them, in
segments (PolicyWithValueHead.final_hidden_states); each segment is one more pass through every
layer. The plan weighs that pass as `call_tokens` token-rows. Here a micro-batch of `B x T` random
tokens (the embedded model, fp32 weights, full fine-tuning unless --lora, log-probs of the second
half of the columns, as the loss reads them) runs as one segment and cut into `--cuts`+1 column
segments over the same rows: no row saved, so the difference is the segments' own cost. Timed
alternately, forward+backward and a no-grad forward; per extra segment in seconds and in
token-rows (seconds x the one-segment pass's token-rows per second). Printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from itertools import pairwise

import torch

from bench.generation import best_seconds
from bench.update_prefixes import planned_by
from grpo.forward.segment_plan import Segment
from grpo.models.config import LoraConfig, ModelConfig
from grpo.models.policy import PolicyWithValueHead


def column_cuts(cuts: int) -> Callable:
    """A plan (plan_segments' signature) running every row in `cuts` + 1 column segments of near
    equal width, whatever the rows share."""

    def plan(input_ids: torch.Tensor, attention_mask: torch.Tensor, min_tokens: int = 0,
             call_tokens: int = 0) -> list[Segment]:
        batch, length = input_ids.shape
        rows = torch.arange(batch, device=input_ids.device)
        ends = [length * i // (cuts + 1) for i in range(cuts + 2)]
        return [Segment(a, b, rows, rows) for a, b in pairwise(ends) if b > a]

    return plan


def measure(policy: PolicyWithValueHead, batch: int, length: int, cuts: int, rounds: int) -> dict:
    """Medians over `rounds` of each plan's forward+backward and no-grad forward seconds, and the
    extra segments' cost per segment."""
    device = policy.device
    gen = torch.Generator().manual_seed(0)
    vocab = policy.language_model().get_input_embeddings().num_embeddings
    ids = torch.randint(0, vocab, (batch, length), generator=gen).to(device)
    mask = torch.ones_like(ids)
    positions = torch.zeros(batch, length - 1, dtype=torch.bool, device=device)
    positions[:, length // 2:] = True

    def forward_backward() -> None:
        policy(ids, mask, positions=positions).logprobs.sum().backward()
        policy.zero_grad(set_to_none=True)

    def forward() -> None:
        with torch.no_grad():
            policy(ids, mask, positions=positions)

    plans = {"one": column_cuts(0), "cut": column_cuts(cuts)}
    times: dict[str, dict[str, list[float]]] = {name: {"grad": [], "no_grad": []} for name in plans}
    for round_ in range(rounds + 1):  # round 0 warms up
        for name, plan in plans.items():
            with planned_by(plan):
                # One timed run each (best of 1; on CUDA timed with events).
                grad = best_seconds(forward_backward, 1, device.type)
                no_grad = best_seconds(forward, 1, device.type)
            if round_:
                times[name]["grad"].append(grad)
                times[name]["no_grad"].append(no_grad)
    out = {"batch": batch, "length": length, "cuts": cuts}
    for mode in ("grad", "no_grad"):
        one = statistics.median(times["one"][mode])
        cut = statistics.median(times["cut"][mode])
        per_segment = (cut - one) / cuts
        out[mode] = {
            "one_segment_s": round(one, 4),
            "cut_s": round(cut, 4),
            "per_segment_s": round(per_segment, 4),
            "per_segment_token_rows": round(per_segment * batch * length / one),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--shapes", nargs="+", default=["16x96", "8x363"],
                        help="micro-batches as ROWSxCOLUMNS")
    parser.add_argument("--cuts", type=int, default=3, help="extra segments in the cut plan")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lora", action="store_true", help="LoRA instead of full fine-tuning")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args(argv)
    if args.cuts < 1:
        parser.error("--cuts must be at least 1")
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(args.threads)
    policy, _ = PolicyWithValueHead.from_config(
        ModelConfig(name_or_path=args.model, weights_dtype="float32"), LoraConfig(enabled=args.lora), device)
    results = []
    for shape in args.shapes:
        batch, _, length = shape.partition("x")
        if not (batch.isdigit() and length.isdigit() and int(length) > args.cuts + 1):
            parser.error(f"--shapes {shape!r}: expected ROWSxCOLUMNS with more than {args.cuts + 1} columns")
        results.append(measure(policy, int(batch), int(length), args.cuts, args.rounds))
    print(json.dumps({"device": device, "lora": args.lora, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

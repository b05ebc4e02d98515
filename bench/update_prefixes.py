"""The standard step with the update's ways of running shared prefixes and padding, side by side.

    .venv/bin/python -m bench.update_prefixes                   # 5 rounds of 3 timed steps
    .venv/bin/python -m bench.update_prefixes --rounds 3 --plans packed segments

Plans (how PolicyWithValueHead.final_hidden_states runs a micro-batch):
  packed      the default: the micro-batch packed as a prefix tree (every distinct prefix once, no
              padding: grpo/forward/prefix_tree.py) where that is estimated cheaper than the
              segment plan, else the segment plan
  segments    the segment plan alone (grpo/forward/segment_plan.py): every prefix two or more
              rows share, where that pays (the batch-wide chat template and system prompt once,
              each group's prompt once per group); padding runs
  batch-wide  only the prefix that every row of the micro-batch shares (the update before
              prefix segments)
  none        the whole batch in one forward
Each round runs `bench.steps.standard_step` once per plan, in turn (a fresh policy each time, the
same seeded work), so the plans share the host's load; medians over the rounds of each plan's
median step are printed, with the update split, as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterator
from contextlib import contextmanager

import torch

import grpo.models.policy as policy_module
from bench.steps import standard_step
from grpo.forward.segment_plan import Segment, plan_segments


def batch_wide_segments(input_ids: torch.Tensor, attention_mask: torch.Tensor, min_tokens: int,
                        call_tokens: int = 0) -> list[Segment]:
    """The previous plan: the longest prefix every row shares (real tokens, at most T - 1 columns)
    once when it is `min_tokens` or longer, then every row; else one segment (`call_tokens` is
    not weighed: the previous plan did not)."""
    batch, length = input_ids.shape
    everyone = torch.arange(batch, device=input_ids.device)
    same = (input_ids == input_ids[:1]).all(0) & attention_mask.bool().all(0)  # [T]
    prefix = min(int(same.long().cumprod(0).sum()), length - 1)
    if batch < 2 or min_tokens <= 0 or prefix < min_tokens:
        return [Segment(0, length, everyone, everyone)]
    return [Segment(0, prefix, everyone[:1], torch.zeros(batch, dtype=torch.long, device=input_ids.device)),
            Segment(prefix, length, everyone, everyone)]


PLANS = {
    "packed": None,  # the policy's own choice: see planned_by
    "segments": plan_segments,
    "batch-wide": batch_wide_segments,
    "none": lambda input_ids, attention_mask, min_tokens, call_tokens: plan_segments(input_ids, attention_mask, 0, 0),
}


@contextmanager
def planned_by(plan) -> Iterator[None]:
    """Every policy (and reference copy) plans its forward's segments with `plan` meanwhile and
    never packs: the policy module's `plan_segments`, which `PolicyWithValueHead.prefix_segments`
    calls, is swapped, and its `pack_if_cheaper` never packs. `plan` None: nothing is swapped
    (the policy's own choice, packing included)."""
    if plan is None:
        yield
        return
    defaults = policy_module.plan_segments, policy_module.pack_if_cheaper
    policy_module.plan_segments = plan
    policy_module.pack_if_cheaper = lambda *args, **kwargs: None
    try:
        yield
    finally:
        policy_module.plan_segments, policy_module.pack_if_cheaper = defaults


def compare(plans: list[str], rounds: int, steps: int, threads: int) -> dict:
    runs: dict[str, list[dict]] = {name: [] for name in plans}
    for _ in range(rounds):
        for name in plans:
            with planned_by(PLANS[name]):
                runs[name].append(standard_step(steps=steps, threads=threads, skip_zero_advantage=False))

    def median(name: str, key: str) -> float:
        values = [r["standard_step_median_s"] if key == "step_s" else r["split_median_s"][key] for r in runs[name]]
        return round(statistics.median(values), 3)

    keys = ("step_s", "rollout_s", "update_s", "reference_s", "forward_backward_s")
    return {name: {key: median(name, key) for key in keys} for name in plans}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plans", nargs="+", choices=sorted(PLANS), default=["packed", "segments", "none"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="timed standard steps per run (after one warm-up)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    print(json.dumps(compare(args.plans, args.rounds, args.steps, args.threads), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

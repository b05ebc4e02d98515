"""The standard benchmark work run by TRL's GRPOTrainer, for a side-by-side comparison.

    .venv/bin/python -m bench.trl_baseline --steps 4          # needs `pip install trl`
    .venv/bin/python -m bench.run --sections standard trl     # both, one process, with the ratio

The work is docs/design.md's standard step, as bench/steps.py runs it for us: SmolLM2-135M-
Instruct (the embedded weights, fp32), 4 prompts "What is A * B? Answer with the number only." x
G=4 completions per optimizer step, at most 48 new tokens at temperature 1, one pass (TRL's
`num_iterations=1`), KL beta 0.01 against a reference model, learning rate 1e-6, the same
closeness reward. TRL samples with transformers' `generate` (no vLLM). Seconds per optimizer step
are wall time between TRL's step callbacks (generation, reference, forward/backward, optimizer);
the first step is a warm-up and the median of the rest is reported.

TRL is not a dependency of this project: without it this module says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

from bench.steps import PROMPT, closeness_reward
from grpo.models.source import load_causal_lm, load_tokenizer


def trl_available() -> bool:
    try:
        import datasets  # noqa: F401
        import trl  # noqa: F401
    except ImportError:
        return False
    return True


def trl_standard_step(steps: int = 4, threads: int = 2, seed: int = 0, device: str = "cpu") -> dict:
    """1 warm-up + `steps` timed optimizer steps of the standard work under TRL's GRPOTrainer."""
    import datasets
    import trl
    from transformers import TrainerCallback

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    model = load_causal_lm("smollm2-135m-instruct")  # fp32
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(4 * (steps + 1)):
        a, b = (int(x) for x in torch.randint(100, 1000, (2,), generator=gen))
        rows.append({"prompt": [{"role": "user", "content": PROMPT.format(a=a, b=b)}], "truth": a * b})

    def reward(completions, truth, **_) -> list[float]:
        return [closeness_reward(c[0]["content"], t) for c, t in zip(completions, truth)]

    stamps: list[float] = []

    class StepTimes(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        config = trl.GRPOConfig(
            output_dir=out, per_device_train_batch_size=16, num_generations=4,
            gradient_accumulation_steps=1, max_completion_length=48, temperature=1.0,
            beta=0.01, learning_rate=1e-6, num_iterations=1, max_steps=steps + 1,
            logging_steps=1, report_to="none", save_strategy="no", shuffle_dataset=False,
            bf16=False, use_cpu=device == "cpu", seed=seed, disable_tqdm=True,
        )
        trainer = trl.GRPOTrainer(
            model=model, reward_funcs=reward, args=config, processing_class=tokenizer,
            train_dataset=datasets.Dataset.from_list(rows), callbacks=[StepTimes()],
        )
        trainer.train()
    seconds = [end - begin for begin, end in zip(stamps[::2], stamps[1::2])]
    return {
        "trl_version": trl.__version__,
        "trl_step_median_s": round(statistics.median(seconds[1:]), 3),
        "first_step_s": round(seconds[0], 3),
        "steps_s": [round(s, 3) for s in seconds],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4, help="timed steps after the warm-up")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if not trl_available():
        print("TRL is not installed (pip install trl datasets): no baseline to run")
        return 2
    print(json.dumps(trl_standard_step(args.steps, args.threads), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Run directories written for the run report's tests, laid out as a run leaves them: config,
metrics, summary, the evaluations' transcripts and the token samples."""

from __future__ import annotations

import json
import random
from pathlib import Path

import yaml

SYSTEM = {"role": "system", "content": "You can call tools."}


def transcript(request: str, answer: str, result: str, tool: str = "calculate") -> list[dict]:
    return [SYSTEM, {"role": "user", "content": request},
            {"role": "assistant", "content": f'<tool_call>{{"name": "{tool}", "arguments": {{}}}}</tool_call>'},
            {"role": "tool", "name": tool, "content": result},
            {"role": "assistant", "content": f"<answer>{answer}</answer>"}]


def eval_record(task_id: str, success: bool, request: str, result: str, groups: dict, tool: str = "calculate",
                gold_tools: list[str] | None = None) -> dict:
    return {"task_id": task_id, "groups": groups, "gold_tools": gold_tools or [], "prompt_messages": 2, "reward": float(success), "success": success,
            "num_turns": 2, "num_tool_calls": 1, "finish_reasons": ["stop", "stop"], "reward_breakdown": {},
            "transcript": transcript(request, "1" if success else "2", result, tool)}


def write_run(run_dir: Path, *, steps: int = 3, episodes: int = 4, token_samples: int = 2, seed: int = 0,
              hostile: str | None = None, finished: bool = True) -> Path:
    """A run of `steps` training steps and `episodes` held-out tasks (evaluated before and after);
    `hostile`, when given, is a tool result and a request of task 0."""
    rng = random.Random(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"run_name": run_dir.name, "device": "cpu",
                                                         "model": {"name_or_path": "tiny"}}))
    rows = [{"step": 0, "eval/success_rate": 0.25}]
    rows += [{"warmup/step": k, "warmup/loss": 1.0 / k, "step": 0} for k in (1, 2)]
    for step in range(1, steps + 1):
        rows.append({"step": step, "rollout/reward_mean": step / steps, "rollout/success_rate": step / (2 * steps),
                     "rollout/success/kind=sum": 0.5, "train/loss": 0.1, "time/step_s": 2.0,
                     "tools/calculator.calculate/calls": 10, "tools/calculator.calculate/errors": 1,
                     "tools/calculator.calculate/p50_ms": 2.0 + step, "tools/calculator.calculate/p99_ms": 10.0 * step,
                     "tools/calculator.calculate/errors/tool_error": 1,
                     "tools/restarts": 1 if step == 2 else 0, "tools/errors/tool_error": 1,
                     "tools/server=calculator/restarts": 1 if step == 2 else 0,
                     "tools/server=calculator/breaker_openings": 1 if step == 3 else 0,
                     "tools/breaker_openings": 1 if step == 3 else 0})
    rows.append({"step": steps, "eval/success_rate": 0.75})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
        (run_dir / "summary.json").write_text(json.dumps({
            "success_before": 0.25, "success_after": 0.75, "success_before/kind=sum": 0.0,
            "success_after/kind=sum": 1.0, "wall_minutes": 1.5}))
    evals = run_dir / "eval"
    evals.mkdir(exist_ok=True)
    # Outcomes before -> after cycle through fixed, broken, still failing, always right.
    outcomes = [(False, True), (True, False), (False, False), (True, True)]
    for stage, pick in (("before", 0), ("after", 1)):
        lines = []
        for i in range(episodes):
            request = f"What is {i} + {rng.randint(1, 999)}?"
            result = str(i)
            if hostile is not None and i == 0:
                request, result = hostile, hostile
            groups = {"kind": ["sum", "word"][i % 2], "split": "eval", "server": "calculator"}
            # Even tasks' gold chains call calculate, every third also convert.
            gold = ["calculator.calculate"] * (i % 2 == 0) + ["calculator.convert"] * (i % 3 == 0)
            lines.append(json.dumps(eval_record(f"task-{i:05d}", outcomes[i % 4][pick], request, result, groups,
                                                gold_tools=gold)) + "\n")
        (evals / f"{stage}.jsonl").write_text("".join(lines))
    samples = run_dir / "samples"
    samples.mkdir(exist_ok=True)
    with (samples / "tokens.jsonl").open("w") as handle:
        for step in range(1, token_samples + 1):
            tokens = [["<|im_start|>", 0, 0.0, None, None], ["What", 0, 0.0, None, None],
                      ["<tool_call>", 1, 0.5, -0.2, -0.25], ["}", 1, 0.5, -0.1, -0.1], ["42", 0, 0.0, None, None],
                      ["<answer>", 1, -0.3, -0.5, -0.4]]
            handle.write(json.dumps({"step": step, "task_id": "task-00000", "reward": 1.0, "success": True,
                                     "prompt_length": 2, "num_tokens": len(tokens), "cut_at": None, "cut_tokens": 0,
                                     "tokens": tokens}) + "\n")
    return run_dir

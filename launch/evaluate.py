"""Evaluate a model or checkpoint on held-out tasks: success rate, mean reward, pass@k.

    python -m launch.evaluate --config configs/cpu.yaml [--model DIR | --checkpoint DIR] [--k 4]
    python -m launch.evaluate --config configs/community_servers.yaml --task-file tasks.jsonl --gold

`--model` is an HF directory (e.g. a run's `final_model/`); `--checkpoint` a training checkpoint
(`outputs/RUN/checkpoints/step-000010`); neither: the config's model as it is. Writes per-task
transcripts to `<run_dir>/eval/<name>.jsonl`, prints the metrics as JSON, and rewrites the run's
`report.html` with this evaluation among its episodes (its path on stderr). A setup problem (the
model, the dataset, a server, a task naming a tool no server offers) is one line, exit status 1;
so is a run in which every task was excluded (each group had an episode that failed).
`--task-file` evaluates a task file instead of the config's held-out tasks; `--gold` needs no model:
it replays every task's gold chain on fresh state and scores it with the task's own reward, prints
each task whose gold fails with the reason, and exits 1 when any does (a task file checked at any
time, e.g. a day later under `tools.clock_offset=+1d`).

BFCL multi-turn (the Berkeley Function Calling Leaderboard, scored by its official checker):

    python -m launch.evaluate --config configs/bfcl.yaml --env bfcl --category base [--split eval] [--tasks 20]

`--category` is base, miss_func, miss_param, long_context, a comma list, or all; `--split` eval
(the declared held-out scenarios, default), train or all; `--tasks N` keeps the first N of each
category. Metrics add `bfcl/<category>/accuracy` (official) and `bfcl/<category>/turn_credit`;
each transcript line carries the checker's verdict and the decoded calls under `bfcl`.

τ²-bench (a simulated user; τ²'s own evaluator; environments/tau2):

    python -m launch.evaluate --config configs/tau2.yaml --env tau2 --domain mock [--split all] [--k 4]

`--domain` is mock, airline, retail or telecom; `--split` eval (the declared held-out tasks of
configs/data/tau2_split.json, default), train or all; `--tasks N` keeps the first N. The config's
`environment.tau2` section chooses the simulated user; a server `tau2_<domain>` is added when the
config has none of that name. Metrics add `eval/tau2/<domain>/pass^1` .. `pass^k` (τ²'s pass^k
over k plays of every task) and `avg_reward`; each transcript line carries τ²'s verdict under `tau2`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from environments.bfcl.data import BFCLUnavailable, load_bfcl_tasks
from environments.bfcl.scoring import summarize as summarize_bfcl
from environments.tasks.loading import load_file, train_validation_split
from environments.tasks.schema import TaskDataError
from environments.tasks.tool_references import check_tool_references
from environments.tau2.data import load_tau2_tasks
from environments.tau2.gold import server_config as tau2_server_config
from environments.tau2.scoring import summarize as summarize_tau2
from grpo.collect.collector import TrajectoryCollector
from grpo.config import ConfigError, RunConfig, load_config, name_problem
from grpo.models.devices import resolve_device
from grpo.models.policy import PolicyWithValueHead
from grpo.models.source import load_tokenizer
from grpo.report.page import write_report
from grpo.rollout.registry import choose_engine, make_engine
from grpo.train.checkpoint import load_checkpoint
from grpo.train.evaluation import evaluate, summarize, transcript_records
from grpo.train.gold import GoldVerdict, replay_gold
from launch.interrupt import stops_cleanly_on_interrupt
from launch.validate_setup import setup_problem
from tools.config import MCPServerConfig
from tools.manager import SharedToolManager
from tools.secrets import mask_value
from tools.servers.tau2_domains import DOMAINS as TAU2_DOMAINS
from tools.servers.tau2_domains import Tau2Unavailable


def bfcl_setup(config: RunConfig, category: str, split: str, num_tasks: int | None) -> list:
    """BFCL tasks, with the config pointed at the `bfcl` environment and server."""

    tasks = load_bfcl_tasks(category, split, limit=num_tasks)
    config.environment.env_class = "bfcl"
    if "bfcl" not in config.tools.servers:
        config.tools.servers = {**config.tools.servers,
                                "bfcl": MCPServerConfig(command="python", args=["-m", "tools.servers.bfcl"])}
    return tasks


def tau2_setup(config: RunConfig, domain: str, split: str, num_tasks: int | None) -> list:
    """τ² tasks of the domain's split, with the config pointed at the `tau2` environment and a
    server for the domain."""

    tasks = load_tau2_tasks(domain, split, limit=num_tasks)
    config.environment.env_class = "tau2"
    if f"tau2_{domain}" not in config.tools.servers:
        config.tools.servers = {**config.tools.servers, f"tau2_{domain}": tau2_server_config(domain)}
    return tasks


BENCHMARKS = {
    "bfcl": lambda trajectories, tasks, k: summarize_bfcl(trajectories, tasks),
    "tau2": summarize_tau2,
}
"""The official scores of each benchmark: (trajectories, tasks, k) -> metrics (without `eval/`)."""


async def evaluate_benchmark(collector, tasks: list, benchmark: str, *, k: int, temperature: float, seed: int,
                             transcripts_path: Path) -> dict[str, float]:
    """Play the benchmark's tasks k times each; generic eval metrics plus its official scores
    (BFCL: per-category accuracy and turn credit; τ²: pass^1..pass^k per domain)."""

    result = await collector.collect(tasks, group_size=k, temperature=temperature, seed=seed, step=-1)
    metrics = summarize(result.trajectories, len(tasks), k, result.excluded_groups)
    scores = BENCHMARKS[benchmark](result.trajectories, tasks, k)
    metrics.update({f"eval/{key}": value for key, value in scores.items()})
    lines = []
    for traj, record in zip(result.trajectories, transcript_records(result.trajectories)):
        record[benchmark] = mask_value((traj.metadata.get("info") or {}).get(benchmark))[0]
        lines.append(json.dumps(record, default=str) + "\n")
    transcripts_path.parent.mkdir(parents=True, exist_ok=True)
    transcripts_path.write_text("".join(lines))
    return metrics


async def evaluate_config(config: RunConfig, *, checkpoint: str | None, k: int, temperature: float,
                          num_tasks: int | None, name: str, tasks: list | None = None,
                          benchmark: str | None = None) -> dict[str, float]:
    """Evaluate on `tasks` of `benchmark` (scored officially), else on the config's held-out tasks."""

    device, _ = resolve_device(config.device)
    policy, tokenizer = PolicyWithValueHead.from_config(config.model, config.lora, device=device,
                                                        seed=config.seed)
    if checkpoint is not None:
        policy.load_state_dict(load_checkpoint(Path(checkpoint))["policy"])
    policy.eval()
    engine_name, _ = choose_engine(config.rollout.engine, device)
    engine = make_engine(engine_name, policy=policy, tokenizer=tokenizer, config=config, device=device)
    if tasks is None:
        _, tasks = train_validation_split(config.data, config.environment.env_class)
        tasks = tasks[:num_tasks] if num_tasks else tasks
    started = time.time()
    transcripts = config.run_dir / "eval" / f"{name}.jsonl"
    async with SharedToolManager(config.tools) as tools:
        check_tool_references(tasks, tools.tool_specs(), config.tools, config.environment)
        collector = TrajectoryCollector(engine, tokenizer, tools, config.environment, config.rollout)
        if benchmark is not None:
            metrics = await evaluate_benchmark(collector, tasks, benchmark, k=k, temperature=temperature,
                                               seed=config.seed, transcripts_path=transcripts)
        else:
            metrics = await evaluate(collector, tasks, k=k, temperature=temperature, seed=config.seed,
                                     transcripts_path=transcripts)
    metrics["eval/seconds"] = time.time() - started
    engine.close()
    return metrics


GOLD_TOKENS = 1 << 17
"""A gold replay's token budget: room for any task's prompt, examples and results."""


async def check_gold(config: RunConfig, tasks: list) -> list[GoldVerdict]:
    """Every task's gold chain replayed on fresh state on the config's servers and scored with the
    task's own reward (no model: the gold turns are scripted, tokenized with the config's model's
    tokenizer)."""
    tokenizer = load_tokenizer(config.model.name_or_path, config.model.cache_dir)
    # No model reads these episodes: a model's prompt budget does not apply to them.
    rollout = config.rollout.model_copy(update={"max_total_tokens": max(config.rollout.max_total_tokens, GOLD_TOKENS)})
    async with SharedToolManager(config.tools) as tools:
        check_tool_references(tasks, tools.tool_specs(), config.tools, config.environment)
        return await replay_gold(tasks, tools, tokenizer, config.environment, rollout)


def print_gold(verdicts: list[GoldVerdict], path: str) -> int:
    """One line per task whose gold does not hold, then the count; status 1 when any failed."""
    failed = [v for v in verdicts if not v.success]
    for verdict in failed:
        print(f"gold fails: task {verdict.task_id}: {verdict.reason}")
    print(f"{len(verdicts) - len(failed)} of {len(verdicts)} gold chains in {path} pass their own checks")
    return 1 if failed else 0


@contextmanager
def _collector_messages_on_stderr():
    """The collector says how tools reach the model (tool prompt and call format, and why) and
    which groups it excluded; training writes that to its log, evaluation to stderr."""
    logger = logging.getLogger("mcp_grpo.collector")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("evaluate: %(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@stops_cleanly_on_interrupt
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--model", help="an HF model directory to evaluate instead of the config's")
    parser.add_argument("--checkpoint", help="a training checkpoint directory to load")
    parser.add_argument("--k", type=int, default=1, help="samples per task (pass@k)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="sampling temperature (default: rollout.eval_temperature, or 1.0 when k > 1)")
    parser.add_argument("--tasks", type=int, default=None, help="evaluate only the first N held-out tasks")
    parser.add_argument("--task-file", default=None,
                        help="a task file (.jsonl, .json, .parquet) to evaluate instead of the config's held-out tasks")
    parser.add_argument("--gold", action="store_true",
                        help="no model: replay every task's gold chain on fresh state and score it with the task's "
                             "own reward (exit 1 when any fails)")
    parser.add_argument("--name", default="evaluate", help="name of the transcripts file")
    parser.add_argument("--env", choices=["config", "bfcl", "tau2"], default="config",
                        help="bfcl: BFCL multi-turn tasks; tau2: τ²-bench tasks (instead of the config's held-out tasks)")
    parser.add_argument("--category", default="base",
                        help="with --env bfcl: base, miss_func, miss_param, long_context, a comma list, or all")
    parser.add_argument("--domain", default="mock", choices=TAU2_DOMAINS, help="with --env tau2: the τ² domain")
    parser.add_argument("--split", default="eval", choices=["eval", "train", "all"],
                        help="with --env bfcl or tau2: the declared held-out tasks (eval), train, or all")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    if name_problem(args.name):  # the transcripts land in <run_dir>/eval/<name>.jsonl
        print(f"evaluate: --name {args.name!r} {name_problem(args.name)}", file=sys.stderr)
        return 2
    overrides = list(args.overrides)
    if args.model:
        overrides.append(f"model.name_or_path={args.model}")
    try:
        config = load_config(args.config, overrides)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    temperature = args.temperature
    if temperature is None:
        temperature = config.rollout.eval_temperature if args.k == 1 else 1.0
    tasks, benchmark = None, (None if args.env == "config" else args.env)
    try:
        if args.task_file:
            tasks = load_file(args.task_file, config.environment.env_class)[:args.tasks or None]
        elif args.gold:
            _, tasks = train_validation_split(config.data, config.environment.env_class)
            tasks = tasks[:args.tasks or None]
        if args.gold:
            with _collector_messages_on_stderr():
                verdicts = asyncio.run(check_gold(config, tasks))
            return print_gold(verdicts, args.task_file or "the config's held-out tasks")
        if args.env == "bfcl":
            tasks = bfcl_setup(config, args.category, args.split, args.tasks)
        elif args.env == "tau2":
            tasks = tau2_setup(config, args.domain, args.split, args.tasks)
    except (BFCLUnavailable, Tau2Unavailable, ValueError, FileNotFoundError, TaskDataError) as exc:
        print(f"evaluate: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a setup problem (a server, the tokenizer) is one line; a bug is re-raised
        problem = setup_problem(exc)
        if problem is None:
            raise
        print(f"evaluate: {problem}", file=sys.stderr)
        return 1
    try:
        with _collector_messages_on_stderr():
            metrics = asyncio.run(evaluate_config(config, checkpoint=args.checkpoint, k=args.k, temperature=temperature,
                                                  num_tasks=args.tasks, name=args.name, tasks=tasks, benchmark=benchmark))
    except Exception as exc:  # only setup errors (worded as --dry-run words them) are handled; a bug is re-raised
        problem = setup_problem(exc)
        if problem is None:
            raise
        print(f"evaluate: {problem}", file=sys.stderr)
        return 1
    print(json.dumps(metrics, indent=2))
    print(f"report: {write_report(config.run_dir)}", file=sys.stderr)  # stdout stays the metrics' JSON
    if metrics["eval/num_tasks"] and metrics["eval/excluded_tasks"] >= metrics["eval/num_tasks"]:
        print(f"evaluate: all {metrics['eval/num_tasks']:.0f} tasks were excluded (every group had an episode "
              "that failed: see the warnings above); nothing was evaluated", file=sys.stderr)
        return 1
    if benchmark == "tau2":
        scores = ", ".join(f"pass^{j} {metrics[f'eval/tau2/{args.domain}/pass^{j}']:.3f}" for j in range(1, args.k + 1))
        print(f"τ² {args.domain} ({args.split} split, {len(tasks)} tasks, k={args.k}): {scores}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The `async` section of `make bench`: the calculator work with slow tools, synchronous steps
beside asynchronous rollouts (`train.async_rollouts`), in one process, at the same step size and
threads.

Each side runs `steps` GRPO steps of `configs/cpu.yaml` through GRPOTrainer with every calculator
call answering after `latency` seconds (the server's `latency:`), so a step pays what a real tool
costs. The first step of each side is a warm-up (its producer starts from an empty queue); the
figure is groups trained per hour over the others: tasks_per_step x (steps - 1) / their seconds.
The sides alternate `repeats` times and each figure is the median.

With vLLM installed, the same pair runs again sampled by two `vllm serve` processes on this
machine (`rollout.engine: vllm_server`, configs/vllm_servers.yaml: LoRA, an adapter pushed to
both servers after each update), started once for both sides by `python -m launch.vllm_servers`.

    .venv/bin/python -m bench.async_rollouts --repeats 3              # HF engine, then vllm_server
    .venv/bin/python -m bench.async_rollouts --engines hf --steps 6
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench.engines import vllm_installed
from bench.report import write_json_report
from bench.steps import STEPS_ONLY
from grpo.config import load_config
from grpo.train.trainer import GRPOTrainer

SERVERS_CONFIG = "configs/vllm_servers.yaml"
SERVER_PORTS = (8150, 8151)
"""Ports of the bench's two vLLM servers (not launch.vllm_servers' defaults, so a user's own
servers on those keep running beside it)."""


def run_side(mode: str, *, steps: int, config_path: str, threads: int, latency: float, max_staleness: int,
             tasks_per_step: int, overrides: tuple[str, ...]) -> dict:
    """`steps` steps of one side (`sync` or `async`); its rate and where the time went."""
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(config_path, [
            f"output_dir={out}", f"run_name=bench-{mode}", f"threads={threads}", f"train.steps={steps}",
            f"train.tasks_per_step={tasks_per_step}", *STEPS_ONLY,
            f"tools.servers.calculator.latency={latency}",
            f"train.async_rollouts.enabled={str(mode == 'async').lower()}",
            f"train.async_rollouts.max_staleness={max_staleness}", *overrides,
        ])
        trainer = GRPOTrainer(cfg)
        trainer.setup()
        asyncio.run(trainer.run_async())
        history = trainer.history
    timed = history[1:]
    seconds = sum(m["time/step_s"] for m in timed)
    row = {
        "groups_per_hour": round(tasks_per_step * len(timed) / seconds * 3600, 1),
        "step_s": [round(m["time/step_s"], 2) for m in history],
        "waiting_for_groups_s": [round(m["time/rollout_s"], 2) for m in history],
        "success_rate": [round(m.get("rollout/success_rate", 0.0), 3) for m in history],
    }
    if mode == "async":
        row.update(
            staleness_mean=[round(m["async/staleness_mean"], 2) for m in history],
            dropped_stale_groups=sum(m["async/dropped_stale_groups"] for m in history),
            producer_finished_groups=history[-1]["async/finished_groups"],
            trainer_idle_share=[round(m["async/trainer_idle_share"], 3) for m in history],
            producer_idle_share=[round(m["async/producer_idle_share"], 3) for m in history],
        )
    return row


def async_vs_sync(steps: int = 4, config_path: str = "configs/cpu.yaml", threads: int = 2,
                  latency: float = 0.3, max_staleness: int = 1, tasks_per_step: int = 8, repeats: int = 1,
                  overrides: tuple[str, ...] = ()) -> dict:
    """Both sides `repeats` times, alternating; the medians and their ratio."""
    sides: dict[str, list[dict]] = {"sync": [], "async": []}
    for _ in range(repeats):
        for mode, runs in sides.items():
            runs.append(run_side(mode, steps=steps, config_path=config_path, threads=threads,
                                        latency=latency, max_staleness=max_staleness,
                                        tasks_per_step=tasks_per_step, overrides=overrides))
    rate = {mode: statistics.median(r["groups_per_hour"] for r in runs) for mode, runs in sides.items()}
    return {
        "tool_latency_s": latency,
        "max_staleness": max_staleness,
        "tasks_per_step": tasks_per_step,
        "steps": steps,
        "threads": threads,
        "sync_groups_per_hour": rate["sync"],
        "async_groups_per_hour": rate["async"],
        "async_speedup": round(rate["async"] / rate["sync"], 3),
        "runs": sides,
    }


@contextlib.contextmanager
def vllm_servers(log_dir: str, startup_timeout_s: float = 900.0) -> Iterator[list[str]]:
    """Two vLLM servers for SERVERS_CONFIG (`python -m launch.vllm_servers`, its log in `log_dir`);
    yields their URLs, and stops them (Ctrl-C to the launcher) afterwards."""
    command = [sys.executable, "-m", "launch.vllm_servers", "--config", SERVERS_CONFIG,
               "--num", str(len(SERVER_PORTS)), "--base-port", str(SERVER_PORTS[0]), f"output_dir={log_dir}"]
    log_path = Path(log_dir) / "launcher.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            ready = [line for line in log_path.read_text().splitlines() if line.startswith("vLLM servers ready:")]
            if ready:
                break
            if process.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(log_path.read_text().splitlines()[-20:])
                raise RuntimeError(f"the bench's vLLM servers did not start ({' '.join(command)}):\n{tail}")
            time.sleep(1.0)
        yield ready[0].split(":", 1)[1].split()
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def async_vs_sync_vllm_servers(steps: int = 4, threads: int = 2, latency: float = 0.3, max_staleness: int = 1,
                               tasks_per_step: int = 8, repeats: int = 1, overrides: tuple[str, ...] = ()) -> dict:
    """`async_vs_sync` sampled by two vLLM servers (configs/vllm_servers.yaml), started for both sides."""
    with tempfile.TemporaryDirectory() as logs, vllm_servers(logs) as urls:
        report = async_vs_sync(steps=steps, config_path=SERVERS_CONFIG, threads=threads, latency=latency,
                               max_staleness=max_staleness, tasks_per_step=tasks_per_step, repeats=repeats,
                               overrides=(*overrides, f"rollout.vllm_server.urls=[{','.join(urls)}]"))
    report["servers"] = len(urls)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", nargs="+", choices=("hf", "vllm_server"), default=["hf", "vllm_server"])
    parser.add_argument("--steps", type=int, default=4, help="steps per side, the first a warm-up")
    parser.add_argument("--repeats", type=int, default=1, help="alternations of the two sides (median)")
    parser.add_argument("--latency", type=float, default=0.3, help="seconds every calculator call takes")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="outputs/bench/async.json")
    args = parser.parse_args(argv)
    settings = {"steps": args.steps, "threads": args.threads, "latency": args.latency, "repeats": args.repeats}
    report = {"load_average_start": round(os.getloadavg()[0], 2)}
    if "hf" in args.engines:
        report["hf"] = async_vs_sync(**settings)
        print(f"[bench.async] hf: async x{report['hf']['async_speedup']}", flush=True)
    if "vllm_server" in args.engines:
        if vllm_installed():
            report["vllm_server"] = async_vs_sync_vllm_servers(**settings)
            print(f"[bench.async] vllm_server: async x{report['vllm_server']['async_speedup']}", flush=True)
        else:
            report["vllm_server"] = {"skipped": "vLLM is not installed"}
    report["load_average_end"] = round(os.getloadavg()[0], 2)
    write_json_report(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

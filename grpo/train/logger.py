"""The one metrics writer of a run: console lines, metrics.jsonl, and wandb when configured.

Functions elsewhere return flat dicts of metrics (`train/…`, `rollout/…`, `tools/…`, `eval/…`);
only this logger writes them. It is a no-op on non-zero ranks, drops non-finite values with a
warning, and never lets a wandb problem stop training. On resume, `truncate_after(step)` drops the
rows that a killed run wrote after its last checkpoint, so no step appears twice.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from tools.secrets import MaskingFormatter

log = logging.getLogger("mcp_grpo")

# Shown on the console line, in this order, when present.
_CONSOLE_KEYS = (
    ("rollout/reward_mean", "reward"),
    ("rollout/success_rate", "success"),
    ("train/loss", "loss"),
    ("train/kl_ref", "kl_ref"),
    ("train/ratio_mean", "ratio"),
    ("train/clip_frac", "clip"),
    ("train/grad_norm", "gnorm"),
    ("train/logprob_mismatch", "mismatch"),
    ("train/mismatch_kl", "mismatch_kl"),
    ("train/is_weight_mean", "is_w"),
    ("async/staleness_mean", "stale"),
    ("async/queue_groups", "queue"),
    ("async/dropped_stale_groups", "dropped"),
    ("time/step_s", "step_s"),
)


def finite_metrics(metrics: dict[str, Any]) -> tuple[dict[str, float], list[str]]:
    """Split metrics into finite floats and the names of dropped (non-finite or non-numeric) ones."""
    kept, dropped = {}, []
    for key, value in metrics.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            dropped.append(key)
            continue
        if math.isfinite(number):
            kept[key] = number
        else:
            dropped.append(key)
    return kept, dropped


class MetricsLogger:
    def __init__(
        self,
        run_dir: Path | None,
        *,
        is_main_process: bool = True,
        log_every: int = 1,
        wandb_config=None,
        run_name: str = "run",
        config_dict: dict | None = None,
    ):
        self.enabled = is_main_process and run_dir is not None
        self.log_every = log_every
        self._schedule: tuple[int, int, float, float | None] | None = None
        self._jsonl = None
        self._wandb = None
        if not self.enabled:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        # Held open for the run (closed in close()): one line per step, line-buffered.
        self._jsonl = open(self.path, "a", buffering=1)  # noqa: SIM115
        if wandb_config is not None and wandb_config.enabled:
            self._wandb = _start_wandb(wandb_config, run_dir, run_name, config_dict)

    def log(self, metrics: dict[str, Any], step: int, *, console: bool = True) -> None:
        """Write `metrics` for `step` (metrics.jsonl, wandb) and, with `console`, a console line."""
        if not self.enabled:
            return
        kept, dropped = finite_metrics(metrics)
        if dropped:
            log.warning("step %d: dropped non-finite metrics: %s", step, ", ".join(sorted(dropped)))
        self._jsonl.write(json.dumps({"step": step, "time": time.time(), **kept}) + "\n")
        if self._wandb is not None:
            try:
                self._wandb.log(kept, step=step)
            except Exception as exc:  # noqa: BLE001 - wandb must never stop a run
                log.warning("wandb log failed (%s); continuing without it", exc)
                self._wandb = None
        if console and (step % self.log_every == 0 or any(k.startswith("eval/") for k in kept)):
            if self._schedule is not None and "time/step_s" in kept:
                total, first, since, deadline = self._schedule
                eta = eta_seconds(step, total, first, since, time.time(), deadline)
                log.info("step %d/%d | %s | eta %s", step, total, format_console(kept), duration(eta))
            else:
                log.info("step %d | %s", step, format_console(kept))

    def schedule(self, total_steps: int, first_step: int, deadline: float | None = None) -> None:
        """From now on a training step's console line says `step i/total` and an ETA: the mean
        step time since this call times the steps left, capped by `deadline` (the wall-clock
        time after which no step starts, `train.max_minutes`)."""
        self._schedule = (total_steps, first_step, time.time(), deadline)

    def truncate_after(self, step: int) -> int:
        """Drop the metrics.jsonl rows of steps after `step`, the checkpoint this run resumes
        from (a killed run wrote them; this run writes them again), and any line torn by the
        kill; returns how many rows went. wandb keeps what it was sent."""
        if self._jsonl is None:
            return 0
        self._jsonl.close()
        kept, dropped = [], 0
        for line in self.path.read_text().splitlines():
            try:
                row_step = int(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):
                dropped += 1  # a line torn by the kill
                continue
            if row_step > step:
                dropped += 1
            else:
                kept.append(line + "\n")
        if dropped:
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(kept))
            tmp.replace(self.path)  # atomic: a second kill leaves one file or the other
            log.info("metrics.jsonl: dropped %d row(s) written after step %d, the checkpoint "
                     "this run resumes from", dropped, step)
        self._jsonl = open(self.path, "a", buffering=1)  # noqa: SIM115
        return dropped

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._wandb is not None:
            try:
                self._wandb.finish()
            except Exception as exc:  # noqa: BLE001 - wandb must never stop a run
                log.warning("wandb finish failed (%s)", exc)
            self._wandb = None


def eta_seconds(step: int, total: int, first: int, since: float, now: float, deadline: float | None) -> float:
    """Seconds until the last step ends: steps left x the mean step since `since` (when step
    `first` began), no later than `deadline` allows."""
    done = max(step - first, 1)
    left = (now - since) / done * max(total - step, 0)
    return min(left, max(deadline - now, 0.0)) if deadline is not None else left


def duration(seconds: float) -> str:
    """`45s`, `12m05s`, `3h07m`."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def format_console(metrics: dict[str, float]) -> str:
    parts = [f"{short} {metrics[key]:.4g}" for key, short in _CONSOLE_KEYS if key in metrics]
    parts += [f"{k} {v:.4g}" for k, v in metrics.items() if k.startswith("eval/")]
    return " | ".join(parts) or "(no metrics)"


def _start_wandb(wandb_config, run_dir: Path, run_name: str, config_dict: dict | None):
    try:
        import wandb
    except ImportError:
        log.warning("logging.wandb.enabled but wandb is not installed; continuing without it")
        return None
    mode = wandb_config.mode
    if mode == "auto":
        mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
    try:
        return wandb.init(
            project=wandb_config.project,
            entity=wandb_config.entity,
            name=run_name,
            dir=str(run_dir),
            mode=mode,
            config=config_dict,
        )
    except Exception as exc:  # noqa: BLE001 - wandb must never stop a run
        log.warning("wandb.init failed (%s); continuing without wandb", exc)
        return None


def setup_console_logging(run_dir: Path | None = None, level: int = logging.INFO) -> None:
    """Console + `training.log` in the run directory, one format for both, secrets masked
    (tools/secrets.py)."""
    fmt = MaskingFormatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S")
    root = logging.getLogger("mcp_grpo")
    root.setLevel(level)
    root.propagate = False
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    console = logging.StreamHandler()
    console.setFormatter(fmt)
    root.addHandler(console)
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        file_handler = logging.FileHandler(run_dir / "training.log")
        file_handler.setFormatter(fmt)
        root.addHandler(file_handler)


def close_run_logging(run_dir: Path) -> None:
    """Detach and close the handlers writing into `run_dir` (its `training.log`): a run's file
    must not outlive it, or the next log line of the process goes to a directory that may be gone."""
    root = logging.getLogger("mcp_grpo")
    path = os.path.abspath(run_dir / "training.log")  # as FileHandler names its file (no symlinks resolved)
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler) and handler.baseFilename == path:
            root.removeHandler(handler)
            handler.close()

"""The run's evaluations, as part of GRPOTrainer: the held-out tasks and then each of
`data.evaluation_sets` at a tag (`before`, `warmup`, `step<N>`, `after`), transcripts under
`eval/`, one logged row.

`RunEvaluations` is mixed into GRPOTrainer (grpo/train/trainer.py) and uses its collector, tasks,
logger and the data-parallel hooks (`_local_share`, `_reduce_metrics`).
"""

from __future__ import annotations

import logging
import time

from grpo.models.devices import release_free_memory
from grpo.train.evaluation import evaluate, set_metrics

log = logging.getLogger("mcp_grpo")


class RunEvaluations:
    async def _evaluate(self, tag: str) -> dict[str, float]:
        """The held-out tasks (transcripts eval/<tag>.jsonl), then each further evaluation set
        (eval/<tag>.<name>.jsonl, figures under `eval/set=<name>/`), logged as one row."""
        cfg = self.config
        held_out = self.val_tasks[: cfg.train.eval_tasks] if cfg.train.eval_tasks else self.val_tasks
        metrics = await self._play_evaluation(held_out, tag)
        log.info("eval %s: success %.1f%% on %d held-out tasks (%.0f s)", tag,
                 100 * metrics["eval/success_rate"], len(held_out), metrics["eval/seconds"])
        for name, tasks in self.eval_sets.items():
            figures = await self._play_evaluation(tasks, f"{tag}.{name}")
            log.info("eval %s: success %.1f%% on %d tasks of the set %s (%.0f s)", tag,
                     100 * figures["eval/success_rate"], len(tasks), name, figures["eval/seconds"])
            metrics.update(set_metrics(figures, name))
        self.logger.log(metrics, self.step)
        return metrics

    async def _play_evaluation(self, all_tasks: list, transcripts: str) -> dict[str, float]:
        """One evaluation of `all_tasks` (this process plays its share): the run's figures, each
        set reduced over the ranks with its own weight."""
        cfg = self.config
        tasks = self._local_share(all_tasks)
        t0 = time.time()
        metrics: dict[str, float] = {}
        # evaluate() rejects an empty held-out set; with data parallelism one rank may get no share.
        if tasks or not all_tasks:
            # Transcripts come from the main process only (with data parallelism: its share).
            path = self.run_dir / "eval" / f"{transcripts}.jsonl" if self.is_main_process else None
            metrics = await evaluate(
                self.collector, tasks, k=1, temperature=cfg.rollout.eval_temperature, seed=cfg.seed,
                transcripts_path=path,
            )
        metrics["eval/seconds"] = time.time() - t0
        release_free_memory()
        return self._reduce_metrics(metrics, weight=float(len(tasks)))

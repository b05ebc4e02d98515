"""GRPOTrainer around the update (issue 14): a skipped non-finite update is skipped whole (no EMA
step, no weight push), and a resumed run does not log the steps after its checkpoint twice.
Both run the smoke config (tiny model, the real calculator server)."""

from __future__ import annotations

import json
import shutil

import grpo.train.trainer as trainer_module
from grpo.algorithm.update import NonFiniteLossError
from grpo.config import load_config
from grpo.train.trainer import GRPOTrainer

QUIET = ["train.save_final_model=false", "train.eval_before=false", "train.eval_after=false"]


def _rows(config) -> list[dict]:
    return [json.loads(line) for line in (config.run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_non_finite_update_runs_no_ema_step_and_pushes_no_weights(tmp_path, monkeypatch):
    config = load_config("configs/smoke.yaml", [f"output_dir={tmp_path}", "train.steps=2", "train.save_every=0",
                                                *QUIET])
    calls = {"train_step": 0, "after_update": []}
    real_train_step, real_after_update = trainer_module.train_step, GRPOTrainer._after_update

    def first_step_is_non_finite(*args, **kwargs):
        calls["train_step"] += 1
        if calls["train_step"] == 1:
            raise NonFiniteLossError("non-finite loss nan")
        return real_train_step(*args, **kwargs)

    def after_update(self):
        calls["after_update"].append(self.step)
        real_after_update(self)

    monkeypatch.setattr(trainer_module, "train_step", first_step_is_non_finite)
    monkeypatch.setattr(GRPOTrainer, "_after_update", after_update)
    summary = GRPOTrainer(config).run()
    assert summary["steps"] == 2
    assert calls["after_update"] == [2]  # step 1 was skipped: no EMA step (update_every 1), no push
    rows = [row for row in _rows(config) if "train/lr" in row]
    assert rows[0]["train/skipped_nonfinite"] == 1.0 and "train/skipped_nonfinite" not in rows[1]


def test_resume_after_a_kill_logs_each_step_once(tmp_path):
    """Killed after step 3 was logged but before its checkpoint (step 2 is the newest): the
    resumed run repeats step 3, and metrics.jsonl holds it once, from the resumed run."""
    overrides = [f"output_dir={tmp_path}", "train.steps=3", "train.save_every=2", *QUIET]
    first = load_config("configs/smoke.yaml", overrides)
    GRPOTrainer(first).run()
    shutil.rmtree(first.run_dir / "checkpoints" / "step-000003")  # what the kill would have lost
    killed_rows = _rows(first)
    assert [row["step"] for row in killed_rows] == [1, 2, 3]
    resumed = load_config("configs/smoke.yaml", [*overrides, "train.resume=auto"])
    assert GRPOTrainer(resumed).run()["steps"] == 3
    rows = _rows(resumed)
    assert [row["step"] for row in rows] == [1, 2, 3]  # was [1, 2, 3, 3]
    assert rows[:2] == killed_rows[:2] and rows[2]["time"] > killed_rows[2]["time"]

import json
import logging

from grpo.train.logger import MetricsLogger, duration, eta_seconds, finite_metrics, format_console


def test_non_finite_and_non_numeric_values_are_dropped():
    kept, dropped = finite_metrics({"a": 1, "b": float("nan"), "c": float("inf"), "d": "x", "e": 2.5})
    assert kept == {"a": 1.0, "e": 2.5}
    assert sorted(dropped) == ["b", "c", "d"]


def test_logger_writes_jsonl_and_warns_on_dropped(tmp_path, caplog):
    logger = MetricsLogger(tmp_path, log_every=1)
    with caplog.at_level(logging.WARNING, logger="mcp_grpo"):
        logger.log({"train/loss": 0.5, "train/kl_ref": float("nan")}, step=3)
    logger.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["step"] == 3 and rows[0]["train/loss"] == 0.5
    assert "train/kl_ref" not in rows[0]
    assert "dropped non-finite metrics: train/kl_ref" in caplog.text


def test_non_main_process_writes_nothing(tmp_path):
    logger = MetricsLogger(tmp_path / "rank1", is_main_process=False)
    logger.log({"train/loss": 1.0}, step=1)
    logger.close()
    assert not (tmp_path / "rank1").exists()


def test_console_line_orders_known_keys():
    assert format_console({"train/loss": 0.25, "rollout/reward_mean": 0.5}) == "reward 0.5 | loss 0.25"


def test_resume_truncates_rows_written_after_the_checkpoint(tmp_path):
    """A run killed at step 113 after a checkpoint at 111 wrote rows 112 and 113 (and maybe a torn
    line); resuming from 111 drops them, so the resumed run's 112 and 113 are the only ones."""
    logger = MetricsLogger(tmp_path)
    for step in (0, 110, 111, 112, 113):
        logger.log({"train/loss": float(step)}, step=step)
    logger.close()
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 114, "train/lo')  # the kill tore the last line
    resumed = MetricsLogger(tmp_path)
    assert resumed.truncate_after(111) == 3
    for step in (112, 113):
        resumed.log({"train/loss": -float(step)}, step=step)
    resumed.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 110, 111, 112, 113]
    assert [row["train/loss"] for row in rows[-2:]] == [-112.0, -113.0]
    assert MetricsLogger(tmp_path, is_main_process=False).truncate_after(0) == 0  # other ranks: no-op


def test_eta_is_the_mean_step_times_the_steps_left_capped_by_the_deadline():
    # Resumed at step 10 of 50 at t=100; step 14 ends at t=180: 20 s a step, 36 steps left.
    assert eta_seconds(14, 50, 10, since=100.0, now=180.0, deadline=None) == 720.0
    assert eta_seconds(14, 50, 10, since=100.0, now=180.0, deadline=480.0) == 300.0
    assert eta_seconds(14, 50, 10, since=100.0, now=180.0, deadline=150.0) == 0.0
    assert eta_seconds(50, 50, 10, since=100.0, now=900.0, deadline=None) == 0.0
    assert [duration(s) for s in (44.6, 60, 725, 3600, 11_240)] == ["45s", "1m00s", "12m05s", "1h00m", "3h07m"]


def test_a_scheduled_step_line_says_how_far_and_how_long(tmp_path, caplog):
    logger = MetricsLogger(tmp_path)
    logger.schedule(total_steps=200, first_step=0)
    with caplog.at_level(logging.INFO, logger="mcp_grpo"):
        logger.log({"train/loss": 0.5, "time/step_s": 1.0}, step=3)
        logger.log({"eval/success_rate": 0.5}, step=3)
    logger.close()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("step 3/200 | loss 0.5 | step_s 1 | eta ")
    assert lines[1] == "step 3 | eval/success_rate 0.5"  # an evaluation row is no step: no schedule

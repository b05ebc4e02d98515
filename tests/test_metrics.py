import json
import logging

from grpo.train.logger import MetricsLogger, finite_metrics, format_console


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

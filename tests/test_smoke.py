"""`make smoke` as a test: the tiny model trains 2 steps against the real calculator server,
weights change, losses are finite, and a resumed run continues from the checkpoint."""

import json
from pathlib import Path

from launch.smoke import run_smoke


def test_smoke_end_to_end_with_resume(tmp_path):
    assert run_smoke("configs/smoke.yaml", str(tmp_path), []) == []
    run_dir = tmp_path / "smoke"
    assert (run_dir / "summary.json").is_file() and (run_dir / "curves.png").is_file()
    assert (run_dir / "final_model" / "config.json").is_file()
    assert (run_dir / "config.yaml").read_text().startswith("run_name: smoke")
    if Path("/proc/self/statm").is_file():  # every training step says how much memory the run holds
        steps = [row for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
                 if "time/step_s" in row]
        assert steps and all(row["memory/rss_mib_max"] > 100 for row in steps)

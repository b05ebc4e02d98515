"""`make smoke` as a test: the tiny model trains 2 steps against the real calculator server,
weights change, losses are finite, and a resumed run continues from the checkpoint; its run
report opens in headless Chromium with every view populated."""

import json
import re
from pathlib import Path

import pytest
from browser import console_errors, needs_chromium, page_dom, screenshot

from launch.smoke import run_smoke


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("smoke")
    # Held-out evaluations before and after, so the report has episodes to compare.
    assert run_smoke("configs/smoke.yaml", str(out), ["train.eval_before=true", "train.eval_after=true"]) == []
    return out / "smoke"


def test_smoke_end_to_end_with_resume(smoke_run):
    run_dir = smoke_run
    assert (run_dir / "summary.json").is_file() and (run_dir / "curves.png").is_file()
    assert (run_dir / "final_model" / "config.json").is_file()
    assert (run_dir / "config.yaml").read_text().startswith("run_name: smoke")
    if Path("/proc/self/statm").is_file():  # every training step says how much memory the run holds
        steps = [row for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
                 if "time/step_s" in row]
        assert steps and all(row["memory/rss_mib_max"] > 100 for row in steps)


def test_the_run_keeps_a_token_sample_per_step_that_matches_its_trajectory(smoke_run):
    samples = [json.loads(line) for line in (smoke_run / "samples" / "tokens.jsonl").read_text().splitlines()]
    steps = [row["step"] for row in map(json.loads, (smoke_run / "metrics.jsonl").read_text().splitlines())
             if "time/step_s" in row]
    assert [s["step"] for s in samples] == steps
    for sample in samples:
        tokens = sample["tokens"]
        assert len(tokens) == sample["num_tokens"] - sample["cut_tokens"]
        assert all(t[1] == 0 for t in tokens[:sample["prompt_length"]])  # the prompt is never trained
        trained = [t for t in tokens if t[1]]
        assert trained and all(t[3] is not None and t[4] is not None for t in trained)
        # Engine and trainer agree on the sampled tokens (the step-0 gate holds them to 0.05).
        assert sum(abs(t[3] - t[4]) for t in trained) / len(trained) < 0.05
        assert all(t[2] == 0.0 for t in tokens if not t[1])


@needs_chromium
def test_the_report_of_the_run_opens_with_every_view_populated(smoke_run, tmp_path):
    path = smoke_run / "report.html"
    assert path.is_file()
    for fragment, present in (("", r'<table id="stages">'), ("tab=curves", r"<polyline"),
                              ("tab=tools", r'<table id="tool-health">.*?<td>calculator\.calculate</td>'),
                              ("tab=episodes", r'class="item[^"]*" data-task="'),
                              ("tab=tokens", r'class="tok turn"')):
        dom, log = page_dom(path, fragment)
        assert 'data-ready="1"' in dom and "data-errors" not in dom and not console_errors(log), fragment
        assert re.search(present, dom, re.DOTALL), fragment
    shot = screenshot(path, "tab=tokens", tmp_path / "tokens.png")
    assert shot.stat().st_size > 10_000

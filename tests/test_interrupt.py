"""Ctrl-C: every launch entry point stops with one line and exit status 130, never a traceback;
an interrupted training run keeps its metrics and checkpoints the last step it finished. Real
subprocesses, sent SIGINT the way a terminal does (to the whole process group, servers included)."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo.train.checkpoint import list_checkpoints, load_checkpoint
from grpo.train.task_stream import TaskStream

REPO = Path(__file__).resolve().parents[1]
LAUNCH = sorted(p.stem for p in (REPO / "launch").glob("*.py") if 'if __name__ == "__main__"' in p.read_text())


def start(tmp_path: Path, module: str, *args: str) -> tuple[subprocess.Popen, Path, Path]:
    out, err = tmp_path / f"{module}.out", tmp_path / f"{module}.err"
    # A test run started in the background by a non-interactive shell inherits SIGINT ignored,
    # and so would the child (Python then never raises KeyboardInterrupt): the child starts with
    # the disposition a terminal gives.
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        proc = subprocess.Popen([sys.executable, "-u", "-m", f"launch.{module}", *args], cwd=REPO,
                                stdout=out.open("w"), stderr=err.open("w"), start_new_session=True)
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    return proc, out, err


def interrupt_when(proc: subprocess.Popen, ready, timeout: float = 240.0) -> int:
    """Ctrl-C (SIGINT to the process group) once `ready()` holds; the exit status."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"exited with {proc.returncode} before it was interrupted"
        assert time.monotonic() < deadline, "never got ready"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        return proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_every_launch_entry_point_stops_cleanly_on_ctrl_c():
    # The wrapper is what the subprocess tests below exercise on two of them.
    assert len(LAUNCH) >= 6, LAUNCH
    for name in LAUNCH:
        main = importlib.import_module(f"launch.{name}").main
        assert getattr(main, "stops_cleanly_on_interrupt", False), f"launch.{name}.main"


@pytest.mark.slow
def test_ctrl_c_gives_one_line_and_status_130(tmp_path):
    # validate_setup stands for the entry points without a trainer (evaluate, generate_tasks, smoke
    # run the same wrapper); training, below, is the one with something to keep.
    proc, out, err = start(tmp_path, "validate_setup", "--config", "configs/smoke.yaml")
    rc = interrupt_when(proc, lambda: "[ok] package torch" in out.read_text())
    text = err.read_text()
    assert rc == 130, text
    assert text.splitlines()[-1] == "interrupted (Ctrl-C)"
    assert "Traceback" not in text + out.read_text()


@pytest.mark.slow
def test_an_interrupted_run_keeps_its_metrics_and_checkpoints_its_last_step(tmp_path):
    proc, _, err = start(tmp_path, "train", "--config", "configs/smoke.yaml", f"output_dir={tmp_path}",
                         "train.steps=500", "train.save_every=0")
    metrics = tmp_path / "smoke" / "metrics.jsonl"
    rc = interrupt_when(proc, lambda: metrics.is_file() and metrics.read_text().count("\n") >= 2)
    text = err.read_text()
    assert rc == 130, text
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = len(rows)
    assert [row["step"] for row in rows] == list(range(1, steps + 1))
    checkpoint = tmp_path / "smoke" / "checkpoints" / f"step-{steps:06d}"
    assert list_checkpoints(tmp_path / "smoke") == [checkpoint]
    assert text.splitlines()[-1] == (f"interrupted (Ctrl-C) at step {steps} of 500: checkpoint {checkpoint}; "
                                     "resume with train.resume=auto")
    assert "Traceback" not in text
    state = load_checkpoint(checkpoint)
    assert state["step"] == steps and len(state["history"]) == steps
    # The data position is the one after `steps` batches: the interrupted step's batch is served again.
    stream = TaskStream(list(range(16)), batch_size=2, seed=0)
    for _ in range(steps):
        stream.next_batch()
    assert state["data"] == stream.state_dict()

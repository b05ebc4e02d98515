"""Atomic training checkpoints: everything needed to resume a run exactly where it stopped.

A checkpoint is a directory `checkpoints/step-000010/` holding `trainer_state.pt` (policy or
adapter + value head, EMA reference, optimizer, scheduler, RNG states, data position, step).
It is written into a temporary sibling and renamed into place, so a crash mid-write never
leaves a checkpoint that looks complete. Only the newest `keep` checkpoints are kept.
A data-parallel run (launch/distributed.py) writes the same directory with the policy and
optimizer in `accelerate/` (every rank's share, `save_sharded_checkpoint`) instead.
"""

from __future__ import annotations

import random
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

_STEP_DIR = re.compile(r"^step-(\d+)$")
STATE_FILE = "trainer_state.pt"
SHARDS_DIR = "accelerate"
"""Data-parallel checkpoints: the per-rank model/optimizer state (accelerate's save_state)."""


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / STATE_FILE).is_file():
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def save_checkpoint(run_dir: Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write `state` (plus RNG states) as checkpoint `step` atomically; prune all but `keep`."""
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step-{step:06d}-", dir=root))
    try:
        torch.save({**state, "step": step, "rng": rng_state()}, tmp / STATE_FILE)
        if final.exists():  # re-saving a step (e.g. after resume) replaces it whole
            shutil.rmtree(final)
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def save_sharded_checkpoint(
    run_dir: Path,
    step: int,
    state: dict[str, Any],
    save_shards: Callable[[Path], None],
    *,
    is_main_process: bool,
    barrier: Callable[[], None],
    keep: int = 2,
) -> Path:
    """A checkpoint that every rank writes part of (data parallelism), made atomic like
    `save_checkpoint`: every rank calls this together.

    All ranks write their shards with `save_shards(dir)` (e.g. accelerate's `save_state`: ZeRO-3
    optimizer partitions are per rank) into `step-N/accelerate/` of a temporary sibling
    `.step-N.partial` (one fixed name, so every rank finds it on a shared file system); then the
    main process adds `trainer_state.pt` (`state` + step + its RNG state) and renames the
    directory into place. A crash before the rename leaves only the `.partial` directory, which
    `list_checkpoints` ignores and the next save of that step replaces.
    """
    root = checkpoints_dir(run_dir)
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.partial"
    if is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    barrier()
    save_shards(tmp / SHARDS_DIR)
    barrier()
    if is_main_process:
        torch.save({**state, "step": step, "rng": rng_state()}, tmp / STATE_FILE)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        for old in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    barrier()
    return final


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint directory (or its state file). Restores nothing by itself."""
    path = Path(path)
    state_file = path / STATE_FILE if path.is_dir() else path
    if not state_file.is_file():
        raise FileNotFoundError(f"no checkpoint at {path} (expected {STATE_FILE})")
    return torch.load(state_file, map_location="cpu", weights_only=False)


def resolve_resume(resume: str | None, run_dir: Path) -> Path | None:
    """`auto` -> newest checkpoint of the run (None if there is none); a path -> that path."""
    if resume is None:
        return None
    if resume == "auto":
        return latest_checkpoint(run_dir)
    path = Path(resume)
    if not path.exists():
        raise FileNotFoundError(f"train.resume={resume!r}: no such checkpoint")
    return path

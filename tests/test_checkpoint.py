import random

import torch

from grpo.train.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    resolve_resume,
    save_checkpoint,
)


def test_save_is_atomic_prunes_and_restores_rng(tmp_path):
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, {"weights": torch.full((2,), float(step))}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000002", "step-000003"]
    assert latest_checkpoint(tmp_path).name == "step-000003"
    # No temporary directories are left behind.
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-000002", "step-000003"]
    state = load_checkpoint(latest_checkpoint(tmp_path))
    assert state["step"] == 3
    assert torch.equal(state["weights"], torch.tensor([3.0, 3.0]))


def test_rng_state_round_trip(tmp_path):
    random.seed(5)
    torch.manual_seed(5)
    path = save_checkpoint(tmp_path, 7, {})
    expected = (random.random(), torch.rand(3))
    from grpo.train.checkpoint import restore_rng_state

    restore_rng_state(load_checkpoint(path)["rng"])
    assert random.random() == expected[0]
    assert torch.equal(torch.rand(3), expected[1])


def test_incomplete_checkpoint_is_ignored_and_resume_resolves(tmp_path):
    (tmp_path / "checkpoints" / "step-000009").mkdir(parents=True)  # no state file: incomplete
    assert latest_checkpoint(tmp_path) is None
    assert resolve_resume("auto", tmp_path) is None
    assert resolve_resume(None, tmp_path) is None
    path = save_checkpoint(tmp_path, 4, {})
    assert resolve_resume("auto", tmp_path) == path
    try:
        resolve_resume(str(tmp_path / "missing"), tmp_path)
    except FileNotFoundError as exc:
        assert "no such checkpoint" in str(exc)
    else:
        raise AssertionError("a missing resume path must raise")

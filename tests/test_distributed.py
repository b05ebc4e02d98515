"""Data-parallel training under `accelerate launch`, 2 CPU processes: plain DDP and DeepSpeed
ZeRO-3 (over gloo). Each case trains the tiny model 2 steps against the real calculator server,
then resumes to step 3; the ranks must end with identical parameters, rank 0 alone writes the
logs and the final model, and the resumed run must start from exactly the saved weights (with
ZeRO-3 it must also end where an uninterrupted 3-step run ends). The
gradient check compares one fixed batch split over the 2 ranks (unequal token counts) with the
single-process gradient.

The first ZeRO-3 run on a machine JIT-compiles DeepSpeed's shared-memory CPU collective (about a
minute; cached in ~/.cache/torch_extensions afterwards).
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
# Two steps of the smoke run, one thread per process (2 processes share the CPU).
FAST = ["train.steps=2", "threads=1"]

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch_args(kind: str) -> list[str]:
    port = ["--main_process_port", str(_free_port())]
    if kind == "zero3":
        if not HAS_DEEPSPEED:
            pytest.skip("deepspeed is not installed (make install installs it)")
        return ["--config_file", "configs/accelerate_zero3_cpu.yaml", *port]
    # No CUDA here: distributed.py trains these torchrun-started processes on the CPU over gloo.
    return ["--multi_gpu", "--num_processes", "2", *port]


def _launch(kind: str, *script_args: str, timeout: int = 420) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *_launch_args(kind),
           "launch/distributed.py", "--config", "configs/smoke.yaml", *script_args]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(cmd, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result


def _reports(directory: Path) -> list[dict]:
    return [json.loads((directory / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("kind", ["ddp", "zero3"])
def test_two_steps_identical_ranks_rank0_io_and_resume(tmp_path, kind):
    _launch(kind, f"output_dir={tmp_path}", *FAST, "--rank-report", str(tmp_path / "first"))
    first = _reports(tmp_path / "first")
    assert [r["steps"] for r in first] == [2, 2]
    assert all(r["world_size"] == 2 and r["deepspeed"] == (kind == "zero3") for r in first)
    assert first[0]["param_sha256"] == first[1]["param_sha256"]  # gathered weights agree
    assert first[0]["param_sha256"] != first[0]["start_param_sha256"]  # and they trained

    run_dir = tmp_path / "smoke"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]  # one writer: rank 0
    assert all(row["train/num_sequences"] == 4.0 for row in rows)  # 2 tasks x G=2, over 2 ranks
    checkpoint = run_dir / "checkpoints" / "step-000002"
    assert (checkpoint / "trainer_state.pt").is_file() and (checkpoint / "accelerate").is_dir()
    if kind == "zero3":  # every rank wrote its own optimizer partition
        assert len(list(checkpoint.rglob("*zero_pp_rank_*optim_states.pt"))) == 2

    # The final model holds the full (gathered) weights, not ZeRO-3's empty partitions.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run_dir / "final_model")
    assert all(p.numel() > 0 for p in model.parameters())

    _launch(kind, f"output_dir={tmp_path}", *FAST, "train.steps=3", "train.resume=auto",
            "--rank-report", str(tmp_path / "resumed"))
    resumed = _reports(tmp_path / "resumed")
    assert [r["start_step"] for r in resumed] == [2, 2]
    assert all(r["start_param_sha256"] == first[0]["param_sha256"] for r in resumed)
    assert [r["steps"] for r in resumed] == [3, 3]
    assert resumed[0]["param_sha256"] == resumed[1]["param_sha256"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    if kind == "zero3":
        # Optimizer partitions, EMA reference, data position and every rank's RNG came back:
        # 2 steps + resume + 1 step equals 3 uninterrupted steps, bit for bit.
        _launch(kind, f"output_dir={tmp_path / 'straight'}", *FAST, "train.steps=3",
                "--rank-report", str(tmp_path / "straight_report"))
        straight = _reports(tmp_path / "straight_report")
        assert straight[0]["param_sha256"] == resumed[0]["param_sha256"]


@pytest.mark.parametrize("kind", ["ddp", "zero3"])
def test_split_batch_gradient_equals_single_process_gradient(tmp_path, kind):
    """Under the default algorithm config (the smoke file's entropy bonus removed: KL in the loss,
    zero-advantage skipping on, behaviour correction on), with a reference that differs from the
    policy and zero-variance groups in the batch: one process (`launch.train`'s settings) and two
    ranks (which never skip) compute the same gradient, i.e. optimise the same objective."""
    out = tmp_path / "check.json"
    _launch(kind, f"output_dir={tmp_path}", "threads=1", "algorithm.loss.entropy_coef=0",
            "--check-gradients", str(out))
    result = json.loads(out.read_text())
    # The ranks hold different numbers of loss tokens: a per-rank token mean would fail this.
    assert result["loss_tokens_per_rank"][0] != result["loss_tokens_per_rank"][1]
    # Half the groups have zero advantage; with the KL in the loss they keep their KL gradient.
    assert result["zero_variance_groups"] == 0.5 and result["single_process_skipped_sequences"] == 0.0
    assert result["tensors_compared"] >= 20
    assert result["max_abs_diff"] <= 1e-5 * result["max_abs_grad"], result
    assert result["ok"]


def _run_distributed_alone(env: dict[str, str]) -> subprocess.CompletedProcess:
    """launch/distributed.py on the smoke config as one plain process with environment `env`."""
    return subprocess.run(
        [sys.executable, "launch/distributed.py", "--config", "configs/smoke.yaml"],
        check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )


def test_running_without_accelerate_launch_is_a_clear_error():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ACCELERATE_") and k not in ("LOCAL_RANK", "WORLD_SIZE", "RANK")}
    result = _run_distributed_alone(env)
    assert result.returncode == 2
    assert "must be started by `accelerate launch`" in result.stderr


def test_accelerate_cpu_flag_single_process_is_a_clear_error():
    """`accelerate launch --cpu --num_processes 2` starts one process (accelerate needs mpirun
    for several CPU processes): say so instead of silently training alone."""
    env = {**os.environ, "ACCELERATE_USE_CPU": "True"}
    env.pop("WORLD_SIZE", None)
    result = _run_distributed_alone(env)
    assert result.returncode == 2
    assert "--multi_gpu --num_processes 2" in result.stderr


# ------------------------------------------------------------------ pieces, in one process
def test_combine_metrics_sums_counts_maximises_maxima_and_weights_means():
    from grpo.distributed.parallel import combine_metrics

    rank0 = ({"eval/success_rate": 1.0, "eval/num_tasks": 1.0, "train/logprob_mismatch_max": 0.1,
              "rollout/episodes_per_s": 2.0, "only/rank0": 5.0}, 1.0)
    rank1 = ({"eval/success_rate": 0.25, "eval/num_tasks": 3.0, "train/logprob_mismatch_max": 0.3,
              "rollout/episodes_per_s": 3.0}, 3.0)
    out = combine_metrics([rank0, rank1])
    assert out["eval/success_rate"] == pytest.approx((1.0 * 1 + 0.25 * 3) / 4)  # per task
    assert out["eval/num_tasks"] == 4.0
    assert out["train/logprob_mismatch_max"] == 0.3
    assert out["rollout/episodes_per_s"] == 5.0
    assert out["only/rank0"] == 5.0


def test_scale_grad_scales_only_the_gradient():
    import torch

    from grpo.distributed.parallel import scale_grad

    x = torch.tensor([1.0, -2.0], requires_grad=True)
    y = scale_grad(x * 3, 0.5)
    assert torch.equal(y.detach(), torch.tensor([3.0, -6.0]))  # forward untouched
    y.sum().backward()
    assert torch.equal(x.grad, torch.tensor([1.5, 1.5]))  # d(3x)/dx = 3, times 0.5


def test_single_process_collectives_are_identities():
    from grpo.distributed.gradient_check import synthetic_groups
    from grpo.distributed.parallel import balance_groups, local_denominator_scale

    batch = synthetic_groups(num_groups=3, group_size=2)
    assert local_denominator_scale(batch, "token_mean") == 1.0
    assert balance_groups(batch) == (batch, 0)


@pytest.mark.parametrize("name, value", [("micro_batch_tokens", 4096), ("micro_batch_overhead_tokens", 0)])
def test_length_dependent_micro_batch_cuts_are_refused(name, value):
    """Cuts that depend on a rank's own sequence lengths could give ranks different numbers of
    forwards, each with collectives: a hang. The run refuses them before starting."""
    from types import SimpleNamespace

    from grpo.config import load_config
    from grpo.distributed.trainer import DistributedGRPOTrainer

    config = load_config(REPO / "configs/smoke.yaml", [f"algorithm.optimizer.{name}={value}"])
    trainer = SimpleNamespace(config=config, world_size=2, uses_deepspeed=False)
    with pytest.raises(ValueError, match=rf"algorithm.optimizer.{name}={value} cuts micro-batches"):
        DistributedGRPOTrainer._check_config(trainer)
    DistributedGRPOTrainer._check_config(SimpleNamespace(config=load_config(REPO / "configs/smoke.yaml"),
                                                         world_size=2, uses_deepspeed=False))


def test_a_warm_start_under_deepspeed_is_refused():
    """The warm start's own AdamW steps the module outside DeepSpeed's engine, whose ZeRO hooks
    take the gradients: it would silently not train. Plain data parallelism keeps it."""
    from types import SimpleNamespace

    from grpo.config import load_config
    from grpo.distributed.trainer import DistributedGRPOTrainer

    config = load_config(REPO / "configs/smoke.yaml", ["train.warmup.steps=3"])
    with pytest.raises(ValueError, match=r"train.warmup.steps=3 with DeepSpeed: the warm start"):
        DistributedGRPOTrainer._check_config(
            SimpleNamespace(config=config, world_size=2, uses_deepspeed=True)
        )
    DistributedGRPOTrainer._check_config(SimpleNamespace(config=config, world_size=2, uses_deepspeed=False))


def test_fewest_calls_gives_every_rank_ceil_rows_over_size_micro_batches():
    from grpo.algorithm.batching import FEWEST_CALLS, micro_batch_rows

    # Two ranks' rows: equal counts, very different lengths. Cost-based cuts would differ
    # (the long rank would split off its longest row); counting calls first, both run 2.
    short = {i: 10 + i for i in range(6)}
    ragged = {i: 10 for i in range(5)} | {5: 5000}
    assert len(micro_batch_rows(ragged, list(ragged), size=4, overhead_tokens=256)) == 3
    for lengths in (short, ragged):
        assert len(micro_batch_rows(lengths, list(lengths), size=4, overhead_tokens=FEWEST_CALLS)) == 2

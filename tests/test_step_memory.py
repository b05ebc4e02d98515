"""A step's worst-case memory, estimated from the config before the run (grpo/train/step_memory.py):
exact terms for a small config; a GPU's 512-episode step fits an H200; absurd sizes stop the dry
run and the run's start naming the fields, the estimate and what is available; a run that runs
out of memory anyway stops with one line. The config's names cannot climb out of output_dir, and
a key given twice in YAML is an error naming the file, the key and the lines."""

from __future__ import annotations

import pytest
import torch

from grpo.config import ConfigError, RunConfig, load_config
from grpo.train import step_memory
from grpo.train.step_memory import (
    ModelShape,
    StepMemoryError,
    check_step_memory,
    estimate_step_memory,
)
from launch.train import main as train_main

GiB = 2**30
TINY = ModelShape(layers=2, hidden_size=64, kv_heads=2, head_dim=16, vocab_size=49152)
QWEN_7B = ModelShape(layers=28, hidden_size=3584, kv_heads=4, head_dim=128, vocab_size=152064)


@pytest.fixture
def host_has_16_gib(monkeypatch):
    monkeypatch.setattr(step_memory, "_host_available", lambda: 16 * GiB)


def test_the_terms_of_a_small_step_on_a_cpu():
    config = load_config("configs/smoke.yaml")  # 2 tasks x 2, 768 tokens, fp32, micro-batches of 4
    terms = estimate_step_memory(config, TINY, torch.device("cpu"), "hf")
    assert [(t.what, t.place, t.bytes) for t in terms] == [
        ("trajectories", "host", 2 * 2 * 768 * 100),
        ("KV cache of the rollout rows", "host", 4 * 768 * (2 * 2 * 2 * 16 * 4)),  # k and v, 2 layers
        ("log-prob chunks", "host", 512 * 49152 * (8 + 4)),  # fp32 logits and gradient, compute copy
    ]
    assert terms[1].formula == (
        "4 rows (the least of rollout.hf.max_batch_size 64, the step's 4 episodes, "
        "rollout.max_concurrent_episodes 64) x rollout.max_total_tokens 768 x 512 B (keys and values "
        "of 2 layers)")
    # vLLM keeps its own cache budget: no KV term for it here.
    assert [t.what for t in estimate_step_memory(config, TINY, torch.device("cpu"), "vllm")] == [
        "trajectories", "log-prob chunks"]


def test_async_rollouts_count_the_queue_and_the_round_beside_the_step():
    config = load_config("configs/smoke.yaml", ["train.async_rollouts.enabled=true",
                                                "train.async_rollouts.max_queue_groups=3"])
    term = estimate_step_memory(config, TINY, torch.device("cpu"), "hf")[0]
    assert (term.what, term.bytes) == ("trajectories", (2 + 3 + 2) * 2 * 768 * 100)
    assert term.formula == ("(train.tasks_per_step 2 + queue 3 + a round 2 of train.async_rollouts) x "
                            "algorithm.group_size 2 x rollout.max_total_tokens 768 x 100 B")


def test_a_gpus_512_episode_step_of_a_7b_model_fits_an_h200():
    config = RunConfig.model_validate({
        "device": "cuda", "model": {"dtype": "bfloat16"}, "algorithm": {"group_size": 8},
        "train": {"tasks_per_step": 64}, "rollout": {"max_total_tokens": 2048,
                                                     "max_concurrent_episodes": 512}})
    summary = check_step_memory(config, QWEN_7B, torch.device("cuda"), "hf",
                                available={"host": 64 * GiB, "device": 139 * GiB})
    # 512 rows x 2048 tokens x 57,344 B of keys and values = 56.0 GiB; the chunks 512 x 152,064 x 10 B = 0.7 GiB
    assert summary == "host 100.0 MiB of 64.0 GiB available; device 56.7 GiB of 139.0 GiB available"


def test_an_absurd_group_size_fails_the_estimate_naming_the_fields():
    config = RunConfig.model_validate({"algorithm": {"group_size": int(1e12)}, "model": {"dtype": "float32"}})
    with pytest.raises(StepMemoryError) as raised:
        check_step_memory(config, TINY, torch.device("cpu"), "hf", available={"host": 16 * GiB})
    assert str(raised.value) == (
        "one step needs up to 1455.2 PiB of host memory, 16.0 GiB available: trajectories "
        "1455.2 PiB = train.tasks_per_step 8 x algorithm.group_size 1,000,000,000,000 x "
        "rollout.max_total_tokens 2,048 x 100 B; log-prob chunks 288.0 MiB = 512 positions x "
        "vocabulary 49,152 x 12 B; KV cache of the rollout rows 64.0 MiB = 64 rows (the least of "
        "rollout.hf.max_batch_size 64, the step's 8,000,000,000,000 episodes, "
        "rollout.max_concurrent_episodes 64) x rollout.max_total_tokens 2,048 x 512 B (keys and "
        "values of 2 layers). Lower the fields named (the worst case: every episode at rollout.max_total_tokens)")


def test_the_dry_run_names_an_absurd_size_and_a_sane_one_passes(capsys, host_has_16_gib):
    rc = train_main(["--config", "configs/smoke.yaml", "rollout.max_total_tokens=1000000000000000000", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 1 and "setup OK" not in out
    (line,) = [line for line in out.splitlines() if "step memory" in line]
    assert line.startswith("  [FAIL] step memory: one step needs up to ")
    assert "of host memory, 16.0 GiB available: KV cache of the rollout rows " in line
    assert "rollout.max_total_tokens 1,000,000,000,000,000,000" in line
    # Concurrency alone does not make the step bigger: rows stop at the step's episodes.
    rc = train_main(["--config", "configs/smoke.yaml", "rollout.max_concurrent_episodes=1000000000", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "  [ok] step memory: host 289.8 MiB of 16.0 GiB available\n" in out


def test_the_run_stops_at_its_start_with_the_estimate_in_one_line(tmp_path, capsys, host_has_16_gib,
                                                                  quiet_run_logging):
    rc = train_main(["--config", "configs/smoke.yaml", f"output_dir={tmp_path}", "algorithm.group_size=1000000000000"])
    err = capsys.readouterr().err.splitlines()
    assert rc == 1
    assert err[-2].startswith("step memory: one step needs up to 136.4 PiB of host memory, 16.0 GiB "
                              "available: trajectories 136.4 PiB = train.tasks_per_step 2 x "
                              "algorithm.group_size 1,000,000,000,000 x rollout.max_total_tokens 768 x 100 B;")
    assert err[-1] == f"details: {tmp_path / 'smoke' / 'training.log'}"


def test_running_out_of_memory_anyway_stops_with_one_line(tmp_path, capsys, monkeypatch, quiet_run_logging):
    def out_of_memory(self):
        self.run_dir.mkdir(parents=True)
        raise MemoryError

    monkeypatch.setattr("launch.train.GRPOTrainer.run", out_of_memory)
    rc = train_main(["--config", "configs/smoke.yaml", f"output_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.splitlines() == [
        ("training stopped: out of memory; lower train.tasks_per_step, algorithm.group_size, "
        "rollout.max_total_tokens or algorithm.optimizer.micro_batch_size (`--dry-run` estimates a "
        "step's memory)"),
        f"details: {tmp_path / 'smoke' / 'training.log'}",
    ]
    assert "MemoryError" in (tmp_path / "smoke" / "training.log").read_text()


@pytest.mark.parametrize("name", ["..", ".", "../escape", "/tmp/abs", "a/b", "a\\b", ""])
def test_a_run_name_cannot_leave_output_dir(name):
    with pytest.raises(ConfigError) as raised:
        load_config(None, [f"run_name='{name}'"])
    assert f"run_name {name!r} " in str(raised.value)


def test_an_evaluation_name_cannot_leave_the_run_directory(capsys):
    from launch.evaluate import main as evaluate_main

    assert evaluate_main(["--config", "configs/smoke.yaml", "--name", "../../outside"]) == 2
    assert capsys.readouterr().err == ("evaluate: --name '../../outside' may hold only letters, digits, "
                                       "'.', '_', '-' (it names one directory or file, never a path)\n")


def test_a_key_given_twice_in_yaml_is_an_error_naming_the_file_the_key_and_the_lines(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("run_name: a\nalgorithm:\n  group_size: 4\n  advantage: {estimator: grpo}\n"
                    "  group_size: 8\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value) == (f"config file {path}: key 'group_size' appears twice in one mapping "
                                 "(lines 3 and 5); remove one")
    with pytest.raises(ConfigError, match=r"value is not valid YAML \(key 'estimator' appears twice"):
        load_config(None, ["algorithm.advantage={estimator: grpo, estimator: rloo}"])
    # A merge key overriding what it merged is not a duplicate.
    path.write_text("base: &b {group_size: 4}\nalgorithm:\n  <<: *b\n  group_size: 8\n")
    with pytest.raises(ConfigError, match="base: unknown key"):
        load_config(path)  # read without a duplicate error; `base` itself is no config key

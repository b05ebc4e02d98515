"""make bench's parts: the standard work's graded reward, the report's headline figures, and the
wiring of the standard step, of the continuous-batching comparison and of the segment-cost
measurement on the tiny model."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math

import pytest
import torch

from bench.continuous import measure, parse_args
from bench.generation import make_prompts, matmul_dtype
from bench.run import decode_matmul_ceiling, headline, main
from bench.segment_cost import column_cuts
from bench.segment_cost import measure as segment_cost
from bench.steps import closeness_reward, multi_turn_step, standard_step
from bench.update_prefixes import PLANS, batch_wide_segments, planned_by
from grpo.config import ConfigError
from grpo.forward.prefix_tree import PackedRows
from grpo.models.config import LoraConfig, ModelConfig
from grpo.models.devices import compute_dtype
from grpo.models.policy import PolicyWithValueHead


@pytest.mark.parametrize(
    ("text", "truth", "expected"),
    [
        ("224", 224, 1.0),
        ("The answer is 1,000.", 1000, 1.0),
        ("448 is it", 224, 1.0 / (1.0 + math.log(2.0))),
        ("112", 224, 1.0 / (1.0 + math.log(2.0))),  # half and double score alike
        ("no number here", 224, 0.0),
        ("-224", 224, 0.0),
        ("0", 224, 0.0),
        ("12 and then 224", 224, 1.0 / (1.0 + math.log(224 / 12))),  # the first number counts
    ],
)
def test_closeness_reward(text, truth, expected):
    assert closeness_reward(text, truth) == pytest.approx(expected, abs=1e-12)


def test_headline_fractions_of_the_peak_and_worst_tool_overhead():
    report = {
        "peak": {"fp32_gflops": 200.0, "bf16_gflops": 1000.0},
        "standard": {"standard_step_median_s": 5.0},
        "generation": {"parameters": 100_000_000, "b64_tokens_per_s": 500.0, "dtype": "bfloat16",
                       "b64_decode_matmul_ceiling_gflops": 250.0},
        "training": {"parameters": 100_000_000, "tokens_per_s": 400.0, "compute_dtype": "bfloat16"},
        "tools": {"c1": {"overhead_pct": 2.0}, "c32": {"overhead_pct": 7.5}},
        "multiturn": {"multi_turn_step_s": 40.0},
    }
    out = headline(report)
    assert out["standard_step_median_s"] == 5.0
    assert out["gen_fraction_of_peak"] == pytest.approx(500 * 2 * 1e8 / 1e12)  # 0.1 of bf16's
    assert out["gen_fraction_of_decode_matmul_ceiling"] == pytest.approx(500 * 2 * 1e8 / 2.5e11)  # 0.4
    assert out["train_fraction_of_peak"] == pytest.approx(400 * 6 * 1e8 / 1e12)  # 0.24
    assert (out["gen_dtype"], out["train_dtype"]) == ("bfloat16", "bfloat16")
    assert out["tool_overhead_fraction"] == 0.075
    assert out["multi_turn_step_s"] == 40.0
    assert headline({})["gen_fraction_of_peak"] is None  # sections that did not run


def test_headline_measures_fp32_work_against_the_fp32_peak():
    """A CPU without bf16 instructions generates and trains in fp32: its shares are of the fp32
    peak (the bf16 one is emulated there, slower than fp32, and a share of it can exceed 1)."""
    report = {
        "peak": {"fp32_gflops": 250.0, "bf16_gflops": 50.0},
        "generation": {"parameters": 100_000_000, "b64_tokens_per_s": 300.0, "dtype": "float32",
                       "b64_decode_matmul_ceiling_gflops": 150.0},
        "training": {"parameters": 100_000_000, "tokens_per_s": 100.0, "compute_dtype": "float32"},
    }
    out = headline(report)
    assert out["gen_fraction_of_peak"] == pytest.approx(300 * 2 * 1e8 / 2.5e11)  # 0.24, not 1.2
    assert out["gen_fraction_of_decode_matmul_ceiling"] == pytest.approx(300 * 2 * 1e8 / 1.5e11)  # 0.4
    assert out["train_fraction_of_peak"] == pytest.approx(100 * 6 * 1e8 / 2.5e11)  # 0.24
    assert (out["gen_dtype"], out["train_dtype"]) == ("float32", "float32")


def test_the_decode_matmul_ceiling_runs_in_the_engines_dtype():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.Linear(16, 8, bias=False))
    seen = []
    real_linear = torch.nn.functional.linear

    def spy(x, w, *rest):
        seen.append((x.dtype, w.dtype, x.shape[0]))
        return real_linear(x, w, *rest)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.nn.functional, "linear", spy)
        assert decode_matmul_ceiling(model, batch=4, repeats=1, dtype=torch.float32) > 0
    assert set(seen) == {(torch.float32, torch.float32, 4)}


def test_each_generation_variant_is_measured_against_its_own_dtypes_peak():
    assert matmul_dtype("bf16") == matmul_dtype("bf16-fp32-cache") == torch.bfloat16
    assert matmul_dtype("fp32") == matmul_dtype("fp32-unfused-norms") == torch.float32
    assert matmul_dtype("autocast") == torch.bfloat16  # the fp32 policy under bf16 autocast


def test_the_standard_step_runs_its_whole_wiring_on_the_tiny_model():
    """The standard step builds the trainer's parts itself (reference, optimizer, engine, update):
    a config change that breaks that wiring must fail here, not first in `make bench`."""
    report = standard_step(steps=1, threads=1, micro_batch_size=4, model="tiny-random")
    assert len(report["steps"]) == 2  # the warm-up and one timed step
    assert all(step["generated_tokens"] > 0 for step in report["steps"])
    assert report["standard_step_median_s"] == round(report["steps"][1]["step_s"], 3)
    assert report["step_0_logprob_mismatch"] is not None
    assert report["engine_forward"] == "lean (llama)"  # what ran, not just what the config asked for
    # fp32 where `auto` computes in fp32 (a CPU without bf16 instructions), else bf16 weights.
    fp32 = compute_dtype(torch.device("cpu")) == torch.float32
    promise = "batch-invariant up to fp32 rounding (" if fp32 else "reproducible for a fixed batch ("
    assert report["engine_sampling"].startswith(promise)


def test_the_standard_step_takes_config_overrides(monkeypatch):
    """`bench.run --set KEY=VALUE` reaches the standard step's engine too (e.g. to compare
    `rollout.hf.fuse_norms=false` side by side); a key the config does not have is refused by name."""
    from bench import steps

    built = []
    real = steps.make_engine

    def spy(*args, **kwargs):
        built.append(kwargs["config"])
        return real(*args, **kwargs)

    monkeypatch.setattr(steps, "make_engine", spy)
    report = standard_step(steps=0, threads=1, micro_batch_size=4, model="tiny-random",
                           overrides=("rollout.hf.fuse_norms=false", "rollout.hf.park_steps=3"))
    assert (built[0].rollout.hf.fuse_norms, built[0].rollout.hf.park_steps) == (False, 3)
    assert built[0].rollout.max_new_tokens == 48  # the standard work's own settings stay
    assert report["overrides"] == ["rollout.hf.fuse_norms=false", "rollout.hf.park_steps=3"]
    off = standard_step(steps=0, threads=1, micro_batch_size=4, model="tiny-random",
                        overrides=("rollout.hf.lean_forward=false",))
    assert off["engine_forward"] == "transformers' modules (lean_forward is off)"
    with pytest.raises(ConfigError, match="fuse_normz"):
        standard_step(steps=0, threads=1, model="tiny-random", overrides=("rollout.hf.fuse_normz=false",))


def test_headline_cuda_bandwidth_share_trl_ratio_and_calculator512():
    report = {
        "peak": {"fp32_gflops": 5e4, "bf16_gflops": 8e5, "copy_gbs": 3000.0},
        "standard": {"standard_step_median_s": 0.5},
        "generation": {"parameters": 100_000_000, "weight_bytes": 300_000_000,
                       "b512_tokens_per_s": 60000.0, "b512_decode_steps_per_s": 200.0},
        "trl": {"trl_version": "1.16.0", "trl_step_median_s": 2.0},
        "calculator512": {"steps": [{"step_s": 30.0}, {"step_s": 11.0}, {"step_s": 10.0},
                                    {"step_s": 12.0}]},
    }
    out = headline(report)
    assert out["gen_tokens_per_s_b512"] == 60000.0
    assert out["gen_b512_fraction_of_copy_bandwidth"] == 0.02  # 200 steps/s x 0.3 GB / 3000 GB/s
    assert out["standard_step_speedup_vs_trl"] == 4.0
    assert out["calculator512_step_s"] == 11.0  # median after the warm-up step
    skipped = headline({"trl": {"skipped": "TRL is not installed"}, "standard": {"standard_step_median_s": 1.0}})
    assert skipped["trl_step_median_s"] is None and skipped["standard_step_speedup_vs_trl"] is None


def test_the_continuous_batching_comparison_runs_both_modes_on_the_same_work():
    """bench/continuous.py end to end on the tiny model and the real calculator server."""
    args = parse_args([
        "--config", "configs/cpu.yaml", "--model", "tiny-random", "--tasks", "2",
        "--group-size", "2", "--repeats", "1", "--threads", "1", "--tool-latency-ms", "1", "5",
        "rollout.max_new_tokens=8", "model.dtype=float32",
    ])
    report = asyncio.run(measure(args))
    continuous, batched = report["continuous"]["median"], report["turn-batched"]["median"]
    assert continuous["engine_batches"] == 1 and batched["joined_requests"] == 0
    assert continuous["gen_tokens"] == batched["gen_tokens"] > 0  # fp32: the same samples
    # The engine's counters are in the report: turn-batched calls never resume a session.
    assert batched["engine_resumed_requests"] == 0 and batched["engine_idle_seconds"] == 0
    assert continuous["engine_prefill_tokens"] > 0 and continuous["engine_decode_steps"] > 0
    assert report["speedup"] == round(batched["wall_s"] / continuous["wall_s"], 3)
    assert report["tool_latency_ms"] == [1.0, 5.0]
    assert headline({"continuous": report})["continuous_batching_speedup"] == report["speedup"]
    assert "continuous_batching_speedup" not in headline({"continuous": {"skipped": "no model"}})


def test_the_update_prefix_plans_compared_are_the_previous_and_the_current_one():
    template, task_a, task_b = list(range(100, 120)), list(range(200, 220)), list(range(300, 320))
    input_ids = torch.tensor([template + (task_a if row % 2 == 0 else task_b) + list(range(row, row + 10))
                              for row in range(4)])  # [4, 50]: two groups sharing 40 columns, all 20
    attention_mask = torch.ones_like(input_ids)
    plans = {name: [(s.start, s.end, s.rows.tolist()) for s in PLANS[name](input_ids, attention_mask, 16, 16)]
             for name in PLANS if name != "packed"}
    assert plans == {
        "segments": [(0, 20, [0]), (20, 40, [0, 1]), (40, 50, [0, 1, 2, 3])],
        "batch-wide": [(0, 20, [0]), (20, 50, [0, 1, 2, 3])],
        "none": [(0, 50, [0, 1, 2, 3])],
    }
    policy = PolicyWithValueHead.from_config(ModelConfig(name_or_path="tiny-random"), LoraConfig(enabled=False),
                                             "cpu")[0]
    policy.segment_call_tokens = 16
    ends = lambda: [(s.start, s.end) for s in policy.prefix_segments(input_ids, attention_mask)]
    with planned_by(batch_wide_segments):
        assert ends() == [(0, 20), (20, 50)]
        assert isinstance(policy.forward_layout(input_ids, attention_mask), list)  # never packed
    assert ends() == [(0, 20), (20, 40), (40, 50)]
    policy.segment_call_tokens = None  # the CPU's 128 token-rows a segment: packing pays here
    with planned_by(PLANS["packed"]):
        assert isinstance(policy.forward_layout(input_ids, attention_mask), PackedRows)


def test_segment_cost_cuts_every_row_into_equal_column_segments_and_reports_both_modes():
    input_ids = torch.zeros(3, 10, dtype=torch.long)
    plan = column_cuts(3)(input_ids, torch.ones_like(input_ids))
    assert [(s.start, s.end, s.rows.tolist(), s.owner.tolist()) for s in plan] == [
        (0, 2, [0, 1, 2], [0, 1, 2]), (2, 5, [0, 1, 2], [0, 1, 2]),
        (5, 7, [0, 1, 2], [0, 1, 2]), (7, 10, [0, 1, 2], [0, 1, 2])]
    assert [(s.start, s.end) for s in column_cuts(0)(input_ids, input_ids)] == [(0, 10)]
    policy = PolicyWithValueHead.from_config(ModelConfig(name_or_path="tiny-random"), LoraConfig(enabled=False),
                                             "cpu")[0]
    seen = []
    original = policy.prefix_segments
    policy.prefix_segments = lambda ids, mask: seen.append(len(original(ids, mask))) or original(ids, mask)
    report = segment_cost(policy, batch=2, length=12, cuts=2, rounds=1)
    assert set(seen) == {1, 3}  # the one-segment pass and the cut one, each with and without grad
    assert (report["batch"], report["length"], report["cuts"]) == (2, 12, 2)
    for mode in ("grad", "no_grad"):
        numbers = report[mode]
        assert numbers["one_segment_s"] > 0 and numbers["cut_s"] > 0
        assert numbers["per_segment_s"] == pytest.approx((numbers["cut_s"] - numbers["one_segment_s"]) / 2, abs=1e-4)


def test_our_sections_run_without_cudnn_attention_unless_asked_and_trl_with_torchs_default(tmp_path, monkeypatch):
    import bench.run as bench_run

    seen = {}

    def fake_trl(**kwargs):
        seen["trl"] = torch.backends.cuda.cudnn_sdp_enabled()
        return {"trl_step_median_s": 1.0, "trl_version": "1.16.0"}

    def fake_peaks(device):
        seen["peak"] = torch.backends.cuda.cudnn_sdp_enabled()
        return {}

    monkeypatch.setattr(bench_run, "trl_available", lambda: True)
    monkeypatch.setattr(bench_run, "trl_standard_step", fake_trl)
    monkeypatch.setattr(bench_run, "_peaks", fake_peaks)
    assert bench_run.TORCH_CUDNN_SDP is True  # torch's default
    try:
        assert main(["--device", "cpu", "--sections", "peak", "trl", "--out", str(tmp_path)]) == 0
        report = json.loads((tmp_path / "report.json").read_text())
        assert seen == {"peak": False, "trl": True}
        assert report["machine"]["cudnn_attention"] is False and report["trl"]["cudnn_attention"] is True
        assert main(["--device", "cpu", "--sections", "peak", "--cudnn-attention", "--out", str(tmp_path)]) == 0
        assert seen["peak"] is True
        assert json.loads((tmp_path / "report.json").read_text())["machine"]["cudnn_attention"] is True
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


def test_decode_profile_splits_the_step_and_leaves_the_engine_as_it_was(varied_tiny_model, tokenizer):
    from bench.decode_profile import profile_batch
    from grpo.rollout.base import GenerationRequest, SamplingParams
    from grpo.rollout.hf.engine import HFEngine
    from grpo.rollout.hf.live_batch import LiveBatch

    engine = HFEngine(varied_tiny_model, tokenizer, dtype=None)
    sample, decode_step = LiveBatch.sample, engine.loop.decode_step
    requests = [GenerationRequest([5, 6, 7 + i], SamplingParams(max_new_tokens=5, seed=i)) for i in range(3)]
    report = profile_batch(engine, requests, top=3)
    assert (report["rows"], report["decode_steps"]) == (3, 4)  # 5 tokens: the prefill samples the first
    parts = report["attributed_ms_per_step"]
    assert set(parts) == {"forward", "sample", "rest"} and parts["forward"] > 0 and parts["sample"] > 0
    assert report["plain_ms_per_step"] > 0 and report["per_step"]["top-level aten calls"] > 0
    assert "Name" in report["top"][1] and len(report["top"]) == 3 + 5  # 3 rows, rules, header, total
    # The timing wrappers are gone: the class's sampler and the loop's own decode step again.
    assert LiveBatch.sample is sample and "decode_step" not in vars(engine.loop)
    assert engine.loop.decode_step == decode_step
    before = [r.token_ids for r in engine.generate(requests)]
    assert before == [r.token_ids for r in HFEngine(varied_tiny_model, tokenizer, dtype=None).generate(requests)]


def test_generation_prompts_can_share_a_long_system_prompt(tokenizer):
    plain = make_prompts(tokenizer, 6, group=2)
    assert len(plain) == 6 and plain[0] == plain[1] != plain[2]
    long = make_prompts(tokenizer, 6, group=2, system_tokens=300)
    assert [len(p) for p in long] == [len(p) + len(long[0]) - len(plain[0]) for p in plain]
    shared = 0
    while all(p[shared] == long[0][shared] for p in long):
        shared += 1
    assert 300 <= shared < len(long[0]) and long[0] != long[2]


def test_compiled_decode_times_one_step_eager_and_compiled(varied_tiny_model, tokenizer, monkeypatch):
    import grpo.rollout.hf.weights as engine_weights
    from bench import compiled_decode

    compiled = []

    def no_compile(fn, **options):  # the wiring, not inductor (SmolLM2's compile: 2-3 minutes here)
        compiled.append((fn, options))
        return fn

    monkeypatch.setattr(compiled_decode.torch, "compile", no_compile)
    can_pack, packs_fp32 = engine_weights.can_pack, engine_weights.packs_fp32
    row = compiled_decode.measure(
        varied_tiny_model, tokenizer, torch.device("cpu"), batch=3, window=2, repeats=1, dtype=torch.float32
    )
    assert (row["batch"], row["window"], row["dtype"]) == (3, 2, "float32")
    assert row["eager_ms"] > 0 and row["compiled_ms"] > 0
    # The same step on an unpacked copy: fp32 products of another kernel, not another model.
    assert row["max_abs_logit_diff"] < 1e-4
    [(forward, options)] = compiled
    assert options == {"dynamic": False}
    # Inductor packs the weights itself: the copy it is given has none packed, and the patch is undone.
    matmuls = [m.matmul for m in forward.__self__.model.modules() if hasattr(m, "matmul")]
    assert all(matmul.packed is None for matmul in matmuls)
    assert (engine_weights.can_pack, engine_weights.packs_fp32) == (can_pack, packs_fp32)
    assert torch._inductor.config.freezing is False  # set for the compile only


def test_decode_profile_runs_the_engine_copy_in_the_dtype_asked(tmp_path, one_thread):
    from bench.decode_profile import main as decode_profile

    out = tmp_path / "profile.json"
    args = ["--device", "cpu", "--model", "tiny-random", "--batches", "2", "--new-tokens", "3", "--out", str(out)]
    assert decode_profile([*args, "--dtype", "float32", "--threads", "1"]) == 0
    report = json.loads(out.read_text())
    assert (report["dtype"], report["results"][0]["rows"], report["results"][0]["decode_steps"]) == ("float32", 2, 2)
    with pytest.raises(ValueError, match="unknown dtype 'half'"):
        decode_profile([*args, "--dtype", "half"])


def test_scripted_collection_times_the_host_side_work_alone():
    from bench.collector import measure as collect
    from bench.collector import parse_args as collect_args

    report = asyncio.run(collect(collect_args(["--scripted", "--tasks", "3", "--group-size", "2", "--repeats", "2", "--show", "1"])))
    assert (report["engine"], report["temperature"]) == ("scripted (gold scripts, no model)", 0.0)
    for run in report["runs"]:
        # Every gold script calls the calculator, then answers right.
        assert (run["episodes"], run["rollout/success_rate"], run["rollout/tool_calls_per_episode"]) == (6, 1.0, 1.0)
        assert run["collect_s"] > 0 and run["sample_assistant_texts"][0].startswith("<tool_call>")


def test_rollout_ab_alternates_two_engines_on_the_same_requests(monkeypatch):
    """`python -m bench.rollout_ab`: one policy, two engines (the second with the overrides), the
    same requests each round in alternating order, the same tokens required."""
    from bench import rollout_ab as module
    from bench.rollout_ab import rollout_ab

    report = rollout_ab(("rollout.hf.lean_forward=false",), rounds=2, threads=1, model="tiny-random")
    assert report["overrides"] == ["rollout.hf.lean_forward=false"]
    assert [r["round"] for r in report["rounds"]] == [0, 1]
    assert report["median_s"] == {k: report["rounds"][1][f"{k}_s"] for k in ("base", "set")}
    assert report["set_faster_rounds"] == int(report["rounds"][1]["set_s"] < report["rounds"][1]["base_s"])
    assert all(r["generated_tokens"] > 0 for r in report["rounds"])
    # An engine that samples something else is refused unless asked for.
    built = []

    def make_engine(*args, **kwargs):
        engine = real_make_engine(*args, **kwargs)
        if built:  # the second engine: one token more in every result
            generate = engine.generate
            engine.generate = lambda requests: [
                dataclasses.replace(r, token_ids=r.token_ids + [0]) for r in generate(requests)
            ]
        built.append(engine)
        return engine

    real_make_engine = module.make_engine
    monkeypatch.setattr(module, "make_engine", make_engine)
    with pytest.raises(AssertionError, match="round 0: the two engines sampled different tokens"):
        rollout_ab(("rollout.hf.park_steps=3",), rounds=1, threads=1, model="tiny-random")
    built.clear()
    report = rollout_ab(("rollout.hf.park_steps=3",), rounds=1, threads=1, model="tiny-random", allow_different=True)
    assert len(report["rounds"]) == 1


def test_the_multi_turn_step_runs_the_trainer_and_says_how_its_engine_ran():
    """The `multiturn` and `calculator512` sections: real steps of configs/cpu.yaml through
    GRPOTrainer (the calculator server as a subprocess), on the tiny model."""
    report = multi_turn_step(steps=1, threads=1, tasks_per_step=1, group_size=2, overrides=(
        "model.name_or_path=tiny-random", "rollout.max_new_tokens=8", "device=cpu"))
    assert len(report["steps"]) == 1 and report["multi_turn_step_s"] == report["steps"][0]["step_s"]
    assert report["engine_forward"] == "lean (llama)"
    assert report["engine_sampling"].startswith(("batch-invariant", "reproducible"))
    assert report["last_step_metrics"]["rollout/episodes"] == 2.0
    # the run's directory is gone: its training.log handler went with it, so later log lines
    # (any test's, any library user's) do not fail on a missing file
    assert [h for h in logging.getLogger("mcp_grpo").handlers if isinstance(h, logging.FileHandler)] == []


def test_the_engines_section_gives_both_engines_the_same_requests(tmp_path, tokenizer):
    """`--sections engines`: the HF engine and real vLLM from one policy, each batch's requests to
    both (every row runs to its token limit: no stop token), a rate per engine and their ratio."""
    from vllm_helpers import require_vllm, write_model

    from bench.engines import generation_side_by_side

    require_vllm()
    model_dir = write_model(tmp_path / "model", tokenizer)
    report = generation_side_by_side(lora=False, batches=(2, 3), new_tokens=5, repeats=2, threads=1,
                                     eager=True, kv_cache_gib=0.0625,
                                     overrides=(f"model.name_or_path={model_dir}", "model.dtype=float32"))
    assert set(report["engines"]) == {"hf", "vllm"} and report["engines"]["vllm"]["engine"] == "vllm"
    for batch in (2, 3):
        row = report[f"b{batch}"]
        assert row["hf_tokens"] == row["vllm_tokens"] == batch * 5
        assert row["vllm_over_hf"] == round(row["vllm_tokens_per_s"] / row["hf_tokens_per_s"], 3)


def test_the_engines_profile_ranks_each_engines_operators_on_one_batch(tmp_path, tokenizer):
    """`bench.engines --profile B`: one profiled generate call per engine after a warm-up; vLLM's
    engine core runs in this process, so its model's operators are among those ranked."""
    from vllm_helpers import require_vllm, write_model

    from bench.engines import profile_side_by_side

    require_vllm()
    model_dir = write_model(tmp_path / "model", tokenizer)
    report = profile_side_by_side(lora=False, batch=2, new_tokens=4, threads=1, eager=True, kv_cache_gib=0.0625,
                                  top=5, overrides=(f"model.name_or_path={model_dir}", "model.dtype=float32"))
    for name in ("hf", "vllm"):
        assert report[name]["tokens"] == 8 and len(report[name]["top_self_cpu"]) == 5
        times = [ms for _, ms, _ in report[name]["top_self_cpu"]]
        assert times == sorted(times, reverse=True) and report[name]["op_calls_per_token"] > 0
    assert any(key.startswith("aten::") for key, _, _ in report["vllm"]["top_self_cpu"])

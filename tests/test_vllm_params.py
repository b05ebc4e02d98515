"""The vLLM engine's pure logic, without vllm: settings and environment variables, the choice of
log-prob mode, request -> vllm.SamplingParams arguments, grouping into n-sample requests."""

from __future__ import annotations

import importlib.util

import pytest

from grpo.config import RunConfig, load_config
from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.config import VLLMConfig
from grpo.rollout.vllm.params import (
    PROCESSED,
    RAW,
    VLLMSettingsError,
    check_request_logprobs,
    choose_logprobs_mode,
    engine_kwargs,
    group_requests,
    lora_rank_bound,
    memory_kwargs,
    resolve_vllm_config,
    sampling_kwargs,
    vllm_enabled,
)


def _request(prompt=(1, 2, 3), rid="r", **sampling) -> GenerationRequest:
    return GenerationRequest(list(prompt), SamplingParams(**sampling), request_id=rid)


# ----- settings and environment variables --------------------------------------------------------


def test_defaults_and_shipped_vllm_configs():
    cfg = load_config("configs/vllm.yaml")
    assert (cfg.device, cfg.rollout.engine) == ("auto", "vllm") and cfg.lora.enabled
    assert cfg.rollout.vllm.gpu_memory_utilization is None and cfg.rollout.vllm.max_model_len is None
    servers = load_config("configs/vllm_servers.yaml")
    assert servers.rollout.engine == "vllm_server" and len(servers.rollout.vllm_server.urls) == 2
    assert RunConfig().rollout.vllm == VLLMConfig()
    resolved = resolve_vllm_config(VLLMConfig(), environ={})
    assert resolved == VLLMConfig()


def test_environment_overrides_the_config():
    env = {"VLLM_MAX_MODEL_LEN": "4096", "VLLM_GPU_MEMORY_UTILIZATION": "0.45"}
    resolved = resolve_vllm_config(VLLMConfig(max_model_len=1024), environ=env)
    assert (resolved.max_model_len, resolved.gpu_memory_utilization) == (4096, 0.45)
    # Empty values count as unset; the config's values stay.
    blank = {"VLLM_MAX_MODEL_LEN": " ", "VLLM_GPU_MEMORY_UTILIZATION": ""}
    assert resolve_vllm_config(VLLMConfig(max_model_len=1024), environ=blank).max_model_len == 1024


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("VLLM_MAX_MODEL_LEN", "abc"),
        ("VLLM_MAX_MODEL_LEN", "8"),
        ("VLLM_MAX_MODEL_LEN", "1.5"),
        ("VLLM_GPU_MEMORY_UTILIZATION", "1.5"),
        ("VLLM_GPU_MEMORY_UTILIZATION", "0"),
        ("VLLM_GPU_MEMORY_UTILIZATION", "half"),
    ],
)
def test_bad_environment_values_name_the_variable(name, value):
    with pytest.raises(VLLMSettingsError, match=name):
        resolve_vllm_config(VLLMConfig(), environ={name: value})


def test_enable_vllm_spellings():
    for raw, want in [("1", True), ("true", True), ("YES", True), ("0", False), ("off", False), ("", True)]:
        assert vllm_enabled({"ENABLE_VLLM": raw}) is want
    assert vllm_enabled({}) is True
    with pytest.raises(VLLMSettingsError, match="ENABLE_VLLM must be 0 or 1"):
        vllm_enabled({"ENABLE_VLLM": "maybe"})


def test_config_rejects_out_of_range_fraction():
    from grpo.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match="rollout.vllm.gpu_memory_utilization"):
        config_from_dict({"rollout": {"vllm": {"gpu_memory_utilization": 1.2}}})


# ----- log-prob mode --------------------------------------------------------------------------------


def test_logprobs_mode_matches_the_trainers_quantity():
    # Temperature 1 (greedy evaluation aside): raw log softmax(logits) is right, with any top_p.
    assert choose_logprobs_mode("auto", (1.0, 0.0), top_p=0.9) == RAW
    assert choose_logprobs_mode("auto", (1.0, 0.0), top_p=1.0) == RAW
    # Another temperature: only the processed log-probs include it, and they are right at top_p 1.
    assert choose_logprobs_mode("auto", (0.7, 0.0), top_p=1.0) == PROCESSED
    with pytest.raises(VLLMSettingsError, match="top_p"):
        choose_logprobs_mode("auto", (0.7, 0.0), top_p=0.9)
    assert choose_logprobs_mode(PROCESSED, (1.0,), top_p=1.0) == PROCESSED
    with pytest.raises(VLLMSettingsError, match="logprobs_mode"):
        choose_logprobs_mode("raw_logits", (1.0,), top_p=1.0)


def test_requests_that_the_mode_cannot_score_are_refused():
    check_request_logprobs(_request(temperature=1.0, top_p=0.5), RAW)
    check_request_logprobs(_request(temperature=0.0), RAW)  # greedy: scored at T = 1 either way
    check_request_logprobs(_request(temperature=0.6, top_p=1.0), PROCESSED)
    with pytest.raises(ValueError, match="temperature 0.6"):
        check_request_logprobs(_request(temperature=0.6), RAW)
    with pytest.raises(ValueError, match="top_p 0.9"):
        check_request_logprobs(_request(temperature=0.6, top_p=0.9), PROCESSED)


# ----- request -> vllm.SamplingParams ---------------------------------------------------------------


def test_sampling_kwargs_translate_our_request():
    s = SamplingParams(
        temperature=0.8, top_p=1.0, max_new_tokens=12, stop_token_ids=(2, 7), seed=5
    )
    kwargs = sampling_kwargs(s, n=1)
    assert kwargs == {
        "n": 1,
        "temperature": 0.8,
        "top_p": 1.0,
        "max_tokens": 12,
        "seed": 5,
        "stop_token_ids": [2, 7],
        "ignore_eos": True,  # only our stop tokens end a sequence, as in the HF engine
        "logprobs": 0,  # the sampled token's log-prob only
        "detokenize": False,  # token in, token out: no text needed without stop strings
    }


def test_stop_strings_keep_special_tokens_and_the_stop_text():
    kwargs = sampling_kwargs(SamplingParams(stop_strings=("</tool_call>",)), n=3)
    assert kwargs["n"] == 3 and kwargs["stop"] == ["</tool_call>"] and kwargs["detokenize"]
    assert kwargs["include_stop_str_in_output"] and not kwargs["skip_special_tokens"]


def test_greedy_is_temperature_zero_and_never_n_samples():
    kwargs = sampling_kwargs(SamplingParams(temperature=0.0, top_p=0.5))
    assert kwargs["temperature"] == 0.0 and kwargs["top_p"] == 1.0
    with pytest.raises(ValueError, match="greedy"):
        sampling_kwargs(SamplingParams(temperature=0.0), n=2)
    with pytest.raises(ValueError, match="n must be"):
        sampling_kwargs(SamplingParams(), n=0)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_sampling_kwargs_are_accepted_by_vllm():
    from vllm import SamplingParams as VSamplingParams

    params = VSamplingParams(**sampling_kwargs(SamplingParams(stop_strings=("x",), seed=1), n=2))
    assert params.n == 2 and params.logprobs == 0 and params.ignore_eos


# ----- grouping --------------------------------------------------------------------------------------


def test_identical_unseeded_requests_become_one_request_with_n():
    requests = [
        _request((1, 2), "a0"),
        _request((5, 6), "b0"),
        _request((1, 2), "a1"),
        _request((1, 2), "a2"),
        _request((1, 2), "c0", temperature=0.5, top_p=1.0),  # other sampling: its own request
    ]
    assert group_requests(requests) == [[0, 2, 3], [1], [4]]


def test_seeded_greedy_and_empty_requests_are_not_grouped():
    requests = [
        _request((1, 2), "s0", seed=1),
        _request((1, 2), "s1", seed=2),  # vLLM would reseed children as seed + i: keep apart
        _request((1, 2), "g0", temperature=0.0),
        _request((1, 2), "g1", temperature=0.0),  # vLLM refuses n > 1 when greedy
        _request((1, 2), "z", max_new_tokens=0),  # answered without vLLM
    ]
    assert group_requests(requests) == [[0], [1], [2], [3]]


# ----- engine arguments --------------------------------------------------------------------------------


def test_lora_rank_rounds_up_to_a_rank_vllm_accepts():
    assert [lora_rank_bound(r) for r in (1, 2, 8, 9, 16, 33, 512)] == [1, 8, 8, 16, 16, 64, 512]
    with pytest.raises(VLLMSettingsError, match="lora.r=600"):
        lora_rank_bound(600)


def test_engine_kwargs():
    common = {
        "model_dir": "/m",
        "tokenizer_dir": "/m",
        "dtype": "bfloat16",
        "max_model_len": 1024,
        "seed": 3,
        "logprobs_mode": RAW,
        "worker_extension_cls": "x.Y",
    }
    kwargs = engine_kwargs(VLLMConfig(), lora_rank=None, quantization=None, **common)
    assert kwargs["gpu_memory_utilization"] == 0.3 and kwargs["generation_config"] == "vllm"
    assert "kv_cache_memory_bytes" not in kwargs  # CUDA: the fraction sizes the KV cache
    assert "enable_lora" not in kwargs and "quantization" not in kwargs
    assert kwargs["worker_extension_cls"] == "x.Y" and kwargs["logprobs_mode"] == RAW
    lora = engine_kwargs(
        VLLMConfig(max_num_seqs=64), lora_rank=12, quantization="bitsandbytes", **common
    )
    assert (lora["enable_lora"], lora["max_lora_rank"], lora["max_loras"]) == (True, 16, 1)
    assert lora["quantization"] == "bitsandbytes" and lora["max_num_seqs"] == 64
    assert "enable_chunked_prefill" not in kwargs and "max_num_batched_tokens" not in kwargs


def test_on_a_cpu_every_prompt_is_prefilled_in_one_step():
    # A split prompt makes vLLM rewind the request's generator offset, which a CPU generator lacks.
    common = {"model_dir": "/m", "tokenizer_dir": "/m", "dtype": "float32", "seed": 3, "logprobs_mode": RAW,
              "worker_extension_cls": "x.Y", "lora_rank": None, "quantization": None, "device_type": "cpu"}
    short = engine_kwargs(VLLMConfig(), max_model_len=1024, **common)
    assert (short["enable_chunked_prefill"], short["max_num_batched_tokens"]) == (False, 4096)
    long = engine_kwargs(VLLMConfig(), max_model_len=10_000, **common)
    assert long["max_num_batched_tokens"] == 10_000


def test_memory_on_a_cpu_is_a_kv_cache_in_gib_not_a_share_of_host_ram():
    # vLLM's CPU worker reserves gpu_memory_utilization x host RAM and refuses to start when that
    # much is not free: by default the KV cache is sized in GiB instead.
    assert memory_kwargs(VLLMConfig(), "cpu") == {"kv_cache_memory_bytes": 2 * 2**30}
    assert memory_kwargs(VLLMConfig(kv_cache_gib=0.5), "cpu") == {"kv_cache_memory_bytes": 2**29}
    # A fraction the config sets is vLLM's own meaning: of host RAM.
    assert memory_kwargs(VLLMConfig(gpu_memory_utilization=0.2), "cpu") == {"gpu_memory_utilization": 0.2}
    assert memory_kwargs(VLLMConfig(gpu_memory_utilization=0.2, kv_cache_gib=1.0), "cpu") == {
        "kv_cache_memory_bytes": 2**30}
    assert memory_kwargs(VLLMConfig(), "cuda") == {"gpu_memory_utilization": 0.3}
    assert memory_kwargs(VLLMConfig(kv_cache_gib=4.0), "cuda") == {
        "gpu_memory_utilization": 0.3, "kv_cache_memory_bytes": 4 * 2**30}
    with pytest.raises(VLLMSettingsError, match="enable_sleep_mode needs CUDA"):
        memory_kwargs(VLLMConfig(enable_sleep_mode=True), "cpu")

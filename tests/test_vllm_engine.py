"""The vLLM engine's own logic on CPU: adapter versions, full-weight pairs, base-model export,
result mapping and weight-sync calls (through a scripted stand-in for vllm.LLM: it checks what
our engine sends and how it reads what comes back, not vLLM), and the ENABLE_VLLM=0 fallback.
Runs against real vLLM are in tests/test_gpu_backends.py."""

from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace

import pytest
import torch

from grpo.models.config import LoraConfig, ModelConfig
from grpo.models.policy import PolicyWithValueHead
from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.vllm import VLLMApi, VLLMEngine, VLLMUnavailable
from grpo.rollout.vllm_params import RAW
from grpo.rollout.vllm_sync import LoraAdapterStore, export_base_model, full_weight_pairs

TINY = ModelConfig(name_or_path="tiny-random", dtype="float32")
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _policy(lora: bool) -> PolicyWithValueHead:
    policy, _ = PolicyWithValueHead.from_config(TINY, LoraConfig(enabled=lora), "cpu", seed=0)
    return policy


def _move_adapters(policy, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)


# ----- weight sync helpers ------------------------------------------------------------------------


def test_adapter_store_publishes_new_ids_and_keeps_the_newest(tmp_path):
    from safetensors.torch import load_file

    policy = _policy(lora=True)
    store = LoraAdapterStore(tmp_path, keep=2)
    published = []
    for seed in range(3):
        _move_adapters(policy, seed)
        published.append(store.publish(policy))
    assert [a.lora_id for a in published] == [1, 2, 3]  # vLLM refuses id 0; ids only grow
    assert len({a.name for a in published}) == 3  # vLLM tells LoRARequests apart by name
    assert not published[0].path.exists() and published[1].path.exists()
    assert store.current == published[2]
    config = json.loads((published[2].path / "adapter_config.json").read_text())
    assert config["r"] == 16 and "q_proj" in config["target_modules"]
    saved = load_file(str(published[2].path / "adapter_model.safetensors"))
    live = dict(policy.model.named_parameters())
    key = next(k for k in saved if "q_proj.lora_B" in k)
    live_key = key.replace(".weight", ".default.weight")
    torch.testing.assert_close(saved[key], live[live_key].detach(), atol=0, rtol=0)
    store.close()
    assert not published[2].path.exists()
    with pytest.raises(TypeError, match="LoRA"):
        LoraAdapterStore(tmp_path / "x").publish(_policy(lora=False))


def test_full_weight_pairs_are_checkpoint_names_and_live_tensors(tmp_path):
    from safetensors.torch import load_file

    policy = _policy(lora=False)
    pairs = dict(full_weight_pairs(policy))
    policy.model.save_pretrained(str(tmp_path))
    checkpoint = load_file(str(tmp_path / "model.safetensors"))
    # The checkpoint's names (those vLLM's load_weights reads), and the tied head once more: vLLM's
    # in-place reload would otherwise leave its head on the old embedding.
    assert set(pairs) == set(checkpoint) | {"lm_head.weight"} and "lm_head.weight" not in checkpoint
    assert pairs["lm_head.weight"].data_ptr() == pairs["model.embed_tokens.weight"].data_ptr()
    q = "model.layers.0.self_attn.q_proj.weight"
    assert pairs[q].data_ptr() == policy.model.model.layers[0].self_attn.q_proj.weight.data_ptr()
    with pytest.raises(TypeError, match="full fine-tuning"):
        list(full_weight_pairs(_policy(lora=True)))


def test_exported_base_model_is_the_base_without_adapters(tmp_path, tokenizer):
    from transformers import AutoModelForCausalLM

    policy = _policy(lora=True)
    _move_adapters(policy, 0)
    export_base_model(policy, tmp_path, tokenizer)
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 200, 31]])
    with torch.no_grad(), policy.model.disable_adapter():
        want = policy.model(input_ids=ids).logits
    torch.testing.assert_close(loaded(input_ids=ids).logits, want, atol=1e-6, rtol=0)
    assert (tmp_path / "tokenizer_config.json").is_file()


# ----- the engine over a scripted stand-in for vllm.LLM -------------------------------------------


class _ScriptedLLM:
    """Records what the engine sends. Sample k of a prompt is [last + 1 + k, last + 2 + k],
    each token with log-prob -(token / 100); finish reason 'stop'."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls: list[tuple] = []

    def generate(self, prompts, params, use_tqdm=True, lora_request=None):
        self.calls.append(("generate", prompts, params, lora_request))
        outputs = []
        for prompt, p in zip(prompts, params):
            last = prompt["prompt_token_ids"][-1]
            completions = []
            for k in reversed(range(p["n"])):  # out of order: the engine must sort by index
                tokens = [last + 1 + k, last + 2 + k][: p["max_tokens"]]
                logprobs = [{t: SimpleNamespace(logprob=-t / 100)} for t in tokens]
                completions.append(
                    SimpleNamespace(index=k, token_ids=tokens, logprobs=logprobs, finish_reason="stop")
                )
            outputs.append(SimpleNamespace(outputs=completions))
        return outputs

    def collective_rpc(self, method, args=()):
        self.calls.append(("rpc", method, args))
        return [len(args[0])]

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))


def _api() -> VLLMApi:
    return VLLMApi(
        LLM=_ScriptedLLM,
        SamplingParams=lambda **kw: kw,
        LoRARequest=lambda **kw: SimpleNamespace(**kw),
    )


def _engine(lora: bool, tmp_path, tokenizer, sleep: bool = False) -> tuple[VLLMEngine, object]:
    policy = _policy(lora)
    llm_kwargs = {"max_model_len": 64, "logprobs_mode": RAW}
    engine = VLLMEngine(
        policy, tokenizer, model_dir=None, llm_kwargs=llm_kwargs, sleep_enabled=sleep,
        device="cpu", api=_api(),
    )
    return engine, policy


def test_engine_maps_grouped_samples_back_to_requests_in_order(tmp_path, tokenizer):
    engine, _ = _engine(False, tmp_path, tokenizer)
    requests = [
        GenerationRequest([1, 10], SamplingParams(max_new_tokens=2), "a0"),
        GenerationRequest([1, 50], SamplingParams(max_new_tokens=2, seed=3), "b"),
        GenerationRequest([1, 10], SamplingParams(max_new_tokens=2), "a1"),
        GenerationRequest([1, 10], SamplingParams(max_new_tokens=0), "empty"),
    ]
    results = engine.generate(requests)
    llm = engine.llm
    _, prompts, params, lora = llm.calls[-1]
    assert prompts == [{"prompt_token_ids": [1, 10]}, {"prompt_token_ids": [1, 50]}]
    assert [p["n"] for p in params] == [2, 1] and params[1]["seed"] == 3 and lora is None
    assert results[0].token_ids == [11, 12] and results[2].token_ids == [12, 13]
    assert results[1].token_ids == [51, 52] and results[1].behavior_logprobs == [-0.51, -0.52]
    assert results[3].token_ids == [] and results[3].finish_reason == "length"
    assert results[0].finish_reason == "stop" and results[0].metrics["prompt_tokens"] == 2.0
    assert engine.last_metrics["vllm_requests"] == 2.0
    with pytest.raises(ValueError, match="max_model_len 64"):
        engine.generate([GenerationRequest([1] * 60, SamplingParams(max_new_tokens=8), "long")])
    with pytest.raises(ValueError, match="temperature 0.5"):
        engine.generate([GenerationRequest([1], SamplingParams(temperature=0.5, max_new_tokens=4), "t")])
    engine.close()


def test_lora_sync_sends_a_new_lora_request_each_time(tmp_path, tokenizer):
    engine, policy = _engine(True, tmp_path, tokenizer)
    request = GenerationRequest([1, 10], SamplingParams(max_new_tokens=1, seed=0), "r")
    engine.generate([request])
    first = engine.llm.calls[-1][3]
    assert first.lora_int_id == 1 and first.lora_name == "policy-v1"
    _move_adapters(policy, 1)
    engine.sync_weights(policy)
    engine.generate([request])
    second = engine.llm.calls[-1][3]
    assert second.lora_int_id == 2 and second.lora_path != first.lora_path
    assert not any(call[0] == "rpc" for call in engine.llm.calls)  # no full-weight push
    engine.close()


def test_full_sync_pushes_every_weight_and_resets_the_prefix_cache(tmp_path, tokenizer):
    engine, policy = _engine(False, tmp_path, tokenizer, sleep=True)
    rpc = [c for c in engine.llm.calls if c[0] == "rpc"]
    assert len(rpc) == 1 and rpc[0][1] == "grpo_load_weights"  # pushed once at construction
    names = [name for name, _ in rpc[0][2][0]]
    assert names == [name for name, _ in policy.model.named_parameters()] + ["lm_head.weight"]
    engine.sleep()
    engine.llm.calls.clear()
    engine.sync_weights(policy)
    engine.generate([GenerationRequest([1, 10], SamplingParams(max_new_tokens=1, seed=0), "r")])
    kinds = [c[0] if c[0] != "wake_up" else ("wake_up", tuple(c[1])) for c in engine.llm.calls]
    assert kinds == [
        ("wake_up", ("weights",)),  # weights back before they are overwritten
        "rpc",
        "reset_prefix_cache",  # cached KV was computed with the old weights
        ("wake_up", ("kv_cache",)),  # the KV cache only when sampling resumes
        "generate",
    ]
    engine.close()


# ----- backends: availability and the ENABLE_VLLM=0 fallback ---------------------------------------


def test_where_vllm_cannot_run_is_a_clear_error(monkeypatch):
    from grpo.rollout import vllm as vllm_module

    monkeypatch.setattr(vllm_module.importlib.util, "find_spec", lambda name: object())  # "installed"
    vllm_module.check_vllm_available("cpu")
    with pytest.raises(VLLMUnavailable, match="on a CUDA GPU or on the CPU, not on mps"):
        vllm_module.check_vllm_available("mps")
    if not torch.cuda.is_available():
        with pytest.raises(VLLMUnavailable, match="asked for CUDA.*device: cpu"):
            vllm_module.check_vllm_available("cuda")
    monkeypatch.setattr(vllm_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(VLLMUnavailable, match="`make install` installs vLLM's CPU build"):
        vllm_module.check_vllm_available("cpu")


def test_choose_engine_resolves_auto_and_the_enable_vllm_fallback(monkeypatch):
    from grpo.rollout.registry import choose_engine

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    monkeypatch.delenv("ENABLE_VLLM", raising=False)
    assert choose_engine("hf", cuda) == ("hf", "requested in config")
    assert choose_engine("vllm", cuda) == ("vllm", "requested in config")
    assert choose_engine("vllm", cpu) == ("vllm", "requested in config")
    assert choose_engine("vllm_server", cpu) == ("vllm_server", "requested in config")
    assert choose_engine("auto", cpu) == ("hf", "auto: the HF engine on cpu (rollout.engine: vllm asks for vLLM)")
    if not HAS_VLLM:
        assert choose_engine("auto", cuda) == ("hf", "auto: the vllm package is not installed")
    monkeypatch.setenv("ENABLE_VLLM", "0")
    assert choose_engine("vllm", cuda) == ("hf", "ENABLE_VLLM=0 in the environment")
    assert choose_engine("auto", cuda) == ("hf", "ENABLE_VLLM=0 in the environment")
    monkeypatch.setenv("ENABLE_VLLM", "perhaps")
    with pytest.raises(ValueError, match="ENABLE_VLLM must be 0 or 1"):
        choose_engine("vllm", cuda)
    with pytest.raises(ValueError, match="unknown rollout engine 'tgi'; options: auto, hf, vllm, vllm_server"):
        choose_engine("tgi", cpu)


def test_vllm_runs_on_cpu_or_cuda_and_servers_need_urls():
    from grpo.config import ConfigError, config_from_dict

    assert config_from_dict({"device": "cpu", "rollout": {"engine": "vllm"}}).rollout.engine == "vllm"
    with pytest.raises(ConfigError, match="rollout.engine=vllm runs on device cuda or cpu"):
        config_from_dict({"device": "mps", "rollout": {"engine": "vllm"}})
    with pytest.raises(ConfigError, match="vllm_server needs vllm_server.urls"):
        config_from_dict({"rollout": {"engine": "vllm_server"}})

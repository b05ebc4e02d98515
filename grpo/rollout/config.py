"""Config of sampling (`rollout:`: the engine, temperature, token budgets, concurrency), with the
sections of the engines it picks from: our HF engine (`rollout.hf`), vLLM in process
(`rollout.vllm`) and vLLM servers (`rollout.vllm_server`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from grpo.sections import Section

DecodeMode = Literal["auto", "dynamic", "static", "graph"]
"""How HFEngine runs decode steps (grpo/rollout/hf/engine.py, grpo/rollout/hf/decode_graphs.py)."""
_DEVICE_DEFAULTS = {
    # field: (on CUDA, elsewhere) -- what null means; `HFEngineConfig.for_device` applies it.
    "max_batch_size": (512, 64),
    "join_columns": (512, 1024),
    "join_wait_steps": (4, 0),
    "prefill_chunk_tokens": (32768, 4096),
}


class HFEngineConfig(Section):
    """Our KV-cached engine (`rollout.engine: hf`, grpo/rollout/hf/engine.py). HFEngine takes
    this section as it is and resolves it for its device once (`for_device`)."""

    max_batch_size: int | None = Field(default=None, ge=1)
    """Rows decoded together; a generate call with more requests runs in waves of this many.
    null: 512 on CUDA (a GPU's decode step costs about the same at 16 rows as at 512), else 64
    (a CPU's step grows with the batch). A value set here may not exceed
    `rollout.max_concurrent_episodes` (the config refuses it): the collector never gathers more
    requests than that."""
    decode_mode: DecodeMode = "auto"
    """How decode steps run: `graph` replays fixed-shape steps as CUDA graphs
    (grpo/rollout/hf/decode_graphs.py; CUDA only), `static` runs those steps eagerly, `dynamic`
    attends exactly the columns in use; `auto` = graph on CUDA with the engine's own weight copy,
    else dynamic."""
    sample_in_decode_step: bool = True
    """With `graph` (or `static`) decode, draw the next tokens inside the decode step's CUDA graph
    instead of launching the sampler's kernels from Python after each replay (rows with top_p < 1
    are still sampled outside it); the same tokens either way. It pays at large batches, where
    the sampler's eager launches no longer overlap the replay."""
    fuse_norms: bool = True
    """The engine copy's RMSNorm layers run as one `torch.rms_norm` op each (a fused kernel on
    CUDA, so a decode step's CUDA graph launches ~6 fewer kernels per norm) where their own
    forward computes that function (grpo/rollout/hf/fused_norms.py); false: transformers' forward."""
    lean_forward: bool = True
    """The engine copy's forwards skip transformers' module plumbing: the same tensor ops in the
    same order, so the same logits bit for bit (a probe checks at start;
    grpo/rollout/hf/lean_forward.py). The model families in grpo/rollout/hf/families/ (Llama,
    Qwen2, Qwen3); others keep transformers' forward. On a CPU a decode step's Python is a large
    share of it at small batches."""
    copy_weights: bool = True
    """Sample from the engine's own inference copy of the policy (LoRA merged; Linear weights in
    the compute dtype, packed and fused: grpo/rollout/hf/weights.py), which `sync_weights`
    refreshes after each update. false: sample from the policy module itself (under autocast
    where the compute dtype differs from its weights'); slower, for comparison."""
    head_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """The dtype of the engine copy's LM head; auto: the copy's matmul dtype. float32 under a bf16
    compute dtype brings the engine's log-probs closer to an fp32 trainer's, at some speed."""
    decode_attention: Literal["grouped", "sdpa"] = "grouped"
    """How the engine copy attends in decode steps: `grouped` (two batched matmuls per layer,
    grpo/rollout/hf/decode_attention.py; needed for the kept prefix and a KV cache in another
    dtype than the model's) or `sdpa` (transformers' SDPA)."""
    compact_fraction: float = Field(default=0.25, ge=0.0)
    """Compact the batch once this fraction of its rows has finished (0: at every finish; above
    1: never)."""
    continuous_batching: bool = True
    """Requests of episodes coming back from their tools join the batch the engine is decoding
    (at its next step), and each result goes back the moment its sequence ends, instead of the
    collector gathering each turn's requests into one batch that waits for its longest row
    (grpo/rollout/hf/live_batch.py)."""
    park_steps: int = Field(default=64, ge=0)
    """With continuous batching, a finished turn's cache row waits this many decode steps for its
    episode's next turn, which then prefills only its new tokens (the observation) instead of the
    whole conversation; it leaves earlier when the episode ends. 0: never wait. A waiting row
    rides along in every decode step, about as costly as re-prefilling a prompt of that many
    tokens."""
    park_wait_s: float = Field(default=2.0, ge=0.0)
    """How long the engine, with nothing else to decode, waits for the next turns of those rows
    (episodes in their tool calls) before it lets them go."""
    join_columns: int | None = Field(default=None, ge=0)
    """Cache columns a batch keeps beyond its first prompts and their token budgets, for the
    longer prompts of later turns that join it; a request that does not fit waits until the
    batch has drained, then its whole conversation is prefilled again (memory: columns x rows x
    layers x 2 x kv heads x head dim x dtype size). null: 512 on CUDA (its cache is allocated and
    zeroed whole), else 1024: a CPU cache's columns take memory only once written, and fewer
    columns made multi-turn calculator collections drain and re-prefill whole conversations."""
    join_wait_steps: int | None = Field(default=None, ge=0)
    """With continuous batching, requests that arrive while rows are decoding (mostly episodes
    back from their tools) wait until the first of them has waited this many decode steps, then
    join in one prefill forward instead of one forward per step. null: 4 on CUDA (a decode step
    takes milliseconds there, an admission's prefill forward far longer), else 0 (a CPU's prefill
    cost grows with its tokens: nothing to gain by waiting)."""
    kv_cache_dtype: Literal["auto", "model", "bfloat16", "float16", "float32"] = "auto"
    """The KV cache's dtype. auto: on a CPU or a CUDA GPU with grouped decode attention, the
    engine copy's matmul dtype (bf16: decode steps read the whole cache at every step, and the
    trainer's attention under autocast reads bf16 keys too; on a GPU an fp32 cache also makes
    the attention products fp32 matmuls), else the model's; model: the model's dtype. Another
    dtype than the model's needs the engine's own weight copy with grouped decode attention."""
    keys_transposed: bool | None = None
    """Store the cache's keys [rows, heads, dim, columns] (grpo/rollout/hf/kv_cache.py). null: on
    a CPU with a bf16 cache, where the query x keys product runs faster so."""
    shared_prefix_min_tokens: int = Field(default=64, ge=0)
    """Prompts that join a batch together and start alike (chat template, system prompt, tool
    docs) prefill their common prefix once, copied to every row, where that saves at least this
    many prefill tokens (prefix length x (distinct prompts - 1)). 0: every prompt is prefilled
    whole."""
    prefix_attention_min_tokens: int = Field(default=64, ge=0)
    """A batch keeps the prefix its rows' prompts share (chat template, system prompt, tool docs;
    at least this many tokens) once: decode steps attend to it once for all the rows that start
    with it, and requests that join later with it skip its prefill (grpo/rollout/hf/kept_prefix.py).
    Dynamic decode with the engine's own weight copy and grouped decode attention only. 0: never."""
    prefix_attention_min_cells: int = Field(default=4096, ge=1)
    """A decode step attends the kept prefix once where that reads at least this many fewer cache
    cells (rows x columns) from the rows; below, its fixed cost is more than the copies it saves
    (the default is a CPU's break-even: e.g. 16 rows x 256 columns, or 64 x 64)."""
    prefill_chunk_tokens: int | None = Field(default=None, ge=1)
    """Padded prompt tokens per prefill forward (bounds its activation memory). null: 32768 on
    CUDA (a GPU's forward costs about the same at 4096 tokens as at 32768), else 4096."""

    def for_device(self, device_type: str) -> HFEngineConfig:
        """This section resolved for a device type ("cpu", "cuda", "mps"): every null replaced by
        its default there, `decode_mode: auto` by the mode it picks, and
        `prefix_attention_min_tokens` 0 where the kept prefix does not apply. Raises ValueError
        for a choice the device cannot run (graph decode off CUDA)."""
        cuda = device_type == "cuda"
        resolved = {
            name: getattr(self, name) if getattr(self, name) is not None else on_cuda if cuda else other
            for name, (on_cuda, other) in _DEVICE_DEFAULTS.items()
        }
        mode = self.decode_mode
        if mode == "auto":
            mode = "graph" if cuda and self.copy_weights else "dynamic"
        if mode == "graph" and not cuda:
            raise ValueError(f"decode_mode 'graph' needs a CUDA device, not {device_type}")
        keeps_prefix = self.copy_weights and self.decode_attention == "grouped" and mode == "dynamic"
        return self.model_copy(update={
            **resolved, "decode_mode": mode,
            "prefix_attention_min_tokens": self.prefix_attention_min_tokens if keeps_prefix else 0,
        })


class VLLMConfig(Section):
    """The vLLM rollout engine (`rollout.engine: vllm`, or `auto` on CUDA with vllm installed), on
    a CUDA GPU or on the CPU (vLLM's CPU build).

    Environment variables override two fields (a bad value is an error naming the variable):
    `VLLM_MAX_MODEL_LEN` -> `max_model_len`, `VLLM_GPU_MEMORY_UTILIZATION` ->
    `gpu_memory_utilization` (and `ENABLE_VLLM=0` picks the HF engine instead)."""

    gpu_memory_utilization: float | None = Field(default=None, gt=0.0, le=1.0)
    """Fraction of the GPU's memory vLLM may take (weights + KV cache); training gets the rest.
    null: 0.3. On a CPU vLLM reads it as the fraction of host RAM to reserve and refuses to start
    when that much is not free; there `kv_cache_gib` is the setting to use."""
    kv_cache_gib: float | None = Field(default=None, gt=0.0)
    """vLLM's KV cache in GiB (it sets the cache's size instead of `gpu_memory_utilization`).
    null: on a CPU 2 GiB unless `gpu_memory_utilization` is set (vllm_params.memory_kwargs); on
    CUDA whatever `gpu_memory_utilization` leaves after the weights."""
    max_model_len: int | None = Field(default=None, ge=16)
    """Longest sequence (prompt + completion) vLLM serves; null = `rollout.max_total_tokens`."""
    enable_sleep_mode: bool = False
    """Let the engine release its GPU memory while the trainer updates (`RolloutEngine.sleep`):
    level-1 sleep offloads weights to CPU and drops the KV cache; the next generate or weight
    sync wakes it. Costs a CPU copy of the weights and a wake-up per step. CUDA only."""
    enforce_eager: bool = False
    """Skip CUDA-graph capture on a GPU, torch.compile on a CPU (faster start, slower decode)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """vLLM's weight/compute dtype; `auto` = the trainer's compute dtype (`model.dtype`)."""
    enable_prefix_caching: bool = True
    """Reuse the KV cache of shared prefixes: the G samples of a group, and earlier turns."""
    logprobs_mode: Literal["auto", "raw_logprobs", "processed_logprobs"] = "auto"
    """Which log-probs vLLM returns. `raw_logprobs`: log softmax(logits), right only at
    temperature 1 (or greedy); `processed_logprobs`: after temperature and top-p, right only with
    top_p = 1. `auto` picks the one that equals the trainer's log softmax(logits / T)."""
    quantization: Literal["auto", "none", "bitsandbytes"] = "auto"
    """vLLM weight quantization; `auto` = bitsandbytes 4-bit when `model.load_in_4bit`."""
    max_num_seqs: int | None = Field(default=None, ge=1)
    """Most sequences vLLM decodes at once (null = vLLM's default)."""


class VLLMServerConfig(Section):
    """Already-running `vllm serve` processes that sample over HTTP (`rollout.engine:
    vllm_server`, grpo/rollout/vllm/server.py). Each server must be started from the policy's base
    model with the flags `vllm_server_args` names (grpo/rollout/vllm/server.py), which
    `python -m launch.vllm_servers` uses to start them on this machine."""

    urls: list[str] = Field(default_factory=list)
    """Base URLs of the servers (`http://host:port`); requests are spread over them."""
    weights_dir: str | None = None
    """A directory every server can read (on other nodes: a shared filesystem) where the trainer
    publishes each adapter version (LoRA) or weight version (full fine-tuning) for the servers to
    load. null: a temporary directory (servers on this machine)."""
    request_timeout_s: float = Field(default=300.0, gt=0.0)
    """A request a server has not answered in full within this long (one deadline for the whole
    exchange: connecting, sending, and every byte of the answer) counts as a failure of that
    server (a stalled or dripping server never holds a step longer) and goes to another server."""
    connect_timeout_s: float = Field(default=5.0, gt=0.0)
    """How long to wait for a server to accept a connection."""
    retry_after_s: float = Field(default=30.0, ge=0.0)
    """A server that failed gets no requests for this long; then it is tried again (after it has
    been brought up to the current weights)."""


class RolloutConfig(Section):
    engine: Literal["auto", "hf", "vllm", "vllm_server"] = "auto"
    """What samples the rollouts (grpo/rollout/): `hf` our KV-cached engine on the training device
    (CPU, CUDA, MPS); `vllm` vLLM in the training process (CUDA, or the CPU with vLLM's CPU
    build); `vllm_server` already-running `vllm serve` processes over HTTP (`rollout.vllm_server`).
    `auto`: vllm on CUDA when the package is installed and `ENABLE_VLLM` is not 0, else
    hf. `ENABLE_VLLM=0` also turns an explicit vllm into hf (logged)."""
    temperature: float = Field(default=1.0, ge=0.0)
    """Sampling temperature (0 = greedy)."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling."""
    max_new_tokens: int = Field(default=128, ge=1)
    """Tokens the model may write per turn."""
    max_total_tokens: int = Field(default=2048, ge=16)
    """Hard cap on an episode's whole token sequence (prompt + turns + observations)."""
    max_concurrent_episodes: int = Field(default=64, ge=1)
    """Episodes in flight at once in the collector."""
    episode_retries: int = Field(default=1, ge=0)
    """Retries of an episode that failed (engine or tool-layer error) before it is excluded."""
    eval_temperature: float = Field(default=0.0, ge=0.0)
    """Temperature of held-out evaluation (0 = greedy)."""
    hf: HFEngineConfig = Field(default_factory=HFEngineConfig)
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    vllm_server: VLLMServerConfig = Field(default_factory=VLLMServerConfig)

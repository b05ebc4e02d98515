"""What one training step will hold in memory at worst, estimated from the config before the run.

A size that no machine can hold (`algorithm.group_size=1e12`, `rollout.max_total_tokens=1e18`)
passes every field's own check; the run then fails far from the cause (a MemoryError deep in
the collector). Fixed caps would also refuse a GPU's legitimate 512-episode step, so instead the
step's largest holdings are estimated from the config and the model's shape, each where it lives,
and compared with what is available there (`check_step_memory`):

- **trajectories** (host): every episode of the step at `rollout.max_total_tokens` tokens, at
  TRAJECTORY_BYTES_PER_TOKEN (with `train.async_rollouts`, also a full queue of finished groups
  and the round that overflows it);
- **the KV cache of the rollout rows** (the training device, with our `hf` engine): the rows
  decoded at once (the engine's `max_batch_size`, at most the step's episodes and
  `rollout.max_concurrent_episodes`) at full length, keys and values of every layer in the
  compute dtype. vLLM reserves its own cache from its settings and checks it at start;
  `vllm_server`'s live on other machines;
- **the log-prob chunks** (the training device): one chunk of fp32 logits with its low-precision
  copy and gradient (grpo/forward/logprobs.py).

The worst case is the bound: every episode at full length. Not counted: the model's weights and
optimizer state (the model fixes them, not these fields, and loading it fails clearly), and a
micro-batch's activations, which `algorithm.optimizer.micro_batch_tokens` bounds and which at
full length would be far above what real steps hold (the sequences are mostly short): counting
them would refuse configs that run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from transformers import AutoConfig

from grpo.forward.logprobs import DEFAULT_CHUNK_SIZE
from grpo.models.devices import compute_dtype
from grpo.models.source import load_tokenizer, resolve_model_dir, tiny_model_config

TRAJECTORY_BYTES_PER_TOKEN = 100
"""A collected token held as Python lists (an int id 36 B, its mask 8 B, its log-prob 32 B) and
again as the update's tensors (id 8 B, mask 1 B, four fp32 log-prob and advantage columns 16 B)."""

class StepMemoryError(ValueError):
    """The config's step cannot fit the memory available; the message names the fields, the
    estimate and what is available."""


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a causal LM that the estimate needs."""

    layers: int
    hidden_size: int
    kv_heads: int
    head_dim: int
    vocab_size: int

    @classmethod
    def from_hf_config(cls, config) -> ModelShape:
        """From a transformers config (its text model's, for a multimodal one)."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        return cls(text.num_hidden_layers, text.hidden_size,
                   getattr(text, "num_key_value_heads", None) or heads, head_dim, text.vocab_size)


@dataclass(frozen=True)
class MemoryTerm:
    what: str
    place: str
    """`host` or `device` (the training device, when it is not the host's memory)."""
    bytes: int
    formula: str
    """The fields and numbers it comes from, e.g. `train.tasks_per_step 8 x ... x 100 B`."""


def model_shape(model_config) -> ModelShape:
    """The shape of the model a `model` config section names, read from its config.json (or
    built for `tiny-random`) without loading its weights."""
    model_dir = resolve_model_dir(model_config.name_or_path, model_config.cache_dir)
    if model_dir is None:
        tokenizer = load_tokenizer(model_config.name_or_path, model_config.cache_dir)
        return ModelShape.from_hf_config(
            tiny_model_config(tokenizer, model_config.tiny_layers, model_config.tiny_hidden_size))
    return ModelShape.from_hf_config(AutoConfig.from_pretrained(str(model_dir)))


def estimate_step_memory(config, shape: ModelShape, device: torch.device, engine: str) -> list[MemoryTerm]:
    """The step's largest holdings at worst (see the module docstring). `config` is a RunConfig;
    `engine` the rollout engine chosen (`hf`, `vllm`, `vllm_server`)."""
    rollout, optimizer = config.rollout, config.algorithm.optimizer
    tokens = rollout.max_total_tokens
    episodes = config.train.tasks_per_step * config.algorithm.group_size
    dtype_bytes = torch.finfo(compute_dtype(device, config.model.dtype)).bits // 8
    on_device = "host" if device.type in ("cpu", "mps") else "device"  # MPS memory is the host's
    groups, counted = config.train.tasks_per_step, f"train.tasks_per_step {config.train.tasks_per_step:,}"
    asynchronous = config.train.async_rollouts
    if asynchronous.enabled:  # the step's groups, a full queue, and the round that overflows it
        queue = asynchronous.max_queue_groups or groups
        round_tasks = asynchronous.round_tasks or groups
        groups += queue + round_tasks
        counted = f"({counted} + queue {queue:,} + a round {round_tasks:,} of train.async_rollouts)"
    terms = [MemoryTerm(
        "trajectories", "host", groups * config.algorithm.group_size * tokens * TRAJECTORY_BYTES_PER_TOKEN,
        f"{counted} x algorithm.group_size {config.algorithm.group_size:,} x rollout.max_total_tokens "
        f"{tokens:,} x {TRAJECTORY_BYTES_PER_TOKEN} B")]
    if engine == "hf":
        batch = rollout.hf.for_device(device.type).max_batch_size
        rows = min(batch, episodes, rollout.max_concurrent_episodes)
        per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * dtype_bytes
        terms.append(MemoryTerm(
            "KV cache of the rollout rows", on_device, rows * tokens * per_token,
            f"{rows:,} rows (the least of rollout.hf.max_batch_size {batch:,}, the step's "
            f"{episodes:,} episodes, rollout.max_concurrent_episodes "
            f"{rollout.max_concurrent_episodes:,}) x rollout.max_total_tokens {tokens:,} x "
            f"{per_token:,} B (keys and values of {shape.layers} layers)"))
    batch_tokens = min(optimizer.micro_batch_size, episodes) * tokens
    chunk_rows = min(DEFAULT_CHUNK_SIZE, batch_tokens)
    terms.append(MemoryTerm(
        "log-prob chunks", on_device, chunk_rows * shape.vocab_size * (8 + dtype_bytes),
        f"{chunk_rows:,} positions x vocabulary {shape.vocab_size:,} x {8 + dtype_bytes} B"))
    return terms


def available_memory(device: torch.device) -> dict[str, int]:
    """Bytes available now: `host` (Linux MemAvailable, elsewhere the physical memory) and, on a
    CUDA device, `device` (its free memory)."""
    available = {"host": _host_available()}
    if device.type == "cuda":
        available["device"] = torch.cuda.mem_get_info(device)[0]
    return available


def _host_available() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def memory_problems(terms: list[MemoryTerm], available: dict[str, int]) -> list[str]:
    """One line per place whose terms together exceed what is available there: the estimate,
    what is available, and the terms largest first with the fields they come from."""
    problems = []
    for place, free in available.items():
        held = sorted((t for t in terms if t.place == place), key=lambda t: -t.bytes)
        total = sum(t.bytes for t in held)
        if total > free:
            where = "host memory" if place == "host" else "device memory"
            parts = "; ".join(f"{t.what} {format_bytes(t.bytes)} = {t.formula}" for t in held if t.bytes)
            problems.append(f"one step needs up to {format_bytes(total)} of {where}, "
                            f"{format_bytes(free)} available: {parts}")
    return problems


def memory_summary(terms: list[MemoryTerm], available: dict[str, int]) -> str:
    """`host 1.2 GiB of 21.0 GiB available; ...`: the estimate per place, for a passing check."""
    return "; ".join(
        f"{place} {format_bytes(sum(t.bytes for t in terms if t.place == place))} of "
        f"{format_bytes(free)} available" for place, free in available.items())


def check_step_memory(config, shape: ModelShape, device: torch.device, engine: str,
                      available: dict[str, int] | None = None) -> str:
    """The summary line when the step fits; raises StepMemoryError naming the fields otherwise."""
    terms = estimate_step_memory(config, shape, device, engine)
    available = available_memory(device) if available is None else available
    problems = memory_problems(terms, available)
    if problems:
        raise StepMemoryError("; and ".join(problems) + ". Lower the fields named (the worst case: "
                              "every episode at rollout.max_total_tokens)")
    return memory_summary(terms, available)


def format_bytes(size: int) -> str:
    """`512 B`, `1.5 GiB`, ..., and past PiB `3.2e+09 PiB`: absurd sizes stay one short word."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024:
            return f"{size} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} PiB" if size < 1e4 else f"{size:.2g} PiB"

"""Weight sync from the trained policy to the vLLM engine, through vLLM's public API only.

- LoRA runs: `LoraAdapterStore.publish(policy)` saves the peft adapter (`save_pretrained`) into a
  fresh directory and returns the (name, id, path) of a new `vllm.lora.request.LoRARequest`: every
  sync gets a new, larger id, so vLLM loads the new adapter on the next request without a restart
  (and its prefix cache, keyed by the adapter name, never serves KV computed by an older adapter).
  Only the newest `keep` adapter directories stay on disk.
- Servers (grpo/rollout/vllm_server.py) load from disk: `LoraAdapterStore` for adapters,
  `FullWeightStore` for a fully fine-tuned policy's weights (safetensors, Hugging Face names).
- Full fine-tuning in process: `full_weight_pairs(policy)` yields (name, tensor) pairs under the Hugging Face
  checkpoint names that vLLM's `model.load_weights` takes; the engine hands them to every worker
  with `LLM.collective_rpc` and the worker extension of grpo/rollout/vllm_worker.py.
- `export_base_model(policy, directory)`: a model directory vLLM can load when the policy has none
  on disk (the in-memory `tiny-random` model): the base weights (adapters left out) + tokenizer.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from grpo.models.peft_weights import base_model_of, is_peft, language_model_of, lm_tensors


@dataclass(frozen=True)
class PublishedAdapter:
    """What a `vllm.lora.request.LoRARequest` is built from."""

    name: str
    lora_id: int
    path: Path


class LoraAdapterStore:
    """Numbered adapter directories under `root` (a temporary directory when None).

    Ids start at 1 (vLLM refuses 0) and only grow; names are unique per id (vLLM compares
    LoRARequests by name). The newest `keep` directories are kept: the newest is the one vLLM
    reads on the next request, one older is a margin for a request still in flight."""

    def __init__(self, root: str | Path | None = None, *, keep: int = 2, prefix: str = "policy"):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self._owns_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="mcp-grpo-lora-")) if root is None else Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self.prefix = prefix
        self.current: PublishedAdapter | None = None
        self._published: list[PublishedAdapter] = []
        self._next_id = 1

    def _check(self, model) -> None:
        if not is_peft(model):
            raise TypeError("LoraAdapterStore.publish needs a peft (LoRA) policy")

    def _save(self, policy, directory: Path) -> None:
        language_model_of(policy).save_pretrained(str(directory))

    def publish(self, policy) -> PublishedAdapter:
        """Save the policy's current adapter as the next version and return it."""
        model = language_model_of(policy)
        self._check(model)
        lora_id = self._next_id
        path = self.root / f"v{lora_id:06d}"
        tmp = self.root / f".v{lora_id:06d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        self._save(policy, tmp)
        tmp.rename(path)  # vLLM never sees a half-written adapter
        adapter = PublishedAdapter(name=f"{self.prefix}-v{lora_id}", lora_id=lora_id, path=path)
        self._next_id += 1
        self._published.append(adapter)
        self.current = adapter
        while len(self._published) > self.keep:
            shutil.rmtree(self._published.pop(0).path, ignore_errors=True)
        return adapter

    def close(self) -> None:
        """Remove the adapter directories (the whole root when the store created it)."""
        for adapter in self._published:
            shutil.rmtree(adapter.path, ignore_errors=True)
        self._published.clear()
        if self._owns_root:
            shutil.rmtree(self.root, ignore_errors=True)


class FullWeightStore(LoraAdapterStore):
    """Numbered directories of a fully fine-tuned policy's weights (`save_full_weights`:
    config.json and safetensors under the names vLLM loads), as LoraAdapterStore keeps
    adapters: a server reloads the newest while a request may still read one older."""

    def __init__(self, root: str | Path | None = None, *, keep: int = 2, prefix: str = "weights"):
        super().__init__(root, keep=keep, prefix=prefix)

    def _check(self, model) -> None:
        if is_peft(model):
            raise TypeError("FullWeightStore is for full fine-tuning; LoRA runs publish the adapter")

    def _save(self, policy, directory: Path) -> None:
        save_full_weights(policy, directory)


def full_weight_pairs(policy) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of a fully fine-tuned policy's LM parameters, detached, under the
    Hugging Face checkpoint names (`model.layers.0.self_attn.q_proj.weight`, ...) that vLLM's
    `load_weights` maps onto its fused layers. Tensors are the live parameters (no copy). Buffers
    are not sent: vLLM builds its own (rotary tables) and never loads them.

    A tied output embedding comes twice, as the input embedding and as the head
    (`lm_head.weight`), unlike a checkpoint: vLLM's in-place reload (0.32) gives the embedding
    fresh storage and puts the head's old tensor back when nothing was loaded into it, so the
    head would keep sampling from the old embedding."""
    model = language_model_of(policy)
    if is_peft(model):
        raise TypeError("full_weight_pairs is for full fine-tuning; LoRA runs publish the adapter")
    names = {}
    for name, param in model.named_parameters():
        names[id(param)] = name
        yield name, param.detach()
    head = model.get_output_embeddings()
    if head is not None and names.get(id(head.weight)) != _module_name(model, head) + ".weight":
        yield _module_name(model, head) + ".weight", head.weight.detach()


def _module_name(model, module) -> str:
    return next(name for name, m in model.named_modules() if m is module)


def save_full_weights(policy, directory: str | Path) -> None:
    """Write `full_weight_pairs` (tied head included) as one safetensors file with the model's
    config.json: a directory vLLM's `reload_weights(weights_path=...)` reads."""
    from safetensors.torch import save_file

    model = language_model_of(policy)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(str(directory))
    # save_file refuses tensors that share memory (the tied head): every tensor gets its own copy.
    state = {name: t.to("cpu", copy=True).contiguous() for name, t in full_weight_pairs(policy)}
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})


def export_base_model(policy, directory: str | Path, tokenizer=None) -> Path:
    """Write the policy's base LM (adapters left out) and tokenizer as a Hugging Face directory.

    For models that exist only in memory (`tiny-random`): it builds a fresh model of the same
    config on the CPU, so it is meant for small models; a model loaded from a directory is served
    from that directory instead (grpo/rollout/vllm.py)."""

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model = language_model_of(policy)
    fresh = AutoModelForCausalLM.from_config(base_model_of(model).config)
    state = {name: t.cpu() for name, t in lm_tensors(model, adapters=False).items()}
    result = fresh.load_state_dict(state, strict=False)
    expected = {name for name, _ in fresh.named_parameters()}
    missing = sorted(expected & set(result.missing_keys))
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"export_base_model: missing {missing[:5]}, unexpected {result.unexpected_keys[:5]}"
        )
    fresh.save_pretrained(str(directory))
    tokenizer = tokenizer if tokenizer is not None else getattr(policy, "tokenizer", None)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))
    return directory

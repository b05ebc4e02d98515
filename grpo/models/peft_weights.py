"""The one place that reads a causal LM's weights through peft/LoRA and bitsandbytes wrappers.

- `is_peft(model)`, `language_model_of(policy)`: recognise a peft model; find the causal LM
  inside a policy wrapper.
- `is_4bit_tensor(t)`: a bitsandbytes packed 4-bit weight (never averaged, never copied as is).
- `lm_tensors(model, adapters=True)`: the LM's parameters and buffers under the plain
  (un-wrapped) model's names — `...q_proj.weight`, never `...base_layer.weight` — with the active
  LoRA deltas folded in (`adapters=False`: the base weights alone), `modules_to_save` resolved
  (the active adapter's trained copy, or the original module without adapters), 4-bit weights
  dequantized and their quantization state left out. The model itself is never modified.
- `dequantize_linears_(model)`: replace bitsandbytes 4-bit Linear layers by plain ones in place
  (for an inference copy of a QLoRA policy).

Every consumer (the HF engine's weight copy, the vLLM base export, the merged Hugging Face save)
reads weights through `lm_tensors`, so an edge case is handled once for all of them.
"""

from __future__ import annotations

import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer
from peft.utils.integrations import dequantize_module_weight
from torch import nn
from transformers import PreTrainedModel


def is_peft(model) -> bool:
    return isinstance(model, PeftModel)


def is_4bit_tensor(tensor: torch.Tensor | None) -> bool:
    """A bitsandbytes 4-bit packed weight (its values are not floats and are never averaged)."""
    return type(tensor).__name__ == "Params4bit"


def language_model_of(policy) -> nn.Module:
    """The causal LM inside `policy`: the policy itself when it is a transformers model or a peft
    model, else the first such module found as `.model`, `.lm`, `.causal_lm` or `.pretrained_model`
    (wrappers that add a value head)."""
    if isinstance(policy, PreTrainedModel) or is_peft(policy):
        return policy
    for name in ("model", "lm", "causal_lm", "pretrained_model"):
        inner = getattr(policy, name, None)
        if isinstance(inner, PreTrainedModel) or is_peft(inner):
            return inner
    raise TypeError(
        f"cannot find a causal LM in {type(policy).__name__}: pass a transformers model, a peft "
        "model, or a wrapper holding one as .model / .lm / .causal_lm / .pretrained_model"
    )


def base_model_of(model: nn.Module) -> nn.Module:
    """The transformers model under a peft wrapper (adapter layers still injected), or `model`."""
    return model.get_base_model() if is_peft(model) else model


def _plain_name(name: str, adapters: bool) -> str | None:
    """The plain model's name for a wrapped tensor name, or None when the tensor is not part of
    the plain model (LoRA factors; the inactive side of a `modules_to_save` pair)."""
    if ".lora_" in name:
        return None
    if ".original_module." in name:
        # With adapters the trained copy stands in for it; without, it is the base module.
        return None if adapters else name.replace(".original_module.", ".")
    if ".modules_to_save." in name:  # `x.modules_to_save.<adapter>.weight` -> `x.weight`
        if not adapters:
            return None
        head, _, tail = name.partition(".modules_to_save.")
        return f"{head}.{tail.split('.', 1)[1]}"
    return name.replace(".base_layer.", ".")


def _unmerged_adapters(module: nn.Module) -> list[str]:
    if getattr(module, "disable_adapters", False):
        return []
    merged_already = getattr(module, "merged_adapters", [])
    return [a for a in module.active_adapters if a in module.lora_A and a not in merged_already]


@torch.no_grad()
def lm_tensors(model: nn.Module, *, adapters: bool = True) -> dict[str, torch.Tensor]:
    """See the module doc. Tensors are detached; unchanged ones share storage with the model."""
    base = base_model_of(model)
    quantized = {
        name: module for name, module in base.named_modules()
        if is_4bit_tensor(getattr(module, "weight", None))
    }
    quant_state_prefixes = tuple(f"{name}.weight." for name in quantized)
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in base.state_dict(keep_vars=True).items():
        if name.startswith(quant_state_prefixes):
            continue  # bitsandbytes quantization state (absmax, quant_map, ...)
        plain = _plain_name(name, adapters)
        if plain is None:
            continue
        module_name, _, leaf = name.rpartition(".")
        if module_name in quantized and leaf == "weight":
            tensor = dequantize_module_weight(quantized[module_name])
        tensors[plain] = tensor.detach()
    if adapters and is_peft(model):
        for name, module in base.named_modules():
            if not isinstance(module, LoraLayer):
                continue
            names = _unmerged_adapters(module)
            if names:
                key = f"{name}.weight"
                weight = tensors[key]
                delta = sum(module.get_delta_weight(a).float() for a in names)
                tensors[key] = (weight.float() + delta).to(weight.dtype)
    return tensors


def dequantize_linears_(model: nn.Module) -> None:
    """In place: every bitsandbytes 4-bit Linear of `model` becomes an `nn.Linear` holding its
    dequantized weight (dtype of the dequantization, the layer's compute dtype)."""
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if not is_4bit_tensor(getattr(child, "weight", None)):
                continue
            weight = dequantize_module_weight(child)
            plain = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None,
                              device="meta")
            plain.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
            if child.bias is not None:
                plain.bias = nn.Parameter(child.bias.detach().to(weight.dtype).clone(), requires_grad=False)
            setattr(parent, child_name, plain)

"""The engine copy's forward without transformers' module plumbing, for the families that have one.

HFEngine runs one forward of its weight copy per decode step (and per prefill chunk). Through
transformers that forward walks ~14 modules per layer (each `nn.Module.__call__` with its hook
checks), keyword plumbing and decorators, the mask preprocessing, the fused q/k/v and gate/up
members handing out their slices, and the attention interface lookup. At decode shapes, where
the matmuls are small, that Python is a large share of the step, most of all on a CPU
(`python -m bench.generation --variants fp32-transformers-forward fp32` compares the two
forwards on SmolLM2-135M).

`LeanForward` runs the same tensor operations in the same order on the same weights: each
RMSNorm's and Linear's own `forward` (the engine copy's fused norms and packed matmuls), the
rotary embedding module once per forward, the family's attention inputs (its projections, any
per-head norms and its own rotary formula: `Architecture.lean`, families/), the cache's
`update`, and the engine's attention function (decode_attention.py) with the 4-D boolean mask
the engine built. So its logits are bit for bit those of `model(...)`: `build` checks that on a
probe (a two-row left-padded prefill, then a decode step, through both) before the engine uses
it, and tests/test_lean_forward.py checks whole generations, joins, resumed sessions and the
kept prefix.

It covers the model classes its family record names (families/: Llama, Qwen2, Qwen3) with the
engine's own weight copy and its attention. Where the copy fuses q/k/v and gate/up into one
matmul each (bf16 copies, fp32 ones on an x86-64 CPU), the fused product is split; where it
keeps them as separate Linear layers (an fp32 copy on a GPU, MPS or an ARM CPU), each is called
in transformers' order. For anything else `build` says why not and the engine keeps
transformers' forward. Hooks are looked for when the engine is built: a forward hook registered
on the copy (or globally) later is not called by the lean forward.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import DynamicCache

from grpo.forward.cache_argument import cache_keyword
from grpo.rollout.hf.architecture import Architecture, LeanLayer
from grpo.rollout.hf.decode_attention import ENGINE_ATTENTION, PrefixAttention, engine_attention
from grpo.rollout.hf.weights import FusedGroup, FusedMember

PROBE_TOKENS = 6
"""Prompt length of the build-time probe (its second row is left-padded by 2)."""


def _group_of(members: list[nn.Module]) -> FusedGroup | None:
    """The fused group these members are, in order, all of; else None."""
    if not all(isinstance(m, FusedMember) for m in members):
        return None
    group = members[0].group
    same = all(m.group is group and m.index == i for i, m in enumerate(members))
    return group if same and len(group.bounds) == len(members) + 1 else None


def _projections(members: list[nn.Module]):
    """One fused matmul for all `members`, or each member's own forward (called in this order,
    as transformers' modules call them)."""
    group = _group_of(members)
    return tuple(m.forward for m in members) if group is None else group


def unsupported(model: nn.Module, architecture: Architecture) -> str | None:
    """Why `model` (an HFEngine weight copy of the family `architecture`) cannot run the lean
    forward, or None."""
    if architecture.lean is None:
        return (f"no lean forward for model type {getattr(model.config, 'model_type', None)!r} "
                "(grpo/rollout/hf/families/)")
    classes = architecture.lean.classes.parts()
    base = getattr(model, "model", None)
    parts = [("the model", model), ("its base model", base)]
    for layer in getattr(base, "layers", []):
        parts += [("a decoder layer", layer), ("an attention layer", layer.self_attn),
                  ("an MLP", layer.mlp)]
    for what, module in parts:
        if type(module) is not classes[what]:
            return f"{what} is {type(module).__name__}, not transformers' {classes[what].__name__}"
        if "forward" in vars(module):
            return f"{what} has a forward of its own"
    if model.config._attn_implementation != ENGINE_ATTENTION:
        return f"its attention is {model.config._attn_implementation!r}, not the engine's"
    hooked = [name for name, m in model.named_modules() if m._forward_hooks or m._forward_pre_hooks]
    if hooked:
        return f"forward hooks are registered on {hooked[:3]}"
    if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        return "global forward hooks are registered"
    return None


class LeanForward:
    """`forward(input_ids, attention_mask, position_ids, cache, shared_prefix)` -> the logits of
    each row's last position, [n, V]: what `ModelRunner.forward` gets from `model(...)`."""

    def __init__(self, model: nn.Module, architecture: Architecture) -> None:
        base = model.model
        self.attention_inputs = architecture.lean.attention_inputs
        self.embed, self.rotary = base.embed_tokens, base.rotary_emb
        self.norm, self.head = base.norm.forward, model.lm_head.forward
        self.layers = [
            LeanLayer(
                input_norm=layer.input_layernorm.forward,
                qkv=_projections([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]),
                attention=layer.self_attn,
                o_proj=layer.self_attn.o_proj.forward,
                post_norm=layer.post_attention_layernorm.forward,
                gate_up=_projections([layer.mlp.gate_proj, layer.mlp.up_proj]),
                act=layer.mlp.act_fn,
                down=layer.mlp.down_proj.forward,
            )
            for layer in base.layers
        ]

    @classmethod
    def build(
        cls, model: nn.Module, architecture: Architecture
    ) -> tuple[LeanForward | None, str | None]:
        """The lean forward of `model` (of the family `architecture`) and None, or None and why
        not (`unsupported`, or the probe gave other logits than the model's own forward)."""
        reason = unsupported(model, architecture)
        if reason is not None:
            return None, reason
        lean = cls(model, architecture)
        try:
            mismatch = lean._probe(model)
        except Exception as error:  # noqa: BLE001 (whatever it was, transformers' forward stays)
            return None, f"the probe failed: {type(error).__name__}: {error}"
        return (None, mismatch) if mismatch else (lean, None)

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache,
        shared_prefix: PrefixAttention | None = None,
    ) -> torch.Tensor:
        hidden = self.embed(input_ids)  # [n, T, hidden]
        cos, sin = self.rotary(hidden, position_ids)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # broadcast over heads: [n, 1, T, D]
        rows, width = input_ids.shape
        extra = {} if shared_prefix is None else {"shared_prefix": shared_prefix}
        for layer in self.layers:
            attn = layer.attention
            query, key, value = self.attention_inputs(layer, layer.input_norm(hidden), cos, sin)
            key, value = cache.update(key, value, attn.layer_idx)
            out, _ = engine_attention(
                attn, query, key, value, attention_mask, dropout=0.0, scaling=attn.scaling, **extra
            )
            hidden = hidden + layer.o_proj(out.reshape(rows, width, -1).contiguous())
            x = layer.post_norm(hidden)
            if isinstance(layer.gate_up, FusedGroup):
                gate_up = layer.gate_up.compute(x)
                split = layer.gate_up.bounds[1]
                gate, up = gate_up[..., :split], gate_up[..., split:]
            else:
                gate, up = layer.gate_up[0](x), layer.gate_up[1](x)
            hidden = hidden + layer.down(layer.act(gate) * up)
        return self.head(self.norm(hidden)[:, -1:])[:, -1]

    __call__ = forward

    def _probe(self, model: nn.Module) -> str | None:
        """None if this forward gives the model's own logits, bit for bit, on a two-row prefill
        (the second row left-padded) and a decode step after it; else what differed."""
        device = model.lm_head.weight.device
        vocab = model.config.vocab_size
        ids = torch.arange(2 * PROBE_TOKENS, device=device).view(2, PROBE_TOKENS) * 7919 % vocab
        real = torch.ones(2, PROBE_TOKENS, dtype=torch.bool, device=device)
        real[1, :2] = False  # row 1: two pad columns on the left
        positions = (real.long().cumsum(-1) - 1).clamp_(min=0)
        causal = torch.ones(PROBE_TOKENS, PROBE_TOKENS, dtype=torch.bool, device=device).tril()
        allowed = causal & real[:, None, :]
        allowed |= torch.eye(PROBE_TOKENS, dtype=torch.bool, device=device)  # pads see themselves
        steps = [(ids, allowed[:, None], positions)]
        steps.append((ids[:, :1], torch.cat([real, real[:, :1]], -1)[:, None, None],
                      positions[:, -1:] + 1))
        caches = (DynamicCache(config=model.config), DynamicCache(config=model.config))
        for step, (step_ids, mask, pos) in enumerate(steps):
            with torch.no_grad():
                want = model(input_ids=step_ids, attention_mask=mask, position_ids=pos,
                             **{cache_keyword(model): caches[0]}, use_cache=True, logits_to_keep=1).logits[:, -1]
            got = self.forward(step_ids, mask, pos, caches[1])
            if not torch.equal(want, got):
                gap = (want.float() - got.float()).abs().max().item()
                return f"the probe's {('prefill', 'decode step')[step]} logits differ from the model's by up to {gap:.3g}"
        return None


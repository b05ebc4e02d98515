"""The engine copy's RMSNorm layers as one `F.rms_norm` call each.

transformers writes a Llama-style RMSNorm as separate ops: cast up, square, mean, add epsilon,
rsqrt, multiply, cast back, multiply by the weight. A decode step runs two per decoder layer plus
the final one (61 for SmolLM2-135M), each op a kernel on a GPU -- inside a CUDA graph every one of
them still costs a launch slot -- and a dispatch on a CPU. `torch.rms_norm` computes the same
function as one op: a fused kernel on CUDA; on a CPU torch composes it from the same ops, so
there it only saves the Python module around them.

Which layers: the model family's RMSNorm layers (`Architecture.is_norm`, architecture.py: the
family's own classes, or any class named "*RMSNorm" for a family without a record) with a 1-D
weight and an epsilon (`variance_epsilon` or `eps`), and whose own forward gives what `F.rms_norm` gives on a probe (a
seeded random input in the weight's dtype, the layer's own weight), within the dtype's rounding
(`torch.testing.assert_close`'s default tolerance). A variant with another formula -- Gemma's
`(1 + weight)` scale, a norm with a bias or a different mean -- fails the probe and keeps its
forward. The layer keeps its class, parameters and names (sync_weights copies by name into the
same weight); only the instance's `forward` is replaced, and an input whose dtype is not the
weight's goes to the class's own forward, since `F.rms_norm` rounds such mixes differently.

In fp32 on a CPU the results are the same bits as transformers' forward (tests/test_fused_norms.py);
a fused CUDA kernel sums in its own order (the last bits), and in bf16 it rounds once where
transformers rounds the normalised states before the weight's product (up to one bf16 step). The
trainer keeps transformers' layers: the engine-vs-trainer log-prob mismatch covers the difference.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

PROBE_SHAPE = (2, 5)
"""Leading dimensions of the probe input (its last one is the layer's width)."""


def _epsilon(module: nn.Module) -> float | None:
    for name in ("variance_epsilon", "eps"):
        value = getattr(module, name, None)
        if isinstance(value, float):
            return value
    return None


def _candidate(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        isinstance(weight, nn.Parameter)
        and weight.dim() == 1
        and getattr(module, "bias", None) is None
        and _epsilon(module) is not None
    )


def _fused_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """A fused layer's forward, bound to the layer (a deep copy binds it to the copy)."""
    if hidden_states.dtype != self.weight.dtype:
        return type(self).forward(self, hidden_states)
    return F.rms_norm(hidden_states, (hidden_states.shape[-1],), self.weight, _epsilon(self))


@torch.no_grad()
def agrees_with_rms_norm(module: nn.Module) -> bool:
    """Does `module` compute `F.rms_norm` with its weight and epsilon (the probe above)?"""
    weight = module.weight
    generator = torch.Generator().manual_seed(0)
    probe = (3 * torch.randn(*PROBE_SHAPE, weight.shape[0], generator=generator)).to(
        device=weight.device, dtype=weight.dtype
    )
    expected = type(module).forward(module, probe)
    fused = F.rms_norm(probe, (weight.shape[0],), weight, _epsilon(module))
    try:
        torch.testing.assert_close(fused, expected)
    except AssertionError:
        return False
    return True


def fuse_rms_norms(model: nn.Module, is_norm: Callable[[nn.Module], bool]) -> int:
    """Give every RMSNorm layer of `model` (an engine copy; `is_norm`: the model family's rule,
    `Architecture.is_norm`) that passes the probe the one-op forward; returns how many did."""
    fused = 0
    for module in model.modules():
        if (is_norm(module) and _candidate(module) and "forward" not in vars(module)
                and agrees_with_rms_norm(module)):
            module.forward = types.MethodType(_fused_forward, module)
            fused += 1
    return fused

"""What a transformers model calls its KV cache: the forward's keyword and the output's field.

transformers 5 renamed `past_key_values` to `cache` (the old keyword still works, with a
FutureWarning on every call, until its removal in 5.40); releases before 5 know only
`past_key_values`. pyproject allows both, so the callers that hand a model a cache or read one
back (the rollout engine's forwards, the update's segments and common prefix) ask here instead
of naming either.
"""

from __future__ import annotations

import functools
import inspect

from torch import nn

NEW, OLD = "cache", "past_key_values"


@functools.cache
def _forward_takes(cls: type, name: str) -> bool:
    return name in inspect.signature(cls.forward).parameters


def cache_keyword(model: nn.Module) -> str:
    """The keyword `model`'s forward takes its KV cache as. A wrapper that forwards **kwargs (a
    peft model) is asked for the module it wraps."""
    while not _forward_takes(type(model), NEW) and not _forward_takes(type(model), OLD):
        inner = getattr(model, "base_model", None)
        inner = getattr(inner, "model", inner) if inner is not None else None
        if inner is None or inner is model:
            return OLD
        model = inner
    return NEW if _forward_takes(type(model), NEW) else OLD


def output_cache(output):
    """The KV cache a forward returned (`output.cache`, or `output.past_key_values` before 5)."""
    fields = getattr(output, "__dataclass_fields__", None) or {}
    return getattr(output, NEW) if NEW in fields else getattr(output, OLD)

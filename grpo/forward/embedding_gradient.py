"""The input embedding's weight gradient in a buffer reused between backward passes (CPU).

torch's embedding backward returns its weight's gradient dense: a zero-filled [V, H] tensor with
the looked-up rows added. On a CPU every [V, H] fp32 block is fresh memory (glibc maps blocks over
32 MiB anew and the kernel faults them in page by page: ~100-150 ms for SmolLM2's 113 MB on a
2-core CPU), and a forward run as prefix segments looks the embedding up once per
segment, so an update pays that per segment and micro-batch.

`ReusedEmbeddingGradient.install(embedding)` makes that module's lookups (with gradients, on a CPU,
in one process) return their gradient in one [V, H] buffer per thread that stays zero outside the
rows the last lookup wrote: each row the sum of its tokens' gradients in token order, as torch's
dense backward sums them, so the same numbers. Autograd adds it into the weight's other gradient
(a tied LM head's) in place, or copies it into the parameter's gradient; it never keeps the
buffer, which the next lookup's backward reuses, unless autograd still holds it (its use count),
then it gets a fresh tensor as before.
"""

from __future__ import annotations

import functools
import threading

import torch
import torch.nn.functional as F
from torch import nn


class _Buffers(threading.local):
    """One gradient-shaped buffer per (shape, dtype) and thread, zero outside the rows last written."""

    def __init__(self) -> None:
        self.buffers: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def write(self, shape: torch.Size, rows: torch.Tensor, sums: torch.Tensor) -> torch.Tensor | None:
        """The buffer with `sums` [U, H] in `rows` [U] and zeros elsewhere, or None while something
        besides this holder still has it (then it is left as it is)."""
        key = (tuple(shape), sums.dtype)
        buffer, written = self.buffers.get(key, (None, None))
        if buffer is None:
            buffer = torch.zeros(shape, dtype=sums.dtype)
        elif not _only_holder(buffer):
            return None
        else:
            buffer.index_fill_(0, written, 0)
        self.buffers[key] = (buffer.index_copy_(0, rows, sums), rows)
        return buffer


def _storage_holders(tensor: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


@functools.cache
def _holders_alone() -> int:
    """What `_storage_holders` reads for a storage that one tensor alone holds."""
    return _storage_holders(torch.zeros(1))


def _only_holder(buffer: torch.Tensor) -> bool:
    """Whether this module's reference is the tensor's only one and the tensor its storage's only
    user (autograd's input buffer holds the tensor itself; a gradient taken over would be a view).
    On a torch without these counts: never (every backward gets a tensor of its own)."""
    try:
        return buffer._use_count() == 1 and _storage_holders(buffer) == _holders_alone()
    except AttributeError:
        return False


_BUFFERS = _Buffers()


class _EmbeddingLookup(torch.autograd.Function):
    """weight[ids]; the backward writes each distinct id's summed gradient row into the reused
    buffer (none for `padding_idx`, as torch's embedding backward)."""

    @staticmethod
    def forward(ctx, ids, weight, padding_idx):
        ctx.save_for_backward(ids)
        ctx.weight_meta = (weight.shape, weight.dtype)
        ctx.padding_idx = padding_idx
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, grad):
        (ids,) = ctx.saved_tensors
        shape, dtype = ctx.weight_meta
        flat_ids, flat_grad = ids.reshape(-1), grad.reshape(-1, grad.shape[-1]).to(dtype)  # [N], [N, H]
        if ctx.padding_idx is not None:
            keep = flat_ids != ctx.padding_idx
            flat_ids, flat_grad = flat_ids[keep], flat_grad[keep]
        rows, inverse = torch.unique(flat_ids, sorted=True, return_inverse=True)  # [U], [N]
        sums = flat_grad.new_zeros(rows.shape[0], flat_grad.shape[1]).index_add_(0, inverse, flat_grad)  # [U, H]
        weight_grad = _BUFFERS.write(shape, rows, sums)
        if weight_grad is None:  # autograd still holds the buffer: a tensor of its own
            weight_grad = torch.zeros(shape, dtype=dtype).index_copy_(0, rows, sums)
        return None, weight_grad, None


class ReusedEmbeddingGradient:
    """The forward hook `install` attaches to an embedding module; `remove` detaches it."""

    def __init__(self, embedding: nn.Embedding):
        self._handle = embedding.register_forward_hook(self._lookup)

    @classmethod
    def install(cls, embedding: nn.Module) -> ReusedEmbeddingGradient | None:
        """Attach to a plain, trainable `nn.Embedding`; None for anything else (it keeps its own
        backward) and where one is attached already (a module copied with its hooks)."""
        if type(embedding) is not nn.Embedding or not embedding.weight.requires_grad:
            return None
        if embedding.max_norm is not None or embedding.scale_grad_by_freq or embedding.sparse:
            return None
        if any(hook is cls._lookup for hook in embedding._forward_hooks.values()):
            return None
        return cls(embedding)

    def remove(self) -> None:
        self._handle.remove()

    @classmethod
    def remove_from(cls, model: nn.Module) -> int:
        """Detach the hook from every module of `model`, a copy that never trains (an engine's
        weight copy inherits it through deepcopy, and transformers' forward would call it at
        every step); returns how many were detached."""
        removed = 0
        for module in model.modules():
            for key, hook in list(module._forward_hooks.items()):
                if hook is cls._lookup:
                    del module._forward_hooks[key]
                    module._forward_hooks_with_kwargs.pop(key, None)
                    module._forward_hooks_always_called.pop(key, None)
                    removed += 1
        return removed

    @staticmethod
    def _lookup(module: nn.Embedding, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
        weight = module.weight
        if not (torch.is_grad_enabled() and weight.requires_grad and weight.device.type == "cpu"):
            return None
        # DeepSpeed's partitioned parameters and DDP's gradient buckets hook the gradient themselves.
        if hasattr(weight, "ds_id") or (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return None
        # The module's own output is dropped with its graph; looking the rows up again is a gather.
        return _EmbeddingLookup.apply(args[0], weight, module.padding_idx)

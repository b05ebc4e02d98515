"""Scratch buffers a thread keeps between calls, so that large temporaries reuse warm memory.

On a CPU torch takes every tensor from glibc's malloc, which maps each block over its (dynamic, at
most 32 MiB) threshold fresh, and the kernel then faults the block in page by page: a standard
update on a 2-core CPU spent ~0.5 s of 3.4 s faulting in weight-sized temporaries. A `Scratch`
hands out views of buffers it keeps, one per (name, dtype) and thread, each grown to the largest
request. Users: the fused LM head (grpo/forward/logprobs.py) and the CPU training attention
(grpo/forward/training_attention.py).

A buffer is only ever used within one forward or one backward and is never saved for a later one
nor returned to a caller, except through `claim`, whose holder checks with `holds` that no later
claim has taken it. CUDA's caching allocator already reuses its memory: off the CPU every request
is a new tensor. A request over MAX_BUFFER_BYTES is a new tensor too, so one very long batch does
not leave gigabytes held for the rest of a run.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import torch

MAX_BUFFER_BYTES = 512 * 2**20
"""Largest buffer kept between calls; larger requests get a tensor of their own each time."""


class Scratch(threading.local):
    """Named CPU buffers that outlive a call, one set per thread (see the module docstring)."""

    def __init__(self) -> None:
        self.buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}
        self.claims: dict[tuple[str, torch.dtype], object] = {}

    def take(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        numel = math.prod(shape)
        if device.type != "cpu" or numel * dtype.itemsize > MAX_BUFFER_BYTES:
            return torch.empty(shape, dtype=dtype, device=device)
        buffer = self.buffers.get((name, dtype))
        if buffer is None or buffer.numel() < numel:
            # A normal tensor even when first asked for under inference_mode (sampling with the
            # policy itself): an inference tensor refuses the in-place writes of a later update.
            with torch.inference_mode(False):
                buffer = self.buffers[(name, dtype)] = torch.empty(numel, dtype=dtype)
        return buffer[:numel].view(shape)

    def claim(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Claim:
        """A buffer (as `take`) that a later backward may read: valid until the next claim of the
        same name and dtype on this thread (`holds`). Off the CPU the tensor is new and stays valid."""
        token = object() if device.type == "cpu" else None
        if token is not None:
            self.claims[(name, dtype)] = token
        return Claim(self.take(name, shape, dtype, device), name, token)

    def holds(self, claim: Claim) -> torch.Tensor | None:
        """The claimed tensor while no later claim has taken its buffer, else None."""
        if claim.token is None or self.claims.get((claim.name, claim.tensor.dtype)) is claim.token:
            return claim.tensor
        return None


@dataclass(frozen=True)
class Claim:
    tensor: torch.Tensor
    name: str
    token: object | None


SCRATCH = Scratch()
"""The process's scratch buffers (thread-local contents)."""

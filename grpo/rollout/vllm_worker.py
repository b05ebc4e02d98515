"""The vLLM worker extension that receives full-weight updates.

vLLM mixes the class named by the engine argument `worker_extension_cls` into its worker (GPU or
CPU); `LLM.collective_rpc("method", args=...)` then runs the method on every worker.

`grpo_load_weights` copies (name, tensor) pairs under Hugging Face checkpoint names into the
served model through the worker's own public `reload_weights(weights_iterator=...)` where the
vLLM in use has it: an in-place reload that restores each layer's checkpoint-format loaders,
loads, and processes the weights again as at start-up. A plain `model.load_weights` fails once
the weights were processed into a kernel layout (vLLM's CPU backend repacks its linear layers at
start-up, and the packed parameters have no `weight_loader`: `AttributeError: 'Parameter'
object has no attribute 'weight_loader'`). Older vLLMs, whose `reload_weights` takes no weights,
get `model.load_weights`, the route of their RLHF examples.

The engine runs in-process (grpo/rollout/vllm.py), so `collective_rpc` passes the trainer's
tensors by reference: no serialization, no second copy. This module imports nothing from vllm, so
the worker loads it by its dotted name.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable

import torch

WORKER_EXTENSION = "grpo.rollout.vllm_worker.WeightSyncWorkerExtension"


def reload_takes_weights(reload_weights) -> bool:
    """Whether a worker's `reload_weights` accepts the weights to load (`weights_iterator`):
    0.32's worker forwards `*args, **kwargs` to its model runner; older ones take nothing."""
    if reload_weights is None:
        return False
    try:
        inspect.signature(reload_weights).bind(weights_iterator=[], is_checkpoint_format=True)
    except TypeError:
        return False
    return True


class WeightSyncWorkerExtension:
    """Methods vLLM adds to its worker (`self` is the worker)."""

    def grpo_load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy (name, tensor) pairs into the served model; returns how many were given."""
        pairs = list(weights)
        reload_weights = getattr(self, "reload_weights", None)
        if reload_takes_weights(reload_weights):
            reload_weights(weights_iterator=pairs, is_checkpoint_format=True)
        else:
            self.model_runner.model.load_weights(weights=pairs)  # type: ignore[attr-defined]
        if pairs and pairs[0][1].is_cuda:
            torch.cuda.synchronize()  # the trainer may change these tensors right after
        return len(pairs)

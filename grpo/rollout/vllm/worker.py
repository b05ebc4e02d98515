"""The vLLM worker extension that receives full-weight updates.

vLLM mixes the class named by the engine argument `worker_extension_cls` into its GPU worker;
`LLM.collective_rpc("method", args=...)` then runs the method on every worker. This is the
weight-update route of vLLM's RLHF examples (`examples/offline_inference/rlhf*.py`): the worker
calls `self.model_runner.model.load_weights(weights=[(name, tensor), ...])`, which maps Hugging
Face checkpoint names onto vLLM's fused layers (q/k/v -> qkv_proj, gate/up -> gate_up_proj).

The engine runs in-process (grpo/rollout/vllm/engine.py), so `collective_rpc` passes the trainer's
tensors by reference: no serialization, no second copy; `load_weights` copies them into vLLM's
own parameters (casting to vLLM's dtype). This module imports nothing from vllm, so the worker
loads it by its dotted name.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

WORKER_EXTENSION = "grpo.rollout.vllm.worker.WeightSyncWorkerExtension"


class WeightSyncWorkerExtension:
    """Methods vLLM adds to its worker (`self` is the worker: it has `model_runner`)."""

    def grpo_load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy (name, tensor) pairs into the served model; returns how many were given."""
        pairs = list(weights)
        self.model_runner.model.load_weights(weights=pairs)  # type: ignore[attr-defined]
        torch.cuda.synchronize()
        return len(pairs)

    def grpo_weight_checksum(self, name_contains: str = "") -> float:
        """Sum of the served model's parameters whose name contains `name_contains` (for tests
        that check a push arrived)."""
        total = 0.0
        for name, param in self.model_runner.model.named_parameters():  # type: ignore[attr-defined]
            if name_contains in name:
                total += float(param.detach().float().sum())
        return total

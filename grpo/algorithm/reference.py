"""The EMA reference policy that the KL term pulls toward: ref <- decay * ref + (1 - decay) * policy.

Two kinds behind one interface (`make_reference` picks by the policy):
- `LoraEMAReference`: the frozen base weights are shared with the policy; the reference is an EMA
  copy of the adapter tensors only, swapped into the policy's forward with
  `torch.func.functional_call` (no second model in memory, the policy's parameters untouched).
- `FullCopyEMAReference`: a separate frozen copy of the whole LM, optionally kept on the CPU and
  moved to the policy's device only while it scores (once per scoring pass: `scoring_on`).

Only floating-point parameters are averaged: buffers and quantized tensors (bitsandbytes 4-bit
weights and their quant states) are never touched. The value head is not part of the reference.

Note for LoRA: an EMA of the factors A and B is not the EMA of the merged weight B A. After one
update from (B0, A0) to (B1, A1), EMA(B A) - EMA(B) EMA(A) = d (1 - d) (B1 - B0)(A1 - A0) * scale
(d = decay): exact for d in {0, 1} or when one factor did not move, second order otherwise.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
from torch import nn

from grpo.algorithm.config import ReferenceConfig
from grpo.forward.common_prefix import CommonPrefix
from grpo.models.peft_weights import is_4bit_tensor
from grpo.models.policy import PolicyWithValueHead


@torch.no_grad()
def ema_update_(
    ref_tensors: Iterable[torch.Tensor], policy_tensors: Iterable[torch.Tensor], decay: float
) -> None:
    """In place: ref <- decay * ref + (1 - decay) * policy (decay 0 copies, decay 1 keeps ref)."""
    for ref, new in zip(ref_tensors, policy_tensors, strict=True):
        # lerp is exact at both ends: weight 1 returns `new`, weight 0 returns `ref`.
        ref.lerp_(new.detach().to(device=ref.device, dtype=ref.dtype), 1.0 - decay)


class EMAReference(ABC):
    """An EMA of the policy's weights, used only to score tokens (no gradients)."""

    def __init__(self, policy: PolicyWithValueHead, *, decay: float, update_every: int):
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"EMA decay must lie in [0, 1], got {decay}")
        if update_every < 1:
            raise ValueError(f"update_every must be >= 1, got {update_every}")
        self.policy = policy
        self.decay = decay
        self.update_every = update_every

    def maybe_update(self, step: int) -> bool:
        """Update after every `update_every`-th completed training step (step counts from 1)."""
        if step > 0 and step % self.update_every == 0:
            self.update()
            return True
        return False

    @abstractmethod
    def update(self) -> None:
        """One EMA step toward the policy's current weights."""

    def copy_policy(self) -> None:
        """Become the policy's current weights (after a warm start: the KL then anchors there)."""
        decay, self.decay = self.decay, 0.0
        try:
            self.update()
        finally:
            self.decay = decay

    def scoring_on(self, device: torch.device) -> AbstractContextManager:
        """A context for many `ref_logprobs` calls on `device`: an offloaded copy moves there
        once on entry and back on exit, not once per call."""
        return nullcontext()

    @abstractmethod
    def ref_logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        temperature: float = 1.0,
        positions: torch.Tensor | None = None,
        prefix: CommonPrefix | None = None,
    ) -> torch.Tensor:
        """[B, T-1] log-probs of input_ids[:, 1:] under the reference (no grad); with
        `positions` ([B, T-1] bool) only those are computed, the rest read 0. `prefix`: the
        pass's common prefix, run under the reference's weights (one instance for the reference
        alone; PolicyWithValueHead.common_prefix)."""

    @abstractmethod
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The averaged tensors by parameter name (what a checkpoint stores)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...


@contextmanager
def _eval_mode(module: nn.Module):
    """Deterministic scoring (no dropout) without disturbing the caller's train/eval mode."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def _averaged_names(model: nn.Module, trainable_only: bool) -> list[str]:
    return [
        name
        for name, p in model.named_parameters()
        if p.is_floating_point()
        and not is_4bit_tensor(p)
        and (p.requires_grad or not trainable_only)
    ]


class LoraEMAReference(EMAReference):
    """The frozen base plus an EMA copy of the LoRA adapter tensors (all that LoRA trains)."""

    def __init__(self, policy: PolicyWithValueHead, *, decay: float, update_every: int):
        super().__init__(policy, decay=decay, update_every=update_every)
        if not policy.is_lora:
            raise ValueError("LoraEMAReference needs a LoRA policy")
        params = dict(policy.model.named_parameters())
        self._names = _averaged_names(policy.model, trainable_only=True)
        self.ema: dict[str, torch.Tensor] = {
            name: params[name].detach().clone() for name in self._names
        }

    def _policy_tensors(self) -> list[torch.Tensor]:
        params = dict(self.policy.model.named_parameters())
        return [params[name] for name in self._names]

    def update(self) -> None:
        ema_update_([self.ema[name] for name in self._names], self._policy_tensors(), self.decay)

    def reference_parameters(self) -> dict[str, torch.Tensor]:
        """The EMA tensors keyed as parameters of the policy module (for functional_call)."""
        return {f"model.{name}": tensor for name, tensor in self.ema.items()}

    @torch.no_grad()
    def ref_logprobs(self, input_ids, attention_mask, temperature: float = 1.0, positions=None,
                     prefix=None) -> torch.Tensor:
        with _eval_mode(self.policy):
            out = torch.func.functional_call(
                self.policy,
                self.reference_parameters(),
                (input_ids, attention_mask),
                {"temperature": temperature, "positions": positions, "prefix": prefix},
                strict=False,
            )
        return out.logprobs  # [B, T-1]

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: tensor.detach().clone() for name, tensor in self.ema.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        _check_keys(state, self._names)
        with torch.no_grad():
            for name in self._names:
                self.ema[name].copy_(state[name])


class FullCopyEMAReference(EMAReference):
    """A frozen copy of the whole LM; with `offload_to_cpu` it lives on the CPU between uses."""

    def __init__(
        self,
        policy: PolicyWithValueHead,
        *,
        decay: float,
        update_every: int,
        offload_to_cpu: bool = False,
    ):
        super().__init__(policy, decay=decay, update_every=update_every)
        if policy.is_lora:
            raise ValueError(
                "FullCopyEMAReference is for full fine-tuning; use LoraEMAReference for LoRA"
            )
        self.offload_to_cpu = offload_to_cpu
        self._resident = False
        model = copy.deepcopy(policy.model)
        model.requires_grad_(False)
        for p in model.parameters():
            p.grad = None
        if offload_to_cpu:
            model.to("cpu")
        self.model = PolicyWithValueHead(
            model,
            value_head=False,
            compute_dtype=policy.compute_dtype,
            logprob_chunk_size=policy.logprob_chunk_size,
            share_prefix_min=policy.share_prefix_min,
            segment_call_tokens=policy.segment_call_tokens,
            packing=policy.packing,
        )
        self.model.eval()
        self._names = _averaged_names(model, trainable_only=False)

    def _pairs(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        ref = dict(self.model.model.named_parameters())
        pol = dict(self.policy.model.named_parameters())
        return [ref[n] for n in self._names], [pol[n] for n in self._names]

    def update(self) -> None:
        ref, pol = self._pairs()
        ema_update_(ref, pol, self.decay)

    @contextmanager
    def scoring_on(self, device: torch.device) -> Iterator[None]:
        moved = self.offload_to_cpu and device.type != "cpu" and not self._resident
        if moved:
            self.model.to(device)
            self._resident = True
        try:
            yield
        finally:
            if moved:
                self.model.to("cpu")
                self._resident = False

    @torch.no_grad()
    def ref_logprobs(self, input_ids, attention_mask, temperature: float = 1.0, positions=None,
                     prefix=None) -> torch.Tensor:
        with self.scoring_on(input_ids.device):
            return self.model(
                input_ids, attention_mask, temperature=temperature, positions=positions, prefix=prefix
            ).logprobs  # [B, T-1]

    def state_dict(self) -> dict[str, torch.Tensor]:
        ref, _ = self._pairs()
        return {name: tensor.detach().clone() for name, tensor in zip(self._names, ref)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        _check_keys(state, self._names)
        ref, _ = self._pairs()
        with torch.no_grad():
            for name, tensor in zip(self._names, ref):
                tensor.copy_(state[name])


def _check_keys(state: dict[str, torch.Tensor], names: list[str]) -> None:
    missing, unexpected = sorted(set(names) - set(state)), sorted(set(state) - set(names))
    if missing or unexpected:
        raise RuntimeError(
            f"reference checkpoint mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )


def make_reference(policy: PolicyWithValueHead, config: ReferenceConfig) -> EMAReference:
    """The EMA reference for `policy`: adapter EMA for LoRA, a full copy otherwise."""
    if policy.is_lora:
        return LoraEMAReference(policy, decay=config.ema_decay, update_every=config.update_every)
    return FullCopyEMAReference(
        policy,
        decay=config.ema_decay,
        update_every=config.update_every,
        offload_to_cpu=config.offload_to_cpu,
    )

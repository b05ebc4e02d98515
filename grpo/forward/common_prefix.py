"""Common prefix (one pass): the columns every row starts with, run once per pass, not per micro-batch.

A step's trajectories all open with the same chat template, system prompt and tool docs (on
configs/cpu.yaml 253 of a mean 326 tokens). `plan_segments` (grpo/forward/segment_plan.py) runs
that prefix once per micro-batch; a pass over k micro-batches still runs it k times. A
`CommonPrefix` runs it once per pass and model: the first forward that is handed it runs the
prefix alone (one row, under that forward's weights, autocast and grad mode) and keeps its final
hidden states and KV cache; every forward then runs only its rows' later columns, continuing
that cache (`PolicyWithValueHead.final_hidden_states`). The prefix's numbers are those the
one-row segment of a micro-batch computes.

With gradients the prefix's graph is shared by every micro-batch's backward, and each backward
frees the graph it runs. So forwards before the last use detached copies of the prefix tensors
(leaves that collect the gradient their backward sends the prefix); `finish()` before the last
micro-batch's forward hands that forward the prefix's own tensors, and `carried_loss()`, added to
its loss, sends the collected gradient through the prefix's graph in the same backward: the
gradients are those of running the prefix in every micro-batch, and the step still makes one
backward per micro-batch (what data-parallel gradient hooks count on).

One instance per pass and model: the state is computed under the weights of its first forward.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from transformers import DynamicCache

from grpo.forward.cache_argument import output_cache


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every sequence shares (lists and tuples alike)."""
    if not sequences:
        return 0
    first, length = sequences[0], min(len(s) for s in sequences)
    for other in sequences[1:]:
        if other[:length] == first[:length]:  # the usual case, compared in C
            continue
        length = next((i for i in range(length) if other[i] != first[i]), length)  # a list vs a tuple
        if length == 0:
            break
    return length


def leading_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """The common prefix that still leaves every sequence at least one token of its own (whose
    forward gives that sequence's next-token logits or its own states): at most the shortest
    length less one. 0 for no sequences. The pass-wide prefix here and the rollout engine's
    shared-prefix prefill (grpo/rollout/hf/prefill.py) both take this rule."""
    if not sequences:
        return 0
    return max(0, min(common_prefix_length(sequences), min(len(s) for s in sequences) - 1))


class CommonPrefix:
    """Columns [0, len(self)) that every row of a pass holds, with the state one forward computed."""

    def __init__(self, token_ids: Sequence[int]):
        if not token_ids:
            raise ValueError("a common prefix needs at least one token")
        self.token_ids = torch.tensor(list(token_ids), dtype=torch.long)  # [P]
        self._live: tuple[torch.Tensor, list[torch.Tensor]] | None = None
        """The prefix's final hidden states [1, P, H] and per-layer keys and values [1, h, P, d]."""
        self._leaves: tuple[torch.Tensor, list[torch.Tensor]] | None = None
        """Detached copies that collect the gradient of forwards before the last (grad mode)."""
        self._finishing = False

    @classmethod
    def of(cls, sequences: Sequence[Sequence[int]], min_tokens: int) -> CommonPrefix | None:
        """The prefix all `sequences` share, leaving every one at least one token of its own;
        None when that is shorter than `min_tokens` (or `min_tokens` <= 0: never share)."""
        if min_tokens <= 0 or not sequences:
            return None
        length = leading_prefix_length(sequences)
        return cls(sequences[0][:length]) if length >= min_tokens else None

    def fresh(self) -> CommonPrefix:
        """The same prefix with no state yet: for another model's forwards."""
        return CommonPrefix(self.token_ids.tolist())

    def __len__(self) -> int:
        return int(self.token_ids.numel())

    def check(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """Refuse a batch whose rows do not all start with this prefix as real tokens (their
        states would be another prefix's)."""
        length = len(self)
        ids = self.token_ids.to(input_ids.device)
        if (input_ids.shape[1] <= length or not bool((input_ids[:, :length] == ids).all())
                or not bool(attention_mask[:, :length].bool().all())):
            raise ValueError(
                f"batch of shape {tuple(input_ids.shape)} does not start with the common prefix of "
                f"{length} tokens in every row (a CommonPrefix belongs to the rows it was built from)"
            )

    def finish(self) -> None:
        """The next forward is the pass's last: it gets the prefix's own tensors (grad mode)."""
        self._finishing = True

    def carried_loss(self) -> torch.Tensor | None:
        """sum(prefix tensor * gradient collected on its copy): added to the last micro-batch's
        loss, its backward carries the earlier micro-batches' share through the prefix. None when
        nothing was collected (no gradients, or a single forward)."""
        if self._live is None or self._leaves is None or not self._live[0].requires_grad:
            return None
        terms = [(live * leaf.grad).sum()
                 for live, leaf in zip(_flat(self._live), _flat(self._leaves), strict=True)
                 if leaf.grad is not None]
        return torch.stack(terms).sum() if terms else None

    def states(self, decoder: nn.Module) -> tuple[torch.Tensor, DynamicCache]:
        """[1, P, H] final hidden states of the prefix and a fresh one-row cache holding its keys
        and values; the first call runs the prefix through `decoder`."""
        if self._live is None:
            ids = self.token_ids.to(decoder.device).unsqueeze(0)  # [1, P]
            out = decoder(input_ids=ids, attention_mask=torch.ones_like(ids),
                          position_ids=torch.arange(len(self), device=ids.device).unsqueeze(0), use_cache=True)
            layers = [(layer.keys, layer.values) for layer in output_cache(out).layers]
            self._live = (out.last_hidden_state, [t for pair in layers for t in pair])
        hidden, kv = self._live
        if hidden.requires_grad and not self._finishing:
            if self._leaves is None:
                self._leaves = (hidden.detach().requires_grad_(), [t.detach().requires_grad_() for t in kv])
            hidden, kv = self._leaves
        cache = DynamicCache(ddp_cache_data=list(zip(kv[0::2], kv[1::2], strict=True)), config=decoder.config)
        return hidden, cache


def _flat(state: tuple[torch.Tensor, list[torch.Tensor]]) -> list[torch.Tensor]:
    return [state[0], *state[1]]

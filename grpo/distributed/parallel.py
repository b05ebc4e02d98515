"""Data parallelism under `accelerate launch`: the pieces between GRPOTrainer and DDP / ZeRO-3.

Every rank plays its own whole groups, computes advantages within them and runs the unchanged
`train_step` (grpo/algorithm/update.py) on them; DDP or DeepSpeed ZeRO-3 averages the gradients.
This module holds what that needs and nothing of the algorithm:

- `require_accelerate_launch`: a clear error when `launch/distributed.py` runs without it.
- `DataParallelPolicy`: what `train_step` calls as "the policy": forwards through the wrapped
  module (DDP / DeepSpeed engine), scales gradients for the global loss denominator (below).
- `DeepSpeedStep`: what `train_step` calls as "the optimizer" under DeepSpeed.
- `local_denominator_scale`, `reduce_metrics`, `balance_groups`, `gathered_parameters`:
  the collectives, each called by every rank at the same point.

The loss denominator across ranks. `train_step` divides each rank's summed token losses by that
rank's own denominator N_r (tokens for `token_mean`, sequences for the seq-mean modes, as
`grpo.algorithm.loss.loss_denominator` defines it), and DDP / ZeRO-3 then average the W ranks' gradients:
(1/W) sum_r grad(S_r) / N_r. That is the mean of per-rank means, which weighs a token on a rank
with fewer tokens more. The global loss is sum_r S_r / N with N = sum_r N_r. So each rank scales
the gradient flowing out of the policy by W * N_r / N (one all-reduce of N_r per step): the
average becomes (1/W) sum_r W * grad(S_r) / N = grad(sum_r S_r) / N, exactly the gradient of one
process holding every group. Forward values (and every logged metric) are untouched. With
`num_minibatches > 1` the minibatch split happens inside `train_step`, so the step's ratio is
applied to every minibatch: exact in expectation, not per minibatch.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from grpo.algorithm.loss import loss_denominator
from grpo.models.policy import PolicyOutput


class DistributedLaunchError(RuntimeError):
    """The distributed entry point was started wrongly; the message says how to start it."""


def require_accelerate_launch() -> None:
    """Raise unless this process was started by `accelerate launch` (or torchrun) in a way that
    gives it its rank; one process under `accelerate launch` is allowed."""
    launched = "LOCAL_RANK" in os.environ or any(k.startswith("ACCELERATE_") for k in os.environ)
    if not launched:
        raise DistributedLaunchError(
            "launch/distributed.py must be started by `accelerate launch`, e.g.\n"
            "  accelerate launch --config_file configs/accelerate_zero3.yaml launch/distributed.py "
            "--config configs/zero3.yaml\n"
            "  accelerate launch --multi_gpu --num_processes 2 launch/distributed.py --config "
            "configs/smoke.yaml   (plain DDP; on a machine without CUDA it runs on the CPU)\n"
            "For one process use `python -m launch.train --config ...`."
        )
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true" and "WORLD_SIZE" not in os.environ:
        raise DistributedLaunchError(
            "`accelerate launch --cpu` starts a single process whatever --num_processes says "
            "(accelerate spreads CPU processes only through mpirun). For data parallelism on CPUs "
            "use `accelerate launch --multi_gpu --num_processes 2 launch/distributed.py ...` "
            "(no CUDA here: the processes train on the CPU over gloo) or "
            "`--config_file configs/accelerate_zero3_cpu.yaml` for ZeRO-3; for one process "
            "`python -m launch.train`."
        )


# ------------------------------------------------------------------------ gradient scaling
class _ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the incoming gradient by a constant in backward."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


def scale_grad(tensor: torch.Tensor | None, scale: float) -> torch.Tensor | None:
    if tensor is None or scale == 1.0 or not tensor.requires_grad:
        return tensor
    return _ScaleGrad.apply(tensor, scale)


class TupleForward(nn.Module):
    """The policy with a tuple output, the module DDP / DeepSpeed wrap.

    DeepSpeed finds the tensors of a forward's output to hook its backward prologue (needed when
    `loss.backward()` is called directly, as `train_step` does) only in tensors, tuples, lists
    and dicts, not in the `PolicyOutput` dataclass. Checkpoint state is the policy's own
    (LoRA: adapter and value head only), with the policy's key names.
    """

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.policy = policy

    def forward(self, input_ids, attention_mask, **kwargs) -> tuple:
        out = self.policy(input_ids, attention_mask, **kwargs)
        return out.logprobs, out.entropy, out.values

    def state_dict(self, *args, **kwargs):
        return self.policy.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.policy.load_state_dict(state_dict, strict=strict, assign=assign)


class DataParallelPolicy:
    """Stands in for the policy inside `train_step`: the same calls, routed through the wrapper.

    `grad_scale` multiplies the gradient of every output (see the module docstring); parameters
    and `trainable_parameters()` are the policy's own (under ZeRO-3 they are partitioned and
    hold no `.grad`: DeepSpeed keeps gradients in its partitions and clips them itself).
    """

    def __init__(self, policy: nn.Module, wrapped: nn.Module):
        self.policy = policy
        self.wrapped = wrapped
        self.grad_scale = 1.0

    def __call__(self, input_ids, attention_mask, **kwargs) -> PolicyOutput:
        logprobs, entropy, values = self.wrapped(input_ids, attention_mask, **kwargs)
        return PolicyOutput(
            logprobs=scale_grad(logprobs, self.grad_scale),
            entropy=scale_grad(entropy, self.grad_scale),
            values=scale_grad(values, self.grad_scale),
        )

    def parameters(self) -> Iterable[nn.Parameter]:
        return self.policy.parameters()

    def modules(self) -> Iterable[nn.Module]:
        return self.wrapped.modules()

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.policy.compute_dtype

    @property
    def device(self) -> torch.device:
        return self.policy.device

    def trainable_parameters(self) -> list[nn.Parameter]:
        return self.policy.trainable_parameters()

    @property
    def training(self) -> bool:
        return self.wrapped.training

    def train(self, mode: bool = True) -> DataParallelPolicy:
        self.wrapped.train(mode)
        return self

    def eval(self) -> DataParallelPolicy:
        return self.train(False)


class DeepSpeedStep:
    """Stands in for the optimizer inside `train_step` under DeepSpeed.

    `zero_grad` drops the accumulated gradient partitions (the next backward overwrites instead
    of adding); `step` runs the engine's step: gradient clipping (`gradient_clipping` in the
    DeepSpeed config, set from `algorithm.optimizer.max_grad_norm`), the optimizer, zeroing. The engine
    computes the global gradient norm; `grad_norms` keeps one per optimizer step.
    """

    def __init__(self, engine):
        self.engine = engine
        self.grad_norms: list[float] = []

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.engine.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        if norm is not None:
            self.grad_norms.append(float(norm))

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.engine.optimizer.param_groups


# ------------------------------------------------------------------------ collectives
def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) when no process group is up."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_reduce_float(value: float, op: str = "sum") -> float:
    """`value` reduced over ranks (`sum`, `min` or `max`), on the CPU (works over gloo and NCCL
    alike through all_gather_object, and is tiny)."""
    _, size = world()
    if size == 1:
        return value
    values: list[Any] = [None] * size
    dist.all_gather_object(values, float(value))
    return {"sum": sum, "min": min, "max": max}[op](values)


def local_denominator_scale(trajectories, loss_agg: str) -> float:
    """W * N_r / N: the gradient scale that turns the mean of per-rank means into the global
    mean (module docstring). 1.0 with one process or when no rank has a token to learn from."""
    _, size = world()
    masks = [torch.tensor(t.loss_mask[1:], dtype=torch.bool).unsqueeze(0) for t in trajectories]  # [1, n]
    local = loss_denominator(masks, loss_agg) if masks else 0.0
    total = all_reduce_float(local, "sum")
    return size * local / total if total > 0 else 1.0


# Metrics that are counts (summed over ranks), maxima, and throughputs (summed); the rest are
# means over ranks, weighted (e.g. by held-out tasks evaluated on each rank).
_SUMMED = {
    "eval/num_tasks", "eval/excluded_tasks", "train/num_sequences", "train/num_tokens",
    "train/dropped_groups", "rollout/episodes", "rollout/gen_tokens", "rollout/failed_episodes",
    "rollout/excluded_groups", "rollout/engine_batches",
}


def reduce_metrics(metrics: dict[str, float], weight: float = 1.0) -> dict[str, float]:
    """The run's metrics from every rank's (`combine_metrics`); identical on every rank."""
    _, size = world()
    if size == 1:
        return dict(metrics)
    gathered: list[Any] = [None] * size
    dist.all_gather_object(gathered, (dict(metrics), float(weight)))
    return combine_metrics(gathered)


def combine_metrics(per_rank: list[tuple[dict[str, float], float]]) -> dict[str, float]:
    """(metrics, weight) of each rank -> one dict: counts summed, `*_max` maximised, `*_per_s`
    (throughputs) summed, the rest averaged, weighted, over the ranks that report the key."""
    by_key: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for rank_metrics, rank_weight in per_rank:
        for key, value in rank_metrics.items():
            by_key[key].append((float(value), rank_weight))
    out: dict[str, float] = {}
    for key, pairs in by_key.items():
        values = [v for v, _ in pairs]
        if key in _SUMMED or key.endswith("_per_s"):
            out[key] = sum(values)
        elif key.endswith("_max"):
            out[key] = max(values)
        else:
            total_weight = sum(w for _, w in pairs)
            out[key] = (sum(v * w for v, w in pairs) / total_weight if total_weight > 0
                        else sum(values) / len(values))
    return out


def balance_groups(trajectories: list) -> tuple[list, int]:
    """Keep the same number of whole groups on every rank (the fewest any rank has).

    ZeRO-3 gathers parameters in every forward and DDP reduces in every backward, so every rank
    must run the same number of micro-batches; a rank that lost a group to failing tools would
    otherwise hang the others. Returns (kept trajectories, groups dropped here).
    """
    order: list[str] = []
    groups: dict[str, list] = defaultdict(list)
    for t in trajectories:
        if t.group_id not in groups:
            order.append(t.group_id)
        groups[t.group_id].append(t)
    keep = int(all_reduce_float(float(len(order)), "min"))
    kept = [t for gid in order[:keep] for t in groups[gid]]
    return kept, len(order) - keep


def gathered_parameters(module: nn.Module, deepspeed: bool) -> AbstractContextManager:
    """A context in which `module`'s parameters hold their full values on every rank.

    ZeRO-3 partitions every parameter (a rank's `.data` is empty outside a forward); reading
    weights (EMA reference, engine sync, export, hashing) must happen inside this context,
    entered by every rank together. Without DeepSpeed the parameters are already whole.
    """
    if not deepspeed:
        return nullcontext()
    import deepspeed as ds

    return ds.zero.GatheredParameters(list(module.parameters()), modifier_rank=None)

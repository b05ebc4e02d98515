"""The rollout engine's own copy of the policy's weights, and how it follows the policy.

`inference_copy` clones the policy's causal LM (LoRA merged in) and keeps everything outside the
matmuls (embeddings, norms, the residual stream, rotary, attention, KV cache) in the policy's
dtype, while the Linear layers get bf16 weights: the input is rounded to bf16, as under bf16
autocast, but the weights are cast once instead of at every call, pre-packed for oneDNN (`_Matmul`;
where oneDNN has bf16 kernels, else `F.linear`: `_onednn_bf16`), and sibling projections that read
the same input run as one matmul (q/k/v, gate/up). Measured on SmolLM2-135M, 2 threads, batch
64, 64 new tokens (bench/generation.py): this copy 658 tok/s, with an fp32 LM head 482, an fp32 copy 264,
bf16 autocast over the fp32 policy 285. Mean |Δ log-prob| of the sampled tokens against a plain
fp32 forward of the whole sequence (16 seeded completions, ~690 tokens): this copy 0.027, with an
fp32 LM head 0.018, bf16 autocast 0.029, an fp32 copy 0.000; an all-bf16 copy (bf16 residual
stream: SmolLM2's hidden states carry large outliers) was 0.042, too close to the trainer's 0.05
tolerance.

An fp32 copy on a CPU (`auto` on a CPU without bf16 instructions, or `dtype=None` over an fp32
policy) is built the same way with fp32 weights: packed and fused for speed alone, since packed
fp32 products are 2-3x faster than `F.linear`'s at decode shapes (`_FP32_PACKING_MACHINES`). Where
torch has MKL the fp32 weights are packed for MKL's sgemm rather than oneDNN (`_MKL_PACK_ROWS`).

Row independence: whether a product gives a row the same bits whatever rows are computed with it
depends on the CPU and the kernel the BLAS picks for it, not on the weights' values. MKL's
AVX-512 fp32 kernels do at every row count probed; its AVX2 ones (MKL_ENABLE_INSTRUCTIONS=AVX2,
or a CPU without AVX-512) do not at 2-3 rows of each block of 4 for some shapes, and MKL on an
AMD CPU not at one row; oneDNN's fp32 packs not at one row for some shapes; `F.linear` not at
1-8 rows. `products_rows_independent` probes the copy's products (once per process and kind of
product) and the engine reports it (grpo/rollout/batch_invariance.py: the engine's promise, which
holds either way).

`copy_weights_into` (sync_weights) copies tensors by name from the policy, casting as it goes,
then re-packs the packed weights.
"""

from __future__ import annotations

import copy
import functools
import platform

import torch
import torch.nn.functional as F
from torch import nn

from grpo.models.embedding_gradient import ReusedEmbeddingGradient
from grpo.models.peft_weights import dequantize_linears_, is_peft, language_model_of, lm_tensors
from grpo.rollout.fused_norms import fuse_rms_norms

_LOW_PRECISION_OUTPUTS = {"o_proj", "down_proj", "gate_proj", "up_proj"}
"""Linear layers whose output may stay in the matmul dtype, as under autocast: it only feeds the
residual add (which promotes to fp32) or the SiLU-gated product that feeds `down_proj`. Any other
Linear's output is cast back to its input's dtype (attention wants one dtype for q, k and v)."""
_FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""Sibling Linear layers that read the same input: one matmul computes all of them."""
_FP32_PACKING_MACHINES = ("x86_64", "amd64")
"""Machines (`platform.machine()`, lower case) where fp32 weights are packed too (`packs_fp32`). On
an x86-64 CPU without bf16 instructions (no AVX-512 BF16 or AMX, where `auto` computes in fp32)
`F.linear`'s decode-shape products run at a third of the packed ones' speed -- SmolLM2-135M, 2 threads, a Xeon with AVX-512 but no BF16, 20-30 distinct weights:
[16, 576] x [576, 1536] 861 µs plain, 301 µs packed; the [49k, 576] head at 16 rows 26.8 ms against
7.9 ms; 2.2-2.9x from 4 to 32 rows. From 128 rows up (prefill) the two are within 10%, and at one
row the packed product is 0.6-0.9x. Packed fp32 products differ from `F.linear`'s in the last
bits (4e-5 on products of size ~25)."""
_PACK_BATCH_HINT = 16
"""Rows oneDNN lays the decoder layers' packed weights out for. SmolLM2-135M's four layer
products at decode shapes, 30 layers' distinct weights, 2 threads: 13.9 / 21.8 / 40.4 ms at
16 / 32 / 64 rows laid out for 16, against 15.2 / 22.1 / 41.5 ms for 64; prefill-sized products
(512, 2,048 rows) the same either way; the engine's tokens identical (the standard step's
generate, 96 and 384 seeded completions, the two layouts alternating in one process: 2.01 vs
2.08 s at 16 rows)."""
_HEAD_PACK_BATCH_HINT = 64
"""The same for the LM head: its [49k, 576] product at 16 rows is a little faster laid out for
64 (3.13 vs 3.37 ms a call), and equal at 64 rows."""
_MKL_PACK_ROWS = 256
"""Rows MKL lays a packed fp32 weight out for (`cblas_sgemm_pack`'s m). The layout serves any row
count: the products are right for every count (whether a row's bits depend on the rows beside
it depends on the CPU's kernels: module docstring), and Intel's own extension for PyTorch
computes with one B pack whatever the input's rows. It is chosen for speed: SmolLM2-135M's
products, 2 threads, a Xeon with AVX-512 but no BF16, 8-30 distinct weights, against oneDNN's packs (16 rows for the layers, 64 for the head):
- gate/up [3,072, 576] at 16 / 64 / 512 rows: 660 / 1,082 / 6,979 µs against 680 / 1,253 / 8,239;
- down [576, 1,536]: 310 / 546 / 3,569 µs against 338 / 731 / 3,865;
- the head [49,152, 576]: 7.9 / 16.6 / 151 ms against 8.2 / 18.5 / 179;
- at one row 0.85x oneDNN's time; laid out for 16 rows instead, MKL's products at 40-128 rows
  took 1.3-1.9x as long as these, which is why the layout is not the decode batch's."""

_PROBE_ROWS = 80
"""Rows a probe computes together (`probe_rows_independent`): past a 64-row decode batch."""
_PROBE_COUNTS = (1, 2, 3, 5, 8, 16, 17, 33, 64)
"""Row counts a probe computes alone: decode batch sizes, among them those where kernels were
seen to treat rows apart -- a lone row (MKL on an AMD CPU; oneDNN's fp32 packs for some shapes),
2 or 3 rows past a multiple of 4 (MKL's AVX2 kernels), one past a power of two."""


def _onednn_packs(device: torch.device) -> bool:
    return (
        device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def _mkl_packs(device: torch.device) -> bool:
    return (
        device.type == "cpu"
        and torch.backends.mkl.is_available()
        and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight")
    )


def packs_fp32(device: torch.device) -> bool:
    """Does the engine copy pre-pack fp32 Linear weights on `device`? On an x86-64 CPU with oneDNN
    (where it was measured); then an fp32 copy is built like a bf16 one (packed, siblings fused),
    for speed alone. Other CPUs (ARM) keep `F.linear`: unmeasured there."""
    return _onednn_packs(device) and platform.machine().lower() in _FP32_PACKING_MACHINES


def _onednn_bf16() -> bool:
    """Can oneDNN compute bf16 products on this CPU? It refuses to pack bf16 weights on one
    without AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT (an AVX2-only x86-64 CPU, or oneDNN capped by
    ONEDNN_MAX_CPU_ISA): there a bf16 copy keeps `F.linear`."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return check is not None and bool(check())


def _can_pack(weight: torch.Tensor) -> bool:
    if weight.dtype == torch.float32:
        return packs_fp32(weight.device)
    return weight.dtype == torch.bfloat16 and _onednn_packs(weight.device) and _onednn_bf16()


def _packer_for(weight: torch.Tensor) -> str | None:
    """How `_Matmul` lays out `weight`: "mkl" (fp32, torch has MKL), "onednn", or None (plain)."""
    if not _can_pack(weight):
        return None
    return "mkl" if weight.dtype == torch.float32 and _mkl_packs(weight.device) else "onednn"


def probe_rows_independent(product, in_features: int, dtype: torch.dtype, device) -> bool:
    """Does `product` (a function of an [n, in_features] input) give each row the same bits
    whether the row is computed alone or among others? Random inputs: the first n rows of
    `_PROBE_ROWS` for each n of `_PROBE_COUNTS`, and the last 1 and 3, computed on their own
    against the same rows among all of them. A BLAS picks its kernel and blocking by the row
    count (and the CPU, and the threads), so a product that passes is not proven to pass at
    every count: these are the counts where kernels were seen to differ."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(_PROBE_ROWS, in_features, generator=generator).to(device, dtype)
    together = product(x)
    return all(
        torch.equal(product(x[:rows]), together[:rows]) for rows in _PROBE_COUNTS
    ) and all(torch.equal(product(x[-rows:]), together[-rows:]) for rows in (1, 3))


@functools.cache
def _probe_kind(packer, dtype, shape, has_bias, batch_hint, device_type, threads) -> bool:
    """`probe_rows_independent` for a random weight packed as a `_Matmul` with these traits; the
    answer depends on them (and the CPU), not on the weight's values, so it is kept per process."""
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(shape, generator=generator).to(device_type, dtype)
    bias = torch.randn(shape[0], generator=generator).to(device_type, dtype) if has_bias else None
    matmul = _Matmul(weight, bias, batch_hint, packer=packer)
    return probe_rows_independent(matmul, shape[1], dtype, weight.device)


class _Matmul:
    """x @ weight.T + bias in the weight's dtype, with the weight pre-packed on CPU: for MKL's
    sgemm when it is fp32 and torch has MKL (`packer == "mkl"`), else for oneDNN ("onednn").

    A bf16 weight handed to `F.linear` is re-laid-out for the AMX/AVX-512 kernels at every call;
    with 30 layers' weights streaming from memory each decode step that doubled the matmul time
    (SmolLM2, batch 64, 1 thread: the fused gate/up product 835 µs plain, 472 µs packed; results
    identical). `repack()` must follow any change to the dense weight (sync_weights)."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, batch_hint: int = _PACK_BATCH_HINT,
        packer: str | None = "auto",
    ) -> None:
        self.weight, self.bias, self.batch_hint = weight, bias, batch_hint
        self.packed: torch.Tensor | None = None
        self.packer = _packer_for(weight) if packer == "auto" else packer
        self.repack()

    def repack(self) -> None:
        if self.packer == "mkl":
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(self.weight, _MKL_PACK_ROWS)
        elif self.packer == "onednn":
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, self.batch_hint)

    def rows_independent(self) -> bool:
        """Is each row's product the same bits whatever rows it is computed with? Probed once per
        process for this kind of product (`probe_rows_independent`); a quantized weight is not."""
        if not self.weight.is_floating_point():
            return False
        return _probe_kind(
            self.packer, self.weight.dtype, tuple(self.weight.shape), self.bias is not None,
            self.batch_hint, self.weight.device.type, torch.get_num_threads(),
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.weight.dtype:  # (a same-dtype `to` costs a dispatch per call)
            x = x.to(self.weight.dtype)
        if self.packer == "mkl":
            rows = x.numel() // x.shape[-1]
            if rows:  # torch's op computes with the pack only when told the input's row count
                return torch.ops.mkl._mkl_linear(x, self.packed, self.weight, self.bias, rows)
        elif self.packer == "onednn":
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


class LowPrecisionLinear(nn.Linear):
    """A Linear whose weight is stored in a lower dtype: the input is rounded to it (what
    autocast does, with the weight cast once); the output stays in that dtype or, with
    `cast_back`, returns to the input's dtype."""

    cast_back: bool = True

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, dtype: torch.dtype, cast_back: bool,
        batch_hint: int = _PACK_BATCH_HINT,
    ) -> LowPrecisionLinear:
        new = cls(
            linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta"
        )
        new.weight = nn.Parameter(linear.weight.detach().to(dtype), requires_grad=False)
        if linear.bias is not None:
            new.bias = nn.Parameter(linear.bias.detach().to(dtype), requires_grad=False)
        new.cast_back = cast_back
        new.matmul = _Matmul(new.weight, new.bias, batch_hint)
        return new

    def repack(self) -> None:
        self.matmul.repack()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.matmul(x)
        return out.to(x.dtype) if self.cast_back and out.dtype != x.dtype else out


class FusedGroup:
    """One matmul for sibling Linear layers that read the same input (q/k/v, gate/up).

    The members' weights are views into one concatenated weight, so copying into a member's
    `weight` (sync_weights, by name) updates the fused one. The first member called with an input
    computes every member's output; the others get their slice of it when called with that very
    tensor. A member called twice, or with another tensor, triggers a fresh product: a stale
    result is never served."""

    def __init__(self, linears: list[nn.Linear], dtype: torch.dtype, cast_back: bool) -> None:
        weight = torch.cat([linear.weight.detach() for linear in linears]).to(dtype)  # [sum N, K]
        has_bias = linears[0].bias is not None
        bias = (
            torch.cat([linear.bias.detach() for linear in linears]).to(dtype) if has_bias else None
        )
        self.matmul = _Matmul(weight, bias)
        self.bounds = [0]
        for linear in linears:
            self.bounds.append(self.bounds[-1] + linear.out_features)
        self.cast_back = cast_back
        self._input: torch.Tensor | None = None
        self._output: torch.Tensor | None = None
        self._unserved: set[int] = set()

    def member(self, index: int, linear: nn.Linear) -> FusedMember:
        member = FusedMember(
            linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta"
        )
        lo, hi = self.bounds[index], self.bounds[index + 1]
        member.weight = nn.Parameter(
            self.matmul.weight[lo:hi], requires_grad=False
        )  # a view: shares storage
        if self.matmul.bias is not None:
            member.bias = nn.Parameter(self.matmul.bias[lo:hi], requires_grad=False)
        member.group, member.index = self, index
        return member

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        """Every member's output side by side, [..., sum N] (`bounds` splits it)."""
        out = self.matmul(x)
        return out.to(x.dtype) if self.cast_back and out.dtype != x.dtype else out

    def output(self, index: int, x: torch.Tensor) -> torch.Tensor:
        if x is not self._input or index not in self._unserved:
            self._output = self.compute(x)
            self._input, self._unserved = x, set(range(len(self.bounds) - 1))
        self._unserved.discard(index)
        out = self._output[..., self.bounds[index] : self.bounds[index + 1]]
        if not self._unserved:  # every member served: let go of the tensors
            self._input = self._output = None
        return out


class FusedMember(nn.Linear):
    group: FusedGroup
    index: int

    def repack(self) -> None:
        if self.index == 0:
            self.group.matmul.repack()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.output(self.index, x)


def _lower_linears(model: nn.Module, dtype: torch.dtype, head_dtype: torch.dtype) -> None:
    """Replace the Linear layers of `model` in place by low-precision ones, fusing siblings."""
    head = model.get_output_embeddings()
    for parent in list(model.modules()):
        linears = {
            n: c for n, c in parent.named_children() if type(c) is nn.Linear and c is not head
        }
        for names in _FUSED_GROUPS:
            members = [linears.get(n) for n in names]
            if (
                any(m is None for m in members)
                or len({(m.in_features, m.bias is None) for m in members}) > 1
            ):
                continue
            group = FusedGroup(members, dtype, cast_back=not set(names) <= _LOW_PRECISION_OUTPUTS)
            for index, (name, linear) in enumerate(zip(names, members)):
                setattr(parent, name, group.member(index, linear))
                del linears[name]
        for name, linear in linears.items():
            setattr(
                parent,
                name,
                LowPrecisionLinear.from_linear(linear, dtype, name not in _LOW_PRECISION_OUTPUTS),
            )
    if type(head) is nn.Linear and (head.weight.dtype != head_dtype or _can_pack(head.weight)):
        # A tied head gets a module of its own: a copy in another dtype, or (same dtype) the
        # shared weight plus its packed copy; the input embedding keeps the policy's dtype.
        model.set_output_embeddings(
            LowPrecisionLinear.from_linear(
                head, head_dtype, cast_back=False, batch_hint=_HEAD_PACK_BATCH_HINT
            )
        )


def inference_copy(
    policy, matmul_dtype: torch.dtype | None, head_dtype: torch.dtype | None, device: torch.device,
    fuse_norms: bool = True,
) -> nn.Module:
    """An inference copy of the policy's causal LM: LoRA merged (4-bit bases dequantized), Linear
    weights in `matmul_dtype` (the LM head in `head_dtype`), the rest in the policy's dtype; eval
    mode, no grads. The weights come from `lm_tensors`, as every later `copy_weights_into` does.
    `fuse_norms`: its RMSNorm layers run as one op each (grpo/rollout/fused_norms.py)."""
    model = language_model_of(policy)
    with torch.no_grad():
        clone = copy.deepcopy(model)
        if is_peft(clone):
            clone = clone.unload()  # the plain module tree; the merged values are copied in below
        dequantize_linears_(clone)
        ReusedEmbeddingGradient.remove_from(clone)
        for param in clone.parameters():
            param.grad = None
            param.requires_grad_(False)
        clone = clone.to(device)
        _copy_tensors(clone, lm_tensors(model))
        base_dtype = next(clone.parameters()).dtype
        matmul_dtype = matmul_dtype or base_dtype
        head_dtype = head_dtype or matmul_dtype
        fp32 = matmul_dtype == head_dtype == torch.float32
        if matmul_dtype != base_dtype or head_dtype != base_dtype or (fp32 and packs_fp32(device)):
            _lower_linears(clone, matmul_dtype, head_dtype)
        if fuse_norms:
            fuse_rms_norms(clone)
    clone.eval()
    return clone


def linear_products(model: nn.Module) -> list[_Matmul]:
    """The distinct Linear products of `model`: its packed ones, and a plain `_Matmul` (the
    `F.linear` it calls) for each `nn.Linear` left as it is."""
    products: dict[int, _Matmul] = {}
    for module in model.modules():
        if isinstance(module, LowPrecisionLinear):
            matmul = module.matmul
        elif isinstance(module, FusedMember):
            matmul = module.group.matmul
        elif isinstance(module, nn.Linear):
            matmul = _Matmul(module.weight, module.bias, packer=None)
        else:
            continue
        products[id(matmul)] = matmul
    return list(products.values())


def products_rows_independent(model: nn.Module) -> bool:
    """Does every Linear product of `model` give each row the same bits whatever rows are computed
    with it? Each kind of product is probed once per process (`_Matmul.rows_independent`)."""
    return all(matmul.rows_independent() for matmul in linear_products(model))


@torch.no_grad()
def copy_weights_into(target: nn.Module, policy) -> None:
    """Copy the policy's current tensors (LoRA merged) into `target` by name, casting dtypes."""
    _copy_tensors(target, lm_tensors(language_model_of(policy)))
    for module in target.modules():
        if isinstance(module, (LowPrecisionLinear, FusedMember)):
            module.repack()


def _copy_tensors(target: nn.Module, source: dict[str, torch.Tensor]) -> None:
    targets = target.state_dict(keep_vars=True)
    missing = [name for name in targets if name not in source]
    if missing:
        raise KeyError(f"the policy has no tensors for {missing[:5]} ({len(missing)} missing)")
    for name, tensor in targets.items():
        tensor.data.copy_(source[name])

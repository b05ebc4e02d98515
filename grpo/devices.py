"""Device and compute-dtype selection, and the autocast context every forward pass runs under.

- `pick_device(backend)`: the torch device a `backend:` value trains on.
- `compute_dtype(device, requested)`: the autocast dtype. `auto` is bf16 on CUDA (fp16 on GPUs
  without bf16) and on CPUs with AVX-512 BF16 or AMX (where bf16 matmuls run ~4x faster than
  fp32), fp16 on MPS, fp32 otherwise.
- `autocast_context(device, dtype)`: `torch.autocast` for reduced precision, a no-op for fp32.

Weights stay in their own dtype (`model.weights_dtype`); autocast only changes the precision of
the matmuls, so the optimizer updates full-precision master weights.
"""

from __future__ import annotations

import contextlib
from functools import lru_cache
from pathlib import Path

import torch

BACKENDS = ("auto", "vllm", "hf", "deepspeed", "mps", "cpu")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def pick_device(backend: str = "auto") -> torch.device:
    """The device that a `backend:` config value trains on.

    `auto`, `hf`: CUDA if present, else MPS, else CPU. `deepspeed`: CUDA (the local rank's GPU)
    or CPU (DeepSpeed also runs over gloo on CPU). `vllm` needs CUDA, `mps` needs MPS.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; allowed values: {', '.join(BACKENDS)}")
    cuda = torch.cuda.is_available()
    if backend == "cpu":
        return torch.device("cpu")
    if backend == "mps":
        if not _mps_available():
            raise RuntimeError(
                "backend 'mps' needs an Apple-silicon GPU (torch.backends.mps.is_available() is False)"
            )
        return torch.device("mps")
    if backend == "vllm":
        if not cuda:
            raise RuntimeError(
                "backend 'vllm' needs a CUDA GPU; use backend 'hf' or 'cpu' on this machine"
            )
        return torch.device("cuda", torch.cuda.current_device())
    if backend == "deepspeed":
        return torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    # auto, hf
    if cuda:
        return torch.device("cuda", torch.cuda.current_device())
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


@lru_cache(maxsize=1)
def cpu_has_fast_bf16() -> bool:
    """True when the CPU has native bf16 matmul instructions (AVX-512 BF16 or AMX)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return bool(flags & {"avx512_bf16", "amx_bf16"})
    # No /proc/cpuinfo (macOS, Windows): torch's dispatch level names AMX-capable x86 builds only.
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "")()
    return "AMX" in str(capability).upper()


def compute_dtype(device: torch.device, requested: str = "auto") -> torch.dtype:
    """The autocast dtype for `device`; `requested` is `auto` or a dtype name (`float32`, ...)."""
    if requested != "auto":
        if requested not in _DTYPES:
            raise ValueError(
                f"unknown dtype {requested!r}; allowed values: auto, {', '.join(_DTYPES)}"
            )
        return _DTYPES[requested]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu":
        return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
    if device.type == "mps":
        # MPS autocast supports fp16 everywhere (bf16 only on recent macOS); fp16 needs a GradScaler.
        return torch.float16 if torch.amp.is_autocast_available("mps") else torch.float32
    return torch.float32


def needs_grad_scaler(dtype: torch.dtype) -> bool:
    """fp16 gradients underflow without loss scaling; bf16 and fp32 do not need it."""
    return dtype == torch.float16


def autocast_context(device: torch.device, dtype: torch.dtype):
    """`torch.autocast` for reduced-precision compute; a no-op context for fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)

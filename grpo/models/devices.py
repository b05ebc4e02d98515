"""Device and compute-dtype selection, and the autocast context every forward pass runs under.

- `pick_device(backend)`: the torch device a `backend:` value trains on.
- `compute_dtype(device, requested)`: the autocast dtype. `auto` is bf16 on CUDA (fp16 on GPUs
  without bf16) and on CPUs with AVX-512 BF16 or AMX (where bf16 matmuls run ~4x faster than
  fp32), bf16 on MPS with macOS 14+ (else fp32: `mps_compute_dtype`), fp32 otherwise.
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
    if device.type == "mps":
        return mps_compute_dtype(
            requested,
            bf16_supported=mps_supports_bf16(),
            autocast_available=torch.amp.is_autocast_available("mps"),
        )
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
    return torch.float32


def mps_supports_bf16() -> bool:
    """bf16 tensors on MPS need macOS 14 (Sonoma) or newer."""
    check = getattr(getattr(torch.backends, "mps", None), "is_macos_or_newer", None)
    return bool(_mps_available() and check is not None and check(14, 0))


def mps_compute_dtype(
    requested: str, *, bf16_supported: bool, autocast_available: bool
) -> torch.dtype:
    """The autocast dtype on an Apple GPU (a pure function of what the machine supports).

    `auto`: bf16 where MPS has it (macOS 14+) and torch has MPS autocast, else fp32. Not fp16:
    fp16 gradients need loss scaling, which the update step does not apply. An explicit
    `bfloat16` without bf16 support, or any reduced dtype without MPS autocast, is an error.
    MPS has no float64 at all; nothing here ever asks for it."""
    if requested == "auto":
        return torch.bfloat16 if bf16_supported and autocast_available else torch.float32
    if requested not in _DTYPES:
        raise ValueError(f"unknown dtype {requested!r}; allowed values: auto, {', '.join(_DTYPES)}")
    dtype = _DTYPES[requested]
    if dtype == torch.bfloat16 and not bf16_supported:
        raise ValueError(
            "bfloat16 on MPS needs macOS 14 or newer; use model.dtype: float32 (or auto)"
        )
    if dtype != torch.float32 and not autocast_available:
        raise ValueError(
            f"model.dtype {requested} on MPS needs torch's MPS autocast (torch >= 2.5); "
            "use float32 (or auto)"
        )
    return dtype


def check_weights_dtype(device: torch.device, dtype: torch.dtype) -> None:
    """Raise a clear error for weight dtypes the device cannot hold (bf16 on older macOS)."""
    if device.type == "mps" and dtype == torch.bfloat16 and not mps_supports_bf16():
        raise ValueError(
            "model.weights_dtype: bfloat16 on MPS needs macOS 14 or newer; use float32"
        )


def needs_grad_scaler(dtype: torch.dtype) -> bool:
    """fp16 gradients underflow without loss scaling; bf16 and fp32 do not need it."""
    return dtype == torch.float16


def autocast_context(device: torch.device, dtype: torch.dtype):
    """`torch.autocast` for reduced-precision compute; a no-op context for fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)

"""Device and compute-dtype selection, and the autocast context every forward pass runs under.

- `resolve_device(name)`: the torch device a `device:` value trains on, and why.
- `compute_dtype(device, requested)`: the autocast dtype. `auto` is bf16 on CUDA (fp16 on GPUs
  without bf16) and on CPUs with AVX-512 BF16 or AMX (where bf16 matmuls run ~4x faster than
  fp32), bf16 on MPS with macOS 14+ (else fp32: `mps_compute_dtype`), fp32 otherwise.
- `autocast_context(device, dtype)`: `torch.autocast` for reduced precision, a no-op for fp32.
- `select_attention_kernels(device, model_config)`: on CUDA, whether SDPA may use cuDNN's
  kernels (`model.cudnn_attention`).
- `memory_metrics(device)`: this process's resident memory and, on CUDA, its peak allocation
  since the last call (every training step's `memory/*` metrics).
- `release_free_memory()`: hand the memory the C allocator keeps after a phase (a rollout, an
  update) back to the system, where the allocator can (glibc).

Weights stay in their own dtype (`model.weights_dtype`); autocast only changes the precision of
the matmuls, so the optimizer updates full-precision master weights. fp16 compute (GPUs without
bf16 under `auto`, or `model.dtype: float16`) needs loss scaling: `needs_grad_scaler` tells the
update (grpo/algorithm/update.py, `make_grad_scaler`) to use torch's GradScaler.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from functools import lru_cache
from pathlib import Path
from typing import get_args

import torch

from grpo.models.config import Device, ModelConfig

DEVICES: tuple[str, ...] = get_args(Device)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


class DeviceUnavailable(RuntimeError):
    """The requested device is not present here; the message says what is missing."""


def resolve_device(name: str = "auto") -> tuple[torch.device, str]:
    """The device a `device:` config value trains on, and why (the launcher prints it).

    `auto`: CUDA if present (the local rank's GPU under `accelerate launch`), else MPS, else CPU.
    An explicit `cuda` or `mps` that is not present is an error."""
    if name not in DEVICES:
        raise ValueError(f"unknown device {name!r}; allowed values: {', '.join(DEVICES)}")
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if name == "cuda" and not cuda:
        raise DeviceUnavailable("device=cuda: torch.cuda.is_available() is False here")
    if name == "mps" and not _mps_available():
        raise DeviceUnavailable("device=mps: torch reports no MPS device (Apple GPU) here")
    if name == "cpu":
        return torch.device("cpu"), "requested in config"
    if name == "cuda" or (name == "auto" and cuda):
        return torch.device("cuda", local_rank), "requested in config" if name == "cuda" else "auto: CUDA is available"
    if name == "mps" or _mps_available():
        return torch.device("mps"), "requested in config" if name == "mps" else "auto: an Apple MPS device is available"
    return torch.device("cpu"), "auto: no CUDA or MPS device found"


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
    its gradients need loss scaling (the update applies it, but bf16 needs none). An explicit
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
    """fp16 gradients underflow without loss scaling (gradients below ~6e-8 flush to zero in an
    fp16 backward); bf16 (fp32's exponent range) and fp32 do not need it."""
    return dtype == torch.float16


def autocast_context(device: torch.device, dtype: torch.dtype):
    """`torch.autocast` for reduced-precision compute; a no-op context for fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def select_attention_kernels(device: torch.device, model: ModelConfig) -> None:
    """On CUDA, switch `scaled_dot_product_attention`'s cuDNN kernels on or off for this process
    as `model.cudnn_attention` says (see its docstring for why off is the default); elsewhere
    nothing changes."""
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(model.cudnn_attention)


def memory_metrics(device: torch.device) -> dict[str, float]:
    """This process's memory for a step's metrics, in MiB. `memory/rss_mib_max`: resident now
    (Linux /proc; not reported elsewhere); `memory/cuda_peak_mib_max` (CUDA): the most tensors
    held at once since the previous call, whose peak counter it then resets. `_max` makes a
    data-parallel run report its largest rank (grpo/distributed/parallel.py `combine_metrics`)."""
    out: dict[str, float] = {}
    try:
        with open("/proc/self/statm") as statm:
            resident_pages = int(statm.read().split()[1])
        out["memory/rss_mib_max"] = resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        pass
    if device.type == "cuda":
        out["memory/cuda_peak_mib_max"] = torch.cuda.max_memory_allocated(device) / 2**20
        torch.cuda.reset_peak_memory_stats(device)
    return out


@lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's `malloc_trim`, or None where the C library has none (macOS, musl, Windows)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None


def release_free_memory() -> bool:
    """Return the free memory the C allocator holds to the system (glibc's `malloc_trim(0)`).

    Tensors on a CPU come from malloc. glibc keeps the blocks freed after a phase (a rollout's
    caches, an update's activations: many a few MB each, below the mmap threshold it raises as
    large blocks come and go) in its arenas, so a training process's resident size climbs step
    after step although nothing is held, by gigabytes for a small model. Trimming after each phase
    keeps it near what the next phase needs; it costs milliseconds. A no-op elsewhere. Returns
    whether the allocator could be asked."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    return trim is not None

"""grpo/models/devices.py: the device and compute dtype a run takes, autocast, attention
kernels, memory metrics."""

from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path

import pytest
import torch

from grpo.models.config import ModelConfig
from grpo.models.devices import (
    DeviceUnavailable,
    autocast_context,
    compute_dtype,
    memory_metrics,
    release_free_memory,
    resolve_device,
    select_attention_kernels,
)


def test_resolve_device_and_dtypes():
    assert resolve_device("cpu") == (torch.device("cpu"), "requested in config")
    assert resolve_device("auto") == (torch.device("cpu"), "auto: no CUDA or MPS device found")
    with pytest.raises(ValueError, match="allowed values: auto, cpu, cuda, mps"):
        resolve_device("tpu")
    with pytest.raises(DeviceUnavailable, match=r"device=cuda: torch.cuda.is_available\(\) is False"):
        resolve_device("cuda")
    cpu = torch.device("cpu")
    assert compute_dtype(cpu, "float32") == torch.float32
    assert compute_dtype(cpu, "bfloat16") == torch.bfloat16
    assert compute_dtype(cpu, "auto") in (torch.float32, torch.bfloat16)
    with pytest.raises(ValueError, match="allowed values"):
        compute_dtype(cpu, "float8")
    assert isinstance(autocast_context(cpu, torch.float32), contextlib.nullcontext)
    with autocast_context(cpu, torch.bfloat16):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


@pytest.fixture
def cudnn_sdp_flag():
    """Restores torch's process-wide cuDNN attention switch after the test."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


def test_cudnn_attention_is_switched_off_on_cuda_unless_the_config_asks_for_it(cudnn_sdp_flag):
    assert ModelConfig().cudnn_attention is False
    torch.backends.cuda.enable_cudnn_sdp(True)
    select_attention_kernels(torch.device("cpu"), ModelConfig())  # not CUDA: left as it is
    assert torch.backends.cuda.cudnn_sdp_enabled() is True
    select_attention_kernels(torch.device("cuda", 0), ModelConfig())
    assert torch.backends.cuda.cudnn_sdp_enabled() is False
    select_attention_kernels(torch.device("cuda", 0), ModelConfig(cudnn_attention=True))
    assert torch.backends.cuda.cudnn_sdp_enabled() is True


@pytest.mark.skipif(not Path("/proc/self/statm").is_file(), reason="no /proc: resident memory is not reported")
def test_memory_metrics_follow_this_process_resident_memory():
    # A fresh anonymous mapping, not a tensor: the allocator may hand a tensor pages this process
    # already holds (freed by an earlier test), and then resident memory does not move.
    cpu = torch.device("cpu")
    size = 64 * 2**20
    page = mmap.PAGESIZE
    before = memory_metrics(cpu)
    with mmap.mmap(-1, size) as block:
        for offset in range(0, size, page):  # touch every page so it becomes resident
            block[offset] = 1
        after = memory_metrics(cpu)
    assert set(after) == {"memory/rss_mib_max"}  # nothing CUDA on a CPU device
    assert after["memory/rss_mib_max"] - before["memory/rss_mib_max"] == pytest.approx(64, abs=4)


def test_auto_dtype_follows_cpu_flags(monkeypatch):
    from grpo.models import devices

    flags = Path("/proc/cpuinfo").read_text()
    expected = torch.bfloat16 if ("avx512_bf16" in flags or "amx_bf16" in flags) else torch.float32
    assert devices.compute_dtype(torch.device("cpu"), "auto") == expected
    monkeypatch.setattr(devices, "cpu_has_fast_bf16", lambda: False)
    assert devices.compute_dtype(torch.device("cpu"), "auto") == torch.float32


def _resident_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_freed_tensors_stay_resident_until_released():
    if not release_free_memory():
        pytest.skip("the C library has no malloc_trim (glibc only)")
    # Freeing a 16 MB block raises glibc's mmap threshold to 16 MB, as a step's large tensors do;
    # 4 MB tensors then come from the heap, and one allocated after them keeps the heap's top.
    big = torch.ones(4 << 20)
    del big
    blocks = [torch.ones(1 << 20) for _ in range(128)]  # 512 MB, touched
    top = torch.ones(1 << 20)
    held = _resident_mib()
    del blocks
    assert _resident_mib() > held - 64  # freed, still resident: what climbs step after step
    release_free_memory()
    assert _resident_mib() < held - 384
    del top

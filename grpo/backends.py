"""Backends: where the policy trains and which engine samples rollouts.

Each backend is a small class behind `Backend`; `make_backend(name)` resolves `auto` and raises
on an unknown name, listing the options. A backend says which device the policy lives on,
builds the rollout engine, and says why it was chosen (the launcher prints that).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from grpo.config import BACKENDS
from grpo.rollout.vllm_params import vllm_enabled

log = logging.getLogger(__name__)


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run here; the message says what is missing."""


@dataclass
class Backend(ABC):
    reason: str = ""

    name: str = "abstract"

    @abstractmethod
    def device(self) -> torch.device: ...

    def make_engine(self, policy, tokenizer, config):
        """The rollout engine: HF sampling on the policy's own device by default."""
        from grpo.rollout import make_engine

        return make_engine("hf", policy=policy, tokenizer=tokenizer, config=config, device=self.device())

    @property
    def is_main_process(self) -> bool:
        return int(os.environ.get("RANK", "0")) == 0


@dataclass
class CPUBackend(Backend):
    name: str = "cpu"

    def device(self) -> torch.device:
        return torch.device("cpu")


@dataclass
class MPSBackend(Backend):
    name: str = "mps"

    def device(self) -> torch.device:
        if not torch.backends.mps.is_available():
            raise BackendUnavailable("backend=mps: torch reports no MPS device (Apple GPU) here")
        return torch.device("mps")


@dataclass
class HFCudaBackend(Backend):
    name: str = "hf"

    def device(self) -> torch.device:
        if not torch.cuda.is_available():
            raise BackendUnavailable("backend=hf needs CUDA; torch.cuda.is_available() is False")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


@dataclass
class VLLMBackend(HFCudaBackend):
    """Trains on CUDA with HF, samples with vLLM (grpo/rollout/vllm.py). With `ENABLE_VLLM=0`
    or `vllm.enabled: false` it samples with the HF engine on the same GPU (logged)."""

    name: str = "vllm"

    def device(self) -> torch.device:
        if vllm_enabled() and importlib.util.find_spec("vllm") is None:
            raise BackendUnavailable(
                "backend=vllm: the vllm package is not installed (make install-gpu, or pip install "
                "'.[vllm]'); set ENABLE_VLLM=0 to sample with the HF engine instead"
            )
        return super().device()

    def make_engine(self, policy, tokenizer, config):
        from grpo.rollout import make_engine

        if not vllm_enabled(config.vllm.enabled):
            source = "ENABLE_VLLM" if os.environ.get("ENABLE_VLLM", "").strip() else "vllm.enabled"
            log.info("backend=vllm: vLLM disabled by %s; sampling with the HF engine on %s",
                     source, self.device())
            return super().make_engine(policy, tokenizer, config)
        return make_engine("vllm", policy=policy, tokenizer=tokenizer, config=config, device=self.device())


@dataclass
class DeepSpeedBackend(Backend):
    name: str = "deepspeed"

    def device(self) -> torch.device:
        if importlib.util.find_spec("deepspeed") is None:
            raise BackendUnavailable("backend=deepspeed: the deepspeed package is not installed")
        if "ACCELERATE_USE_DEEPSPEED" not in os.environ and "LOCAL_RANK" not in os.environ:
            raise BackendUnavailable(
                "backend=deepspeed runs under `accelerate launch --config_file configs/accelerate_zero3.yaml "
                "launch/distributed.py ...`"
            )
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cpu")


_CLASSES: dict[str, type[Backend]] = {
    "cpu": CPUBackend,
    "mps": MPSBackend,
    "hf": HFCudaBackend,
    "vllm": VLLMBackend,
    "deepspeed": DeepSpeedBackend,
}


def resolve_auto() -> tuple[str, str]:
    """The backend `auto` picks here, and why."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        return "deepspeed", "running under accelerate with a DeepSpeed config"
    if torch.cuda.is_available():
        if importlib.util.find_spec("vllm") is not None and vllm_enabled():
            return "vllm", "CUDA is available and vllm is installed"
        return "hf", "CUDA is available, vllm is not installed (or ENABLE_VLLM=0)"
    if torch.backends.mps.is_available():
        return "mps", "an Apple MPS device is available and CUDA is not"
    return "cpu", "no CUDA or MPS device found"


def make_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; options: {', '.join(BACKENDS)}")
    if name == "auto":
        chosen, reason = resolve_auto()
        return _CLASSES[chosen](reason=f"auto: {reason}")
    return _CLASSES[name](reason="requested in config")

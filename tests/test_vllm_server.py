"""The vLLM server engine's own logic (grpo/rollout/vllm/server.py) over a scripted HTTP transport:
what it sends, how it spreads requests, how it reads answers, and what happens when a server dies
or stalls. The scripted servers stand in for `vllm serve` to make failures exact; the engine
against real servers is tests/test_vllm_servers_real.py."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from grpo.config import RunConfig
from grpo.models.config import LoraConfig, ModelConfig
from grpo.models.policy import PolicyWithValueHead
from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.config import VLLMServerConfig
from grpo.rollout.vllm.params import RAW
from grpo.rollout.vllm.server import SERVED_NAME, ServerFailure, VLLMServerEngine, serve_command

URLS = ["http://a:1", "http://b:2"]


class ScriptedServers:
    """Answers like `vllm serve`: a completion of prompt [..., last] is [last + 1, last + 2],
    each token with log-prob -token / 100. `dead` servers refuse connections, `stalled` ones
    time out, `refusing` ones answer completions with HTTP 400."""

    def __init__(self):
        self.dead: set[str] = set()
        self.stalled: set[str] = set()
        self.refusing: set[str] = set()
        self.answers: dict[str, httpx.Response] = {}
        """A fixed answer to every completion request, by server."""
        self.adapters: dict[str, set[str]] = {}
        self.calls: list[tuple[str, str, dict]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        server = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        body = json.loads(request.content) if request.content else {}
        if server in self.dead:
            raise httpx.ConnectError("connection refused", request=request)
        if server in self.stalled:
            raise httpx.ReadTimeout("timed out", request=request)
        self.calls.append((server, request.url.path, body))
        loaded = self.adapters.setdefault(server, set())
        if request.url.path == "/v1/load_lora_adapter":  # as vLLM: a loaded name needs load_inplace
            if body["lora_name"] in loaded and not body.get("load_inplace"):
                return httpx.Response(400, json={"error": "adapter already loaded"})
            loaded.add(body["lora_name"])
        if request.url.path == "/v1/completions" and server in self.answers:
            return self.answers[server]
        if request.url.path == "/v1/completions" and server in self.refusing:
            return httpx.Response(400, json={"error": "prompt too long"})
        if request.url.path == "/v1/completions":
            last = body["prompt"][-1]
            tokens = [last + 1, last + 2][: body["max_tokens"]]
            return httpx.Response(200, json={"choices": [{
                "token_ids": tokens, "finish_reason": "length",
                "logprobs": {"token_logprobs": [-t / 100 for t in tokens]}}]})
        return httpx.Response(200, json={})

    def paths(self, server: str | None = None) -> list[str]:
        return [path for s, path, _ in self.calls if server is None or s == server]


def _engine(lora: bool, servers: ScriptedServers, tmp_path, **settings) -> VLLMServerEngine:
    policy, tokenizer = PolicyWithValueHead.from_config(
        ModelConfig(name_or_path="tiny-random", dtype="float32"), LoraConfig(enabled=lora), "cpu", seed=0)
    config = VLLMServerConfig(urls=URLS, weights_dir=str(tmp_path / "weights"), **settings)
    return VLLMServerEngine(policy, tokenizer, settings=config, logprobs_mode=RAW, max_model_len=64,
                            transport=httpx.MockTransport(servers))


def _requests(n: int, max_new: int = 2) -> list[GenerationRequest]:
    return [GenerationRequest([1, 10 * (i + 1)], SamplingParams(max_new_tokens=max_new, seed=i), f"r{i}")
            for i in range(n)]


def test_requests_are_spread_and_results_come_back_in_order(tmp_path):
    servers = ScriptedServers()
    engine = _engine(False, servers, tmp_path)
    results = engine.generate(_requests(6))
    assert [r.token_ids for r in results] == [[10 * (i + 1) + 1, 10 * (i + 1) + 2] for i in range(6)]
    assert results[0].behavior_logprobs == [-0.11, -0.12] and results[0].finish_reason == "length"
    sent = [(s, b) for s, path, b in servers.calls if path == "/v1/completions"]
    assert {s for s, _ in sent} == set(URLS)  # both servers sampled
    body = sent[0][1]
    assert body["prompt"] == [1, 10] and body["model"] == SERVED_NAME and body["seed"] == 0
    assert body["logprobs"] == 0 and body["return_token_ids"] and body["ignore_eos"]
    assert "n" not in body and "detokenize" not in body  # not /v1/completions fields
    assert engine.last_metrics["server_failures"] == 0 and engine.last_metrics["live_servers"] == 2
    with pytest.raises(ValueError, match="max_model_len 64"):
        engine.generate([GenerationRequest([1] * 60, SamplingParams(max_new_tokens=8), "long")])
    with pytest.raises(ValueError, match="temperature 0.5"):
        engine.generate([GenerationRequest([1], SamplingParams(temperature=0.5), "t")])


def test_full_weights_are_published_and_reloaded_by_every_server(tmp_path):
    servers = ScriptedServers()
    engine = _engine(False, servers, tmp_path)
    assert servers.paths(URLS[0]) == ["/collective_rpc", "/reset_prefix_cache"]
    rpc = next(b for _, path, b in servers.calls if path == "/collective_rpc")
    assert rpc["method"] == "reload_weights"
    published = rpc["kwargs"]["weights_path"]
    assert (tmp_path / "weights" / "v000001").as_posix() == published
    assert any(p.suffix == ".safetensors" for p in (tmp_path / "weights" / "v000001").iterdir())
    assert engine.model_name == SERVED_NAME  # full fine-tuning samples the (reloaded) base name
    engine.close()
    assert not (tmp_path / "weights" / "v000001").exists()


def test_lora_adapters_are_loaded_as_new_names_and_requests_use_them(tmp_path):
    servers = ScriptedServers()
    engine = _engine(True, servers, tmp_path)
    servers.calls.clear()
    policy, _ = PolicyWithValueHead.from_config(
        ModelConfig(name_or_path="tiny-random", dtype="float32"), LoraConfig(enabled=True), "cpu", seed=0)
    engine.sync_weights(policy)
    for url in URLS:
        assert servers.paths(url) == ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"]
    load, unload = [b for s, _, b in servers.calls if s == URLS[0]]
    assert load == {"lora_name": "policy-v2", "lora_path": str(tmp_path / "weights" / "v000002"),
                    "load_inplace": True}
    assert unload == {"lora_name": "policy-v1"}
    engine.generate(_requests(1))
    assert servers.calls[-1][2]["model"] == "policy-v2"


def test_a_dead_server_loses_no_request_and_is_reported(tmp_path):
    servers = ScriptedServers()
    engine = _engine(True, servers, tmp_path, retry_after_s=60.0)
    servers.dead.add(URLS[0])
    results = engine.generate(_requests(8))
    assert [r.token_ids[0] for r in results] == [10 * (i + 1) + 1 for i in range(8)]
    assert engine.last_metrics["server_failures"] == 1
    assert engine.last_metrics["retried_requests"] >= 1 and engine.last_metrics["live_servers"] == 1
    servers.dead.clear()  # back, but within retry_after_s: still skipped
    servers.calls.clear()
    engine.generate(_requests(4))
    assert {s for s, _, _ in servers.calls} == {URLS[1]}


def test_a_server_back_after_its_wait_gets_the_current_weights_first(tmp_path):
    servers = ScriptedServers()
    engine = _engine(True, servers, tmp_path, retry_after_s=0.0)
    servers.stalled.add(URLS[1])
    engine.generate(_requests(4))
    assert engine.last_metrics["server_failures"] == 1
    servers.stalled.clear()
    servers.calls.clear()
    engine.generate(_requests(6))
    revived = servers.paths(URLS[1])  # it held policy-v1 already: loaded again in place
    assert revived[0] == "/v1/load_lora_adapter" and "/v1/completions" in revived
    assert engine.last_metrics["live_servers"] == 2


def test_every_server_down_is_an_error_naming_them(tmp_path):
    servers = ScriptedServers()
    engine = _engine(False, servers, tmp_path)
    servers.dead.update(URLS)
    with pytest.raises(ServerFailure, match="no live vLLM server left.*http://a:1.*http://b:2"):
        engine.generate(_requests(2))
    with pytest.raises(ServerFailure, match="no vLLM server took the new weights"):
        engine.sync_weights(PolicyWithValueHead.from_config(
            ModelConfig(name_or_path="tiny-random", dtype="float32"), LoraConfig(enabled=False),
            "cpu", seed=0)[0])


def test_a_refused_request_is_our_error_not_a_failover(tmp_path):
    servers = ScriptedServers()
    engine = _engine(False, servers, tmp_path)
    servers.refusing.update(URLS)
    with pytest.raises(ValueError, match="refused the request: HTTP 400.*prompt too long"):
        engine.generate(_requests(1))
    assert engine.last_metrics.get("server_failures", 0) == 0


def test_serve_command_carries_the_engine_arguments(tmp_path):
    config = RunConfig.model_validate({
        "model": {"name_or_path": "tiny-random", "dtype": "float32"},
        "lora": {"enabled": True, "r": 16},
        "rollout": {"max_total_tokens": 512, "vllm": {"enforce_eager": True, "kv_cache_gib": 0.5}},
    })
    command = serve_command(config, tmp_path, port=8123, python="py")
    assert command[:5] == ["py", "-m", "vllm.entrypoints.openai.api_server", "--model", str(tmp_path)]
    flags = dict(zip(command[5::2], command[6::2]))
    assert flags["--port"] == "8123" and flags["--served-model-name"] == SERVED_NAME
    assert flags["--dtype"] == "float32" and flags["--max-model-len"] == "512"
    assert flags["--kv-cache-memory-bytes"] == str(2**29) and flags["--logprobs-mode"] == RAW
    assert flags["--max-lora-rank"] == "16" and flags["--generation-config"] == "vllm"
    assert "--enforce-eager" in command and "--enable-lora" in command
    assert "--enable-prefix-caching" in command and "--gpu-memory-utilization" not in command
    # on a CPU each prompt is prefilled whole (params.whole_prefill_kwargs), in a budget of >= one prompt
    assert "--no-enable-chunked-prefill" in command and flags["--max-num-batched-tokens"] == "4096"
    on_cuda = serve_command(config, tmp_path, port=8123, python="py", device="cuda")
    assert not any("chunked-prefill" in arg or "max-num-batched" in arg for arg in on_cuda)


def test_weights_sync_and_requests_are_served_from_inside_a_running_event_loop(tmp_path):
    # The trainer pushes weights from its own event loop (GRPOTrainer._after_update): the engine
    # must not call asyncio.run there ("cannot be called from a running event loop").
    import asyncio

    servers = ScriptedServers()
    engine = _engine(True, servers, tmp_path)
    policy, _ = PolicyWithValueHead.from_config(
        ModelConfig(name_or_path="tiny-random", dtype="float32"), LoraConfig(enabled=True), "cpu", seed=0)

    async def inside_a_loop():
        engine.sync_weights(policy)
        return engine.generate(_requests(2))

    results = asyncio.run(inside_a_loop())
    assert engine.model_name == "policy-v2" and [r.token_ids for r in results] == [[11, 12], [21, 22]]
    assert servers.calls[-1][2]["model"] == "policy-v2"


def test_a_server_that_fails_a_weight_push_is_counted_by_the_next_call(tmp_path):
    servers = ScriptedServers()
    engine = _engine(True, servers, tmp_path, retry_after_s=60.0)
    policy, _ = PolicyWithValueHead.from_config(
        ModelConfig(name_or_path="tiny-random", dtype="float32"), LoraConfig(enabled=True), "cpu", seed=0)
    servers.dead.add(URLS[1])
    engine.sync_weights(policy)  # b refuses the adapter: stale, and down for retry_after_s
    engine.generate(_requests(2))
    assert (engine.last_metrics["server_failures"], engine.last_metrics["live_servers"]) == (1, 1)
    engine.generate(_requests(2))
    assert engine.last_metrics["server_failures"] == 0


def _completion(token_ids, logprobs, finish_reason="length") -> dict:
    return {"choices": [{"token_ids": token_ids, "finish_reason": finish_reason,
                         "logprobs": {"token_logprobs": logprobs}}]}


def _json(answer) -> httpx.Response:
    return httpx.Response(200, json=answer)


INVALID_ANSWERS = {
    "id past the vocabulary": (_json(_completion([11, 49152], [-0.1, -0.2])),
                               "token 1 is id 49152, outside the vocabulary [0, 49152)"),
    "negative id": (_json(_completion([-1], [-0.1])), "token 0 is id -1, outside the vocabulary [0, 49152)"),
    "more tokens than asked": (_json(_completion([5] * 5000, [-0.1] * 5000)),
                               "5000 tokens for a request of at most 2 (max_new_tokens)"),
    "NaN log-prob": (httpx.Response(200, content=b'{"choices": [{"token_ids": [5], "finish_reason": '
                                                  b'"length", "logprobs": {"token_logprobs": [NaN]}}]}',
                                    headers={"content-type": "application/json"}),
                     "the log-prob of token 0 is nan, not a finite number"),
    "positive log-prob": (_json(_completion([5, 6], [-0.1, 0.5])),
                          "the log-prob of token 1 is 0.5, above 0 (a probability over 1)"),
    "garbage JSON": (httpx.Response(200, content=b"{choices: [", headers={"content-type": "application/json"}),
                     ("the answer is not JSON (Expecting property name enclosed in double quotes: line 1 "
                     "column 2 (char 1)): '{choices: ['")),
    "no choices": (_json({"object": "error"}), "`choices` is missing (null), not a list of one choice"),
    "choices an object": (_json({"choices": {"token_ids": [5]}}), "`choices` is an object of 1, not a list of one choice"),
    "a token id as text": (_json(_completion(["5"], [-0.1])), "token 0 is '5', not an integer id"),
    "a token id true": (_json(_completion([True], [-0.1])), "token 0 is True, not an integer id"),
    "fewer log-probs": (_json(_completion([5, 6], [-0.1])), "2 tokens but 1 log-probs"),
    "a null log-prob": (_json(_completion([5], [None])), "the log-prob of token 0 is missing (null), not a finite number"),
    "aborted": (_json(_completion([5], [-0.1], "abort")), "finish_reason 'abort', not 'stop' or 'length'"),
    "a JSON list": (_json([1, 2]), "the answer is a list of 2, not a JSON object"),
}


@pytest.mark.parametrize("case", list(INVALID_ANSWERS))
def test_an_invalid_answer_fails_the_server_and_the_request_goes_elsewhere(case, tmp_path, caplog):
    answer, problem = INVALID_ANSWERS[case]
    servers = ScriptedServers()
    engine = _engine(False, servers, tmp_path, retry_after_s=60.0)
    servers.answers[URLS[0]] = answer
    with caplog.at_level("WARNING", logger="grpo.rollout.vllm.server"):
        results = engine.generate(_requests(1))
    assert [r.token_ids for r in results] == [[11, 12]]  # served by the other server
    assert (engine.last_metrics["server_failures"], engine.last_metrics["live_servers"]) == (1, 1)
    assert problem in caplog.text and URLS[0] in caplog.text
    servers.answers[URLS[1]] = answer
    engine.servers[0].down_until = 0.0  # both back in service, both answering the same way
    with pytest.raises(ServerFailure) as failed:
        engine.generate(_requests(1))
    assert "no live vLLM server left" in str(failed.value) and problem in str(failed.value)


def test_a_log_prob_rounded_just_above_zero_is_taken_as_zero(tmp_path):
    servers = ScriptedServers()
    engine = _engine(False, servers, tmp_path)
    servers.answers.update({url: _json(_completion([5, 6], [3e-5, -0.25], "stop")) for url in URLS})
    (result,) = engine.generate(_requests(1))
    assert (result.token_ids, result.behavior_logprobs, result.finish_reason) == ([5, 6], [0.0, -0.25], "stop")


class LocalServer:
    """A real HTTP server on a local port, in a thread: it answers weight pushes with `{}` and
    completions like ScriptedServers, or, when `drip`, with headers and then one byte of a
    300-byte body every 0.5 s (2.5 minutes in all: every read comes well within any timeout)."""

    def __init__(self, drip: bool):
        stopped = self.stopped = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                answer = json.dumps({})
                if self.path == "/v1/completions":
                    tokens = [body["prompt"][-1] + 1, body["prompt"][-1] + 2][: body["max_tokens"]]
                    answer = json.dumps(_completion(tokens, [-t / 100 for t in tokens]))
                size = 300 if drip and self.path == "/v1/completions" else len(answer)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(size))
                self.end_headers()
                if size == len(answer):
                    self.wfile.write(answer.encode())
                    return
                for _ in range(size):
                    if stopped.wait(0.5):
                        return
                    try:
                        self.wfile.write(b" ")
                        self.wfile.flush()
                    except OSError:  # the client hung up
                        return

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self):
        self.stopped.set()
        self.http.shutdown()
        self.http.server_close()


def test_a_server_dripping_its_answer_fails_at_the_deadline_and_the_request_goes_elsewhere(tmp_path):
    drip, good = LocalServer(drip=True), LocalServer(drip=False)
    try:
        policy, tokenizer = PolicyWithValueHead.from_config(
            ModelConfig(name_or_path="tiny-random", dtype="float32"), LoraConfig(enabled=False), "cpu", seed=0)
        settings = VLLMServerConfig(urls=[drip.url, good.url], weights_dir=str(tmp_path / "w"),
                                    request_timeout_s=2.0, retry_after_s=60.0)
        engine = VLLMServerEngine(policy, tokenizer, settings=settings, logprobs_mode=RAW, max_model_len=64)
        started = time.perf_counter()
        results = engine.generate(_requests(1))  # the first request goes to the first server
        elapsed = time.perf_counter() - started
        assert [r.token_ids for r in results] == [[11, 12]]
        assert 2.0 <= elapsed < 4.0, f"generate took {elapsed:.1f} s with a 2 s deadline"
        assert engine.last_metrics["server_failures"] == 1
        assert engine.servers[0].last_error == (f"{drip.url}/v1/completions: no complete answer within "
                                                "2 s (rollout.vllm_server.request_timeout_s)")
        only_drip = VLLMServerEngine(policy, tokenizer, settings=settings.model_copy(update={
                                         "urls": [drip.url], "weights_dir": str(tmp_path / "w2")}),
                                     logprobs_mode=RAW, max_model_len=64)
        started = time.perf_counter()
        with pytest.raises(ServerFailure, match="no live vLLM server left.*no complete answer within 2 s"):
            only_drip.generate(_requests(1))
        assert time.perf_counter() - started < 4.0
    finally:
        drip.close()
        good.close()

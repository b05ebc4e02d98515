"""The vLLM server engine (`rollout.engine: vllm_server`) against two real vLLM servers on
localhost (vLLM's CPU build in `make test`), started once for the module by
launch/vllm_servers.py: a LoRA adapter and a full-weight update reach both servers through
vLLM's own endpoints and change what they sample, their log-probs match the trainer's, and a
server killed in the middle of a batch loses no request: the other serves it, the same tokens.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
from vllm_helpers import (
    DEVICE,
    chat_requests,
    mismatch,
    perturb,
    require_vllm,
    run_config,
    write_model,
)

from grpo.models.policy import PolicyWithValueHead
from grpo.rollout.vllm_server import VLLMServerEngine
from launch.vllm_servers import running_servers

# The first test's time includes starting both servers (imports, model load, engine start): more
# than pytest's default 300 s on a busy 2-core machine.
pytestmark = pytest.mark.timeout(900)


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.fixture(scope="module")
def servers(tmp_path_factory, tokenizer):
    require_vllm()
    model_dir = write_model(tmp_path_factory.mktemp("served-model"), tokenizer)
    config = run_config(model_dir, lora=True)
    with running_servers(config, model_dir, _free_ports(2), log_dir=tmp_path_factory.mktemp("logs"),
                         device=DEVICE) as running:
        yield model_dir, running


def _engine(model_dir, running, lora: bool, tmp_path):
    config = run_config(model_dir, lora=lora)
    config.vllm_server.urls = [s.url for s in running]
    config.vllm_server.weights_dir = str(tmp_path / "weights")
    policy, tokenizer = PolicyWithValueHead.from_config(config.model, config.lora, DEVICE, seed=0)
    policy.eval()
    return policy, VLLMServerEngine.from_config(policy, tokenizer, config)


@pytest.mark.parametrize(("lora", "touched"), [(True, ("lora_B",)), (False, ("mlp.down_proj", "embed_tokens"))],
                         ids=["lora-adapter", "full-weights"])
def test_weight_updates_reach_both_servers(servers, tokenizer, tmp_path, lora, touched):
    model_dir, running = servers
    policy, engine = _engine(model_dir, running, lora, tmp_path)
    try:
        greedy = chat_requests(tokenizer, 2, temperature=0.0, seed0=None, stop=())
        both = greedy + greedy[::-1]  # spread in turn: each server answers each prompt once
        before = [r.token_ids for r in engine.generate(both)]
        assert before[:2] == before[2:][::-1]
        perturb(policy, touched, scale=0.5)
        engine.sync_weights(policy)
        after = [r.token_ids for r in engine.generate(both)]
        assert after[:2] == after[2:][::-1] and after[:2] != before[:2]
        sampled = chat_requests(tokenizer, 4)
        stats = mismatch(policy, sampled, engine.generate(sampled))
        assert stats["train/logprob_mismatch"] < 1e-4, stats
        assert engine.last_metrics["live_servers"] == 2
    finally:
        engine.close()


def test_a_server_killed_mid_batch_loses_no_request(servers, tokenizer, tmp_path):
    model_dir, running = servers
    _, engine = _engine(model_dir, running, True, tmp_path)
    requests = chat_requests(tokenizer, 8, max_new=128, stop=())
    done: list = []
    worker = threading.Thread(target=lambda: done.append(engine.generate(requests)))
    worker.start()
    deadline = time.monotonic() + 60
    while engine.servers[0].in_flight == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    running[0].kill()  # at once: its 128-token completions cannot have finished yet
    worker.join(timeout=engine.settings.request_timeout_s)
    assert not worker.is_alive() and done, "generate did not return"
    results = done[0]
    assert [len(r.token_ids) for r in results] == [128] * 8
    assert engine.last_metrics["server_failures"] == 1 and engine.last_metrics["retried_requests"] >= 1
    # Seeded requests: the survivor gives each the tokens it would have given from the start.
    again = engine.generate(requests)
    assert [r.token_ids for r in again] == [r.token_ids for r in results]
    assert engine.last_metrics["live_servers"] == 1
    engine.close()

"""HFEngine and the per-row sampler: exactness against uncached forwards, seeded reproducibility
under any batch company, stopping rules, log-probs, shared prefill, compaction, weight sync."""

from __future__ import annotations

import pytest
import torch

from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.config import HFEngineConfig
from grpo.rollout.hf import HFEngine
from grpo.rollout.registry import ENGINES, make_engine
from grpo.rollout.sampling import (
    _mul32,
    counter_uniforms,
    row_keys,
    sample_next_tokens,
    uniforms_per_row,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def model(varied_tiny_model):
    return varied_tiny_model  # tests/conftest.py: O(1) weights, varied continuations


@pytest.fixture
def engine(model, tokenizer):
    return HFEngine(model, tokenizer, dtype=torch.float32, seed=0)


@pytest.fixture
def prompts(tokenizer):
    return [
        tokenizer.encode("What is 964 * 494?"),
        tokenizer.encode("Hi"),
        tokenizer.encode(
            "A much longer prompt, with quite a few more tokens in it than the others have."
        ),
    ]


def request(prompt, **sampling) -> GenerationRequest:
    return GenerationRequest(list(prompt), SamplingParams(**sampling))


@torch.no_grad()
def full_logits(model, ids: list[int]) -> torch.Tensor:
    """Logits of a plain fp32 forward over the whole sequence, no cache: [T, V]."""
    return model(torch.tensor([ids])).logits[0].float()


def test_empty_request_list_returns_empty(engine):
    assert engine.generate([]) == []


def test_greedy_equals_uncached_argmax_loop(engine, model, prompts):
    results = engine.generate([request(p, temperature=0.0, max_new_tokens=10) for p in prompts])
    for prompt, result in zip(prompts, results):
        ids = list(prompt)
        for _ in range(10):
            ids.append(int(full_logits(model, ids)[-1].argmax()))
        assert result.token_ids == ids[len(prompt) :]
        assert result.finish_reason == "length"
    assert len({tuple(r.token_ids) for r in results}) == len(prompts)  # the prompts matter


def test_seeded_request_reproduces_alone_batched_and_reordered(engine, prompts):
    target = request(prompts[0], temperature=1.0, max_new_tokens=12, seed=1234)
    alone = engine.generate([target])[0]
    others = [request(p, temperature=0.8, max_new_tokens=7) for p in prompts[1:]]
    first = engine.generate([target, *others])[0]
    last = engine.generate([*reversed(others), target])[-1]
    assert alone.token_ids == first.token_ids == last.token_ids
    assert alone.behavior_logprobs == pytest.approx(last.behavior_logprobs, abs=1e-5)
    other_seed = engine.generate(
        [request(prompts[0], temperature=1.0, max_new_tokens=12, seed=99)]
    )[0]
    assert other_seed.token_ids != alone.token_ids


def test_unseeded_requests_follow_the_engine_seed(model, tokenizer, prompts):
    def run():
        engine = HFEngine(model, tokenizer, dtype=torch.float32, seed=7)
        return [
            r.token_ids for r in engine.generate([request(p, max_new_tokens=8) for p in prompts])
        ]

    assert run() == run()


def test_max_new_tokens_is_exact(engine, prompts):
    results = engine.generate(
        [request(prompts[i % 3], max_new_tokens=n, seed=i) for i, n in enumerate([1, 5, 17, 0])]
    )
    assert [len(r.token_ids) for r in results] == [1, 5, 17, 0]
    assert all(r.finish_reason == "length" for r in results)
    assert all(len(r.behavior_logprobs) == len(r.token_ids) for r in results)


def test_stop_token_ends_the_sequence(engine, prompts):
    free = engine.generate([request(prompts[0], temperature=0.0, max_new_tokens=12)])[0].token_ids
    stop = free[4]
    cut = free.index(stop) + 1
    result = engine.generate(
        [request(prompts[0], temperature=0.0, max_new_tokens=12, stop_token_ids=(2, stop))]
    )[0]
    assert result.token_ids == free[:cut]
    assert result.token_ids[-1] == stop
    assert result.finish_reason == "stop"


def test_stop_string_keeps_tokens_up_to_the_completing_one(engine, tokenizer, prompts):
    free = engine.generate([request(prompts[0], temperature=0.0, max_new_tokens=16)])[0].token_ids
    # a stop string that spans a token boundary: its last character comes from token k
    for k in range(2, len(free)):
        before = tokenizer.decode(free[:k])
        stop = before[-2:] + tokenizer.decode(free[k : k + 1])[:1]
        if len(stop) == 3 and stop not in before:
            break
    else:
        pytest.fail(f"no usable stop string in {tokenizer.decode(free)!r}")
    result = engine.generate(
        [request(prompts[0], temperature=0.0, max_new_tokens=16, stop_strings=("zzz", stop))]
    )[0]
    assert result.token_ids == free[: k + 1]
    assert result.finish_reason == "stop"


def test_stop_strings_need_a_tokenizer(model, prompts):
    engine = HFEngine(model, None, dtype=torch.float32)
    with pytest.raises(ValueError, match="tokenizer"):
        engine.generate([request(prompts[0], stop_strings=("x",))])


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
def test_behavior_logprobs_equal_full_forward_log_softmax(engine, model, prompts, temperature):
    results = engine.generate(
        [
            request(p, temperature=temperature, top_p=0.9, max_new_tokens=9, seed=i)
            for i, p in enumerate(prompts)
        ]
    )
    for prompt, result in zip(prompts, results):
        logits = full_logits(model, list(prompt) + result.token_ids)[len(prompt) - 1 : -1]  # [N, V]
        scale = temperature if temperature > 0 else 1.0
        expected = torch.log_softmax(logits / scale, -1).gather(
            -1, torch.tensor(result.token_ids)[:, None]
        )[:, 0]
        assert torch.tensor(result.behavior_logprobs) == pytest.approx(expected, abs=1e-4)


def test_shared_prefill_equals_separate_prefill(engine, prompts):
    group = [request(prompts[0], max_new_tokens=10, seed=s) for s in range(4)]
    shared = engine.generate([*group, request(prompts[1], max_new_tokens=6, seed=9)])
    assert engine.last_metrics["prefill_tokens"] == len(prompts[0]) + len(prompts[1])
    separate = [engine.generate([r])[0] for r in group]
    assert [r.token_ids for r in shared[:4]] == [r.token_ids for r in separate]
    assert len({tuple(r.token_ids) for r in shared[:4]}) > 1  # different seeds, different samples


def test_compaction_and_waves_do_not_change_results(model, tokenizer, prompts):
    requests = [
        request(prompts[i % 3], max_new_tokens=4 + 3 * i, seed=i, stop_token_ids=(2,))
        for i in range(6)
    ]
    reference = HFEngine(model, tokenizer, dtype=torch.float32, compact_fraction=2.0).generate(
        requests
    )
    eager = HFEngine(model, tokenizer, dtype=torch.float32, compact_fraction=0.0)
    compacted = eager.generate(requests)
    assert eager.last_metrics["compactions"] > 0
    waves = HFEngine(model, tokenizer, dtype=torch.float32, max_batch_size=4).generate(requests)
    for a, b, c in zip(reference, compacted, waves):
        assert a.token_ids == b.token_ids == c.token_ids
        assert a.behavior_logprobs == pytest.approx(b.behavior_logprobs, abs=1e-5)


def test_top_p_samples_only_inside_the_nucleus():
    # probabilities 0.5, 0.3, 0.15, 0.05 (+ a zero-probability tail): top_p 0.7 keeps the first two,
    # 0.85 the first three (0.8 < 0.85 so the crossing token 0.15 is kept).
    probs = torch.tensor([0.15, 0.0, 0.5, 0.05, 0.3] + [0.0] * 600)
    logits = probs.log().expand(4000, -1)  # [N, V]
    uniforms = torch.rand(
        4000, uniforms_per_row(605), generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )
    ones = torch.ones(4000)
    for top_p, nucleus in [(0.7, {2, 4}), (0.85, {0, 2, 4}), (1.0, {0, 2, 3, 4})]:
        tokens, logprobs = sample_next_tokens(logits, ones, ones * top_p, uniforms)
        assert set(tokens.tolist()) == nucleus
        # log-probs are of the untruncated distribution
        assert torch.allclose(logprobs, probs[tokens].log(), atol=1e-6)
    tokens, _ = sample_next_tokens(logits, ones, ones * 0.7, uniforms)
    share = (tokens == 2).double().mean().item()
    assert share == pytest.approx(0.5 / 0.8, abs=0.03)


def test_sampler_follows_the_distribution_with_temperature():
    vocab = 700  # spans several chunks of the two-level inverse CDF
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(1)) * 2
    n = 20000
    uniforms = torch.rand(
        n, uniforms_per_row(vocab), generator=torch.Generator().manual_seed(2), dtype=torch.float64
    )
    temperature = torch.full((n,), 0.5)
    tokens, logprobs = sample_next_tokens(
        logits.expand(n, -1), temperature, torch.ones(n), uniforms
    )
    expected = torch.softmax(logits / 0.5, -1)
    counts = torch.bincount(tokens, minlength=vocab).double() / n
    assert (counts - expected).abs().max() < 0.02
    assert torch.allclose(logprobs, expected[tokens].log(), atol=1e-5)
    greedy, _ = sample_next_tokens(
        logits.expand(3, -1), torch.zeros(3), torch.ones(3), uniforms[:3]
    )
    assert greedy.tolist() == [int(logits.argmax())] * 3


def test_all_greedy_batches_need_no_uniforms_and_sampled_ones_do():
    logits = torch.randn(3, 700, generator=torch.Generator().manual_seed(1))
    tokens, _ = sample_next_tokens(logits, torch.zeros(3), torch.ones(3), None)
    assert tokens.tolist() == logits.argmax(-1).tolist()
    with pytest.raises(ValueError, match="None only when every row is greedy"):
        sample_next_tokens(logits, torch.tensor([0.0, 1.0, 0.0]), torch.ones(3), None)


def test_mul32_is_exact_multiplication_modulo_2_32():
    x = torch.randint(0, 2**32, (1000,), generator=torch.Generator().manual_seed(0))
    for m in (0x21F0AAAD, 0x735A2D97, 0xFFFFFFFF, 3):
        assert _mul32(x, m).tolist() == [(int(v) * m) % 2**32 for v in x]


def test_counter_uniforms_are_pinned_batch_invariant_and_uniform():
    keys = row_keys([0, 2**61 + 12345], torch.device("cpu"))
    assert keys.tolist() == [340428713, 4288290520]
    first = counter_uniforms(keys, 0, 3, torch.float64)
    # The stream is part of what a seed means: a change here changes every seeded sample.
    assert first.tolist() == [
        [0.19167184841353446, 0.12926169869024307, 0.17296476860065013],
        [0.5637011908693239, 0.08200854936148971, 0.5362026781076565],
    ]
    assert counter_uniforms(keys[1:], 0, 3, torch.float64).tolist() == first[1:].tolist()
    assert counter_uniforms(keys, 1, 3, torch.float64)[0, 0].item() == 0.49363650486338884
    many = counter_uniforms(row_keys(list(range(1000)), torch.device("cpu")), 7, 448, torch.float64)
    assert 0.0 < many.min() and many.max() < 1.0
    assert abs(many.mean().item() - 0.5) < 0.002  # 448k draws: sd of the mean 0.0004
    counts = torch.histc(many.float(), 100, 0, 1)
    chi2 = (((counts - counts.mean()) ** 2) / counts.mean()).sum().item()
    assert chi2 < 150  # 99 degrees of freedom: p < 0.001 above 149
    next_step = counter_uniforms(row_keys(list(range(1000)), torch.device("cpu")), 8, 448, torch.float64)
    assert abs(torch.corrcoef(torch.stack([many.flatten(), next_step.flatten()]))[0, 1]) < 0.01


def test_counter_uniforms_take_a_step_per_row():
    keys = row_keys([0, 2**61 + 12345], torch.device("cpu"))
    per_row = counter_uniforms(keys, torch.tensor([1, 0]), 3, torch.float64)
    assert per_row[0].tolist() == counter_uniforms(keys[:1], 1, 3, torch.float64)[0].tolist()
    assert per_row[0, 0].item() == 0.49363650486338884
    assert per_row[1].tolist() == [0.5637011908693239, 0.08200854936148971, 0.5362026781076565]


def test_sync_weights_follows_the_policy(model, tokenizer, prompts):
    engine = HFEngine(model, tokenizer, dtype=torch.float32)
    before = engine.generate([request(prompts[0], temperature=0.0, max_new_tokens=6)])[0].token_ids
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.0)  # tied to the embeddings: a different model
    stale = engine.generate([request(prompts[0], temperature=0.0, max_new_tokens=6)])[0].token_ids
    assert stale == before  # the engine holds its own copy
    engine.sync_weights(model)
    after = engine.generate([request(prompts[0], temperature=0.0, max_new_tokens=6)])[0].token_ids
    ids = list(prompts[0])
    for _ in range(6):
        ids.append(int(full_logits(model, ids)[-1].argmax()))
    assert after == ids[len(prompts[0]) :] != before


def test_sync_weights_merges_lora(model, tokenizer, prompts):
    peft = pytest.importorskip("peft")
    policy = peft.get_peft_model(
        model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    engine = HFEngine(policy, tokenizer, dtype=torch.float32)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    engine.sync_weights(policy)
    result = engine.generate([request(prompts[0], temperature=0.0, max_new_tokens=6)])[0]
    ids = list(prompts[0])
    for _ in range(6):
        ids.append(int(full_logits(policy, ids)[-1].argmax()))
    assert result.token_ids == ids[len(prompts[0]) :]
    assert not any(p.requires_grad for p in engine.model.parameters())


def test_bf16_engine_logprobs_stay_close_to_fp32(model, tokenizer, prompts):
    engine = HFEngine(model, tokenizer, dtype=torch.bfloat16)
    results = engine.generate(
        [request(p, max_new_tokens=12, seed=i) for i, p in enumerate(prompts)]
    )
    deltas = []
    for prompt, result in zip(prompts, results):
        logits = full_logits(model, list(prompt) + result.token_ids)[len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits, -1).gather(
            -1, torch.tensor(result.token_ids)[:, None]
        )[:, 0]
        deltas.append((torch.tensor(result.behavior_logprobs) - expected).abs())
    assert torch.cat(deltas).mean() < 0.05


def test_concurrent_callers_get_their_own_results(engine, prompts):
    import threading

    batches = [
        [request(p, max_new_tokens=6, seed=10 * t + i) for i, p in enumerate(prompts)]
        for t in range(3)
    ]
    expected = [[r.token_ids for r in engine.generate(b)] for b in batches]
    got: dict[int, list] = {}
    threads = [
        threading.Thread(
            target=lambda t=t: got.__setitem__(
                t, [r.token_ids for r in engine.generate(batches[t])]
            )
        )
        for t in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [got[t] for t in range(3)] == expected


def test_make_engine_names_the_options(model, tokenizer):
    assert isinstance(make_engine("hf", policy=model, tokenizer=tokenizer), HFEngine)
    with pytest.raises(ValueError, match="options: hf, vllm, vllm_server"):
        make_engine("nope", policy=model)
    assert tuple(ENGINES) == ("hf", "vllm", "vllm_server")


def _seeded_requests(prompts, count: int, **sampling) -> list[GenerationRequest]:
    return [
        request(prompts[i % 3], max_new_tokens=4 + 7 * i, seed=i, stop_token_ids=(2,), **sampling)
        for i in range(count)
    ]


def _assert_same_results(expected, got) -> None:
    for a, b in zip(expected, got, strict=True):
        assert a.token_ids == b.token_ids
        assert a.finish_reason == b.finish_reason
        assert a.behavior_logprobs == pytest.approx(b.behavior_logprobs, abs=1e-5)


def test_static_decode_equals_dynamic_with_compaction_waves_and_reuse(model, tokenizer, prompts):
    requests = _seeded_requests(prompts, 7)
    dynamic = HFEngine(model, tokenizer, dtype=torch.float32, decode_mode="dynamic")
    static = HFEngine(model, tokenizer, dtype=torch.float32, decode_mode="static")
    expected = dynamic.generate(requests)
    _assert_same_results(expected, static.generate(requests))
    assert static.last_metrics["compactions"] > 0
    cache = static._static.cache
    assert (cache.rows, cache.capacity) == (8, 256)  # 7 rows -> 8; 19 + 46 columns -> 256
    # A later, smaller call reuses the cache; a call needing more columns regrows it.
    _assert_same_results(expected[:3], static.generate(requests[:3]))
    assert static._static.cache is cache
    long = [request(prompts[2], max_new_tokens=300, seed=5, stop_token_ids=(2,))]
    _assert_same_results(dynamic.generate(long), static.generate(long))
    assert static._static.cache.capacity == 512
    waves = HFEngine(model, tokenizer, dtype=torch.float32, decode_mode="static", max_batch_size=3)
    _assert_same_results(expected, waves.generate(requests))
    # Steps padded to at least 4 rows (what graph decode does with 64): the same results.
    assert {rows for rows, _ in static._static.buckets} == {1, 2, 4, 8}
    static._static.min_rows = 4
    static._static.buckets.clear()
    _assert_same_results(expected, static.generate(requests))
    assert {rows for rows, _ in static._static.buckets} == {4, 8}


def test_decode_mode_is_checked(model, tokenizer):
    with pytest.raises(ValueError, match="decode_mode must be one of"):
        HFEngine(model, tokenizer, decode_mode="fast")
    with pytest.raises(ValueError, match="'graph' needs a CUDA device"):
        HFEngine(model, tokenizer, decode_mode="graph")
    engine = HFEngine(model, tokenizer)
    assert engine.decode_mode == "dynamic"  # auto on a CPU
    assert (engine.max_batch_size, engine.prefill_chunk_tokens) == (64, 4096)
    assert (engine.join_columns, engine.prefill_call_tokens) == (1024, 32)
    gpu = HFEngineConfig()
    assert (gpu.batch_size_for("cuda"), gpu.prefill_chunk_for("cuda")) == (512, 32768)
    assert (gpu.join_columns_for("cuda"), gpu.join_columns_for("cpu")) == (512, 1024)
    chosen = HFEngineConfig(max_batch_size=8, prefill_chunk_tokens=100, join_columns=64)
    assert (chosen.batch_size_for("cuda"), chosen.prefill_chunk_for("cpu")) == (8, 100)
    assert chosen.join_columns_for("cpu") == 64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_cuda_graph_decode_equals_dynamic_and_reuses_its_graphs(model, tokenizer, prompts):
    model = model.to("cuda")
    requests = _seeded_requests(prompts, 7)
    dynamic = HFEngine(model, tokenizer, dtype=torch.float32, decode_mode="dynamic")
    graph = HFEngine(model, tokenizer, dtype=torch.float32)
    assert graph.decode_mode == "graph"  # auto on CUDA
    assert HFEngine(model, tokenizer).kv_cache_dtype == torch.bfloat16  # auto on CUDA: the bf16 copy's
    expected = dynamic.generate(requests)
    _assert_same_results(expected, graph.generate(requests))
    captured = graph.last_metrics["graph_captures"]
    assert captured > 0
    assert graph.last_metrics["steps_with_draws"] == graph.last_metrics["decode_steps"]  # in the graphs
    _assert_same_results(expected, graph.generate(requests))
    assert graph.last_metrics["graph_captures"] == 0  # the same shapes replay
    greedy = [request(p, max_new_tokens=12, temperature=0.0) for p in prompts]
    _assert_same_results(dynamic.generate(greedy), graph.generate(greedy))

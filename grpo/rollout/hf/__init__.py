"""Our KV-cached engine over a transformers causal LM (`rollout.engine: hf`).

engine.py (`HFEngine`: the interface, settings and lock) runs its calls through decode_loop.py
(one live batch per call: live_batch.py, sequence.py, kept_prefix.py) over a `ModelRunner`
(runner.py: the engine's weight copy and its forward), which uses prefill.py, kv_cache.py,
sampling.py, decode_graphs.py (CUDA graphs), decode_attention.py, weights.py (the copy's packed,
fused matmuls), fused_norms.py and lean_forward.py. What the lean forward needs to know about a
model family lives in families/: one file per family and one registry line.
"""

"""Rollout engines: token ids in, sampled token ids and behavior log-probs out. The interface
(base.py), the registry that picks and builds an engine (registry.py), our KV-cached HF engine
(hf.py with its cache, sampler, per-sequence state and inference weights) and vLLM (vllm*.py)."""

"""Rollout engines: token ids in, sampled token ids and behavior log-probs out, one wing each.

base.py is the interface every engine implements (`RolloutEngine`: generate, serve, sync_weights,
describe); registry.py picks and builds one (`rollout.engine`); config.py holds the `rollout:`
section with each engine's own (`rollout.hf`, `rollout.vllm`). hf/ is our KV-cached engine over a
transformers model (its model families in hf/families/), vllm/ the vLLM engine, scripted.py an
engine that writes given texts (gold trajectories for the warm start)."""

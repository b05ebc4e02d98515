"""Local models that play the other parties of an episode, each over our HF engine: the LLM judge
(judge.py, `judge.backend: local`) and τ²'s simulated user (user.py, `user.backend: local`).
Importing a module registers its backend with environments/, which never imports grpo."""

"""The LLM judge of `reward_spec.method: judge`: its config (config.py), the judge with its
prompts, strict reply reading, transcript-hash cache and group-relative mode (judge.py), and the
backends behind one interface (models.py: an OpenAI-compatible endpoint here, a local HF model
registered by grpo/local_models/judge.py, a scripted one for tests)."""


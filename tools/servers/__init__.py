"""Bundled offline MCP servers, each runnable alone with `python -m tools.servers.<name>`:
calculator (safe arithmetic), kv (per-episode key-value store), python (sandboxed code), bfcl (the
BFCL multi-turn backends, one state per episode; needs bfcl-eval)."""

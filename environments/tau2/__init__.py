"""τ²-bench as an environment: conversations between the policy (the customer-service agent) and
a simulated user over one τ² domain's MCP server (tools/servers/tau2.py), scored by τ²'s own
evaluator. The episode (env), task records and splits (data), the simulated user and its backends
(user), the OpenAI-compatible client (endpoint), the gold replay (gold), scoring and pass^k
(scoring), and τ²'s reused pieces behind a stand-in for its LLM module (official)."""

"""τ²-bench's own pieces that the environment reuses, imported behind a stand-in for its LLM module.

τ²'s user simulator, agent, orchestrator and evaluator modules import `tau2.utils.llm_utils`, its
litellm wrapper, at import time; importing them would need litellm (a large dependency tree) even
though we never let τ² call a model itself. Before they load, `load()` registers a small stand-in
module under that name. Its `generate(model, messages, **kwargs)` sends the request to the
OpenAI-compatible endpoint bound for the current call with `bound_llm(endpoint)` (the NL-assertion
judge) and raises otherwise; `get_cost` reports no cost. So τ²'s code runs unchanged: its user
prompt and stop signals, its agent system prompt and opening greeting, its evaluator (with its
judge prompt) and its pass^k.

If the real `tau2.utils.llm_utils` was imported first (litellm installed and τ² used directly in
this process), it is left alone and the judge is unavailable (`bound_llm` says so).
"""

from __future__ import annotations

import contextvars
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

from tools.servers.tau2_domains import require_tau2

_STAND_IN = "mcp_grpo_stand_in"
_bound: contextvars.ContextVar[Any] = contextvars.ContextVar("tau2_bound_llm", default=None)


def _generate(model: str, messages: list, tools: list | None = None, **kwargs: Any) -> Any:
    """τ²'s `generate`, answered by the endpoint bound for this call (never litellm)."""
    from tau2.data_model.message import AssistantMessage

    endpoint = _bound.get()
    if endpoint is None:
        raise RuntimeError(f"τ² asked a model ({model}) but no endpoint is bound: mcp-grpo never runs τ²'s "
                           "own LLM calls except the NL-assertion judge (environment.tau2.judge)")
    payload = [{"role": m.role, "content": m.content} for m in messages]
    reply = endpoint.complete(payload, temperature=kwargs.get("temperature", 0.0))
    return AssistantMessage(role="assistant", content=reply.get("content") or "")


def _install_stand_in() -> None:
    if "tau2.utils.llm_utils" in sys.modules:
        return
    module = types.ModuleType("tau2.utils.llm_utils", "mcp-grpo's stand-in for τ²'s litellm wrapper")
    module.generate = _generate
    module.get_cost = lambda messages: None
    setattr(module, _STAND_IN, True)
    sys.modules["tau2.utils.llm_utils"] = module


@cache
def load() -> types.SimpleNamespace:
    """τ²'s modules that the environment uses (the stand-in registered first)."""
    require_tau2()
    import tau2.utils  # noqa: F401  (the parent package loads before its submodule is stood in for)

    _install_stand_in()
    from tau2.agent import llm_agent
    from tau2.data_model import message, simulation, tasks
    from tau2.evaluator import evaluator
    from tau2.metrics import agent_metrics
    from tau2.orchestrator import orchestrator
    from tau2.user import base as user_base
    from tau2.user import user_simulator

    return types.SimpleNamespace(message=message, simulation=simulation, tasks=tasks, evaluator=evaluator,
                                 metrics=agent_metrics, orchestrator=orchestrator, user_base=user_base,
                                 user_simulator=user_simulator, llm_agent=llm_agent)


@contextmanager
def bound_llm(endpoint: Any) -> Iterator[None]:
    """Within the block (and threads started from it with its context), τ²'s `generate` calls go
    to `endpoint` (an object with `complete(messages, temperature=...) -> {"content": ...}`)."""
    load()
    if not getattr(sys.modules["tau2.utils.llm_utils"], _STAND_IN, False):
        raise RuntimeError("τ²'s own tau2.utils.llm_utils (litellm) was imported before mcp-grpo's stand-in; "
                           "the NL-assertion judge cannot be routed to the configured endpoint")
    token = _bound.set(endpoint)
    try:
        yield
    finally:
        _bound.reset(token)

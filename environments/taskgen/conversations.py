"""Tasks from chat logs users already have (OpenAI chat format with `tool_calls` and `tool`
messages): the first user message is the request, the assistant's calls in order are the
`tool_sequence`, the final assistant message the answer.

A log is kept only when its calls still verify: each is re-executed in a fresh episode on the
configured servers (within the safety policy: a call generation may not make is not made, and
the log is kept out) and must succeed with the result the log recorded. A log that fails is
kept out and named with the reason. Secrets in the logs (keys, tokens, passwords: the shapes of
tools/secrets.py) are masked before anything is written, in the request, the arguments, the
answer and the reasons a log is kept out.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from environments.comparisons import normalize_text
from environments.taskgen.drafts import parse_result
from environments.taskgen.safety import judge
from environments.tasks.schema import complexity_for, task_record
from tools.secrets import MASK, mask_secrets, mask_text, mask_value  # noqa: F401 - re-exported

if TYPE_CHECKING:
    from tools.manager import SharedToolManager

# The one rule for secrets (tools/secrets.py); `mask_secrets` stays importable from here.
_mask_value = mask_value


@dataclass
class Conversation:
    request: str
    calls: list[tuple[str, dict[str, Any], str | None]] = field(default_factory=list)
    """(tool name as the log calls it, arguments, the result the log recorded)."""
    answer: str | None = None


class ConversationError(ValueError):
    """A log that cannot be read as a conversation with tool calls."""


def parse_conversation(item: Any) -> Conversation:
    messages = item.get("messages") if isinstance(item, dict) else item
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ConversationError("expected a list of messages (or an object with `messages`)")
    user = next((m for m in messages if m.get("role") == "user" and isinstance(m.get("content"), str)), None)
    if user is None:
        raise ConversationError("no user message")
    conversation = Conversation(user["content"].strip())
    results = {m.get("tool_call_id"): m.get("content") for m in messages if m.get("role") == "tool"}
    for message in messages:
        if message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            try:
                args = json.loads(function.get("arguments") or "{}")
            except ValueError:
                raise ConversationError(f"call {function.get('name')!r}: its arguments are not JSON") from None
            content = results.get(call.get("id"))
            if isinstance(content, list):  # content parts
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            conversation.calls.append((function.get("name", ""), args, content))
        if not message.get("tool_calls") and isinstance(message.get("content"), str) and message["content"].strip():
            conversation.answer = message["content"].strip()
    if not conversation.calls:
        raise ConversationError("no tool calls")
    return conversation


def _answer(conversation: Conversation, last_result: str) -> Any:
    """The answer a task scores: the last call's result (as a number or text) when the final
    message states it, else nothing (the calls alone are checked)."""
    value = parse_result(last_result)
    stated = isinstance(value, (int, float, str)) and not isinstance(value, bool) and conversation.answer
    if stated and normalize_text(str(value)) and normalize_text(str(value)) in normalize_text(conversation.answer):
        return value
    return None


async def import_conversations(tools: SharedToolManager, items: Iterable[Any], allow: Sequence[str] = (),
                               timeout: float | None = None) -> tuple[list[dict], list[dict]]:
    """(task records, the logs kept out as {"index", "reason"}); see the module doc."""
    by_name = {s.name: s for s in tools.tool_specs()}
    kept, rejected = [], []
    for index, item in enumerate(items):
        try:
            conversation = parse_conversation(item)
            record = await _verify(tools, conversation, by_name, allow, timeout, index)
        except (ConversationError, _NotVerified) as exc:
            # A reason may quote the log (a logged result, an argument): masked like the rest.
            rejected.append({"index": index, "reason": mask_text(str(exc))})
            continue
        kept.append(record)
    return kept, rejected


class _NotVerified(Exception):
    pass


async def _verify(tools: SharedToolManager, conversation: Conversation, by_name: dict, allow: Sequence[str],
                  timeout: float | None, index: int) -> dict:
    episode = f"taskgen-import-{uuid.uuid4().hex[:12]}"
    steps, results = [], []
    try:
        for number, (name, args, logged) in enumerate(conversation.calls, start=1):
            spec = by_name.get(name) or next((s for s in by_name.values() if s.tool == name), None)
            if spec is None:
                raise _NotVerified(f"call {number}: no configured server offers the tool {name!r}")
            verdict = judge(spec, tools.config, allow)
            if not verdict.callable:
                raise _NotVerified(f"call {number} {spec.server}.{spec.tool} is not re-executed: {verdict.reason}")
            result = await tools.call_tool(spec.name, args, timeout=timeout, episode_id=episode)
            if result.is_error:
                raise _NotVerified(f"call {number} {spec.server}.{spec.tool} fails now: {result.text[:200]}")
            if logged is not None and normalize_text(result.text) != normalize_text(logged):
                raise _NotVerified(f"call {number} {spec.server}.{spec.tool} no longer gives the logged result "
                                   f"(logged {logged[:80]!r}, now {result.text[:80]!r})")
            masked_args, _ = _mask_value(args)
            steps.append({"step": number, "server": spec.server, "tool": spec.tool, "params": masked_args})
            results.append(result.text.strip())
    finally:
        await tools.end_episode(episode)
    request, masked = mask_secrets(conversation.request)
    answer = _answer(conversation, results[-1])
    masked += sum(_mask_value(args)[1] for _, args, _ in conversation.calls)
    success: dict[str, Any] = {"must_call_tool": True}
    if answer is not None:
        success["answer"] = _mask_value(answer)[0]
    n = len(steps)
    return task_record(
        data_source="imported/" + "+".join(sorted({s["server"] for s in steps})),
        prompt=[{"role": "user", "content": request}],
        methods=["success", "process"],
        ground_truth={"task_id": f"import-{index:05d}", "complexity": complexity_for(n), "max_turns": n + 2,
                      "success": success, "tool_sequence": steps,
                      "limits": {"max_tool_calls": 2 * n + 2, "max_servers": len({s["server"] for s in steps})}},
        extra_info={"template": "imported", "chain_length": n, "split": "train", "source_index": index,
                    "masked_secrets": masked, "results": [mask_secrets(r)[0] for r in results]},
    )

"""Tasks from chat logs users already have (OpenAI chat format with `tool_calls` and `tool`
messages): the first user message is the request, the assistant's calls in order are the
`tool_sequence`, the final assistant message the answer.

A log is kept only when its calls still verify: each is re-executed in a fresh episode on the
configured servers (within the safety policy: a call generation may not make is not made, and
the log is kept out) and must succeed with the result the log recorded. A log that fails is
kept out and named with the reason. Secrets in the logs (API keys, bearer tokens, `api_key=...`)
are masked before anything is written, in the request, the arguments and the answer.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from environments.comparisons import normalize_text
from environments.end_state import without_fields, without_patterns
from environments.taskgen.drafts import parse_result
from environments.taskgen.observe import explore
from environments.taskgen.safety import allowed_by_user
from environments.taskgen.values import leaves
from environments.taskgen.volatile import Unstable, differing_fields, differing_patterns
from environments.tasks.schema import complexity_for, task_record
from tools.secrets import mask_secrets
from tools.secrets import mask_value as _mask_value

if TYPE_CHECKING:
    from tools.manager import SharedToolManager

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


def _stated(conversation: Conversation, runs: list[list[str]]) -> tuple[int, str | None, Any] | None:
    """(step, dotted field or None for the whole result, value) of the value the final message
    states, looked for in the results of the last call first: a number or a text of at least two
    characters that the message contains (compared as normalised text)."""
    if not conversation.answer:
        return None
    said = normalize_text(conversation.answer)
    for step in range(len(runs[0]), 0, -1):
        text = runs[0][step - 1]
        data = parse_result(text)
        candidates = [(None, data)] if isinstance(data, (int, float, str)) else list(leaves(data))
        for path, value in candidates:
            if isinstance(value, bool) or value is None or (isinstance(value, str) and len(value.strip()) < 2):
                continue
            shown = normalize_text(str(value))
            if shown and re.search(rf"(?<![\w.]){re.escape(shown)}(?![\w]|\.\d)", said):
                return step, path, value
    return None


def _same_as_logged(logged: str, now: str, again: str) -> bool:
    """The logged result and today's read the same once the parts that differ between two runs
    (at two times) are left out: timestamps, generated ids."""
    if normalize_text(logged) == normalize_text(now):
        return True
    try:
        first, second, old = json.loads(now), json.loads(again), json.loads(logged)
    except ValueError:
        try:
            patterns = differing_patterns(now.strip(), again.strip())
        except Unstable:
            return False
        return bool(patterns) and normalize_text(without_patterns(logged, patterns)) == \
            normalize_text(without_patterns(now, patterns))
    try:
        ignore = differing_fields(first, second)
    except Unstable:
        return False
    return bool(ignore) and without_fields(old, ignore) == without_fields(first, ignore)


async def import_conversations(tools: SharedToolManager, items: Iterable[Any], allow: Sequence[str] = (),
                               timeout: float | None = None,
                               later: SharedToolManager | None = None) -> tuple[list[dict], list[dict]]:
    """(task records, the logs kept out as {"index", "reason"}); see the module doc. `later`: the
    same servers with their clock ahead, where every log is replayed a second time."""
    by_name = {s.name: s for s in tools.tool_specs()}
    kept, rejected = [], []
    effects: dict[str, dict] = {}
    for index, item in enumerate(items):
        try:
            conversation = parse_conversation(item)
            record = await _verify(tools, later, conversation, by_name, allow, timeout, index, effects)
        except (ConversationError, _NotVerified) as exc:
            rejected.append({"index": index, "reason": mask_secrets(str(exc))[0]})
            continue
        kept.append(record)
    return kept, rejected


class _NotVerified(Exception):
    pass


async def _may_run(tools: SharedToolManager, spec: Any, allow: Sequence[str], timeout: float | None,
                   effects: dict[str, dict]) -> str | None:
    """Why a logged call may not be re-executed, or None: a read (observed where the server's state
    is disposable and confined, else declared) runs; a write only on disposable state and only
    where the user allows it (`--allow-tool`)."""
    if spec.server not in effects:
        effects[spec.server] = (await explore(tools, spec.server, allow, timeout)).effects
    effect = effects[spec.server][spec.tool]
    if effect.kind == "read" and effect.callable:
        return None
    containment = tools.containment(spec.server)
    if containment.disposable and allowed_by_user(spec, allow):
        return None
    missing = " and ".join(filter(None, [
        "" if containment.disposable else "its server has no disposable state",
        "" if allowed_by_user(spec, allow) else f"--allow-tool {spec.server}.{spec.tool} was not given"]))
    return f"it may write ({effect.reason}); a write is re-executed only on disposable state where the user allows it: {missing}"


async def _replay(tools: SharedToolManager, conversation: Conversation, specs: list[Any],
                  timeout: float | None) -> list[str]:
    episode = f"taskgen-import-{uuid.uuid4().hex[:12]}"
    results = []
    try:
        for number, ((_, args, _), spec) in enumerate(zip(conversation.calls, specs), start=1):
            result = await tools.call_tool(spec.name, args, timeout=timeout, episode_id=episode)
            if result.is_error:
                raise _NotVerified(f"call {number} {spec.server}.{spec.tool} fails now: {result.text[:200]}")
            results.append(result.text.strip())
    finally:
        await tools.end_episode(episode)
    return results


async def _verify(tools: SharedToolManager, later: SharedToolManager | None, conversation: Conversation,
                  by_name: dict, allow: Sequence[str], timeout: float | None, index: int,
                  effects: dict[str, dict]) -> dict:
    specs = []
    for number, (name, _, _) in enumerate(conversation.calls, start=1):
        spec = by_name.get(name) or next((s for s in by_name.values() if s.tool == name), None)
        if spec is None:
            raise _NotVerified(f"call {number}: no configured server offers the tool {name!r}")
        why = await _may_run(tools, spec, allow, timeout, effects)
        if why is not None:
            raise _NotVerified(f"call {number} {spec.server}.{spec.tool} is not re-executed: {why}")
        specs.append(spec)
    runs = [await _replay(tools, conversation, specs, timeout),
            await _replay(later or tools, conversation, specs, timeout)]
    for number, ((_, _, logged), spec) in enumerate(zip(conversation.calls, specs), start=1):
        now, again = runs[0][number - 1], runs[1][number - 1]
        if logged is not None and not _same_as_logged(logged, now, again):
            raise _NotVerified(f"call {number} {spec.server}.{spec.tool} no longer gives the logged result "
                               f"(logged {logged[:80]!r}, now {now[:80]!r})")
    steps = [{"step": number, "server": spec.server, "tool": spec.tool, "params": _mask_value(args)[0]}
             for number, ((_, args, _), spec) in enumerate(zip(conversation.calls, specs), start=1)]
    request, masked = mask_secrets(conversation.request)
    masked += sum(_mask_value(args)[1] for _, args, _ in conversation.calls)
    success: dict[str, Any] = {"must_call_tool": True}
    stated = _stated(conversation, runs)
    if stated is not None:
        step, path, value = stated
        again = parse_result(runs[1][step - 1])
        same = (value == again) if path is None else dict(leaves(again)).get(path) == value
        if same:
            success["answer"] = _mask_value(value)[0]
        else:  # it changes with the time: the episode's own call says it
            success["answer_from"] = {"step": step, **({"field": path} if path else {})}
    n = len(steps)
    return task_record(
        data_source="imported/" + "+".join(sorted({s["server"] for s in steps})),
        prompt=[{"role": "user", "content": request}],
        methods=["success", "process"],
        ground_truth={"task_id": f"import-{index:05d}", "complexity": complexity_for(n), "max_turns": n + 2,
                      "success": success, "tool_sequence": steps,
                      "limits": {"max_tool_calls": 2 * n + 2, "max_servers": len({s["server"] for s in steps})}},
        extra_info={"template": "imported", "chain_length": n, "split": "train", "source_index": index,
                    "masked_secrets": masked, "results": [mask_secrets(r)[0] for r in runs[0]]},
    )

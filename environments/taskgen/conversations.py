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
    """A log that cannot be read as a conversation with tool calls; the message names what is
    wrong and where (`message 3 call 0: ...`)."""


@dataclass(frozen=True)
class UnreadableLog:
    """A log that could not even be decoded (a line that is not JSON): kept out with `reason`."""

    reason: str


def parse_conversation(item: Any) -> Conversation:
    """The request, calls and answer of one log; ConversationError for any shape that is not an
    OpenAI-format chat with tool calls. Logs are a user's data: no shape may raise anything else
    (one the checks below did not foresee keeps its log out, not every log)."""
    try:
        return _parse(item)
    except ConversationError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise ConversationError(f"cannot be read: {type(exc).__name__}: {exc}") from None


def _parse(item: Any) -> Conversation:
    if isinstance(item, UnreadableLog):
        raise ConversationError(item.reason)
    messages = item.get("messages") if isinstance(item, dict) else item
    if not isinstance(messages, list):
        raise ConversationError("expected a list of messages (or an object with `messages`), got "
                                + ("an object without `messages`" if messages is None and isinstance(item, dict)
                                   else _kind(messages)))
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ConversationError(f"message {i} is {_kind(message)}, not an object")
    user = next((m for m in messages if m.get("role") == "user" and isinstance(m.get("content"), str)), None)
    if user is None:
        raise ConversationError("no user message")
    conversation = Conversation(user["content"].strip())
    results = {_call_id(m.get("tool_call_id"), f"message {i}: tool_call_id"): _text(m.get("content"), f"message {i}")
               for i, m in enumerate(messages) if m.get("role") == "tool"}
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        calls = message.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise ConversationError(f"message {i}: tool_calls is {_kind(calls)}, not a list")
        for j, call in enumerate(calls or []):
            name, args, call_id = _call(call, f"message {i} call {j}")
            conversation.calls.append((name, args, results.get(call_id)))
        if not calls and isinstance(message.get("content"), str) and message["content"].strip():
            conversation.answer = message["content"].strip()
    if not conversation.calls:
        raise ConversationError("no tool calls")
    return conversation


def _call(call: Any, where: str) -> tuple[str, dict[str, Any], Any]:
    """(function name, arguments, call id) of one entry of `tool_calls`. Arguments may be a JSON
    string (the OpenAI format) or already an object (what some exporters write)."""
    if not isinstance(call, dict):
        raise ConversationError(f"{where} is {_kind(call)}, not an object")
    function = call.get("function")
    function = {} if function is None else function
    if not isinstance(function, dict):
        raise ConversationError(f"{where}: function is {_kind(function)}, not an object")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ConversationError(f"{where}: the function has no name (got {_kind(name)})")
    raw = function.get("arguments")
    if isinstance(raw, str) and raw.strip():
        try:
            args = json.loads(raw)
        except (ValueError, RecursionError):
            raise ConversationError(f"call {name!r}: its arguments are not JSON") from None
    else:
        args = raw
    if args is None or args == "":
        args = {}
    if not isinstance(args, dict):
        raise ConversationError(f"{where} {name!r}: its arguments are {_kind(args)}, not a JSON object")
    return name, args, _call_id(call.get("id"), f"{where}: id")


def _call_id(value: Any, what: str) -> str | int | None:
    """A call id as the key that pairs a call with its result; only a string or number can be."""
    if value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise ConversationError(f"{what} is {_kind(value)}, not a string")


def _text(content: Any, where: str) -> str | None:
    """A tool message's content as text: a string, or the `text` of its content parts."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ConversationError(f"{where}: content is {_kind(content)}, not text or a list of parts")
    texts = []
    for k, part in enumerate(content):
        text = part.get("text", "") if isinstance(part, dict) else None
        if not isinstance(text, str):
            raise ConversationError(f"{where}: content part {k} is {_kind(part)}, not a text part")
        texts.append(text)
    return "".join(texts)


def _kind(value: Any) -> str:
    """What a JSON value is, for a reason: `a string`, `a number`, `null`, `a list`, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


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

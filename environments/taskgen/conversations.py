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
            # A reason may quote the log (a logged result, an argument): masked like the rest.
            rejected.append({"index": index, "reason": mask_text(str(exc))})
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

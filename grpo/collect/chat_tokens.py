"""Token-exact chat rendering: the prompt ids and the observation deltas that go between turns.

Token in, token out: a trajectory is the prompt ids, then each turn's sampled ids exactly as the
engine returned them, then each observation rendered as a *chat-template delta* and tokenized
once. This module owns those deltas. It derives them from the tokenizer's own chat template, not
from a hand-written format, so any family's template works (ChatML, Qwen2.5/3, Llama 3.x,
Mistral, gpt-oss harmony, ...):

    head = render([user], gen=True)                          # up to where the assistant writes
    full = render([user, assistant M, *observations], gen=True)
    full = head + M's body + closer + delta

The delta is what follows the first turn-closing token the template writes after the assistant
turn M (ChatML `<|im_end|>`, Llama `<|eot_id|>`, Mistral `</s>`, gpt-oss `<|call|>` after a tool
call or `<|end|>`). When the model sampled a closing token itself, that token stands in for the
template's; when the turn was cut off by max_new_tokens, the delta starts with the template's
closer. M carries a tool call named like the first tool observation (with its id), because some
templates render tool results from the call before them (gpt-oss names the function, Mistral
checks the id).

Only the part after M is ever taken from a rendering, so templates that render *earlier* turns
differently once more messages follow stay exact: Qwen3 drops past `<think>` blocks and writes an
empty `<think></think>` into a last assistant turn, gpt-oss ends a last turn with `<|return|>` and
an earlier one with `<|end|>`, Mistral's v3 template moves the system message (and the tools) to
whichever user turn is last. `prefix_preserving(tokenizer)` detects such templates. The trajectory keeps what the model
was given and sampled at every turn (append-only); a fresh rendering of the finished transcript
would differ from it in those earlier turns, which is why nothing here ever re-renders history.

The tools of a native prompt (`tools=`) are rendered once, in the prompt; deltas are rendered
without them. The constant pieces are computed once per tokenizer and cached.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]

_PLACEHOLDER = "\x00ASSISTANT_PLACEHOLDER\x00"
_USER: Message = {"role": "user", "content": "placeholder question"}
# A neutral context: the delta is rendered after [user, assistant] because in a real episode the
# observations always follow an assistant turn, and templates that group consecutive tool
# messages (Qwen2.5) look at the previous message's role.
_CONTEXT: list[Message] = [_USER, {"role": "assistant", "content": _PLACEHOLDER}]
_PROBE_VALUE = "probe value 7c1e"
_FALLBACK_CALL_ID = "call00000"  # 9 letters and digits, the only id shape Mistral's template accepts


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot give token-exact observation deltas."""


@dataclass(frozen=True)
class _TemplatePieces:
    template: Any
    """The chat template these pieces were derived from."""
    closing_text: str
    """What the template writes after a last assistant message's content (ChatML: '<|im_end|>\\n')."""
    end_of_turn_id: int
    """The special token that starts `closing_text` (ChatML: <|im_end|>, gpt-oss: <|return|>)."""
    closing_ids: tuple[int, ...]
    """The closing tokenized alone."""
    turn_end_ids: tuple[int, ...]
    """Tokens that end a sampled turn as the template ends it: the end-of-turn token, and the token
    that ends a tool-calling turn when it differs (gpt-oss: <|call|>)."""
    closer_texts: tuple[str, ...]
    """Texts that close an assistant turn in a rendering: `turn_end_ids`' texts and the closer of
    an assistant turn that is not the last (gpt-oss: <|end|>)."""
    stop_ids: tuple[int, ...]
    head_text: str
    """`render([user], gen=True)`: what every observation delta's rendering starts with."""
    prefix_preserving: bool
    """Appending messages never changes how earlier ones render (see the module doc)."""


_CACHE: weakref.WeakKeyDictionary[Any, _TemplatePieces] = weakref.WeakKeyDictionary()
_CACHE_BY_ID: dict[int, tuple[Any, _TemplatePieces]] = {}


def _render(tokenizer, messages: list[Message], *, add_generation_prompt: bool,
            tools: list[dict] | None = None) -> str:
    if getattr(tokenizer, "chat_template", None) is None:
        raise ChatTemplateError(
            f"tokenizer {type(tokenizer).__name__} has no chat template: mcp-grpo renders prompts "
            "and observations with the model's own template (set tokenizer.chat_template)"
        )
    extra = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
    )


def _encode(tokenizer, text: str) -> list[int]:
    # Templates write their own BOS/special tokens into the text; never add more.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _special_ids(tokenizer) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for token_id, added in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
        if getattr(added, "special", False):
            ids.add(int(token_id))
    return ids


def _first_special(tokenizer, text: str) -> int | None:
    special = _special_ids(tokenizer)
    return next((i for i in _encode(tokenizer, text) if i in special), None)


def _call(call_id: str, name: str, arguments: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _try_render(tokenizer, messages: list[Message], *, add_generation_prompt: bool) -> str | None:
    """The rendering, or None where the template rejects these messages (e.g. it has no tool calls)."""
    try:
        return _render(tokenizer, messages, add_generation_prompt=add_generation_prompt)
    except ChatTemplateError:
        raise
    # Jinja raises whatever a template's raise_exception or a missing field gives.
    except Exception:  # noqa: BLE001
        return None


def _call_end_id(tokenizer) -> int | None:
    """The first special token after a rendered tool call's arguments (gpt-oss: <|call|>), or
    None where the template renders no tool calls."""
    call = _call(_FALLBACK_CALL_ID, "probe", {"probe_argument": _PROBE_VALUE})
    text = _try_render(tokenizer, [_USER, {"role": "assistant", "content": "", "tool_calls": [call]}],
                       add_generation_prompt=False)
    if text is None or _PROBE_VALUE not in text:
        return None
    return _first_special(tokenizer, text[text.rindex(_PROBE_VALUE) + len(_PROBE_VALUE):])


def _earlier_closer(tokenizer) -> str | None:
    """The text of the token that closes an assistant turn followed by another message."""
    text = _try_render(tokenizer, [*_CONTEXT, {"role": "user", "content": "next"}], add_generation_prompt=True)
    if text is None or text.count(_PLACEHOLDER) != 1:
        return None
    token = _first_special(tokenizer, text[text.index(_PLACEHOLDER) + len(_PLACEHOLDER):])
    return None if token is None else tokenizer.convert_ids_to_tokens(token)


def prefix_preserving(tokenizer) -> bool:
    """Whether appending messages leaves the rendering of earlier ones unchanged, probed with a
    prompt (system and user) followed by an answer, a tool call followed by its result, a
    `<think>` turn followed by a new question, and a plain turn followed by a new question (probes
    the template rejects are skipped)."""
    return _pieces(tokenizer).prefix_preserving


def _probe_prefix_preserving(tokenizer) -> bool:
    call = _call(_FALLBACK_CALL_ID, "probe", {})
    system = {"role": "system", "content": "probe system"}
    answer = {"role": "assistant", "content": "probe answer"}
    question = {"role": "user", "content": "next question"}
    probes = [  # (earlier messages, rendered with the generation prompt?, what follows them)
        ([system, _USER], True, [answer]),
        ([_USER, {"role": "assistant", "content": "", "tool_calls": [call]}], False,
         [{"role": "tool", "tool_call_id": _FALLBACK_CALL_ID, "name": "probe", "content": "probe result"}]),
        ([_USER, {"role": "assistant", "content": "<think>\nprobe reasoning\n</think>\n\nprobe answer"}], False,
         [question]),
        ([_USER, answer], False, [question]),
    ]
    for before, prompt, after in probes:
        alone = _try_render(tokenizer, before, add_generation_prompt=prompt)
        followed = _try_render(tokenizer, before + after, add_generation_prompt=after[-1]["role"] != "assistant")
        if alone is not None and followed is not None and not followed.startswith(alone):
            return False
    return True


def _build_pieces(tokenizer) -> _TemplatePieces:
    context_text = _render(tokenizer, _CONTEXT, add_generation_prompt=False)
    if context_text.count(_PLACEHOLDER) != 1:
        raise ChatTemplateError(
            "the chat template does not render an assistant message's content verbatim (the "
            "placeholder content appears "
            f"{context_text.count(_PLACEHOLDER)} times); observation deltas cannot be derived"
        )
    closing_text = context_text[context_text.index(_PLACEHOLDER) + len(_PLACEHOLDER) :]
    closing_ids = _encode(tokenizer, closing_text)
    if not closing_ids or closing_ids[0] not in _special_ids(tokenizer):
        raise ChatTemplateError(
            f"the chat template closes an assistant turn with {closing_text!r}, which does not "
            "start with a special end-of-turn token; the model cannot signal the end of its turn"
        )
    end_of_turn_id = closing_ids[0]
    end_of_turn_text = tokenizer.convert_ids_to_tokens(end_of_turn_id)
    if not closing_text.startswith(end_of_turn_text):
        raise ChatTemplateError(
            f"the chat template's assistant closing {closing_text!r} does not start with the "
            f"text of its end-of-turn token {end_of_turn_text!r}"
        )
    turn_end_ids = [end_of_turn_id]
    call_end = _call_end_id(tokenizer)
    if call_end is not None and call_end not in turn_end_ids:
        turn_end_ids.append(call_end)
    closers = [tokenizer.convert_ids_to_tokens(i) for i in turn_end_ids]
    earlier = _earlier_closer(tokenizer)
    if earlier is not None and earlier not in closers:
        closers.append(earlier)
    stop_ids = list(turn_end_ids)
    eos = tokenizer.eos_token_id
    for extra in eos if isinstance(eos, (list, tuple)) else [eos]:
        if extra is not None and int(extra) not in stop_ids:
            stop_ids.append(int(extra))
    return _TemplatePieces(
        template=getattr(tokenizer, "chat_template", None),
        closing_text=closing_text,
        end_of_turn_id=end_of_turn_id,
        closing_ids=tuple(closing_ids),
        turn_end_ids=tuple(turn_end_ids),
        closer_texts=tuple(closers),
        stop_ids=tuple(stop_ids),
        head_text=_render(tokenizer, [_USER], add_generation_prompt=True),
        prefix_preserving=_probe_prefix_preserving(tokenizer),
    )


def _pieces(tokenizer) -> _TemplatePieces:
    """The cached pieces of this tokenizer's current chat template (rebuilt if it changes)."""
    template = getattr(tokenizer, "chat_template", None)
    try:
        cached = _CACHE.get(tokenizer)
        weak = True
    except TypeError:  # not weak-referenceable: key on id, keeping the object alive with it
        entry = _CACHE_BY_ID.get(id(tokenizer))
        cached = entry[1] if entry is not None and entry[0] is tokenizer else None
        weak = False
    if cached is None or cached.template != template:
        cached = _build_pieces(tokenizer)
        if weak:
            _CACHE[tokenizer] = cached
        else:
            _CACHE_BY_ID[id(tokenizer)] = (tokenizer, cached)
    return cached


def prompt_ids(tokenizer, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
    """The chat template of `messages` (with `tools` rendered by the template when given) and the
    generation prompt, tokenized once."""
    return _encode(tokenizer, _render(tokenizer, list(messages), add_generation_prompt=True, tools=tools))


def prompt_lengths(tokenizer, prompts: Sequence[tuple[list[Message], list[dict] | None]]) -> list[int]:
    """`len(prompt_ids(tokenizer, messages, tools))` of each (messages, tools), with the texts
    tokenized in one batch (one call per prompt costs several times more)."""
    texts = [_render(tokenizer, list(messages), add_generation_prompt=True, tools=tools) for messages, tools in prompts]
    if not texts:
        return []
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


_PLAIN_SCALARS = (str, int, float, bool, type(None))


def _plain(value: Any) -> bool:
    """True for JSON-like data (dicts, lists, tuples of str, numbers, bool, None), whose repr says
    all a template can read of it."""
    kind = type(value)
    if kind in _PLAIN_SCALARS:
        return True
    if kind is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if kind in (list, tuple):
        return all(_plain(v) for v in value)
    return False


class PromptCache:
    """`prompt_ids` with the ids of prompts already rendered kept: the G episodes of a group start
    from the same messages, and rendering and tokenizing a ~300-token prompt costs ~1.2 ms on a
    2-core CPU (0.6 s for a 512-episode step's prompts, against 75 ms for its 64 distinct ones).

    The key is the repr of the messages and tools, so it keeps what a template can see and JSON
    would lose: key order (`tojson` writes it), a string against a number, a tuple against a list.
    Messages holding any other type (a str subclass, an object) are rendered every time. The
    collector clears it at the start of each collection; a new chat template clears it too."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._ids: dict[str, tuple[int, ...]] = {}
        self._template = getattr(tokenizer, "chat_template", None)

    @property
    def size(self) -> int:
        return len(self._ids)

    def clear(self) -> None:
        self._ids.clear()

    def prompt_ids(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        if not _plain([messages, tools]):
            return prompt_ids(self.tokenizer, messages, tools)
        template = getattr(self.tokenizer, "chat_template", None)
        if template != self._template:
            self._ids.clear()
            self._template = template
        key = repr((messages, tools))
        ids = self._ids.get(key)
        if ids is None:
            ids = self._ids[key] = tuple(prompt_ids(self.tokenizer, messages, tools))
        return list(ids)


def end_of_turn_id(tokenizer) -> int:
    """The token the template closes a (last) assistant turn with (ChatML: `<|im_end|>`)."""
    return _pieces(tokenizer).end_of_turn_id


def turn_end_ids(tokenizer) -> tuple[int, ...]:
    """Tokens that end a sampled turn the way the template does: the end-of-turn token, and the
    tool-call closer where the template has its own (gpt-oss `<|call|>`)."""
    return _pieces(tokenizer).turn_end_ids


def stop_token_ids(tokenizer) -> tuple[int, ...]:
    """Tokens that end a sampled turn: `turn_end_ids`, then eos (deduplicated)."""
    return _pieces(tokenizer).stop_ids


def turn_text(tokenizer, ids: list[int], *, keep_special_tokens: bool = False) -> str:
    """The text of a sampled turn for the environment, without its final stop token. Native tool
    prompts keep special tokens: some families' call markers are special tokens (Mistral
    `[TOOL_CALLS]`, Llama `<|python_tag|>`, gpt-oss `<|channel|>`)."""
    if ids and ids[-1] in _pieces(tokenizer).stop_ids:
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=not keep_special_tokens)


def _assistant_before(observations: list[Message]) -> Message:
    """The assistant turn the observations answer: a call named like the first tool result (with
    its id), or plain content when none is a tool result."""
    tool = next((m for m in observations if m.get("role") == "tool"), None)
    if tool is None:
        return {"role": "assistant", "content": _PLACEHOLDER}
    call = _call(tool.get("tool_call_id") or _FALLBACK_CALL_ID, tool.get("name") or "tool", {})
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def _with_call_ids(observations: list[Message]) -> list[Message]:
    return [{**m, "tool_call_id": m.get("tool_call_id") or _FALLBACK_CALL_ID} if m.get("role") == "tool" else m
            for m in observations]


def observation_delta_text(tokenizer, observations: list[Message], *, assistant_ended: bool) -> str:
    """The template text that follows a finished assistant turn: the rest of the turn's closing,
    the observation messages, and the generation prompt for the next assistant turn."""
    pieces = _pieces(tokenizer)
    head = pieces.head_text
    turn = _assistant_before(observations)
    full = _render(tokenizer, [_USER, turn, *_with_call_ids(observations)], add_generation_prompt=True)
    if not full.startswith(head):
        raise ChatTemplateError(
            "the chat template renders a user message differently once an assistant turn and "
            "observations follow it, so observations cannot be rendered as a token-exact delta. "
            f"Rendered: {full[: len(head)]!r}; expected {head!r}"
        )
    rest = full[len(head) :]
    body = rest.index(_PLACEHOLDER) + len(_PLACEHOLDER) if _PLACEHOLDER in rest else 0
    found = [(rest.find(text, body), text) for text in pieces.closer_texts if rest.find(text, body) >= 0]
    if not found:
        raise ChatTemplateError(
            f"the chat template writes none of its turn-closing tokens {list(pieces.closer_texts)} "
            f"after an assistant turn (rendered {rest!r}); observation deltas cannot be derived"
        )
    at, closer = min(found)
    # The sampled closing token already stands in for the template's.
    return rest[at + len(closer) :] if assistant_ended else rest[at:]


def observation_delta_ids(
    tokenizer, observations: list[Message], *, assistant_ended: bool
) -> list[int]:
    """Token ids of `observation_delta_text`, tokenized once.

    `assistant_ended`: the sampled turn ended with one of `turn_end_ids`. If not (cut off by
    max_new_tokens, or ended on eos), the delta starts by closing the turn as the template does.
    """
    return _encode(
        tokenizer, observation_delta_text(tokenizer, observations, assistant_ended=assistant_ended)
    )


def closing_ids(tokenizer) -> list[int]:
    """The ids that close an assistant turn (ChatML: `<|im_end|>` `\\n`)."""
    return list(_pieces(tokenizer).closing_ids)

"""Token-exact chat rendering: the prompt ids and the observation deltas that go between turns.

Token in, token out: a trajectory is the prompt ids, then each turn's sampled ids exactly as the
engine returned them, then each observation rendered as a *chat-template delta* and tokenized
once. This module owns those deltas. It derives them from the tokenizer's own chat template, not
from a hand-written format, so any template works that renders a conversation as a string which
only grows when messages are appended:

    render([ctx..., assistant X])                          = A
    render([ctx..., assistant X, *observations], gen=True) = A + suffix

The delta after a sampled assistant turn is `suffix`, preceded by whatever the template puts
between the assistant content and the end of its rendering (the "closing": for ChatML
`<|im_end|>\\n`). When the model sampled the end-of-turn token itself, that token is already in
the trajectory, so the delta starts just after it (ChatML: `\\n<|im_start|>tool\\n...`); when the
turn was cut off by max_new_tokens, the delta starts by closing the turn.

The constant pieces (the rendered context, the closing, the end-of-turn token) are computed once
per tokenizer and cached.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]

_PLACEHOLDER = "\x00ASSISTANT_PLACEHOLDER\x00"
# A neutral context: the delta is rendered after [user, assistant] because in a real episode the
# observations always follow an assistant turn, and templates that group consecutive tool
# messages (Qwen2.5) look at the previous message's role.
_CONTEXT: list[Message] = [
    {"role": "user", "content": "placeholder question"},
    {"role": "assistant", "content": _PLACEHOLDER},
]


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot give token-exact observation deltas."""


@dataclass(frozen=True)
class _TemplatePieces:
    template: Any
    """The chat template these pieces were derived from."""
    context_text: str
    """render(_CONTEXT) without a generation prompt."""
    closing_text: str
    """What the template writes after the assistant content (ChatML: '<|im_end|>\\n')."""
    end_of_turn_text: str
    """The end-of-turn token's text at the start of the closing (ChatML: '<|im_end|>')."""
    end_of_turn_id: int
    closing_ids: tuple[int, ...]
    """The closing tokenized alone: what a truncated turn gets before its observations."""
    stop_ids: tuple[int, ...]


_CACHE: weakref.WeakKeyDictionary[Any, _TemplatePieces] = weakref.WeakKeyDictionary()
_CACHE_BY_ID: dict[int, tuple[Any, _TemplatePieces]] = {}


def _render(tokenizer, messages: list[Message], *, add_generation_prompt: bool) -> str:
    if getattr(tokenizer, "chat_template", None) is None:
        raise ChatTemplateError(
            f"tokenizer {type(tokenizer).__name__} has no chat template: mcp-grpo renders prompts "
            "and observations with the model's own template (set tokenizer.chat_template)"
        )
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
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
    stop_ids = [end_of_turn_id]
    eos = tokenizer.eos_token_id
    for extra in eos if isinstance(eos, (list, tuple)) else [eos]:
        if extra is not None and int(extra) not in stop_ids:
            stop_ids.append(int(extra))
    return _TemplatePieces(
        template=getattr(tokenizer, "chat_template", None),
        context_text=context_text,
        closing_text=closing_text,
        end_of_turn_text=end_of_turn_text,
        end_of_turn_id=end_of_turn_id,
        closing_ids=tuple(closing_ids),
        stop_ids=tuple(stop_ids),
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


def prompt_ids(tokenizer, messages: list[Message]) -> list[int]:
    """The chat template of `messages` with the generation prompt, tokenized once."""
    return _encode(tokenizer, _render(tokenizer, list(messages), add_generation_prompt=True))


def end_of_turn_id(tokenizer) -> int:
    """The token the template closes an assistant turn with (ChatML: `<|im_end|>`)."""
    return _pieces(tokenizer).end_of_turn_id


def stop_token_ids(tokenizer) -> tuple[int, ...]:
    """Tokens that end a sampled turn: the template's end-of-turn token, then eos (deduplicated)."""
    return _pieces(tokenizer).stop_ids


def observation_delta_text(tokenizer, observations: list[Message], *, assistant_ended: bool) -> str:
    """The template text that follows a finished assistant turn: the rest of the turn's closing,
    the observation messages, and the generation prompt for the next assistant turn."""
    pieces = _pieces(tokenizer)
    full = _render(tokenizer, _CONTEXT + list(observations), add_generation_prompt=True)
    if not full.startswith(pieces.context_text):
        raise ChatTemplateError(
            "the chat template is not append-only: rendering a conversation with observation "
            "messages appended changes the text of the earlier messages (e.g. a template that "
            "rewrites or drops past assistant turns), so observations cannot be rendered as a "
            f"token-exact delta. Rendered prefix: {full[: len(pieces.context_text)]!r}; expected "
            f"{pieces.context_text!r}"
        )
    suffix = full[len(pieces.context_text) :]
    if assistant_ended:
        # The sampled end-of-turn token already stands in for the closing's first token.
        return pieces.closing_text[len(pieces.end_of_turn_text) :] + suffix
    return pieces.closing_text + suffix


def observation_delta_ids(
    tokenizer, observations: list[Message], *, assistant_ended: bool
) -> list[int]:
    """Token ids of `observation_delta_text`, tokenized once.

    `assistant_ended`: the sampled turn ended with the template's end-of-turn token (see
    `end_of_turn_id`). If not (cut off by max_new_tokens, or ended on a different stop token), the
    delta starts by closing the turn with the end-of-turn token and what follows it.
    """
    return _encode(
        tokenizer, observation_delta_text(tokenizer, observations, assistant_ended=assistant_ended)
    )


def closing_ids(tokenizer) -> list[int]:
    """The ids that close an assistant turn (ChatML: `<|im_end|>` `\\n`)."""
    return list(_pieces(tokenizer).closing_ids)

"""Observation deltas are token-exact slices of the full chat-template rendering (real SmolLM2
tokenizer, ChatML)."""

from __future__ import annotations

import copy
from typing import ClassVar

import pytest

from grpo.collect import chat_tokens
from grpo.collect.chat_tokens import ChatTemplateError


def _encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _full_ids(tokenizer, messages):
    return _encode(
        tokenizer,
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
    )


PROMPT = [
    {"role": "system", "content": "You can call tools.\nUse <tool_call> blocks."},
    {"role": "user", "content": "What is 964 * 494?"},
]


def test_stop_ids_are_im_end_and_eos(tokenizer):
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert chat_tokens.end_of_turn_id(tokenizer) == im_end
    stops = chat_tokens.stop_token_ids(tokenizer)
    assert stops[0] == im_end and tokenizer.eos_token_id in stops
    assert chat_tokens.closing_ids(tokenizer) == [im_end] + _encode(tokenizer, "\n")


def test_prompt_ids_equal_template_with_generation_prompt(tokenizer):
    ids = chat_tokens.prompt_ids(tokenizer, PROMPT)
    assert ids == _full_ids(tokenizer, PROMPT)
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


def test_delta_text_after_sampled_im_end_is_chatml(tokenizer):
    obs = [{"role": "tool", "content": "476216"}]
    text = chat_tokens.observation_delta_text(tokenizer, obs, assistant_ended=True)
    assert text == "\n<|im_start|>tool\n476216<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(
    "assistant_text,observations",
    [
        (
            '<tool_call>\n{"name": "multiply", "arguments": {"a": 964, "b": 494}}\n</tool_call>',
            [{"role": "tool", "content": "476216"}],
        ),
        (
            "Let me compute both.",
            [
                {"role": "tool", "content": "12"},
                {"role": "tool", "content": "error: division by zero"},
                {"role": "user", "content": "Please answer with the number only."},
            ],
        ),
    ],
)
def test_delta_ids_are_exact_slice_of_full_rendering(tokenizer, assistant_text, observations):
    """prompt ids + assistant ids + <|im_end|> + delta == the whole conversation, tokenized at
    once."""
    assistant_ids = _encode(tokenizer, assistant_text) + [chat_tokens.end_of_turn_id(tokenizer)]
    delta = chat_tokens.observation_delta_ids(tokenizer, observations, assistant_ended=True)
    built = chat_tokens.prompt_ids(tokenizer, PROMPT) + assistant_ids + delta
    full = _full_ids(
        tokenizer, PROMPT + [{"role": "assistant", "content": assistant_text}] + observations
    )
    assert built == full


def test_multi_turn_concatenation_matches_full_rendering(tokenizer):
    turns = [
        ("first try", [{"role": "tool", "content": "1"}]),
        ("second try", [{"role": "tool", "content": "2"}, {"role": "tool", "content": "3"}]),
        ("third", [{"role": "user", "content": "go on"}]),
    ]
    eot = chat_tokens.end_of_turn_id(tokenizer)
    built = chat_tokens.prompt_ids(tokenizer, PROMPT)
    messages = list(PROMPT)
    for text, obs in turns:
        built += _encode(tokenizer, text) + [eot]
        built += chat_tokens.observation_delta_ids(tokenizer, obs, assistant_ended=True)
        messages += [{"role": "assistant", "content": text}, *obs]
    assert built == _full_ids(tokenizer, messages)


def test_truncated_turn_delta_closes_the_turn(tokenizer):
    obs = [{"role": "tool", "content": "7"}]
    ended = chat_tokens.observation_delta_ids(tokenizer, obs, assistant_ended=True)
    truncated = chat_tokens.observation_delta_ids(tokenizer, obs, assistant_ended=False)
    eot = chat_tokens.end_of_turn_id(tokenizer)
    assert truncated == [eot] + ended
    # A cut-off turn (no <|im_end|> sampled) then closed by the delta renders the same conversation.
    text = "The answer is 4"
    built = chat_tokens.prompt_ids(tokenizer, PROMPT) + _encode(tokenizer, text) + truncated
    full = _full_ids(tokenizer, PROMPT + [{"role": "assistant", "content": text}] + obs)
    assert built == full


def test_empty_observations_give_the_next_generation_prompt(tokenizer):
    text = chat_tokens.observation_delta_text(tokenizer, [], assistant_ended=True)
    assert text == "\n<|im_start|>assistant\n"


def test_pieces_are_cached(tokenizer):
    assert chat_tokens._pieces(tokenizer) is chat_tokens._pieces(tokenizer)


class _RewritingTokenizer:
    """A stand-in whose template renders earlier turns differently once more messages follow."""

    chat_template = "fake"
    eos_token_id = 2
    all_special_ids = (2,)
    added_tokens_decoder: ClassVar[dict] = {}

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        last = len(messages) - 1
        out = ""
        for i, m in enumerate(messages):
            content = m["content"] if i == last or m["role"] != "assistant" else "[hidden]"
            out += f"<{m['role']}>{content}<e>"
        return out + ("<assistant>" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=False):
        ids = [2 if text.startswith("<e>") else 5] if text else []
        return {"input_ids": ids}

    def convert_ids_to_tokens(self, token_id):
        return "<e>"


def test_template_that_rewrites_earlier_turns_is_detected_and_its_delta_is_exact(tokenizer):
    """Earlier assistant turns render as [hidden] once more messages follow: the template is not
    prefix-preserving, and the delta is still only what follows the assistant turn."""
    rewriting = _RewritingTokenizer()
    assert chat_tokens.prefix_preserving(rewriting) is False
    text = chat_tokens.observation_delta_text(rewriting, [{"role": "tool", "content": "1"}], assistant_ended=True)
    assert text == "<tool>1<e><assistant>"
    assert chat_tokens.prefix_preserving(tokenizer) is True  # SmolLM2's ChatML


def test_missing_template_is_a_clear_error():
    class NoTemplate(_RewritingTokenizer):
        chat_template = None

    with pytest.raises(ChatTemplateError, match="no chat template"):
        chat_tokens.prompt_ids(NoTemplate(), PROMPT)


# A template in the style of Qwen2.5's: consecutive tool messages share one user turn, each
# wrapped in <tool_response>; the turn closes only after the last of them.
GROUPING_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}"
    "{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_grouping_template_deltas_match_full_rendering(tokenizer):
    grouping = copy.deepcopy(tokenizer)
    grouping.chat_template = GROUPING_TEMPLATE
    observations = [{"role": "tool", "content": "12"}, {"role": "tool", "content": "34"}]
    text = chat_tokens.observation_delta_text(grouping, observations, assistant_ended=True)
    assert text == (
        "\n<|im_start|>user\n<tool_response>\n12\n</tool_response>\n<tool_response>\n34\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assistant = "calling two tools"
    built = (
        chat_tokens.prompt_ids(grouping, PROMPT)
        + _encode(grouping, assistant)
        + [chat_tokens.end_of_turn_id(grouping)]
        + chat_tokens.observation_delta_ids(grouping, observations, assistant_ended=True)
    )
    full = _full_ids(
        grouping, PROMPT + [{"role": "assistant", "content": assistant}] + observations
    )
    assert built == full


def _counting_renders(monkeypatch):
    calls = []
    render = chat_tokens._render

    def counted(tokenizer, messages, **options):
        calls.append((len(messages), options.get("add_generation_prompt")))
        return render(tokenizer, messages, **options)

    monkeypatch.setattr(chat_tokens, "_render", counted)
    return calls


def test_prompt_cache_renders_each_distinct_prompt_once(tokenizer, monkeypatch):
    renders = _counting_renders(monkeypatch)
    cache = chat_tokens.PromptCache(tokenizer)
    expected = chat_tokens.prompt_ids(tokenizer, PROMPT)
    renders.clear()
    first = cache.prompt_ids(PROMPT)
    again = cache.prompt_ids(copy.deepcopy(PROMPT))  # equal messages, other objects
    assert first == again == expected and len(renders) == 1
    first.append(7)  # the caller's list is its own
    assert cache.prompt_ids(PROMPT) == expected
    other = [*PROMPT[:1], {"role": "user", "content": "What is 964 * 495?"}]
    assert cache.prompt_ids(other) == chat_tokens.prompt_ids(tokenizer, other) != expected
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    assert cache.prompt_ids(PROMPT, tools) == chat_tokens.prompt_ids(tokenizer, PROMPT, tools)
    assert len(renders) == 1 + 2 + 1 + 1 and cache.size == 3
    cache.clear()
    assert cache.size == 0 and cache.prompt_ids(PROMPT) == expected


def test_prompt_cache_follows_a_new_chat_template(tokenizer, monkeypatch):
    cache = chat_tokens.PromptCache(tokenizer)
    before = cache.prompt_ids(PROMPT)
    shouting = tokenizer.chat_template.replace("'<|im_start|>' + message['role']", "'<|im_start|>' + message['role'] | upper")
    assert shouting != tokenizer.chat_template
    monkeypatch.setattr(tokenizer, "chat_template", shouting)
    after = cache.prompt_ids(PROMPT)
    assert after == chat_tokens.prompt_ids(tokenizer, PROMPT) != before and cache.size == 1


def test_prompt_cache_keys_on_everything_a_template_can_see(tokenizer, monkeypatch):
    renders = _counting_renders(monkeypatch)
    cache = chat_tokens.PromptCache(tokenizer)
    # Equal as sorted JSON, not to a template: the order of keys (a template's `tojson` keeps it),
    # a string and a number.
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"b": 1, "a": 2}}}]
    reordered = [{"type": "function", "function": {"name": "calc", "parameters": {"a": 2, "b": 1}}}]
    quoted = [{"type": "function", "function": {"name": "calc", "parameters": {"b": "1", "a": 2}}}]
    for variant in (tools, reordered, quoted, tools):
        assert cache.prompt_ids(PROMPT, variant) == chat_tokens.prompt_ids(tokenizer, PROMPT, variant)
    assert cache.size == 3

    class Marked(str):  # a type the key does not know (it may carry state) is never cached
        pass

    renders.clear()
    odd = [{"role": "user", "content": Marked("hello")}]
    hello = chat_tokens.prompt_ids(tokenizer, [{"role": "user", "content": "hello"}])
    assert cache.prompt_ids(odd) == cache.prompt_ids(odd) == hello
    assert len(renders) == 3 and cache.size == 3


def test_observation_delta_renders_the_template_once(tokenizer, monkeypatch):
    obs = [{"role": "tool", "content": "476216"}]
    chat_tokens.observation_delta_text(tokenizer, obs, assistant_ended=True)  # pieces built
    renders = _counting_renders(monkeypatch)
    text = chat_tokens.observation_delta_text(tokenizer, obs, assistant_ended=True)
    assert text == "\n<|im_start|>tool\n476216<|im_end|>\n<|im_start|>assistant\n"
    assert renders == [(3, True)]  # user, the assistant call, the tool result

"""Native tool prompts with the real chat templates of five model families (tests/fixtures/
chat_templates, sources in its README): what each template says about tools, the call syntax read
from it, and token-exact trajectories (prompt with `tools=`, sampled calls, observation deltas)
equal to the template's own rendering of the whole conversation, including the templates that
re-render earlier turns (Qwen3 drops past <think> blocks, gpt-oss ends past turns differently).

Tokenizers: Mistral's is the family's real one (the v3 SentencePiece model that mistral-common
ships, converted by transformers); the others are the embedded SmolLM2 tokenizer with the family's
control tokens added (special where the family's are), since their own are not available offline.
"""

from __future__ import annotations

import copy
import importlib.util
import shutil
from pathlib import Path

import pytest
from conftest import running_manager
from transformers import LlamaTokenizer

import environments  # noqa: F401  (registers mcp_tool)
from environments.config import EnvironmentConfig
from environments.mcp_tool.prompt import resolve_tool_prompt, tool_schemas
from environments.tasks.schema import Task
from environments.toolcalls import parse_tool_calls
from environments.toolcalls.templates import native_call_format, renders_tools, template_text
from grpo.collect import chat_tokens
from grpo.collect.collector import TrajectoryCollector
from grpo.rollout.base import GenerationRequest, GenerationResult, RolloutEngine
from grpo.rollout.config import RolloutConfig

TEMPLATES = Path(__file__).resolve().parent / "fixtures" / "chat_templates"

LLAMA_SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
                 "<|python_tag|>"]
HARMONY_SPECIAL = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"]
FAMILIES = ["qwen2_5", "qwen3", "llama3_1", "llama3_2", "mistral_v3", "gptoss"]


def _smollm2_with(base, template: str, special: list[str] = (), plain: list[str] = (), **tokens):
    tok = copy.deepcopy(base)
    tok.chat_template = (TEMPLATES / f"{template}.jinja").read_text()
    if special:
        tok.add_special_tokens({"additional_special_tokens": list(special)})
    if plain:
        tok.add_tokens(list(plain))
    for name, value in tokens.items():
        setattr(tok, name, value)
    return tok


def _mistral_v3(tmp_dir: Path):
    """Mistral 7B v0.3 / Large 2407's tokenizer: the v3 SentencePiece model from mistral-common."""
    spec = importlib.util.find_spec("mistral_common")
    assert spec is not None, "mistral-common provides Mistral's tokenizer: pip install --no-deps mistral-common"
    model = Path(spec.submodule_search_locations[0]) / "data" / "mistral_instruct_tokenizer_240323.model.v3"
    shutil.copy(model, tmp_dir / "tokenizer.model")
    tok = LlamaTokenizer.from_pretrained(str(tmp_dir))
    tok.chat_template = (TEMPLATES / "mistral_v3.jinja").read_text()
    return tok


@pytest.fixture(scope="module")
def family(tokenizer, tmp_path_factory):
    built = {
        "qwen2_5": _smollm2_with(tokenizer, "qwen2_5", plain=["<tool_call>", "</tool_call>"]),
        "qwen3": _smollm2_with(tokenizer, "qwen3", plain=["<tool_call>", "</tool_call>", "<think>", "</think>",
                                                          "<tool_response>", "</tool_response>"]),
        "llama3_1": _smollm2_with(tokenizer, "llama3_1", LLAMA_SPECIAL, bos_token="<|begin_of_text|>",
                                  eos_token="<|eot_id|>"),
        "llama3_2": _smollm2_with(tokenizer, "llama3_2", LLAMA_SPECIAL, bos_token="<|begin_of_text|>",
                                  eos_token="<|eot_id|>"),
        "gptoss": _smollm2_with(tokenizer, "gptoss", HARMONY_SPECIAL, eos_token="<|return|>"),
        "mistral_v3": _mistral_v3(tmp_path_factory.mktemp("mistral_v3")),
    }
    return built.__getitem__


def encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


TOOLS = [{"type": "function", "function": {
    "name": "calculate", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
CALL = {"id": "call00001", "type": "function", "function": {"name": "calculate", "arguments": {"expression": "964 * 494"}}}
RESULT = {"role": "tool", "tool_call_id": "call00001", "name": "calculate", "content": "476216"}
PROMPT = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "What is 964 * 494?"}]

# What each family's model writes for the call and for the answer (its template's own rendering),
# and the assistant messages that render to it. The final closer of a call turn is part of the
# sampled ids; gpt-oss's generation prompt is `<|start|>assistant`, so its call continues the header.
SAMPLED = {
    "qwen2_5": ('<tool_call>\n{"name": "calculate", "arguments": {"expression": "964 * 494"}}\n</tool_call>',
                "<answer>476216</answer>"),
    "qwen3": (('<think>\nI need the calculator.\n</think>\n\n<tool_call>\n{"name": "calculate", "arguments": '
               '{"expression": "964 * 494"}}\n</tool_call>'),
              "<think>\nIt returned 476216.\n</think>\n\n<answer>476216</answer>"),
    "llama3_1": ('{"name": "calculate", "parameters": {"expression": "964 * 494"}}', "<answer>476216</answer>"),
    "llama3_2": ('{"name": "calculate", "parameters": {"expression": "964 * 494"}}', "<answer>476216</answer>"),
    "mistral_v3": ('[TOOL_CALLS] [{"name": "calculate", "arguments": {"expression": "964 * 494"}, "id": "call00001"}]',
                   " <answer>476216</answer>"),
    "gptoss": (' to=functions.calculate<|channel|>commentary json<|message|>{"expression": "964 * 494"}',
               "<|channel|>final<|message|><answer>476216</answer>"),
}
CLOSERS = {"qwen2_5": ("<|im_end|>", "<|im_end|>"), "qwen3": ("<|im_end|>", "<|im_end|>"),
           "llama3_1": ("<|eot_id|>", "<|eot_id|>"), "llama3_2": ("<|eot_id|>", "<|eot_id|>"),
           "mistral_v3": ("</s>", "</s>"), "gptoss": ("<|call|>", "<|return|>")}
NATIVE_FORMAT = {"qwen2_5": "hermes", "qwen3": "hermes", "llama3_1": "json", "llama3_2": "json",
                 "mistral_v3": "mistral", "gptoss": "harmony"}


def conversation(name: str) -> list[dict]:
    first = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    answer = {"role": "assistant", "content": "<answer>476216</answer>"}
    if name == "qwen3":
        first["content"] = "<think>\nI need the calculator.\n</think>\n\n"
        answer["content"] = "<think>\nIt returned 476216.\n</think>\n\n<answer>476216</answer>"
    return [*PROMPT, first, RESULT, answer]


# -- what the template says ----------------------------------------------------------------------

@pytest.mark.parametrize("name", FAMILIES)
def test_family_templates_render_tools_and_name_their_call_syntax(family, name):
    tok = family(name)
    assert renders_tools(tok) is True
    assert native_call_format(template_text(tok)) == NATIVE_FORMAT[name]
    config, reason = resolve_tool_prompt(EnvironmentConfig(), tok)
    assert (config.tool_prompt, config.call_format) == ("native", NATIVE_FORMAT[name])
    assert reason == (f"tool prompt: native (the chat template renders the tools' JSON schemas); calls parsed as "
                      f"{NATIVE_FORMAT[name]} (read from the chat template)")


def test_smollm2_template_renders_no_tools_so_auto_is_compact_and_native_an_error(tokenizer):
    assert renders_tools(tokenizer) is False
    config, reason = resolve_tool_prompt(EnvironmentConfig(), tokenizer)
    assert config.tool_prompt == "compact"
    assert reason.startswith("tool prompt: compact (auto: the chat template renders no tools")
    with pytest.raises(ValueError, match="tool_prompt is 'native' but this model's chat template renders no tools"):
        resolve_tool_prompt(EnvironmentConfig(tool_prompt="native"), tokenizer)


def test_qwen3_5_xml_parameters_are_not_mistaken_for_hermes(tokenizer):
    tok = _smollm2_with(tokenizer, "qwen3_5_think")
    assert renders_tools(tok) is True and native_call_format(template_text(tok)) is None
    config, reason = resolve_tool_prompt(EnvironmentConfig(), tok)
    assert config.tool_prompt == "compact" and "writes no call syntax this library reads" in reason
    with pytest.raises(ValueError, match="set environment.call_format"):
        resolve_tool_prompt(EnvironmentConfig(tool_prompt="native"), tok)
    configured, _ = resolve_tool_prompt(EnvironmentConfig(tool_prompt="native", call_format="hermes"), tok)
    assert (configured.tool_prompt, configured.call_format) == ("native", "hermes")


@pytest.mark.parametrize("name,preserving", [("qwen2_5", True), ("qwen3", False), ("llama3_1", True),
                                             ("llama3_2", True), ("mistral_v3", False), ("gptoss", False)])
def test_templates_that_rewrite_earlier_turns_are_detected(family, name, preserving):
    assert chat_tokens.prefix_preserving(family(name)) is preserving


@pytest.mark.parametrize("name", FAMILIES)
def test_turn_closers_come_from_the_template(family, name):
    tok = family(name)
    call_closer, answer_closer = CLOSERS[name]
    expected = [answer_closer] + ([call_closer] if call_closer != answer_closer else [])
    assert tok.convert_ids_to_tokens(list(chat_tokens.turn_end_ids(tok))) == expected
    assert set(chat_tokens.turn_end_ids(tok)) <= set(chat_tokens.stop_token_ids(tok))


# -- token-exact trajectories ---------------------------------------------------------------------

def _trajectory(tok, name: str) -> list[int]:
    """What the collector builds: the prompt with tools, the sampled call and its closer, the
    result's delta, the sampled answer and its closer."""
    call_text, answer_text = SAMPLED[name]
    call_closer, answer_closer = (tok.convert_tokens_to_ids(c) for c in CLOSERS[name])
    ids = chat_tokens.prompt_ids(tok, PROMPT, TOOLS)
    ids += encode(tok, call_text) + [call_closer]
    ids += chat_tokens.observation_delta_ids(tok, [RESULT], assistant_ended=True)
    return ids + encode(tok, answer_text) + [answer_closer]


@pytest.mark.parametrize("name", FAMILIES)
def test_native_trajectory_is_the_templates_rendering_of_the_conversation(family, name):
    """After the prompt, the trajectory (sampled calls, closers, deltas) is the template's rendering
    of the whole conversation, text and tokens. The prompt is the template's too, except where the
    template re-renders it once the conversation goes on: Mistral's v3 template writes the system
    message into the last user turn only. Tokens are compared from the prompt's end on, and not for
    Llama's templates here: their generation prompt ends in `<|end_header_id|>\\n\\n`, which the
    embedded SmolLM2 tokenizer splits differently when text follows it ("\\n\\n" alone is one
    token, "\\n\\n{" is "\\n" "\\n" "{"), while Llama 3's own pre-tokenizer keeps a newline run
    whole. The trajectory keeps the ids the engine was given and sampled either way."""
    tok = family(name)
    prompt = chat_tokens.prompt_ids(tok, PROMPT, TOOLS)
    built = _trajectory(tok, name)
    full = tok.apply_chat_template(conversation(name), tools=TOOLS, tokenize=False)
    closer = CLOSERS[name][1]
    full = full[: full.rindex(closer) + len(closer)]  # what follows the last turn is not sampled
    tail = tok.decode(built[len(prompt):])
    assert full.endswith(tail) and tail.startswith(SAMPLED[name][0])
    if not name.startswith("llama"):
        assert built[len(prompt):] == encode(tok, tail)
    prompt_text = tok.apply_chat_template(PROMPT, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    head = full[: len(full) - len(tail)]
    if name == "mistral_v3":
        assert head == prompt_text.replace("[INST] Use the tools.\n\n", "[INST] ")
    else:
        assert head == prompt_text


@pytest.mark.parametrize("name", FAMILIES)
def test_a_cut_off_turn_is_closed_by_the_templates_closer(family, name):
    tok = family(name)
    ended = chat_tokens.observation_delta_ids(tok, [RESULT], assistant_ended=True)
    cut = chat_tokens.observation_delta_ids(tok, [RESULT], assistant_ended=False)
    assert cut == [tok.convert_tokens_to_ids(CLOSERS[name][0])] + ended


@pytest.mark.parametrize("name", FAMILIES)
def test_sampled_calls_parse_in_the_detected_format(family, name):
    tok = family(name)
    ids = encode(tok, SAMPLED[name][0]) + [tok.convert_tokens_to_ids(CLOSERS[name][0])]
    text = chat_tokens.turn_text(tok, ids, keep_special_tokens=True)
    parsed = parse_tool_calls(text, formats=[NATIVE_FORMAT[name]])
    assert [(c.name, c.arguments, c.format) for c in parsed.calls] == [
        ("calculate", {"expression": "964 * 494"}, NATIVE_FORMAT[name])]
    assert parsed.errors == []


def test_deltas_of_each_family_render_the_tool_result_in_its_own_role(family):
    delta = {name: chat_tokens.observation_delta_text(family(name), [RESULT], assistant_ended=True)
             for name in FAMILIES}
    assert delta["qwen2_5"] == ("\n<|im_start|>user\n<tool_response>\n476216\n</tool_response><|im_end|>\n"
                                "<|im_start|>assistant\n")
    assert delta["qwen3"] == delta["qwen2_5"]
    assert delta["llama3_1"] == ('<|start_header_id|>ipython<|end_header_id|>\n\n"476216"<|eot_id|>'
                                 "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert delta["llama3_2"] == delta["llama3_1"]
    assert delta["mistral_v3"] == '[TOOL_RESULTS] {"content": 476216, "call_id": "call00001"}[/TOOL_RESULTS]'
    assert delta["gptoss"] == ('<|start|>functions.calculate to=assistant<|channel|>commentary<|message|>'
                               '"476216"<|end|><|start|>assistant')


# -- templates that re-render history -------------------------------------------------------------

def test_qwen3_history_with_thinking_is_kept_as_sampled_not_re_rendered(family):
    """A new user message makes Qwen3's template drop the earlier <think> block: the trajectory
    keeps the tokens the model saw and sampled; only that block differs from a fresh rendering,
    and the delta is the fresh rendering's own text after the assistant turn."""
    tok = family("qwen3")
    reply = "<think>\nSimple.\n</think>\n\n<answer>4</answer>"
    follow_up = [{"role": "user", "content": "And times 3?"}]
    built = chat_tokens.prompt_ids(tok, PROMPT) + encode(tok, reply) + [tok.convert_tokens_to_ids("<|im_end|>")]
    built += chat_tokens.observation_delta_ids(tok, follow_up, assistant_ended=True)
    fresh = tok.apply_chat_template([*PROMPT, {"role": "assistant", "content": reply}, *follow_up],
                                    tokenize=False, add_generation_prompt=True)
    assert "<think>" not in fresh
    assert tok.decode(built) == fresh.replace("<answer>4</answer>", reply, 1)
    delta = chat_tokens.observation_delta_text(tok, follow_up, assistant_ended=True)
    assert fresh.endswith("<answer>4</answer><|im_end|>" + delta)


def test_gptoss_final_answer_then_user_keeps_the_sampled_return(family):
    """gpt-oss renders a last answer with <|return|> and an earlier one with <|end|>: a sampled
    <|return|> stays, and the delta starts after it with the next user turn."""
    tok = family("gptoss")
    delta = chat_tokens.observation_delta_text(tok, [{"role": "user", "content": "Thanks!"}], assistant_ended=True)
    assert delta == "<|start|>user<|message|>Thanks!<|end|><|start|>assistant"


# -- through the environment and the collector (the real calculator server) ------------------------

class TurnEngine(RolloutEngine):
    """Answers turn k of every episode with the ids `turns[k]` (each ending in its closer)."""

    def __init__(self, turns: list[list[int]]):
        self.turns = turns

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return [GenerationResult(list(self.turns[r.turn]), [0.0] * len(self.turns[r.turn]), "stop") for r in requests]

    def sync_weights(self, policy) -> None:
        pass


def calculator_task() -> dict:
    gt = {"task_id": "calc-964-494", "complexity": "easy",
          "success": {"answer": 476216, "must_call_tool": ["calculate"]},
          "tool_sequence": [{"step": 1, "server": "calculator", "tool": "calculate",
                             "params": {"expression": "964 * 494"}}]}
    return {"data_source": "test", "prompt": [{"role": "user", "content": "What is 964 * 494?"}],
            "reward_spec": {"method": ["final_answer", "must_call_tool"], "ground_truth": gt}}


@pytest.fixture(scope="module")
def calculator(loop):
    with running_manager(loop, "calculator") as manager:
        yield manager


@pytest.mark.parametrize("name", ["qwen2_5", "qwen3", "llama3_2", "mistral_v3", "gptoss"])
def test_native_episode_through_the_collector(loop, calculator, family, name):
    """The collector resolves `auto` to the family's native prompt, renders the tools and the
    worked examples through its template, parses the sampled call in the family's syntax, runs it
    on the real server and appends the result as a template delta: the episode succeeds and its
    ids are exactly prompt (with tools) + call + delta + answer."""
    tok = family(name)
    call_closer, answer_closer = (tok.convert_tokens_to_ids(c) for c in CLOSERS[name])
    turns = [encode(tok, SAMPLED[name][0]) + [call_closer], encode(tok, SAMPLED[name][1]) + [answer_closer]]
    collector = TrajectoryCollector(TurnEngine(turns), tok, calculator, EnvironmentConfig(),
                                    RolloutConfig(max_new_tokens=64, max_total_tokens=4096))
    assert (collector.env_config.tool_prompt, collector.env_config.call_format) == ("native", NATIVE_FORMAT[name])
    result = loop.run_until_complete(collector.collect([Task.from_record(calculator_task(), "test")], 1))
    (traj,) = result.trajectories
    assert traj.reward == 1.0 and traj.success
    transcript = traj.metadata["transcript"]
    opening = transcript[: traj.metadata["prompt_messages"]]
    assert opening[2]["tool_calls"][0]["function"] == {"name": "calculate", "arguments": {"expression": "523 + 198"}}
    assert transcript[-2] == {"role": "tool", "name": "calculate", "content": "476216", "tool_call_id": "call00001"}
    schemas = tool_schemas(list(calculator.tool_specs()))
    prompt = chat_tokens.prompt_ids(tok, opening, schemas)
    expected = prompt + turns[0] + chat_tokens.observation_delta_ids(tok, [transcript[-2]], assistant_ended=True) + turns[1]
    assert traj.token_ids == expected
    assert schemas[0]["function"]["description"] in tok.decode(prompt)  # the template rendered the tools

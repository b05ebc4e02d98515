"""The LLM judge: scores episodes against a rubric, one at a time or a whole group together.

`Judge.score_episode(rubric, transcript)` asks the judge model for one JSON object
`{"score": 0..1, "reason": ...}`; `Judge.score_group(rubric, transcripts)` shows the G episodes of
a group in one request and asks for `{"scores": [{"id": 1..G, "score": 0..1, "reason": ...}]}`,
scored relative to each other (group-relative judging, as OpenPipe's RULER does).

Replies are read strictly: anything but the asked-for JSON (missing or extra ids, a score outside
[0, 1] or not a number) is a `RewardError` that quotes the reply, as is a request that takes
longer than `judge.timeout` or fails. The environment raises it, and the collector's failure path
excludes the episode's group and counts it: a judge failure is never a silent reward of 0.

Verdicts are cached per process by a hash of (judge, rubric, transcripts): an identical episode
(or group) is judged once. Failures are not cached.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
from dataclasses import dataclass
from typing import Any

from environments.judge.config import JudgeConfig
from environments.judge.models import JudgeModel, make_judge_model
from environments.rewards import RewardError
from environments.toolcalls.near_json import NearJSONError, read_value_at, snippet

SINGLE_SYSTEM = (
    "You are a strict, fair grader of an AI assistant's work. You are given a rubric and one episode: "
    "the task, the assistant's messages, and the tool results it saw. Score how well the episode "
    "meets the rubric, from 0 (not at all) to 1 (fully). Reply with only a JSON object: "
    '{"score": <number from 0 to 1>, "reason": "<one short sentence>"}'
)

GROUP_SYSTEM = (
    "You are a strict, fair grader of an AI assistant's work. You are given a rubric and {n} episodes "
    "of the same task, each produced independently: the task, the assistant's messages, and the tool "
    "results it saw. Score each episode from 0 (does not meet the rubric) to 1 (fully meets it), "
    "comparing them with each other: a better episode gets a higher score. Reply with only a JSON "
    'object: {{"scores": [{{"id": 1, "score": <number from 0 to 1>, "reason": "<one short sentence>"}}, '
    "...]}} with exactly one entry for each episode id from 1 to {n}."
)


@dataclass(frozen=True)
class Verdict:
    score: float
    reason: str


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n…[{len(text) - 2 * half} characters cut]…\n{text[-half:]}"


def _first_object(reply: str) -> dict:
    """The first JSON object in `reply` (a ```json fence or prose around it is allowed)."""
    start = reply.find("{")
    if start < 0:
        raise RewardError(f"the judge's reply holds no JSON object: {snippet(reply)!r}")
    try:
        value, _ = read_value_at(reply, start)
    except NearJSONError as exc:
        raise RewardError(f"the judge's reply is not valid JSON ({exc}): {snippet(reply)!r}") from None
    return value


def _score(value: Any, reply: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise RewardError(f"the judge's {where} is {value!r}, not a number from 0 to 1: {snippet(reply)!r}")
    return float(value)


def read_single(reply: str) -> Verdict:
    """The verdict in a reply to the single-episode prompt; RewardError when malformed."""
    obj = _first_object(reply)
    if "score" not in obj:
        raise RewardError(f'the judge\'s reply has no "score": {snippet(reply)!r}')
    return Verdict(_score(obj["score"], reply, "score"), str(obj.get("reason", "")))


def read_group(reply: str, n: int) -> list[Verdict]:
    """The verdicts (in episode order) in a reply to the group prompt; RewardError when malformed:
    every id from 1 to n exactly once."""
    obj = _first_object(reply)
    entries = obj.get("scores")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise RewardError(f'the judge\'s reply has no "scores" list of objects: {snippet(reply)!r}')
    by_id: dict[int, Verdict] = {}
    for entry in entries:
        raw_id = entry.get("id")
        try:
            key = int(raw_id) if not isinstance(raw_id, bool) and str(raw_id).strip().isdigit() else None
        except ValueError:
            key = None
        if key is None or not 1 <= key <= n or key in by_id:
            raise RewardError(f"the judge's reply has a missing, repeated or unknown id {raw_id!r} "
                              f"(expected 1..{n}): {snippet(reply)!r}")
        by_id[key] = Verdict(_score(entry.get("score"), reply, f"score of episode {key}"), str(entry.get("reason", "")))
    if len(by_id) != n:
        missing = sorted(set(range(1, n + 1)) - set(by_id))
        raise RewardError(f"the judge's reply scores no episode {missing}: {snippet(reply)!r}")
    return [by_id[i] for i in range(1, n + 1)]


class Judge:
    """Scores episodes with `model` (see the module doc); `requests` and `cache_hits` count."""

    def __init__(self, model: JudgeModel, config: JudgeConfig):
        self.model = model
        self.config = config
        self.identity = config.model if config.backend == "openai" else config.name_or_path
        self.cache: dict[str, list[Verdict]] = {}
        self.requests = 0
        self.cache_hits = 0

    def _key(self, mode: str, rubric: str, transcripts: list[str]) -> str:
        payload = json.dumps([mode, self.config.backend, self.identity, rubric, transcripts])
        return hashlib.sha256(payload.encode()).hexdigest()

    async def _ask(self, messages: list[dict]) -> str:
        self.requests += 1
        try:
            return await asyncio.wait_for(self.model.complete(messages), self.config.timeout)
        except (asyncio.TimeoutError, TimeoutError):
            raise RewardError(f"the judge did not answer within judge.timeout={self.config.timeout:g} s") from None
        except RewardError:
            raise
        # Any backend failure (HTTP, engine, a model's own exception) is a reward error that names it.
        except Exception as exc:
            raise RewardError(f"the judge request failed: {exc!r}") from exc

    async def _cached(self, mode: str, rubric: str, transcripts: list[str], ask) -> list[Verdict]:
        key = self._key(mode, rubric, transcripts)
        if key in self.cache:
            self.cache_hits += 1
            return self.cache[key]
        verdicts = await ask()
        self.cache[key] = verdicts
        return verdicts

    async def score_episode(self, rubric: str, transcript: str) -> Verdict:
        """One episode's verdict."""
        transcript = _cut(transcript, self.config.max_transcript_chars)

        async def ask() -> list[Verdict]:
            reply = await self._ask([{"role": "system", "content": SINGLE_SYSTEM},
                                     {"role": "user", "content": f"Rubric:\n{rubric}\n\nEpisode:\n{transcript}"}])
            return [read_single(reply)]

        return (await self._cached("single", rubric, [transcript], ask))[0]

    async def score_group(self, rubric: str, transcripts: list[str]) -> list[Verdict]:
        """The verdicts of a group's episodes, judged together, in the given order."""
        transcripts = [_cut(t, self.config.max_transcript_chars) for t in transcripts]

        async def ask() -> list[Verdict]:
            episodes = "\n\n".join(f"Episode {i}:\n{t}" for i, t in enumerate(transcripts, start=1))
            reply = await self._ask([{"role": "system", "content": GROUP_SYSTEM.format(n=len(transcripts))},
                                     {"role": "user", "content": f"Rubric:\n{rubric}\n\n{episodes}"}])
            return read_group(reply, len(transcripts))

        return await self._cached("group", rubric, transcripts, ask)


_JUDGES: dict[str, Judge] = {}
_BUILDING = threading.Lock()


def get_judge(config: JudgeConfig) -> Judge:
    """The process's judge for `config` (built once: a local model loads once, the cache is
    shared by every episode and step). Building it may raise a clear error (a missing key
    variable names it)."""
    key = config.model_dump_json()
    with _BUILDING:  # episodes finishing together (in worker threads) build it once
        if key not in _JUDGES:
            _JUDGES[key] = Judge(make_judge_model(config), config)
        return _JUDGES[key]


# -- transcripts ---------------------------------------------------------------------------------

_SPACES = re.compile(r"\n{3,}")


def transcript_text(task_messages: list[dict], turns: list[dict]) -> str:
    """What the judge reads: the task's messages, then the episode's turns (assistant messages,
    tool results with the tool's name, later user messages), one block each. Worked examples and
    the tool documentation of the system prompt are left out."""
    lines = []
    for message in [*task_messages, *turns]:
        role = message.get("role", "?")
        label = f"TOOL ({message['name']})" if role == "tool" and message.get("name") else role.upper()
        lines.append(f"{label}: {message.get('content') or ''}".rstrip())
    return _SPACES.sub("\n\n", "\n".join(lines))


def rubric_of(task: Any, config: JudgeConfig) -> str:
    """The task's rubric, else the config's; neither is an error naming the task."""
    rubric = task.reward_spec.rubric or config.rubric
    if not rubric:
        raise ValueError(f"task {task.task_id} is scored by method 'judge' but has no reward_spec.rubric, "
                         "and environment.judge.rubric is not set")
    return rubric


async def judge_episode(task: Any, turns: list[dict], config: JudgeConfig,
                        judge: Judge | None = None) -> tuple[Verdict | None, dict | None]:
    """An episode's judging: `(verdict, None)` when judged now, `(None, pending)` under
    group-relative judging, where `pending` ({rubric, transcript}) waits for the whole group.
    `turns`: the episode's messages after its opening prompt."""
    rubric = rubric_of(task, config)
    transcript = transcript_text(task.messages(), turns)
    if config.group:
        return None, {"rubric": rubric, "transcript": transcript}
    judge = judge or await asyncio.to_thread(get_judge, config)
    return await judge.score_episode(rubric, transcript), None

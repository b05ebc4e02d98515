"""The trajectory collector: plays G episodes per task against environments, batching generation.

`TrajectoryCollector.collect(tasks, G)` runs every episode as an asyncio task (at most
`rollout.max_concurrent_episodes` at once). Episodes never call the engine themselves: they hand a
`GenerationRequest` to the `_GenerationBatcher`, which gathers the requests of all live episodes
into one `engine.generate` call running in a worker thread, so tool calls of some episodes overlap
with generation for the others.

Token in, token out: an episode's token ids are the prompt ids, then each turn's sampled ids exactly
as the engine returned them (loss_mask 1, the engine's behavior log-probs), then each observation
rendered as a chat-template delta (`grpo.chat_tokens`), tokenized once (loss_mask 0, log-prob 0.0).
Sampled ids are decoded only to give the environment text; that text is never tokenized again.

Budgets: each turn may write `rollout.max_new_tokens`, shrunk so that the sequence never exceeds
`rollout.max_total_tokens`; an episode whose next prompt would leave no room ends there and is
scored as it stands (the environment's `finish(reason)` when it has one). Stop tokens are the
template's end-of-turn token and eos. Every turn's sampling seed is derived from (seed, step, task
id, sample index, turn), so a seeded collection reproduces exactly however it is batched.

Failures: an episode that raises (engine, environment or tool layer) is retried from scratch up to
`rollout.episode_retries` times; if it still fails, its whole group is excluded, counted and logged
(warning with the task id and the exception). Once a group is lost, its other episodes stop early.
Groups are returned whole or not at all, in task order.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from environments.base import Environment, Message, StepResult, resolve
from environments.config import EnvironmentConfig
from grpo import chat_tokens
from grpo.config import RolloutConfig
from grpo.rollout.base import GenerationRequest, GenerationResult, RolloutEngine, SamplingParams
from grpo.trajectory import Trajectory

log = logging.getLogger("mcp_grpo.collector")

EnvFactory = Callable[[Any, str], Environment]


@dataclass
class CollectResult:
    trajectories: list[Trajectory]
    """Whole groups only, in task order (G consecutive trajectories per kept task)."""
    metrics: dict[str, float]
    """Flat `rollout/...` metrics of this collection."""
    excluded_groups: int = 0
    """Groups dropped because an episode failed after its retries."""
    failed_episodes: int = 0
    """Episodes that failed after their retries (each excludes its group)."""
    errors: list[str] = field(default_factory=list)
    """One line per failed episode: task id, sample index, exception."""


def turn_seed(
    seed: int | None, step: int, task_id: str, sample_index: int, turn: int
) -> int | None:
    """The sampling seed of one turn: a hash of (seed, step, task id, sample index, turn), so a
    seeded run reproduces exactly whatever order episodes happen to be batched in."""
    if seed is None:
        return None
    key = f"{seed}|{step}|{task_id}|{sample_index}|{turn}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & ((1 << 62) - 1)


def task_id_of(task: Any, index: int) -> str:
    """A task's id: `task.id` or `task.task_id`, else `reward_spec.ground_truth.task_id`, else
    `task<index>`."""
    for name in ("id", "task_id"):
        value = getattr(task, name, None)
        if isinstance(value, (str, int)) and value != "":
            return str(value)
    reward_spec = getattr(task, "reward_spec", None)
    ground_truth = getattr(reward_spec, "ground_truth", None)
    value = (
        ground_truth.get("task_id")
        if isinstance(ground_truth, dict)
        else getattr(ground_truth, "task_id", None)
    )
    return str(value) if value not in (None, "") else f"task{index}"


class _Timeline:
    """Splits wall time by what the collection was doing.

    - generating: an `engine.generate` call is in flight (batches run one at a time, so this is
      the summed duration of engine calls).
    - tools_only: at least one episode is inside its environment (`reset`/`step`, which is where
      tool calls happen) while no generation runs: time the engine sits idle waiting on tools.
    - tools_overlapped: episodes are in their environment while generation runs (hidden cost).
    - other: neither (batching waits, tokenization, bookkeeping).
    """

    def __init__(self) -> None:
        self.start = self._last = time.perf_counter()
        self.generating = False
        self.in_env = 0
        self.seconds = {"generating": 0.0, "tools_only": 0.0, "tools_overlapped": 0.0, "other": 0.0}

    def _flush(self) -> None:
        now = time.perf_counter()
        dt, self._last = now - self._last, now
        if self.generating:
            self.seconds["generating"] += dt
            if self.in_env:
                self.seconds["tools_overlapped"] += dt
        elif self.in_env:
            self.seconds["tools_only"] += dt
        else:
            self.seconds["other"] += dt

    def set_generating(self, value: bool) -> None:
        self._flush()
        self.generating = value

    def add_in_env(self, delta: int) -> None:
        self._flush()
        self.in_env += delta

    def wall(self) -> float:
        self._flush()
        return self._last - self.start


class _GenerationBatcher:
    """Gathers generation requests of live episodes into engine batches.

    Each live episode is in one of three states: *active* (running collector code on the event
    loop), *in env* (awaiting its environment's reset/step/close: tool calls), or *waiting* (its
    request is pending). A batch of all pending requests is dispatched when

    - no episode is active and none is in its environment (everyone who will ask soon has asked), or
    - the oldest pending request has waited `max_wait()` seconds: the larger of `min_wait_s` and
      `wait_fraction` of the previous engine call's duration (`initial_generate_s` before the
      first). An episode stuck in a slow tool call therefore delays the others by at most a small
      fraction of a generation, while a tool call that ends within it joins the batch instead of
      waiting out a whole generation for the next one (on a CPU a batch of 16 costs nearly as much
      as a batch of 32, so splitting one turn's requests into two batches nearly doubles its time).

    One engine call runs at a time, in a worker thread; requests arriving meanwhile form the next
    batch.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        timeline: _Timeline,
        *,
        min_wait_s: float,
        wait_fraction: float,
        last_generate_s: float,
    ) -> None:
        self.engine = engine
        self.timeline = timeline
        self.min_wait_s = min_wait_s
        self.wait_fraction = wait_fraction
        self.last_generate_s = last_generate_s
        self.active = 0
        self.in_env = 0
        self._pending: list[tuple[GenerationRequest, asyncio.Future, float]] = []
        self._changed = asyncio.Event()
        self._closed = False
        self.fatal: BaseException | None = None
        """Set when the engine raised something that is not an Exception (e.g. SystemExit): no
        further batches run and the collection re-raises it."""
        self.batch_sizes: list[int] = []
        self.generated_tokens = 0

    def max_wait(self) -> float:
        return max(self.min_wait_s, self.wait_fraction * self.last_generate_s)

    # -- episode side ------------------------------------------------------------------------
    def episode_started(self) -> None:
        self.active += 1
        self._changed.set()

    def episode_finished(self) -> None:
        self.active -= 1
        self._changed.set()

    @contextmanager
    def inside_env(self):
        self.active -= 1
        self.in_env += 1
        self.timeline.add_in_env(+1)
        self._changed.set()
        try:
            yield
        finally:
            self.in_env -= 1
            self.active += 1
            self.timeline.add_in_env(-1)
            self._changed.set()

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        if self.fatal is not None:
            raise RuntimeError(f"generation stopped: {self.fatal!r}")
        future = asyncio.get_running_loop().create_future()
        self._pending.append((request, future, time.perf_counter()))
        self.active -= 1
        self._changed.set()
        try:
            # The batcher moves the episode back to active when it resolves the future.
            return await future
        except asyncio.CancelledError:
            if future.cancelled():  # never resolved: the batcher did not restore the state
                self.active += 1
            raise

    # -- batching loop -----------------------------------------------------------------------
    def close(self) -> None:
        self._closed = True
        self._changed.set()

    async def _wait_changed(self, timeout: float | None) -> None:
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        self._changed.clear()

    async def run(self) -> None:
        while True:
            # Requests of cancelled episodes are dropped, never generated.
            self._pending = [entry for entry in self._pending if not entry[1].done()]
            if not self._pending:
                if self._closed:
                    return
                await self._wait_changed(None)
                continue
            everyone_asked = self.active <= 0 and self.in_env <= 0
            remaining = self._pending[0][2] + self.max_wait() - time.perf_counter()
            if not everyone_asked and remaining > 0:
                await self._wait_changed(remaining)
                continue
            batch, self._pending = self._pending, []
            await self._dispatch(batch)

    async def _dispatch(self, batch: list[tuple[GenerationRequest, asyncio.Future, float]]) -> None:
        requests = [request for request, _, _ in batch]
        self.batch_sizes.append(len(requests))
        self.timeline.set_generating(True)
        started = time.perf_counter()
        try:
            results = await asyncio.to_thread(self.engine.generate, requests)
            self.last_generate_s = time.perf_counter() - started
            if len(results) != len(requests):
                raise RuntimeError(
                    f"engine returned {len(results)} results for {len(requests)} requests"
                )
            error = None
        # Any engine failure fails every episode of the batch (each is then retried).
        except Exception as exc:  # noqa: BLE001
            results, error = None, exc
        # Cancellation or an exit: fail every waiting episode so that none hangs, then stop.
        except BaseException as exc:  # noqa: BLE001
            self.fatal = exc
            results, error = None, RuntimeError(f"generation stopped: {exc!r}")
        finally:
            self.timeline.set_generating(False)
        waiting = batch + (self._pending if self.fatal is not None else [])
        for i, (_, future, _) in enumerate(waiting):
            if future.done():  # the episode was cancelled meanwhile and restored its own state
                continue
            self.active += 1
            if error is not None:
                future.set_exception(error)
            else:
                self.generated_tokens += len(results[i].token_ids)
                future.set_result(results[i])
        if self.fatal is not None:
            self._pending = []
            raise self.fatal


class _GroupAbandoned(Exception):
    """Another episode of the group failed for good: this one's result would be dropped anyway."""


@dataclass
class _EpisodeStats:
    parse_failures: int = 0
    tool_calls: int = 0
    tool_errors: int = 0


@dataclass
class _Episode:
    """One episode being played: who it is and the token sequence built so far."""

    task: Any
    task_id: str
    group_id: str
    sample_index: int
    episode_id: str
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    behavior_logprobs: list[float] = field(default_factory=list)
    prompt_length: int = 0
    transcript: list[Message] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    turn_rewards: list[tuple[int, float]] = field(default_factory=list)
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    done: bool = False
    truncated: bool = False
    """Ended because the next prompt would not fit under rollout.max_total_tokens."""

    @property
    def num_turns(self) -> int:
        return len(self.finish_reasons)

    def start(self, prompt_ids: list[int], messages: list[Message], max_total_tokens: int) -> None:
        if len(prompt_ids) >= max_total_tokens:
            raise ValueError(
                f"task {self.task_id}: the prompt is {len(prompt_ids)} tokens, which leaves no "
                "room "
                f"under rollout.max_total_tokens={max_total_tokens}"
            )
        self.prompt_length = len(prompt_ids)
        self.token_ids = list(prompt_ids)
        self.loss_mask = [0] * len(prompt_ids)
        self.behavior_logprobs = [0.0] * len(prompt_ids)
        self.transcript = list(messages)
        self.prompt_messages = len(messages)

    def add_sampled(self, ids: list[int], logprobs: Sequence[float], finish_reason: str) -> None:
        self.token_ids += ids
        self.loss_mask += [1] * len(ids)
        self.behavior_logprobs += [float(x) for x in logprobs]
        self.finish_reasons.append(finish_reason)

    def add_observation(self, ids: list[int]) -> None:
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.behavior_logprobs += [0.0] * len(ids)

    def add_reward(self, outcome: StepResult, *, final: bool) -> None:
        reward = float(outcome.reward)
        self.reward += reward
        self.info = dict(outcome.info or {})
        if reward and not final:
            # A non-final step's reward belongs to the last token of the turn just sampled.
            self.turn_rewards.append((len(self.token_ids) - 1, reward))

    def to_trajectory(self, stats: _EpisodeStats) -> Trajectory:
        info = self.info
        metadata = {
            "reward_breakdown": info.get("reward_breakdown", {}),
            "success": bool(info.get("success", False)),
            "done_reason": info.get("done_reason", "max_total_tokens" if self.truncated else None),
            "counts": info.get("counts", {}),
            "transcript": self.transcript,
            "prompt_messages": self.prompt_messages,  # transcript[:n] is the prompt (incl. examples)
            "parse_failures": stats.parse_failures,
            "tool_errors": stats.tool_errors,
            "truncated_total_tokens": self.truncated,
            "episode_id": self.episode_id,
            "sample_index": self.sample_index,
            "info": info,
        }
        return Trajectory(
            task_id=self.task_id,
            group_id=self.group_id,
            token_ids=self.token_ids,
            loss_mask=self.loss_mask,
            behavior_logprobs=self.behavior_logprobs,
            prompt_length=self.prompt_length,
            reward=self.reward,
            turn_rewards=self.turn_rewards,
            num_turns=self.num_turns,
            num_tool_calls=stats.tool_calls,
            finish_reasons=list(self.finish_reasons),
            metadata=metadata,
        )


class TrajectoryCollector:
    """Plays groups of episodes and returns their trajectories (see the module docstring).

    One `collect` at a time per collector. The tool manager is the caller's: the collector
    neither starts nor closes it.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer,
        tools,
        env_config: EnvironmentConfig,
        rollout: RolloutConfig,
        *,
        env_factory: EnvFactory | None = None,
        batch_wait_s: float = 0.05,
        batch_wait_fraction: float = 0.25,
        initial_generate_s: float = 2.0,
    ) -> None:
        """`batch_wait_s`, `batch_wait_fraction`, `initial_generate_s`: how long a pending
        generation request may wait for episodes still in their environment before a batch is
        dispatched without them: max(batch_wait_s, batch_wait_fraction x the last engine call's
        seconds), with `initial_generate_s` standing in before the first call (see
        `_GenerationBatcher`)."""
        self.engine = engine
        self.tokenizer = tokenizer
        self.tools = tools
        self.env_config = env_config
        self.rollout = rollout
        self.env_factory = env_factory
        self.batch_wait_s = batch_wait_s
        self.batch_wait_fraction = batch_wait_fraction
        self._last_generate_s = initial_generate_s
        self.stop_ids = chat_tokens.stop_token_ids(tokenizer)
        self.end_of_turn_id = chat_tokens.end_of_turn_id(tokenizer)
        self.max_live_episodes = 0
        """Most episodes ever in flight at once (for tests of the concurrency bound)."""

    # -- environment -------------------------------------------------------------------------
    def _make_env(self, task: Any, episode_id: str) -> Environment:
        if self.env_factory is not None:
            return self.env_factory(task, episode_id)
        env_class = self.env_config.env_class or getattr(task, "env_class", None)
        if not env_class:
            raise ValueError(
                f"task {episode_id}: no env_class on the task nor in the environment config"
            )
        return resolve(env_class)(self.tools, self.env_config, episode_id)

    # -- one episode -------------------------------------------------------------------------
    async def _play(
        self,
        batcher: _GenerationBatcher,
        episode: _Episode,
        *,
        temperature: float,
        seed: int | None,
        step: int,
        abandoned: Callable[[], bool],
    ) -> Trajectory:
        env = self._make_env(episode.task, episode.episode_id)
        try:
            with batcher.inside_env():
                messages = list(await env.reset(episode.task))
            episode.start(
                chat_tokens.prompt_ids(self.tokenizer, messages),
                messages,
                self.rollout.max_total_tokens,
            )
            while not episode.done:
                if abandoned():
                    raise _GroupAbandoned()
                sampling = SamplingParams(
                    temperature=temperature,
                    top_p=self.rollout.top_p,
                    # Shrinks to fit: prompt + new tokens never exceed max_total_tokens.
                    max_new_tokens=min(
                        self.rollout.max_new_tokens,
                        self.rollout.max_total_tokens - len(episode.token_ids),
                    ),
                    stop_token_ids=self.stop_ids,
                    seed=turn_seed(
                        seed, step, episode.task_id, episode.sample_index, episode.num_turns
                    ),
                )
                request = GenerationRequest(
                    list(episode.token_ids),
                    sampling,
                    request_id=f"{episode.episode_id}/t{episode.num_turns}",
                )
                result = await batcher.generate(request)
                await self._take_turn(batcher, env, episode, result)
            return episode.to_trajectory(self._episode_stats(episode.info, episode.transcript))
        finally:
            with batcher.inside_env():
                try:
                    await env.close()
                # The episode is complete: a close error only logs.
                except Exception as exc:  # noqa: BLE001
                    log.warning("episode %s: env.close failed: %r", episode.episode_id, exc)

    async def _take_turn(
        self,
        batcher: _GenerationBatcher,
        env: Environment,
        episode: _Episode,
        result: GenerationResult,
    ) -> None:
        """Append one sampled turn, let the environment answer, append its observation delta."""
        sampled = list(result.token_ids)
        if len(result.behavior_logprobs) != len(sampled):
            raise RuntimeError(
                f"engine returned {len(sampled)} tokens but "
                f"{len(result.behavior_logprobs)} log-probs"
            )
        if not sampled:
            raise RuntimeError(
                f"engine returned no tokens for {episode.episode_id} turn {episode.num_turns}"
            )
        episode.add_sampled(sampled, result.behavior_logprobs, result.finish_reason)
        # The environment reads text; the trajectory keeps the sampled ids. The text is never
        # tokenized again.
        text = self.tokenizer.decode(sampled, skip_special_tokens=True)
        episode.transcript.append({"role": "assistant", "content": text})
        ended = sampled[-1] == self.end_of_turn_id
        with batcher.inside_env():
            outcome = await env.step(text, truncated=not ended)
        episode.transcript.extend(outcome.observations)
        episode.add_reward(outcome, final=outcome.done)
        if outcome.done:
            episode.done = True
            return
        delta = chat_tokens.observation_delta_ids(
            self.tokenizer, list(outcome.observations), assistant_ended=ended
        )
        if len(episode.token_ids) + len(delta) < self.rollout.max_total_tokens:
            episode.add_observation(delta)
            return
        # The next prompt would leave no room to generate: the episode ends here and is scored as
        # it stands (the environment's `finish`, where it has one); the observation that did not
        # fit stays in the transcript only.
        episode.done = episode.truncated = True
        finish = getattr(env, "finish", None)
        if finish is not None:
            with batcher.inside_env():
                episode.add_reward(await finish("max_total_tokens"), final=True)

    @staticmethod
    def _episode_stats(info: dict[str, Any], transcript: list[Message]) -> _EpisodeStats:
        """Counts from the environment's final info (falling back to the transcript for calls)."""
        counts = info.get("counts") if isinstance(info.get("counts"), dict) else info

        def count(*names: str) -> int | None:
            for name in names:
                value = counts.get(name)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    return int(value)
            return None

        tool_calls = count("tool_calls", "num_tool_calls")
        if tool_calls is None:
            tool_calls = sum(1 for m in transcript if m.get("role") == "tool")
        return _EpisodeStats(
            parse_failures=count("parse_failures", "num_parse_failures") or 0,
            tool_calls=tool_calls,
            tool_errors=count("tool_errors", "num_tool_errors") or 0,
        )

    async def _episode_with_retries(
        self,
        batcher: _GenerationBatcher,
        semaphore: asyncio.Semaphore,
        task: Any,
        task_id: str,
        group_id: str,
        sample_index: int,
        *,
        temperature: float,
        seed: int | None,
        step: int,
        group_failed: dict[str, bool],
    ) -> Trajectory | BaseException:
        last_error: BaseException | None = None
        for attempt in range(self.rollout.episode_retries + 1):
            if group_failed[group_id]:
                return _GroupAbandoned()
            episode_id = f"s{step}-{task_id}-{sample_index}-a{attempt}"
            async with semaphore:
                batcher.episode_started()
                self._live += 1
                self.max_live_episodes = max(self.max_live_episodes, self._live)
                try:
                    episode = _Episode(task, task_id, group_id, sample_index, episode_id)
                    return await self._play(
                        batcher,
                        episode,
                        temperature=temperature,
                        seed=seed,
                        step=step,
                        abandoned=lambda: group_failed[group_id],
                    )
                except _GroupAbandoned as exc:
                    return exc
                # Engine, environment or tool-layer failure: retry the episode from scratch.
                except Exception as exc:  # noqa: BLE001
                    last_error = exc
                    level = (
                        logging.INFO if attempt < self.rollout.episode_retries else logging.WARNING
                    )
                    log.log(
                        level,
                        "episode %s (task %s) failed on attempt %d: %r",
                        episode_id,
                        task_id,
                        attempt + 1,
                        exc,
                    )
                finally:
                    self._live -= 1
                    batcher.episode_finished()
        group_failed[group_id] = True
        return last_error if last_error is not None else RuntimeError("episode failed")

    # -- a collection ------------------------------------------------------------------------
    async def collect(
        self,
        tasks: Sequence[Any],
        group_size: int,
        *,
        temperature: float | None = None,
        seed: int | None = None,
        step: int = 0,
    ) -> CollectResult:
        """Play `group_size` episodes of every task; return the whole groups in task order."""
        temperature = self.rollout.temperature if temperature is None else temperature
        timeline = _Timeline()
        batcher = _GenerationBatcher(
            self.engine,
            timeline,
            min_wait_s=self.batch_wait_s,
            wait_fraction=self.batch_wait_fraction,
            last_generate_s=self._last_generate_s,
        )
        semaphore = asyncio.Semaphore(self.rollout.max_concurrent_episodes)
        self._live = 0
        task_ids = [task_id_of(task, i) for i, task in enumerate(tasks)]
        group_ids = [f"s{step}-g{i}-{task_id}" for i, task_id in enumerate(task_ids)]
        group_failed = {group_id: False for group_id in group_ids}

        batching = asyncio.create_task(batcher.run())
        episodes = [
            asyncio.create_task(
                self._episode_with_retries(
                    batcher,
                    semaphore,
                    task,
                    task_ids[i],
                    group_ids[i],
                    k,
                    temperature=temperature,
                    seed=seed,
                    step=step,
                    group_failed=group_failed,
                )
            )
            for i, task in enumerate(tasks)
            for k in range(group_size)
        ]
        try:
            outcomes = await asyncio.gather(*episodes)
        except BaseException:
            # Cancelled (or a fatal error): stop every episode and let each close its environment.
            for episode in episodes:
                episode.cancel()
            await asyncio.gather(*episodes, return_exceptions=True)
            raise
        finally:
            batcher.close()
            await asyncio.gather(batching, return_exceptions=True)
            self._last_generate_s = batcher.last_generate_s
        if batcher.fatal is not None:
            raise batcher.fatal
        wall = timeline.wall()

        trajectories: list[Trajectory] = []
        errors: list[str] = []
        failed_episodes = excluded_groups = 0
        for i, task_id in enumerate(task_ids):
            group = outcomes[i * group_size : (i + 1) * group_size]
            failures = [
                (k, o)
                for k, o in enumerate(group)
                if isinstance(o, BaseException) and not isinstance(o, _GroupAbandoned)
            ]
            if failures:
                excluded_groups += 1
                failed_episodes += len(failures)
                for k, error in failures:
                    errors.append(f"task {task_id} sample {k}: {error!r}")
                log.warning(
                    "excluding group of task %s (%d of %d episodes failed after %d retries): %r",
                    task_id,
                    len(failures),
                    group_size,
                    self.rollout.episode_retries,
                    failures[0][1],
                )
                continue
            trajectories.extend(group)

        metrics = self._metrics(
            trajectories, batcher, timeline, wall, failed_episodes, excluded_groups
        )
        return CollectResult(trajectories, metrics, excluded_groups, failed_episodes, errors)

    @staticmethod
    def _metrics(
        trajectories: list[Trajectory],
        batcher: _GenerationBatcher,
        timeline: _Timeline,
        wall: float,
        failed_episodes: int,
        excluded_groups: int,
    ) -> dict[str, float]:
        """Flat `rollout/` metrics. Rates and means are over the kept trajectories, except
        `gen_tokens` (every token the engine produced, failed episodes included).

        - episodes_per_s: kept episodes / wall seconds of the collection.
        - gen_tokens_per_s: generated tokens / wall seconds; engine_tokens_per_s: / generating s.
        - time_generating_s: wall time with an engine call in flight (calls run one at a time).
        - time_in_tools_s: wall time with at least one episode inside its environment (reset, step,
          close: where tool calls happen) and no engine call in flight: the engine idles on tools.
        - time_tools_overlapped_s: environment time hidden under generation.
        - tool_wait_share / generating_share: those two times over the wall time.
        - parse_failure_rate: turns whose tool-call markup could not be read / turns;
          tool_error_rate: tool calls that returned an error / tool calls.
        """
        n = len(trajectories)

        def mean(values: list[float]) -> float:
            return sum(values) / len(values) if values else 0.0

        rewards = [t.reward for t in trajectories]
        reward_mean = mean(rewards)
        turns = sum(t.num_turns for t in trajectories)
        calls = sum(t.num_tool_calls for t in trajectories)
        lengths = [len(t.token_ids) for t in trajectories]
        seconds = timeline.seconds
        return {
            "rollout/episodes": float(n),
            "rollout/wall_s": wall,
            "rollout/episodes_per_s": n / wall if wall > 0 else 0.0,
            "rollout/gen_tokens_per_s": batcher.generated_tokens / wall if wall > 0 else 0.0,
            "rollout/engine_tokens_per_s": (
                batcher.generated_tokens / seconds["generating"]
                if seconds["generating"] > 0
                else 0.0
            ),
            "rollout/gen_tokens": float(batcher.generated_tokens),
            "rollout/turns_per_episode": turns / n if n else 0.0,
            "rollout/tool_calls_per_episode": calls / n if n else 0.0,
            "rollout/parse_failure_rate": (
                sum(t.metadata.get("parse_failures", 0) for t in trajectories) / turns
                if turns
                else 0.0
            ),
            "rollout/tool_error_rate": (
                sum(t.metadata.get("tool_errors", 0) for t in trajectories) / calls
                if calls
                else 0.0
            ),
            "rollout/traj_len_mean": mean([float(x) for x in lengths]),
            "rollout/traj_len_max": float(max(lengths, default=0)),
            "rollout/reward_mean": reward_mean,
            "rollout/reward_std": math.sqrt(mean([(r - reward_mean) ** 2 for r in rewards])),
            "rollout/success_rate": mean([1.0 if t.success else 0.0 for t in trajectories]),
            "rollout/truncated_rate": mean(
                [1.0 if t.metadata.get("truncated_total_tokens") else 0.0 for t in trajectories]
            ),
            "rollout/time_generating_s": seconds["generating"],
            "rollout/time_in_tools_s": seconds["tools_only"],
            "rollout/time_tools_overlapped_s": seconds["tools_overlapped"],
            "rollout/tool_wait_share": seconds["tools_only"] / wall if wall > 0 else 0.0,
            "rollout/generating_share": seconds["generating"] / wall if wall > 0 else 0.0,
            "rollout/engine_batches": float(len(batcher.batch_sizes)),
            "rollout/mean_batch_size": mean([float(b) for b in batcher.batch_sizes]),
            "rollout/failed_episodes": float(failed_episodes),
            "rollout/excluded_groups": float(excluded_groups),
        }

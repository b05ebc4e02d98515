"""The trajectory collector: plays G episodes per task against environments, batching generation.

`TrajectoryCollector.collect(tasks, G)` runs every episode as an asyncio task (at most
`rollout.max_concurrent_episodes` at once). Episodes never call the engine themselves: they hand a
`GenerationRequest` to the `GenerationBatcher`, which gathers the requests of all live episodes
into one `engine.generate` call running in a worker thread, so tool calls of some episodes overlap
with generation for the others.

This module holds `TrajectoryCollector` (episode play, retries, group assembly), `CollectResult`
and `turn_seed`. The batcher is `grpo.collect.generation_batcher`, the per-episode record
`grpo.collect.episode`, time accounting and the `rollout/` metrics `grpo.collect.metrics`.

Token in, token out: an episode's token ids are the prompt ids, then each turn's sampled ids exactly
as the engine returned them (loss_mask 1, the engine's behavior log-probs), then each observation
rendered as a chat-template delta (`grpo.collect.chat_tokens`), tokenized once (loss_mask 0, log-prob 0.0).
Sampled ids are decoded only to give the environment text; that text is never tokenized again.

Budgets: each turn may write `rollout.max_new_tokens`, shrunk so that the sequence never exceeds
`rollout.max_total_tokens`; an episode whose next prompt would leave no room ends there and is
scored as it stands (the environment's `finish(reason)` when it has one). Stop tokens are the
template's end-of-turn token and eos. Every turn's sampling seed is derived from (seed, step, task
id, sample index, turn), so a seeded collection reproduces exactly however it is batched.

Failures: an episode that raises (engine, environment or tool layer) is retried from scratch up to
`rollout.episode_retries` times; if it still fails, its whole group is excluded, counted and logged
(warning with the task id and the exception). Once a group is lost, its other episodes stop early.
A reward that cannot be computed (`RewardError`: a judge that timed out or answered malformed)
takes the same path and is also counted as `rollout/reward_error_groups`; group-relative judge
scores are filled in once a group has finished (grpo/collect/environment_setup.py).
Groups are returned whole or not at all, in task order.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from environments.base import Environment, resolve
from environments.config import EnvironmentConfig
from environments.judge.judge import Judge
from environments.rewards import RewardError
from grpo.collect import chat_tokens
from grpo.collect.environment_setup import judge_groups, prepare_environment
from grpo.collect.episode import EpisodeRecord, GroupAbandoned, episode_stats, task_id_of
from grpo.collect.generation_batcher import GenerationBatcher
from grpo.collect.metrics import collection_metrics
from grpo.collect.timeline import Timeline
from grpo.rollout.base import GenerationRequest, GenerationResult, RolloutEngine, SamplingParams
from grpo.rollout.config import RolloutConfig
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
    reward_error_groups: int = 0
    """Of the excluded groups, those whose reward could not be computed (RewardError)."""


def turn_seed(
    seed: int | None, step: int, task_id: str, sample_index: int, turn: int
) -> int | None:
    """The sampling seed of one turn: a hash of (seed, step, task id, sample index, turn), so a
    seeded run reproduces exactly whatever order episodes happen to be batched in."""
    if seed is None:
        return None
    key = f"{seed}|{step}|{task_id}|{sample_index}|{turn}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & ((1 << 62) - 1)



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
        `GenerationBatcher`)."""
        self.engine = engine
        self.tokenizer = tokenizer
        self.tools = tools
        self.env_config = prepare_environment(env_config, tokenizer)
        """`env_config` fitted to the tokenizer (tool prompt resolved, chat template installed)."""
        self.judge: Judge | None = None
        """The judge of group-relative judging (None: the process's judge for env_config.judge)."""
        self.rollout = rollout
        self.env_factory = env_factory
        self.batch_wait_s = batch_wait_s
        self.batch_wait_fraction = batch_wait_fraction
        self._last_generate_s = initial_generate_s
        self.stop_ids = chat_tokens.stop_token_ids(tokenizer)
        self.end_of_turn_id = chat_tokens.end_of_turn_id(tokenizer)
        self.turn_end_ids = chat_tokens.turn_end_ids(tokenizer)
        self._prompts = chat_tokens.PromptCache(tokenizer)  # a group's episodes share their prompt
        self.max_live_episodes = 0
        """Most episodes ever in flight at once (for tests of the concurrency bound)."""
        self._live = 0
        """Episodes in flight now (reset by each collect)."""

    # -- environment -------------------------------------------------------------------------
    @contextmanager
    def playing_with(self, env_config: EnvironmentConfig) -> Iterator[None]:
        """Collections inside the block play with `env_config` instead (a variant of this
        collector's own, already fitted to the tokenizer: e.g. every tool shown)."""
        own, self.env_config = self.env_config, env_config
        try:
            yield
        finally:
            self.env_config = own

    def make_env(self, task: Any, episode_id: str) -> Environment:
        """The environment of one episode of `task` (`env_factory`, else the environment class the
        config or the task names)."""
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
        batcher: GenerationBatcher,
        episode: EpisodeRecord,
        *,
        temperature: float,
        seed: int | None,
        step: int,
        abandoned: Callable[[], bool],
    ) -> Trajectory:
        env = self.make_env(episode.task, episode.episode_id)
        try:
            with batcher.inside_env():
                messages = list(await env.reset(episode.task))
            episode.start(
                self._prompts.prompt_ids(messages, getattr(env, "chat_tools", None)),
                messages,
                self.rollout.max_total_tokens,
            )
            while not episode.done:
                if abandoned():
                    raise GroupAbandoned()
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
                    task_id=episode.task_id,
                    turn=episode.num_turns,
                    session=episode.episode_id,
                )
                result = await batcher.generate(request)
                await self._take_turn(batcher, env, episode, result)
            return episode.to_trajectory(episode_stats(episode.info, episode.transcript))
        finally:
            batcher.session_ended(episode.episode_id)
            with batcher.inside_env():
                try:
                    await env.close()
                # The episode is complete: a close error only logs.
                except Exception as exc:  # noqa: BLE001
                    log.warning("episode %s: env.close failed: %r", episode.episode_id, exc)

    async def _take_turn(
        self,
        batcher: GenerationBatcher,
        env: Environment,
        episode: EpisodeRecord,
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
        # A native tool prompt keeps special tokens: some families' call markers are special.
        native = getattr(env, "chat_tools", None) is not None
        text = chat_tokens.turn_text(self.tokenizer, sampled, keep_special_tokens=native)
        episode.transcript.append({"role": "assistant", "content": text})
        ended = sampled[-1] in self.turn_end_ids
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


    async def _episode_with_retries(
        self,
        batcher: GenerationBatcher,
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
                return GroupAbandoned()
            episode_id = f"s{step}-{task_id}-{sample_index}-a{attempt}"
            async with semaphore:
                batcher.episode_started()
                self._live += 1
                self.max_live_episodes = max(self.max_live_episodes, self._live)
                try:
                    episode = EpisodeRecord(task, task_id, group_id, sample_index, episode_id)
                    return await self._play(
                        batcher,
                        episode,
                        temperature=temperature,
                        seed=seed,
                        step=step,
                        abandoned=lambda: group_failed[group_id],
                    )
                except GroupAbandoned as exc:
                    return exc
                except MemoryError:
                    # Not the episode's failure but the process's: retrying every episode would
                    # only log one MemoryError per episode. The step stops on the first.
                    raise
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
        self._prompts.clear()
        timeline = Timeline()
        batcher = GenerationBatcher(
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
        episodes: list[asyncio.Task] = []
        try:
            # Made inside the try: if making them fails (out of memory), those made are stopped.
            for i, task in enumerate(tasks):
                for k in range(group_size):
                    episodes.append(asyncio.create_task(self._episode_with_retries(
                        batcher, semaphore, task, task_ids[i], group_ids[i], k,
                        temperature=temperature, seed=seed, step=step, group_failed=group_failed,
                    )))
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

        groups = [outcomes[i * group_size : (i + 1) * group_size] for i in range(len(tasks))]
        unjudged = await judge_groups(tasks, groups, self.env_config, self.judge)
        trajectories: list[Trajectory] = []
        errors: list[str] = []
        failed_episodes = excluded_groups = reward_error_groups = 0
        for i, task_id in enumerate(task_ids):
            group = groups[i]
            failures = [
                (k, o)
                for k, o in enumerate(group)
                if isinstance(o, BaseException) and not isinstance(o, GroupAbandoned)
            ]
            if i in unjudged:
                excluded_groups += 1
                reward_error_groups += 1
                errors.append(f"task {task_id}: {unjudged[i]!r}")
                log.warning("excluding group of task %s: its reward could not be computed: %s", task_id, unjudged[i])
                continue
            if failures:
                excluded_groups += 1
                failed_episodes += len(failures)
                reward_error_groups += any(isinstance(error, RewardError) for _, error in failures)
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

        metrics = collection_metrics(
            trajectories, batcher, timeline, wall, failed_episodes, excluded_groups
        )
        metrics["rollout/reward_error_groups"] = float(reward_error_groups)
        return CollectResult(
            trajectories, metrics, excluded_groups, failed_episodes, errors, reward_error_groups
        )

"""The generation batcher: gathers the pending generation requests of live episodes into
`engine.generate` calls, one at a time in a worker thread (see `GenerationBatcher`)."""

from __future__ import annotations

import asyncio
import time
from contextlib import contextmanager

from grpo.collect.timeline import Timeline
from grpo.rollout.base import GenerationRequest, GenerationResult, RolloutEngine


class GenerationBatcher:
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
        timeline: Timeline,
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

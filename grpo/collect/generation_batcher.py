"""The generation batcher: gathers the pending generation requests of live episodes into
`engine.generate` calls, one at a time in a worker thread (see `GenerationBatcher`); with an
engine that joins running batches, into one `engine.serve` call that the requests of episodes
coming back from their tools join while it decodes."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from contextlib import contextmanager

from grpo.collect.timeline import Timeline
from grpo.rollout.base import GenerationRequest, GenerationResult, RequestFeed, RolloutEngine

_Entry = tuple[GenerationRequest, asyncio.Future, float]
_ENGINE_TOTALS = (
    "prefill_tokens", "shared_prefix_tokens", "kept_prefix_tokens", "resumed_requests",
    "decode_steps", "prefix_attention_steps", "idle_seconds", "joins", "prefill_seconds",
    "graph_captures", "steps_with_draws", "server_failures", "retried_requests",
)
"""Engine counters summed over a collection's calls (the engine's `last_metrics`: HFEngine's, and
the vLLM server engine's failures and failed-over requests)."""
_ENGINE_GAUGES = ("live_servers",)
"""Engine readings whose last value a collection reports (servers serving after its last call)."""


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
    batch -- unless the engine joins running batches (`engine.joins_running_batches`, our HF
    engine's continuous batching): then the batch is handed to `engine.serve` through a feed,
    requests arriving while it runs join it at its next decode step, and each result reaches its
    episode as soon as its sequence ends, so a short turn's tool call runs while the long turns
    are still generating. The serve call ends when the engine has nothing left to decode; later
    requests start the next one.
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
        self._pending: list[_Entry] = []
        self._feed: _Feed | None = None
        """The running `serve` call's feed (continuous batching), or None."""
        self._changed = asyncio.Event()
        self._closed = False
        self.fatal: BaseException | None = None
        """Set when the engine raised something that is not an Exception (e.g. SystemExit): no
        further batches run and the collection re-raises it."""
        self.batch_sizes: list[int] = []
        """Requests per engine call (a serve call counts the ones that joined it)."""
        self.joined = 0
        """Requests that joined a running serve call."""
        self.generated_tokens = 0
        self.engine_totals: dict[str, float] = {}
        """Sums of the engine's per-call counters (`last_metrics`: prefill tokens, resumed
        requests, idle seconds, ...) over this collection's calls, where the engine has them."""

    def max_wait(self) -> float:
        return max(self.min_wait_s, self.wait_fraction * self.last_generate_s)

    # -- episode side ------------------------------------------------------------------------
    def episode_started(self) -> None:
        self.active += 1
        self._changed.set()

    def episode_finished(self) -> None:
        self.active -= 1
        self._changed.set()

    def session_ended(self, session: str) -> None:
        """The episode whose requests named `session` asks nothing more: a serving engine need
        not keep its last turn."""
        if self._feed is not None:
            self._feed.end_session(session)

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
        self.active -= 1
        if self._feed is not None and self._feed.offer(request, future):
            self.joined += 1
            self.batch_sizes[-1] += 1
        else:
            self._pending.append((request, future, time.perf_counter()))
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

    def _resolve(
        self, future: asyncio.Future, result: GenerationResult | None, error: BaseException | None
    ) -> None:
        """Hand an episode its result (or error); it becomes active again. A cancelled episode
        restored its own state."""
        if future.done():
            return
        self.active += 1
        if error is not None:
            future.set_exception(error)
        else:
            self.generated_tokens += len(result.token_ids)
            future.set_result(result)

    def _add_engine_metrics(self) -> None:
        for key, value in (getattr(self.engine, "last_metrics", None) or {}).items():
            if key in _ENGINE_TOTALS:
                self.engine_totals[key] = self.engine_totals.get(key, 0.0) + float(value)
            elif key in _ENGINE_GAUGES:
                self.engine_totals[key] = float(value)

    async def _call_engine(self, method, *args):
        """Run one engine call in a worker thread, marked as generating on the timeline: its
        value and None, or None and the error every episode waiting on it gets. An engine
        failure is that error (each episode is then retried); cancellation or an exit is
        recorded as `fatal` (the caller fails every waiting episode, so that none hangs, and
        re-raises it)."""
        self.timeline.set_generating(True)
        try:
            value = await asyncio.to_thread(method, *args)
            self._add_engine_metrics()
            return value, None
        except Exception as exc:  # noqa: BLE001
            return None, exc
        except BaseException as exc:  # noqa: BLE001
            self.fatal = exc
            return None, RuntimeError(f"generation stopped: {exc!r}")
        finally:
            self.timeline.set_generating(False)

    def _stop_if_fatal(self, error: BaseException | None) -> None:
        if self.fatal is not None:
            for _, future, _ in self._pending:
                self._resolve(future, None, error)
            self._pending = []
            raise self.fatal

    async def _dispatch(self, batch: list[_Entry]) -> None:
        if getattr(self.engine, "joins_running_batches", False):
            await self._serve(batch)
            return
        requests = [request for request, _, _ in batch]
        self.batch_sizes.append(len(requests))
        started = time.perf_counter()
        results, error = await self._call_engine(self.engine.generate, requests)
        if error is None:
            self.last_generate_s = time.perf_counter() - started
            if len(results) != len(requests):
                error = RuntimeError(
                    f"engine returned {len(results)} results for {len(requests)} requests"
                )
        for i, (_, future, _) in enumerate(batch):
            self._resolve(future, None if error is not None else results[i], error)
        self._stop_if_fatal(error)

    async def _serve(self, batch: list[_Entry]) -> None:
        """Continuous batching: `engine.serve` over a feed that starts with `batch`."""
        self.batch_sizes.append(len(batch))
        feed = self._feed = _Feed(asyncio.get_running_loop(), self._resolve, batch,
                                  on_idle=self.timeline.set_engine_idle)
        _, error = await self._call_engine(self.engine.serve, feed)  # never raises
        self._feed = None
        undelivered = feed.close()
        if error is None and undelivered:
            error = RuntimeError(f"the engine ended without {len(undelivered)} results")
        for future in undelivered:
            self._resolve(future, None, error)
        self._stop_if_fatal(error)


class _Feed(RequestFeed):
    """The batcher's end of a `serve` call. The event loop offers requests; the engine's worker
    thread takes them and hands results back, which reach their futures on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, resolve, batch: list[_Entry],
                 on_idle=None) -> None:
        self._loop = loop
        self._resolve = resolve
        self._on_idle = on_idle
        """Called on the event loop with True when the engine starts waiting on the feed for
        requests, False when the wait ends (the timeline does not count it as generating)."""
        self._changed = threading.Condition()
        """Guards the feed; notified when a request or a session end arrives (an idle engine
        waits on it)."""
        self._ended: list[str] = []
        self._open = True
        self._queue: list[tuple[int, GenerationRequest]] = []
        self._futures: dict[int, asyncio.Future] = {}
        self._tickets = itertools.count()
        for request, future, _ in batch:
            self.offer(request, future)

    def offer(self, request: GenerationRequest, future: asyncio.Future) -> bool:
        """Queue a request for the running engine; False once the feed has closed."""
        with self._changed:
            if not self._open:
                return False
            ticket = next(self._tickets)
            self._futures[ticket] = future
            self._queue.append((ticket, request))
            self._changed.notify_all()
            return True

    def take(
        self, *, close_if_empty: bool, wait_s: float = 0.0
    ) -> list[tuple[int, GenerationRequest]]:
        with self._changed:
            if not self._queue and not self._ended and wait_s > 0:
                if self._on_idle is not None:
                    self._loop.call_soon_threadsafe(self._on_idle, True)
                self._changed.wait(wait_s)
                if self._on_idle is not None:
                    self._loop.call_soon_threadsafe(self._on_idle, False)
            taken, self._queue = self._queue, []
            if not taken and close_if_empty:
                self._open = False
            return taken

    def end_session(self, session: str) -> None:
        """An episode ended: the engine need not keep its last turn for another."""
        with self._changed:
            if self._open:
                self._ended.append(session)
                self._changed.notify_all()

    def ended_sessions(self) -> list[str]:
        with self._changed:
            ended, self._ended = self._ended, []
            return ended

    def _hand_back(self, ticket: int, result, error) -> None:
        with self._changed:
            future = self._futures.pop(ticket)
        self._loop.call_soon_threadsafe(self._resolve, future, result, error)

    def deliver(self, ticket: int, result: GenerationResult) -> None:
        self._hand_back(ticket, result, None)

    def fail(self, ticket: int, error: Exception) -> None:
        self._hand_back(ticket, None, error)

    def close(self) -> list[asyncio.Future]:
        """Close (later offers are refused) and return the futures nothing was handed back to."""
        with self._changed:
            self._open = False
            self._queue = []
            undelivered, self._futures = list(self._futures.values()), {}
            return undelivered

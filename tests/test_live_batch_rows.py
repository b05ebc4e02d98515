"""Who joins a live batch (grpo/rollout/hf/live_batch.py `plan`, `make_room`, `returning`): a
session's next turn finds the parked row it extends, and the rows the waiting requests need are
unparked. Exact rows on hand-built batches, and the same answers as a scan of every row per
waiting request (what `returning` did before it looked rows up by session) on random batches."""

from __future__ import annotations

import copy
import random

import pytest

from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.hf.kv_cache import PreallocatedCache
from grpo.rollout.hf.live_batch import LiveBatch
from grpo.rollout.hf.sequence import Joiner, LiveSequence

SAMPLING = SamplingParams(max_new_tokens=4)


def _batch(rows: list[LiveSequence], max_rows: int = 8, capacity: int = 64) -> LiveBatch:
    batch = LiveBatch(PreallocatedCache(1, max_rows, capacity, 0), max_rows, "cpu", park_steps=100)
    batch.rows = rows
    batch.starts = [0] * len(rows)
    batch.pos = max((row.end_column for row in rows), default=0)
    batch.decode_steps = 50
    return batch


def _parked(ticket: int, session: str, prompt: tuple[int, ...], tokens: list[int], parked_at: int,
            end_column: int = 10) -> LiveSequence:
    row = LiveSequence(ticket, prompt, SAMPLING, session=session, tokens=list(tokens))
    row.finish_reason, row.parked_at = "stop", parked_at
    row.cached, row.end_column = len(prompt) + len(tokens) - 1, end_column  # the last token unfed
    return row


def _live(ticket: int, session: str = "") -> LiveSequence:
    return LiveSequence(ticket, (1, 2), SAMPLING, session=session, tokens=[3], cached=2, end_column=10)


def _joiner(ticket: int, session: str, prompt: tuple[int, ...]) -> Joiner:
    return Joiner(ticket, GenerationRequest(list(prompt), SAMPLING, session=session), seed=ticket)


def test_a_next_turn_finds_the_parked_row_it_extends_and_each_row_serves_one_request():
    rows = [
        _parked(0, "a", (1, 2), [3], parked_at=40),  # session a, a different conversation
        _live(1, "b"),
        _parked(2, "a", (5, 6), [7, 8], parked_at=45),  # session a, the one the turn extends
        _parked(3, "c", (5, 6), [7, 8], parked_at=41),
        _parked(4, "a", (5, 6), [7, 8], parked_at=46),  # a second row the same turn extends
    ]
    batch = _batch(rows)
    first, second = _joiner(10, "a", (5, 6, 7, 8, 9)), _joiner(11, "a", (5, 6, 7, 8, 9, 9))
    assert batch.returning(first, set()) == 2
    assert batch.returning(first, {2}) == 4
    assert batch.returning(first, {2, 4}) is None
    assert batch.returning(_joiner(12, "a", (5, 6, 7)), set()) is None  # extends no cached row
    assert batch.returning(_joiner(13, "", (5, 6, 7, 8, 9)), set()) is None  # no session
    returning, new, _ = batch.plan([first, second, _joiner(14, "d", (1,))])
    assert [(b, j.ticket) for b, j in returning] == [(2, 10), (4, 11)]
    assert [j.ticket for j in new] == [14]


def test_make_room_unparks_rows_their_sessions_left_and_the_longest_parked_for_new_rows():
    rows = [
        _parked(0, "a", (1, 2), [3], parked_at=40),
        _parked(1, "b", (1, 2), [3], parked_at=30),  # parked longest
        _parked(2, "c", (1, 2), [3], parked_at=35),
        _parked(3, "d", (1, 2), [3], parked_at=20),  # its session waits: kept for it
        _live(4),
        _live(5),
    ]
    batch = _batch(rows, max_rows=7)
    waiting = [
        _joiner(10, "a", (9, 9, 9, 9)),  # session a moved on: its row is stale
        _joiner(11, "d", (1, 2, 3, 4)),  # extends row 3
        _joiner(12, "e", (7,)),
        _joiner(13, "f", (7,)),
    ]
    batch.make_room(waiting)
    # 3 new rows (a, e, f) need room: 1 free + row 0 (a's stale row, droppable now) leaves 1 more,
    # the longest-parked row of a session not waiting: b (30) before c (35).
    assert [row.parked_at for row in batch.rows] == [None, None, 35, 20, None, None]


def _scan_returning(batch: LiveBatch, joiner: Joiner, taken: set[int]) -> int | None:
    """The scan `returning` made before rows were looked up by session."""
    if not joiner.request.session:
        return None
    for b, row in enumerate(batch.rows):
        if row.parked_at is None or row.session != joiner.request.session or b in taken:
            continue
        prompt = joiner.prompt
        if len(prompt) > row.cached and prompt[: row.cached] == (row.prompt_ids + tuple(row.tokens))[: row.cached]:
            return b
    return None


def _scan_make_room(batch: LiveBatch, waiting: list[Joiner]) -> None:
    sessions = {j.request.session for j in waiting if j.request.session}
    new_rows = 0
    for joiner in waiting:
        if _scan_returning(batch, joiner, set()) is None:
            new_rows += 1
            for row in batch.rows:
                if row.parked_at is not None and row.session == joiner.request.session:
                    row.parked_at = None
    parked = sorted((r for r in batch.rows if r.parked_at is not None and r.session not in sessions),
                    key=lambda r: r.parked_at)
    free = batch.max_rows - len(batch.rows) + batch.droppable()
    for row in parked[: max(0, new_rows - free)]:
        row.parked_at = None


def _random_case(rng: random.Random) -> tuple[LiveBatch, list[Joiner]]:
    sessions = [f"s{i}" for i in range(6)] + [""]
    conversations = [(1, 2, 3), (1, 2, 4), (5, 6, 7)]
    rows = []
    for ticket in range(rng.randint(0, 12)):
        session = rng.choice(sessions)
        prompt = rng.choice(conversations)
        if session and rng.random() < 0.7:
            rows.append(_parked(ticket, session, prompt, [8, 9][: rng.randint(1, 2)], rng.randint(0, 49)))
        else:
            rows.append(_live(ticket, session))
    waiting = []
    for ticket in range(100, 100 + rng.randint(0, 8)):
        prompt = rng.choice(conversations) + tuple(rng.choice([(8,), (8, 9), (8, 9, 9), ()]))
        waiting.append(_joiner(ticket, rng.choice(sessions), prompt))
    return _batch(rows, max_rows=16), waiting


@pytest.mark.parametrize("seed", range(200))
def test_the_session_lookup_gives_what_a_scan_of_every_row_gives(seed):
    rng = random.Random(seed)
    batch, waiting = _random_case(rng)
    taken = set(rng.sample(range(len(batch.rows)), k=min(2, len(batch.rows))))
    for joiner in waiting:
        assert batch.returning(joiner, taken) == _scan_returning(batch, joiner, taken)
    scanned = copy.deepcopy(batch)
    batch.make_room(waiting)
    _scan_make_room(scanned, waiting)
    assert [row.parked_at for row in batch.rows] == [row.parked_at for row in scanned.rows]

"""The `phrasing` split: a template that says its request in several ways (`say`) holds one
wording out of training, and held-out tasks of trained templates in that wording measure whether
the model learned the intent or the sentence. Against the real time server (mcp-server-time)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from conftest import REPO

from environments.taskgen.run import generate_tasks, held_wording
from environments.taskgen.wording import phrasing_of, recording, say
from tools.config import MCPServerConfig, ToolsConfig
from tools.manager import SharedToolManager

TIME = REPO / ".servers" / "time" / "bin" / "mcp-server-time"


def test_say_draws_as_choice_does_and_notes_each_pick_while_recording():
    options = ("one", "two", "three")
    chosen, expected = random.Random(7), random.Random(7)
    assert say(chosen, options) == expected.choice(options)  # nothing noted outside `recording`
    with recording() as said:
        picks = [say(chosen, options), say(chosen, ("a", "b"))]
    assert picks == [expected.choice(options), expected.choice(("a", "b"))]
    assert said == [(options.index(picks[0]), 3), (("a", "b").index(picks[1]), 2)]
    assert phrasing_of([(1, 3)]) == "1/3" and phrasing_of([(0, 2), (2, 3)]) == "0/2.2/3"
    assert phrasing_of([(0, 1)]) is None and phrasing_of([]) is None


def test_the_held_wording_is_a_seeded_draw_per_template():
    assert held_wording("t", 1, 0, 1.0) is None  # one wording: nothing to hold out
    assert held_wording("t", 3, 0, 0.0) is None
    drawn = [held_wording(f"time/clock:{i}", 3, 0, 1.0) for i in range(30)]
    assert set(drawn) == {0, 1, 2} and drawn == [held_wording(f"time/clock:{i}", 3, 0, 1.0) for i in range(30)]
    some = [held_wording(f"time/clock:{i}", 3, 0, 0.3) for i in range(200)]
    assert 40 <= sum(h is not None for h in some) <= 80  # about 30% of 200
    assert [held_wording(f"time/clock:{i}", 3, 1, 1.0) for i in range(30)] != drawn  # another seed, another draw


@pytest.mark.skipif(not TIME.is_file(), reason="the time server is not installed: run `make servers`")
def test_training_never_sees_the_held_wording_and_the_split_sees_only_it(loop):
    tools = SharedToolManager(ToolsConfig(servers={"time": MCPServerConfig(command=str(TIME))}, call_timeout=30))
    loop.run_until_complete(tools.start())
    try:
        outcome = loop.run_until_complete(generate_tasks(
            tools, servers=["time"], num=40, max_steps=2, seed=0, eval_tasks=6, novel_tasks=0, phrasing_tasks=8,
            phrasing_fraction=1.0, examples=0))
    finally:
        loop.run_until_complete(tools.close())
    splits = Counter(r["extra_info"]["split"] for r in outcome.records)
    assert splits["phrasing"] == 8 and splits["train"] == 40
    held = {}
    for record in outcome.records:
        info = record["extra_info"]
        which, of = map(int, info["phrasing"].split(".")[0].split("/"))
        held.setdefault(info["template"], held_wording(info["template"], of, 0, 1.0))
        if info["split"] == "phrasing":
            assert which == held[info["template"]], record["prompt"]
        else:
            assert which != held[info["template"]], record["prompt"]
    trained = {r["extra_info"]["template"] for r in outcome.records if r["extra_info"]["split"] == "train"}
    assert {r["extra_info"]["template"] for r in outcome.records if r["extra_info"]["split"] == "phrasing"} <= trained

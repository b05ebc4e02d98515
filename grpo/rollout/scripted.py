"""An engine that writes given texts instead of sampling: gold trajectories through the same path.

`ScriptedEngine(tokenizer, scripts)` answers a request of task `t`, turn `k` with `scripts[t][k]`
(or, when `scripts` is a function, with `scripts(request)`: a script that reads what the episode
has seen, grpo/train/gold.py) tokenized once, plus the end-of-turn token; its "behavior log-probs"
are 0. Played through the
collector, the scripts become trajectories exactly as sampled turns would: the environment runs
the calls on the real servers, observations are chat-template deltas, the loss mask covers the
scripted tokens only. The warm start (grpo/train/warmup.py) trains on them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from grpo.collect import chat_tokens
from grpo.rollout.base import GenerationRequest, GenerationResult, RolloutEngine


class ScriptedEngine(RolloutEngine):
    def __init__(self, tokenizer, scripts: Mapping[str, Sequence[str]] | Callable[[GenerationRequest], str]):
        self.tokenizer = tokenizer
        self.scripts = scripts
        self.end_of_turn = chat_tokens.end_of_turn_id(tokenizer)

    def _text(self, request: GenerationRequest) -> str:
        if callable(self.scripts):
            return self.scripts(request)
        turns = self.scripts.get(request.task_id)
        if turns is None:
            raise KeyError(f"no script for task {request.task_id!r}")
        if request.turn >= len(turns):
            raise IndexError(f"task {request.task_id!r}: the script has {len(turns)} turns, "
                             f"turn {request.turn + 1} was asked for")
        return turns[request.turn]

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        results = []
        for request in requests:
            ids = self.tokenizer.encode(self._text(request), add_special_tokens=False) + [self.end_of_turn]
            results.append(GenerationResult(ids, [0.0] * len(ids), "stop"))
        return results

    def sync_weights(self, policy) -> None:
        """Nothing to follow: the scripts do not change."""

"""Token samples for the run report's token view: per training step one trajectory as the update
saw it, token by token — the text piece, the loss mask, the advantage, the engine's log-prob
and the trainer's before the update (their gap shows a mask or re-tokenization problem; their
ratio is the importance weight) — and where the turns and tool results start.

One JSON line per step in `samples/tokens.jsonl`, a trajectory of at most `MAX_TOKENS` tokens
(longer ones keep their first and last halves, with the cut marked), so a long run keeps a small
file."""

from __future__ import annotations

import difflib
import json
import math
from pathlib import Path
from typing import Any

from tools.secrets import mask_text

TOKENS_FILE = Path("samples") / "tokens.jsonl"
MAX_TOKENS = 1536
"""Tokens kept per sample."""


def _round(value: float) -> float | None:
    return round(value, 4) if math.isfinite(value) else None


def masked_pieces(pieces: list[str]) -> list[str]:
    """The pieces with secrets masked by the project's one rule (tools/secrets.py), applied to
    their joined text: a piece that overlaps a masked span shows `***` (the first) or nothing."""
    text = "".join(pieces)
    masked = mask_text(text)
    if masked == text:
        return list(pieces)
    hidden = [False] * len(text)
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, text, masked, autojunk=False).get_opcodes():
        if tag != "equal":
            hidden[i1:max(i2, i1 + 1)] = [True] * (max(i2, i1 + 1) - i1)
    out, start, shown = [], 0, False
    for piece in pieces:
        end = start + len(piece)
        if any(hidden[start:end]):
            out.append("" if shown else "***")
            shown = True
        else:
            out.append(piece)
            shown = False
        start = end
    return out


def token_record(step: int, trajectory: Any, sample: dict, tokenizer: Any) -> dict[str, Any]:
    """One step's sample: `trajectory` with `sample` (`train_step`'s: advantages and the
    trainer's old log-probs per target position, i.e. for token i at position i - 1)."""
    ids = list(trajectory.token_ids)
    advantages, old = sample["advantages"], sample["old_logprobs"]
    pieces = masked_pieces([tokenizer.decode([token_id]) for token_id in ids])
    tokens = []
    for i in range(len(ids)):
        sampled = bool(trajectory.loss_mask[i])
        tokens.append([
            pieces[i],
            int(sampled),
            _round(advantages[i - 1]) if i >= 1 else 0.0,
            _round(trajectory.behavior_logprobs[i]) if sampled else None,
            _round(old[i - 1]) if sampled and i >= 1 else None,
        ])
    kept, cut = tokens, None
    if len(tokens) > MAX_TOKENS:
        half = MAX_TOKENS // 2
        kept, cut = tokens[:half] + tokens[-half:], half
    return {"step": step, "task_id": trajectory.task_id, "reward": trajectory.reward,
            "success": bool(trajectory.success), "prompt_length": trajectory.prompt_length, "num_tokens": len(ids),
            "cut_at": cut, "cut_tokens": len(tokens) - len(kept), "tokens": kept}


def append_sample(run_dir: Path, record: dict[str, Any]) -> None:
    path = run_dir / TOKENS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(json.dumps(record) + "\n")

"""The reward/success curve image written at the end of a run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

_COMPLEXITY = "rollout/success/complexity="
_KIND = "rollout/success/kind="
_ORDER = {"easy": 0, "medium": 1, "hard": 2}


def curve_series(history: list[dict[str, float]]) -> list[tuple[str, str, str]]:
    """(metric key, legend label, line style) of each curve: reward, success, then success per
    kind where the tasks have kinds (dotted), else per complexity (easy, medium, hard, then any
    other name; dashed)."""
    series = [("rollout/reward_mean", "train reward", "-"), ("rollout/success_rate", "train success", "-")]
    per_kind = sorted({key for h in history for key in h if key.startswith(_KIND)})
    if per_kind:
        return series + [(key, f"train success, {key[len(_KIND):]}", ":") for key in per_kind]
    per_complexity = sorted({key for h in history for key in h if key.startswith(_COMPLEXITY)},
                            key=lambda key: (_ORDER.get(key[len(_COMPLEXITY):], len(_ORDER)), key))
    return series + [(key, f"train success, {key[len(_COMPLEXITY):]}", "--") for key in per_complexity]


def plot_curves(history: list[dict[str, float]], summary: dict[str, Any], path: Path) -> Path:
    """Training reward and success per step (and success per task kind or complexity where the
    tasks have them), with held-out success before/after as markers."""
    steps = list(range(1, len(history) + 1))
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for key, label, style in curve_series(history):
        values = [h.get(key) for h in history]
        if any(v is not None for v in values):
            ax.plot(steps, [v if v is not None else float("nan") for v in values], style,
                    marker="o" if style == "-" else ".", label=label)
    if "success_before" in summary:
        ax.scatter([0], [summary["success_before"]], color="black", marker="s", zorder=3,
                   label=f"held-out success before: {summary['success_before']:.0%}")
    if "success_warmup" in summary:
        ax.scatter([0], [summary["success_warmup"]], color="tab:orange", marker="D", zorder=3,
                   label=f"held-out success after the warm start: {summary['success_warmup']:.0%}")
    if "success_after" in summary:
        ax.scatter([len(history)], [summary["success_after"]], color="green", marker="*", s=120, zorder=3,
                   label=f"held-out success after: {summary['success_after']:.0%}")
    ax.set_xlabel("training step")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(Path(summary.get("run_dir", "")).name or "run")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path

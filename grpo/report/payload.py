"""What the run report shows, read from a run directory as it is on disk (a finished run, or one
still going): `run_payload(run_dir) -> dict`, plain JSON data for grpo/report/page.py.

- `run`: the name, the resolved config (`config.yaml`, secrets already masked there) and the
  summary (`summary.json`, absent mid-run), where and when it ran.
- `curves`: chosen `metrics.jsonl` series per step — reward, train and held-out success (and per
  group: kind, split, server, complexity), loss, KL, entropy, engine/trainer mismatch, tool error
  rate, step time, the warm start's loss.
- `stages`: held-out success per group at each evaluation (before, after the warm start, after);
  `tool_stages` the same per tool, over the tasks whose gold chain calls it.
- `tools`: per tool calls, errors (and by kind), p50/p99 latency over the run, its server's
  restarts and breaker openings; the run's retries, timeouts and errors by kind.
- `episodes`: every held-out task with its request, groups, and per stage its outcome and
  transcript (the system prompt and worked examples left out; long messages cut), and how the
  outcome changed from the first evaluation to the last (`fixed`, `broken`, `still failing`,
  `always right`; `right` or `wrong` where there was one).
- `tokens`: token samples of training steps (grpo/report/samples.py), at most MAX_TOKEN_SAMPLES
  spread over the run.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from grpo.report.samples import TOKENS_FILE
from tools.secrets import mask_value

STAGES = ("before", "warmup", "after")
MAX_MESSAGE_CHARS = 2000
"""A transcript message longer than this is cut (the report states it)."""
MAX_TOKEN_SAMPLES = 40
CURVES = {
    "reward (sampled)": "rollout/reward_mean",
    "success (sampled)": "rollout/success_rate",
    "success (held-out)": "eval/success_rate",
    "loss": "train/loss",
    "KL to the reference": "train/kl_ref",
    "entropy estimate": "train/entropy_estimate",
    "engine/trainer log-prob gap": "train/logprob_mismatch",
    "importance weight (mean)": "train/is_weight_mean",
    "tool error rate": "rollout/tool_error_rate",
    "parse failure rate": "rollout/parse_failure_rate",
    "step seconds": "time/step_s",
    "warm start loss": "warmup/loss",
}
GROUPED = re.compile(r"^(rollout|eval)/success/(?!.*/)(kind|split|server|complexity|calls)=(.+)$")
TOOL = re.compile(r"^tools/([^/=]+\.[^/]+)/(calls|errors|p50_ms|p99_ms)$")
TOOL_ERROR_KIND = re.compile(r"^tools/([^/=]+\.[^/]+)/errors/([^/]+)$")
SERVER = re.compile(r"^tools/server=([^/]+)/(restarts|breaker_openings)$")


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a line being written as the report is read
    return rows


def _curves(metrics: list[dict]) -> dict[str, dict[str, list[list[float]]]]:
    """{panel: {series name: [[step, value], ...]}}: the named curves, then one panel per group
    kind for sampled and held-out success."""
    panels: dict[str, dict[str, list[list[float]]]] = {name: {} for name in CURVES}
    for row in metrics:
        step = row.get("warmup/step") if "warmup/loss" in row else row.get("step")
        if step is None:
            continue
        for title, key in CURVES.items():
            value = row.get(key)
            if isinstance(value, (int, float)):
                panels[title].setdefault(title, []).append([step, value])
        for key, value in row.items():
            match = GROUPED.match(key)
            if match and isinstance(value, (int, float)):
                source, group, name = match.groups()
                title = f"success by {group} ({'sampled' if source == 'rollout' else 'held-out'})"
                panels.setdefault(title, {}).setdefault(name, []).append([step, value])
    return {title: series for title, series in panels.items() if series}


def _stages(summary: dict) -> dict[str, dict[str, float]]:
    """{group: {stage: success}} from the summary's `success_<stage>[/group]` entries."""
    table: dict[str, dict[str, float]] = {}
    for key, value in summary.items():
        for stage in STAGES:
            prefix = f"success_{stage}"
            if key == prefix:
                table.setdefault("all", {})[stage] = value
            elif key.startswith(prefix + "/"):
                table.setdefault(key[len(prefix) + 1:], {})[stage] = value
    return dict(sorted(table.items(), key=lambda item: (item[0] != "all", item[0])))


def _tools(metrics: list[dict]) -> dict[str, Any]:
    """Per tool: calls, errors (and by kind), p50 (the median step's) and p99 (the worst
    step's) latency, and its server's restarts and breaker openings; per server those two; the
    run's totals of the rest (retries, timeouts, errors by kind...)."""
    per_tool: dict[str, dict[str, Any]] = {}
    servers: dict[str, dict[str, int]] = {}
    totals: dict[str, float] = {}

    def tool_entry(tool: str) -> dict[str, Any]:
        return per_tool.setdefault(tool, {"calls": 0, "errors": 0, "p50_ms": [], "p99_ms": [], "errors_by_kind": {}})

    for row in metrics:
        for key, value in row.items():
            if not isinstance(value, (int, float)) or not key.startswith("tools/"):
                continue
            if match := TOOL.match(key):
                tool, what = match.groups()
                entry = tool_entry(tool)
                if what in ("calls", "errors"):
                    entry[what] += value
                else:
                    entry[what].append(value)
            elif match := TOOL_ERROR_KIND.match(key):
                kinds = tool_entry(match.group(1))["errors_by_kind"]
                kinds[match.group(2)] = kinds.get(match.group(2), 0) + int(value)
            elif match := SERVER.match(key):
                server, what = match.groups()
                counts = servers.setdefault(server, {"restarts": 0, "breaker_openings": 0})
                counts[what] += int(value)
            elif key.count("/") <= 2 and "." not in key.split("/")[1]:
                totals[key[len("tools/"):]] = totals.get(key[len("tools/"):], 0) + value
    rows = []
    for tool, entry in sorted(per_tool.items()):
        p50 = sorted(entry["p50_ms"])
        server = servers.get(tool.partition(".")[0], {})
        rows.append({"tool": tool, "calls": int(entry["calls"]), "errors": int(entry["errors"]),
                     "errors_by_kind": dict(sorted(entry["errors_by_kind"].items())),
                     "p50_ms": p50[len(p50) // 2] if p50 else None,
                     "p99_ms": max(entry["p99_ms"]) if entry["p99_ms"] else None,
                     "server_restarts": server.get("restarts", 0),
                     "server_breaker_openings": server.get("breaker_openings", 0)})
    return {"per_tool": rows, "servers": dict(sorted(servers.items())),
            "totals": {k: int(v) for k, v in sorted(totals.items())}}


def _tool_stages(episodes: list[dict]) -> dict[str, dict[str, Any]]:
    """Held-out success per tool at each evaluation: over the tasks whose gold chain calls it
    (`gold_tools` of the transcripts), `tasks` their number; other evaluation sets' as
    `<set>: <tool>`."""
    counts: dict[str, dict[str, list[int]]] = {}
    tasks: Counter = Counter()
    for episode in episodes:
        for tool in episode["gold_tools"]:
            name = tool if episode["set"] == "held-out" else f"{episode['set']}: {tool}"
            tasks[name] += 1
            for stage, outcome in episode["stages"].items():
                tally = counts.setdefault(name, {}).setdefault(stage, [0, 0])
                tally[0] += outcome["success"]
                tally[1] += 1
    return {name: {"tasks": tasks[name], **{stage: won / played for stage, (won, played) in by_stage.items()}}
            for name, by_stage in sorted(counts.items())}


def _messages(record: dict) -> tuple[str, list[dict]]:
    """The request and the episode's own messages (no system prompt, no worked examples)."""
    transcript = record.get("transcript") or []
    opening = record.get("prompt_messages")
    if not isinstance(opening, int):
        # Older transcripts: the request is the last user message before the episode's turns.
        users = [i for i, m in enumerate(transcript) if m.get("role") == "user"]
        opening = users[-1] + 1 if users else 0
    request = next((m.get("content", "") for m in reversed(transcript[:opening]) if m.get("role") == "user"), "")
    own = []
    for message in transcript[opening:]:
        content = str(message.get("content", ""))
        cut = len(content) > MAX_MESSAGE_CHARS
        own.append({"role": message.get("role", "?"), "name": message.get("name"),
                    "content": content[:MAX_MESSAGE_CHARS] + (f" …[{len(content) - MAX_MESSAGE_CHARS} characters cut]"
                                                            if cut else "")})
    return str(request), own


def _change(before: bool | None, after: bool | None) -> str:
    if before is None and after is None:
        return "not played"
    if before is None or after is None:  # one evaluation (`mcp-grpo evaluate`): its outcome
        return "right" if (after if before is None else before) else "wrong"
    return {(False, True): "fixed", (True, False): "broken", (False, False): "still failing",
            (True, True): "always right"}[(before, after)]


def _stage_order(name: str) -> tuple[int, str]:
    return (STAGES.index(name) if name in STAGES else len(STAGES), name)


def _episodes(run_dir: Path) -> list[dict]:
    """Held-out tasks with their outcome at each evaluation (`eval/<stage>[.<set>].jsonl`: the
    run's before, warmup and after, or what `mcp-grpo evaluate --name` wrote), the evaluation
    sets' apart (`set`)."""
    episodes: dict[tuple[str, str], dict] = {}
    for path in sorted((run_dir / "eval").glob("*.jsonl")):
        stage, _, rest = path.name.partition(".")
        eval_set = rest[: -len(".jsonl")] if rest != "jsonl" else "held-out"
        for record in _read_jsonl(path):
            task_id = str(record.get("task_id"))
            request, messages = _messages(record)
            entry = episodes.setdefault((eval_set, task_id), {
                "task_id": task_id, "set": eval_set, "request": request, "groups": record.get("groups") or {},
                "tools": [], "gold_tools": [], "stages": {}})
            entry["tools"] = sorted(set(entry["tools"]) | {m["name"] for m in messages if m["role"] == "tool" and m.get("name")})
            entry["gold_tools"] = sorted(set(entry["gold_tools"]) | {str(t) for t in record.get("gold_tools") or []})
            entry["stages"][stage] = {"success": bool(record.get("success")), "reward": record.get("reward"),
                                      "messages": messages}
    out = []
    for entry in episodes.values():
        entry["stages"] = dict(sorted(entry["stages"].items(), key=lambda item: _stage_order(item[0])))
        played = list(entry["stages"].values())
        first = played[0]["success"] if played else None
        last = played[-1]["success"] if len(played) > 1 else None
        entry["change"] = _change(first, last)
        out.append(entry)
    return sorted(out, key=lambda e: (e["set"] != "held-out", e["set"], e["task_id"]))


def _token_samples(run_dir: Path) -> list[dict]:
    samples = _read_jsonl(run_dir / TOKENS_FILE)
    if len(samples) <= MAX_TOKEN_SAMPLES:
        return samples
    stride = (len(samples) - 1) / (MAX_TOKEN_SAMPLES - 1)
    return [samples[round(i * stride)] for i in range(MAX_TOKEN_SAMPLES)]


def run_payload(run_dir: Path) -> dict[str, Any]:
    """Everything the report shows (module doc); a file the run has not written yet is left out.
    Transcripts and token samples were masked when written (tools/secrets.py); the config is
    masked again here."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run directory {run_dir}")
    config_path = run_dir / "config.yaml"
    config = yaml.safe_load(config_path.read_text()) if config_path.is_file() else {}
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    metrics = _read_jsonl(run_dir / "metrics.jsonl")
    episodes = _episodes(run_dir)
    return {
        "run": {"name": (config or {}).get("run_name") or run_dir.name, "dir": str(run_dir),
                "config": mask_value(config or {})[0], "summary": summary, "finished": bool(summary),
                "steps": max((row.get("step", 0) for row in metrics if "warmup/loss" not in row), default=0)},
        "curves": _curves(metrics),
        "stages": _stages(summary),
        "tool_stages": _tool_stages(episodes),
        "tools": _tools(metrics),
        "episodes": episodes,
        "tokens": _token_samples(run_dir),
    }


MAX_TASK_SAMPLES = 300
"""Sample requests in a task generation's report: the first two of each template and split."""


def tasks_payload(report: dict[str, Any], records: list[dict], name: str, where: str) -> dict[str, Any]:
    """A task generation's report (`generate-tasks`): its per-server and per-tool tables, the
    tools left out and why, and sample requests with their gold chains; the run's views empty."""
    samples, seen = [], Counter()
    for record in records:
        extra = record.get("extra_info") or {}
        key = (extra.get("split"), extra.get("template"))
        if seen[key] >= 2 or len(samples) >= MAX_TASK_SAMPLES:
            continue
        seen[key] += 1
        truth = record["reward_spec"]["ground_truth"]
        success = truth.get("success") or {}
        samples.append({
            "split": str(extra.get("split", "")), "template": str(extra.get("template", "")),
            "request": next((m["content"] for m in reversed(record["prompt"]) if m["role"] == "user"), ""),
            "chain": [f"{step.get('server') or ''}.{step['tool']}({json.dumps(step.get('params', {}))})"
                      for step in truth.get("tool_sequence", [])],
            "answer": json.dumps(success.get("answer")) if success.get("answer") is not None else "",
        })
    return {"run": {"name": name, "dir": where, "config": report.get("settings", {}), "summary": {},
                    "finished": True, "steps": 0},
            "curves": {}, "stages": {}, "tool_stages": {}, "tools": {"per_tool": [], "servers": {}, "totals": {}},
            "episodes": [], "tokens": [],
            "generation": {**{k: v for k, v in report.items() if k != "settings"}, "samples": samples}}

"""Secrets in what mcp-grpo writes: one rule that masks API keys, tokens and passwords in task
files, reports, console lines and transcripts (`mask_secrets`, `mask_value`)."""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
SECRETS = (
    re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}"),                          # OpenAI-style keys
    re.compile(r"\b(?:ghp|gho|ghs|github_pat|xox[abpr])_[A-Za-z0-9_\-]{8,}"),  # GitHub, Slack tokens
    re.compile(r"\bAKIA[0-9A-Z]{12,}"),                              # AWS access key ids
    re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/\-]{8,}=*"),
    re.compile(r"(?i)(\b(?:api[_-]?key|access[_-]?token|auth[_-]?token|token|secret|password|passwd)\b[\"']?\s*[:=]\s*[\"']?)"
               r"[^\s\"',;&]{4,}"),
)
"""What counts as a secret: a key-shaped string, or the value after `api_key=`, `token:`, ..."""


def mask_secrets(text: str) -> tuple[str, int]:
    """`text` with every secret replaced by `***` (a prefix such as `Bearer ` kept); the count."""
    count = 0
    for pattern in SECRETS:
        def repl(match: re.Match) -> str:
            nonlocal count
            count += 1
            return (match.group(1) if match.re.groups else "") + MASK
        text = pattern.sub(repl, text)
    return text, count


def mask_value(value: Any) -> tuple[Any, int]:
    if isinstance(value, str):
        return mask_secrets(value)
    if isinstance(value, dict):
        out, total = {}, 0
        for key, item in value.items():
            out[key], n = mask_value(item)
            total += n
        return out, total
    if isinstance(value, list):
        items = [mask_value(item) for item in value]
        return [i for i, _ in items], sum(n for _, n in items)
    return value, 0
